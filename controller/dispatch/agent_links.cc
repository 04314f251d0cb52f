#include "controller/dispatch/agent_links.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <tuple>

#include "common/cuda_version.h"
#include "common/estimate/rate_probe.h"
#include "common/event_line.h"
#include "common/foreign_json.h"
#include "common/text.h"
#include "controller/dispatch/node_info_check.h"
#include "controller/node_certificates.h"
#include "controller/scheduler/scheduler.h"
#include "rpc/connection.h"
#include "rpc/grpc_status.h"
#include "rpc/tls.h"

namespace llmctl::controller {

AgentConnector TlsAgentConnector(rpc::TlsIdentity identity, const SecretsFile& secrets) {
  return [identity = std::move(identity),
          &secrets](const store::NodeRecord& node) -> StatusOr<AgentChannel> {
    ASSIGN_OR_RETURN(std::string token, secrets.NodeToken(node.name));
    // The current registration's name: no certificate of an earlier node of this name passes.
    ASSIGN_OR_RETURN(std::string certificate_name, secrets.NodeCertificateName(node.name));
    // rpc::Dial's channel with a stated receive limit: an event line of the cap must always pass.
    grpc::ChannelArguments arguments;
    arguments.SetSslTargetNameOverride(certificate_name);
    arguments.SetMaxReceiveMessageSize(static_cast<int>(kMaxAgentMessageBytes));
    // An agent cut off without closing: its event streams end (UNAVAILABLE) instead of waiting.
    rpc::SetClientKeepalive(arguments);
    return AgentChannel{
        .channel = grpc::CreateCustomChannel(rpc::GrpcAddress(node.address),
                                             rpc::ChannelCredentials(identity, token), arguments),
        .certificate_name = std::move(certificate_name)};
  };
}

namespace dispatch {
namespace {

// The node's rates from its NodeInfo, stored when they differ from `last` (the link's): parsed with
// the one parser first, since an agent's report is untrusted input, and stored as it reads back, so
// the store holds only probes the estimate can use. A refused probe is logged once.
void StoreNodeRates(store::Store& store, const std::string& node, const std::string& probe_json,
                    std::string& last, store::Time now) {
  if (probe_json.empty() || probe_json == last) return;
  last = probe_json;
  const nlohmann::json json = ParseForeignJson(probe_json);
  const StatusOr<estimate::RateProbe> probe =
      json.is_discarded() ? StatusOr<estimate::RateProbe>(InvalidArgumentError("not JSON"))
                          : estimate::RateProbe::FromJson(json);
  if (!probe.ok()) {
    spdlog::error("node {}: its measured rates are refused: {}", node, probe.status().message());
    return;
  }
  const StatusOr<bool> stored = store.PutNodeRates(node, probe->ToJson().dump(), now);
  if (!stored.ok()) {
    spdlog::error("node {}: cannot store its rates: {}", node, stored.status().ToString());
    last.clear();  // tried again at the next health check
  } else if (*stored) {
    spdlog::info("node {}: rates measured on {}", node, probe->Summary());
  }
}

// What the link keeps of its agent's note on its rates (NodeInfo's rate_probe_pending and
// rate_probe_underway, or a MeasureRates answer): a node that measures takes no trial.
void NoteRatesPending(AgentLinks::Link& link, const std::string& pending, bool underway) {
  link.measuring = pending == estimate::kRateProbeMeasuring;
  link.rate_probe_pending = pending;
  link.rate_probe_underway = underway;
}

}  // namespace

Status NodeNotConnected(const std::string& node) {
  return FailedPreconditionError("node " + node +
                                 " is not connected: its agent has not answered the controller");
}

Status AgentCallFailed(const std::string& node, const Status& called) {
  const bool out_of_reach =
      called.code() == StatusCode::kUnavailable || called.code() == StatusCode::kDeadlineExceeded;
  return Status(out_of_reach ? StatusCode::kFailedPrecondition : called.code(),
                "node " + node + ": " + OnOneLine(called.message(), kQuotedLineBytes));
}

std::string DevicesJson(const std::vector<v1::Device>& devices) {
  nlohmann::json json = nlohmann::json::array();
  for (const v1::Device& device : devices) {
    json.push_back({{"type", device.type()},
                    {"index", device.index()},
                    {"name", device.name()},
                    {"memory_bytes", device.memory_bytes()}});
  }
  return json.dump();
}

void AgentLinks::CheckNodes(const std::vector<store::NodeRecord>& nodes, store::Time now,
                            MonotonicTime monotonic_now) {
  ReclaimChecks();
  {
    // Links of removed nodes. Every Link* is used on the round thread (this one) or looked up
    // under the mutex, so erasing is safe; one whose check is under way is kept until it ends.
    std::set<std::string> listed;
    for (const store::NodeRecord& node : nodes) listed.insert(node.name);
    MutexLock lock(core_.mutex);
    for (auto link = links_.begin(); link != links_.end();) {
      if (listed.contains(link->first)) {
        ++link;
        continue;
      }
      link->second->removed = true;
      retired_.push_back(std::move(link->second));
      link = links_.erase(link);
    }
  }
  struct Due {
    Link* link;
    bool failing;  // its last check failed
  };
  std::vector<Due> due;
  for (const store::NodeRecord& node : nodes) {
    if (node.address.empty()) continue;  // registered before its address is known
    Link* link = EnsureLink(node, monotonic_now);
    MutexLock lock(core_.mutex);
    if (monotonic_now >= link->next_health_at && !link->checking) {
      link->checking = true;
      due.push_back({link, link->health_backoff.count() > 0});
    }
  }
  // Each check may wait its call's deadline on an agent that accepted the connection and never
  // answers, or on a node that went down: the checks run side by side, and the round waits for
  // a node whose last check failed only failing_check_wait, so that such nodes hold the round
  // (placement, reconciling, the lease-end stops) that long at most, not one deadline each round.
  // Each touches only its own link outside the core's mutex.
  for (size_t first = 0; first < due.size(); first += kHealthChecksPerBatch) {
    const size_t end = std::min(due.size(), first + kHealthChecksPerBatch);
    for (size_t i = first; i < end; ++i) StartCheck(*due[i].link, now, monotonic_now);
    const auto give_up = std::chrono::steady_clock::now() + core_.options.failing_check_wait;
    MutexLock lock(core_.mutex);
    while (true) {
      bool awaited = false;
      bool failing = false;
      for (size_t i = first; i < end; ++i) {
        if (due[i].link->checking) (due[i].failing ? failing : awaited) = true;
      }
      if (awaited) {
        checked_.Wait(core_.mutex);
      } else if (!failing || !checked_.WaitUntil(core_.mutex, give_up)) {
        break;
      }
    }
  }
}

void AgentLinks::StartCheck(Link& link, store::Time now, MonotonicTime monotonic_now) {
  // Ended: it has at most its last lock of the mutex and a wake of the round to finish.
  if (link.check.joinable()) link.check.join();
  link.check = std::thread([this, &link, now, monotonic_now] {
    bool was_connected = false;
    {
      MutexLock lock(core_.mutex);
      was_connected = link.connected;
    }
    CheckHealth(link, now, monotonic_now);
    bool reconnected = false;
    {
      MutexLock lock(core_.mutex);
      link.checking = false;
      reconnected = !was_connected && link.connected;
    }
    checked_.NotifyAll();
    // A round that went on without this check places trials on the node now.
    if (reconnected) core_.Wake();
  });
}

void AgentLinks::ReclaimChecks() {
  std::vector<std::thread> ended;
  std::vector<std::unique_ptr<Link>> freed;
  {
    MutexLock lock(core_.mutex);
    for (auto& [name, link] : links_) {
      if (!link->checking && link->check.joinable()) ended.push_back(std::move(link->check));
    }
    for (auto link = retired_.begin(); link != retired_.end();) {
      if ((*link)->checking) {
        ++link;
        continue;
      }
      freed.push_back(std::move(*link));
      link = retired_.erase(link);
    }
  }
  // Outside the lock: an ended check may still be waking the round, which takes the mutex.
  for (std::thread& thread : ended) thread.join();
  for (const std::unique_ptr<Link>& link : freed) {
    if (link->check.joinable()) link->check.join();
  }
}

void AgentLinks::Stop() {
  std::vector<Link*> links;
  {
    MutexLock lock(core_.mutex);
    for (const auto& [name, link] : links_) links.push_back(link.get());
    for (const std::unique_ptr<Link>& link : retired_) links.push_back(link.get());
    for (Link* link : links) {
      if (link->check_context != nullptr) link->check_context->TryCancel();
    }
  }
  for (Link* link : links) {
    if (link->check.joinable()) link->check.join();
  }
}

AgentLinks::Link* AgentLinks::EnsureLink(const store::NodeRecord& node, MonotonicTime now) {
  MutexLock lock(core_.mutex);
  std::unique_ptr<Link>& link = links_[node.name];
  // A removed node registered again before a round erased its old link starts afresh, as does a
  // node at another address while a check of the old one is under way (whose answer is dropped).
  if (link == nullptr || link->removed || (link->address != node.address && link->checking)) {
    // A new link goes on counting its node's silence from where the link it replaces had it.
    const MonotonicTime heard_at = link == nullptr ? now : link->heard_at;
    if (link != nullptr) {
      link->removed = true;
      retired_.push_back(std::move(link));
    }
    link = std::make_unique<Link>();
    link->name = node.name;
    link->address = node.address;
    link->last_seen = node.last_seen;
    link->heard_at = heard_at;
    link->next_health_at = now;
  } else if (link->address != node.address) {
    // Re-registered at another address: dial anew.
    link->stub = nullptr;
    link->address = node.address;
    link->connected = false;
    link->next_health_at = now;
  }
  return link.get();
}

// Another process's description: a node whose description is refused has no devices here and
// runs nothing, and its message is this short one, not its fields (which every waiting trial's
// notice would repeat).
void AgentLinks::ApplyNodeInfo(Link& link, const v1::NodeInfo& info, store::Time now,
                               bool rates_asked_since) {
  if (const Status described = CheckNodeInfo(info); !described.ok()) {
    link.devices.clear();
    const std::string refused =
        "node " + link.name + ": its description is refused: " + described.message();
    if (refused != link.unusable) spdlog::error("{}; no trial is placed there", refused);
    link.unusable = refused;
    return;
  }
  link.devices.assign(info.devices().begin(), info.devices().end());
  Status runs = CheckAgentVersion(link.name, info.llmctl_version());
  if (runs.ok() && !info.unusable().empty()) {
    runs = FailedPreconditionError("node " + link.name + ": " + info.unusable());
  }
  if (runs.ok()) {
    runs = CheckDriverRunsLibTorch(
        {.node = link.name,
         .gpus = static_cast<int>(
             std::count_if(link.devices.begin(), link.devices.end(),
                           [](const v1::Device& device) { return device.type() == "cuda"; })),
         .driver = info.nvidia_driver_version(),
         .driver_cuda = info.driver_cuda_version(),
         .libtorch = info.libtorch_version(),
         .libtorch_cuda = info.libtorch_cuda_version()});
  }
  // Logged once per change, like connecting: the node is checked every health interval.
  if (runs.message() != link.unusable) {
    if (runs.ok()) {
      spdlog::info("node {}: usable again", link.name);
    } else {
      spdlog::error("{}; no trial is placed there", runs.message());
    }
  }
  link.unusable = runs.ok() ? "" : runs.message();
  if (!rates_asked_since) {
    NoteRatesPending(link, info.rate_probe_pending(), info.rate_probe_underway());
  }
  StoreNodeRates(core_.store, link.name, info.rate_probe_json(), link.rate_probe_json, now);
}

void AgentLinks::CheckHealth(Link& link, store::Time now, MonotonicTime monotonic_now) {
  const Dialled dialled = StubFor(link);
  const HealthAnswer answer = AskHealth(link, dialled, now, monotonic_now);
  MutexLock lock(core_.mutex);
  // Disconnect ran meanwhile: keep its link disconnected. Stop cut the check short: it says
  // nothing of the node.
  if (link.removed || core_.stopping) return;
  UpdateLink(link, dialled, answer, now, monotonic_now);
  StoreLinkState(link, answer);
}

AgentLinks::Dialled AgentLinks::StubFor(Link& link) {
  {
    MutexLock lock(core_.mutex);
    if (link.stub != nullptr) return {link.stub, link.certificate_name};
  }
  store::NodeRecord node;
  node.name = link.name;
  node.address = link.address;
  auto channel = connect_(node);
  const std::string failure = channel.ok() ? "" : channel.status().ToString();
  {
    MutexLock lock(core_.mutex);
    if (!failure.empty() && failure != link.cannot_connect) {
      spdlog::warn("node {}: cannot connect: {}", link.name, failure);
    }
    link.cannot_connect = failure;
  }
  if (!channel.ok()) return {};
  return {v1::Agent::NewStub(channel->channel), std::move(channel->certificate_name)};
}

AgentLinks::HealthAnswer AgentLinks::AskHealth(Link& link, const Dialled& dialled, store::Time now,
                                               MonotonicTime monotonic_now) {
  v1::Agent::Stub* stub = dialled.stub.get();
  HealthAnswer answer;
  NodeCertificates* certificates = core_.options.certificates;
  // An expired certificate is reported, not dialled: the handshake would fail on every check.
  answer.unexpired =
      certificates == nullptr ? Status::Ok() : certificates->CheckUnexpired(link.name, now);
  if (!answer.unexpired.ok()) {
    answer.health = answer.unexpired;
    return answer;
  }
  if (stub == nullptr) {
    answer.health = UnavailableError("no channel");
    return answer;
  }
  auto context = core_.CallContext();
  {
    MutexLock lock(core_.mutex);
    // Stop may have cancelled the checks before this one published its context.
    if (core_.stopping) {
      answer.health = CancelledError("the controller is stopping");
      return answer;
    }
    link.check_context = context.get();
    answer.rates_asks = link.rates_asks;
  }
  answer.health = rpc::FromGrpcStatus(stub->GetNodeInfo(context.get(), {}, &answer.info));
  {
    MutexLock lock(core_.mutex);
    link.check_context = nullptr;
  }
  if (answer.health.ok() && certificates != nullptr) {
    // On the link just checked, under the registration it was dialled for (it is refused when the
    // node was registered again since): a failure is logged and tried again at the next check,
    // while half the certificate's lifetime is left for it.
    if (Status renewed = certificates->RenewIfDue(link.name, dialled.certificate_name, *stub, now,
                                                  monotonic_now, core_.options.call_deadline);
        !renewed.ok()) {
      spdlog::warn("{}", renewed.ToString());
    }
  }
  return answer;
}

void AgentLinks::UpdateLink(Link& link, const Dialled& dialled, const HealthAnswer& answer,
                            store::Time now, MonotonicTime monotonic_now) {
  const DispatcherOptions& options = core_.options;
  const bool healthy = answer.health.ok();
  link.health_backoff =
      healthy ? std::chrono::milliseconds(0)
              : NextBackoff(link.health_backoff,
                            std::min(options.backoff_initial, options.health_interval),
                            options.health_interval);
  link.next_health_at = monotonic_now + (healthy ? options.health_interval : link.health_backoff);
  // After a failure the next check dials a fresh channel, so the controller's schedule decides
  // when to try again, not gRPC's growing reconnect backoff: an agent that restarts is seen at the
  // next health check.
  link.stub = healthy ? dialled.stub : nullptr;
  link.certificate_name = healthy ? dialled.certificate_name : "";
  if (healthy) {
    if (!link.connected) {
      spdlog::info("node {}: connected ({})", link.name, link.address);
      link.needs_reconcile = true;
    }
    link.connected = true;
    link.has_connected = true;
    link.last_seen = now;
    link.heard_at = monotonic_now;
    ApplyNodeInfo(link, answer.info, now,
                  /*rates_asked_since=*/link.rates_asks != answer.rates_asks);
    return;
  }
  if (link.connected) spdlog::warn("node {}: unreachable: {}", link.name, answer.health.ToString());
  // Logged once, as the reason stays until the node is registered again.
  if (!answer.unexpired.ok() && link.unusable != answer.unexpired.message()) {
    spdlog::error("{}", answer.unexpired.message());
    link.unusable = answer.unexpired.message();
  }
  link.connected = false;
}

void AgentLinks::StoreLinkState(const Link& link, const HealthAnswer& answer) {
  store::NodeRecord record;
  record.name = link.name;
  record.address = link.address;
  record.devices_json = DevicesJson(link.devices);
  record.last_seen = link.last_seen;
  record.state = !answer.unexpired.ok()  ? "expired"
                 : !link.connected       ? "unreachable"
                 : link.unusable.empty() ? "connected"
                                         : "unusable";
  if (Status stored = core_.store.RecordNodeHealth(record); !stored.ok()) {
    spdlog::error("node {}: cannot store its state: {}", link.name, stored.ToString());
  }
}

std::vector<AttemptKey> AgentLinks::ForgottenRuns(
    const std::vector<store::RunningAttempt>& running) {
  std::vector<Link*> links;
  {
    MutexLock lock(core_.mutex);
    for (auto& [name, link] : links_) links.push_back(link.get());
  }
  std::vector<AttemptKey> forgotten;
  for (Link* link : links) Reconcile(*link, running, forgotten);
  return forgotten;
}

void AgentLinks::Reconcile(Link& link, const std::vector<store::RunningAttempt>& running,
                           std::vector<AttemptKey>& forgotten) {
  std::shared_ptr<v1::Agent::Stub> stub;
  {
    MutexLock lock(core_.mutex);
    if (!link.connected || !link.needs_reconcile) return;
    stub = link.stub;
  }
  auto context = core_.CallContext();
  v1::ListRunsResponse runs;
  grpc::Status listed = stub->ListRuns(context.get(), {}, &runs);
  if (!listed.ok()) {
    spdlog::warn("node {}: ListRuns failed: {}", link.name, listed.error_message());
    return;
  }
  std::set<std::tuple<int64_t, std::string, int64_t>> known;
  for (const v1::RunState& run : runs.runs()) {
    known.emplace(run.key().experiment_id(), run.key().trial(), run.key().attempt());
  }
  for (const store::RunningAttempt& attempt : running) {
    if (!attempt.RunsOn(link.name)) continue;
    auto trial = core_.store.GetTrial(attempt.trial_id);
    if (!trial.ok()) continue;
    if (known.contains({attempt.experiment_id, trial->name, attempt.attempt})) continue;
    spdlog::warn("node {}: has no run for {} of experiment {}; requeueing it", link.name,
                 AttemptName(attempt), attempt.experiment_id);
    forgotten.emplace_back(attempt.trial_id, attempt.attempt);
  }
  MutexLock lock(core_.mutex);
  link.needs_reconcile = false;
}

std::vector<AttemptKey> AgentLinks::SilentRuns(const std::vector<store::RunningAttempt>& running,
                                               MonotonicTime now) {
  std::vector<scheduler::RunningAttempt> attempts;
  {
    MutexLock lock(core_.mutex);
    std::map<AttemptKey, MonotonicTime> running_since;
    for (const store::RunningAttempt& attempt : running) {
      // Silent at most since the round that launched it, not since its started_at: that is a
      // wall-clock date, which a step of the clock moves, and for an attempt started before the
      // controller (re)started it would count the time the controller was down, when it heard
      // nothing from anyone, as the agent's silence. One not running at the previous round was
      // launched in it (placement follows this in a round), or, at the first round, before the
      // controller started: then its agent has requeue_after from the controller's start.
      const AttemptKey key{attempt.trial_id, attempt.attempt};
      auto seen = running_since_.find(key);
      const MonotonicTime since =
          seen != running_since_.end() ? seen->second : previous_round_.value_or(now);
      running_since.emplace(key, since);
      // A multi-node attempt is lost when any of its nodes is silent: its ranks cannot go on
      // without that node's.
      for (const store::AttemptNode& run : attempt.Runs()) {
        auto link = links_.find(run.node);
        attempts.push_back({.trial_id = attempt.trial_id,
                            .attempt = attempt.attempt,
                            .agent = run.node,
                            .agent_last_seen = link == links_.end()
                                                   ? since
                                                   : std::max(link->second->heard_at, since)});
      }
    }
    running_since_ = std::move(running_since);
    previous_round_ = now;
  }
  const scheduler::LostAgentDecision decision =
      scheduler::DecideLostAttempts(attempts, now, core_.options.requeue_after);
  std::vector<AttemptKey> silent;
  for (const scheduler::RunningAttempt& attempt : decision.requeue) {
    if (std::find(silent.begin(), silent.end(), AttemptKey{attempt.trial_id, attempt.attempt}) !=
        silent.end()) {
      continue;  // another of its nodes is silent too
    }
    spdlog::warn(
        "node {} silent for {} s: trial {} attempt {} is lost and requeued", attempt.agent,
        std::chrono::duration_cast<std::chrono::seconds>(now - attempt.agent_last_seen).count(),
        attempt.trial_id, attempt.attempt);
    silent.emplace_back(attempt.trial_id, attempt.attempt);
  }
  return silent;
}

std::shared_ptr<v1::Agent::Stub> AgentLinks::Stub(const std::string& node) {
  MutexLock lock(core_.mutex);
  const Link* link = FindLocked(node);
  return link == nullptr ? nullptr : link->stub;
}

std::string AgentLinks::Unusable(const std::string& node) {
  MutexLock lock(core_.mutex);
  const Link* link = FindLocked(node);
  return link == nullptr || !link->connected ? "" : link->unusable;
}

RatesNote AgentLinks::RatesPending(const std::string& node) {
  MutexLock lock(core_.mutex);
  const Link* link = FindLocked(node);
  if (link == nullptr || !link->connected) return {};
  return {link->rate_probe_pending, link->rate_probe_underway};
}

StatusOr<std::string> AgentLinks::MeasureRates(const std::string& node) {
  const std::shared_ptr<v1::Agent::Stub> stub = Stub(node);
  if (stub == nullptr) return NodeNotConnected(node);
  const std::unique_ptr<grpc::ClientContext> context = core_.CallContext();
  v1::MeasureRatesResponse answer;
  if (const Status called = rpc::FromGrpcStatus(stub->MeasureRates(context.get(), {}, &answer));
      !called.ok()) {
    return AgentCallFailed(node, called);
  }
  if (const Status checked = CheckMeasureRatesAnswer(answer); !checked.ok()) {
    return DataLossError("node " + node + ": its answer is refused: " + checked.message());
  }
  spdlog::info("node {}: measures its rates again ({})", node, answer.pending());
  MutexLock lock(core_.mutex);
  if (Link* link = FindLocked(node); link != nullptr && link->connected) {
    // The agent measures or waits to measure now, whatever a health check in flight read before.
    NoteRatesPending(*link, answer.pending(), /*underway=*/true);
    ++link->rates_asks;
  }
  return answer.pending();
}

void AgentLinks::Disconnect(const std::string& node) {
  MutexLock lock(core_.mutex);
  if (Link* link = FindLocked(node); link != nullptr) {
    link->removed = true;
    link->connected = false;
    link->stub = nullptr;
    link->certificate_name.clear();
  }
}

AgentLinks::Link* AgentLinks::FindLocked(const std::string& node) {
  auto link = links_.find(node);
  return link == links_.end() ? nullptr : link->second.get();
}

void AgentLinks::CollectWakeTimesLocked(std::vector<MonotonicTime>& times) const {
  for (const auto& [name, link] : links_) times.push_back(link->next_health_at);
}

}  // namespace dispatch
}  // namespace llmctl::controller
