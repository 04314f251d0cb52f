#include "controller/dispatcher.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <nlohmann/json.hpp>
#include <set>

#include "common/cuda_version.h"
#include "common/digest/digest.h"
#include "common/trial_config.h"
#include "controller/device_samples.h"
#include "controller/scheduler/scheduler.h"
#include "controller/submission.h"
#include "rpc/status.h"

namespace llmctl::controller {

struct Dispatcher::Link {
  std::string name;
  std::string address;
  // Shared with the stream readers and calls in flight, which may outlive a redial. Replaced by
  // the round thread only, under mutex_; null until dialled and after a failed health check.
  std::shared_ptr<v1::Agent::Stub> stub;
  // Guarded by Dispatcher::mutex_:
  bool connected = false;
  bool needs_reconcile = true;  // ListRuns after each (re)connect
  bool removed = false;         // RemoveNode: never dialled again; the next round erases it
  store::Time last_seen;
  store::Time next_health_at;
  // After a failed check the next comes sooner than health_interval: backoff_initial, doubling up
  // to health_interval, so that an agent that is just starting (the embedded one is started right
  // after it is registered) is seen within a second. 0 after a successful check.
  std::chrono::milliseconds health_backoff{0};
  std::vector<v1::Device> devices;
  // Why the connected node takes no trial (CheckDriverRunsLibTorch's message); "" when it may.
  std::string unusable;
};

struct Dispatcher::Stream {
  store::RunningAttempt attempt;
  std::string trial_name;
  std::thread thread;
  std::shared_ptr<v1::Agent::Stub> stub;  // the reader's own reference
  // Guarded by Dispatcher::mutex_:
  grpc::ClientContext* context = nullptr;  // while the reader is in a call
  bool stop = false;
  bool done = true;      // no reader running
  bool settled = false;  // ended and finished, or fenced off: never reopened
  store::Time retry_at;
  std::chrono::milliseconds backoff{0};
  // The worker's `result` event once it came; used only by the reader thread (one at a time).
  std::string result_json;
};

struct Dispatcher::HubPreparation {
  std::string node;
  std::string model;  // "hf:ORG/NAME@REV"
  std::thread thread;
  // Guarded by Dispatcher::mutex_:
  enum class State { kIdle, kRunning, kReady, kFailed } state = State::kIdle;
  Status failure;                 // kFailed: why preparing cannot succeed
  std::set<int64_t> experiments;  // whose trials waited for this preparation
  store::Time retry_at;           // kIdle after a failure that retrying may cure
  std::chrono::milliseconds backoff{0};
  grpc::ClientContext* context = nullptr;  // while PrepareHubModel is in flight
};

AgentConnector TlsAgentConnector(rpc::TlsIdentity identity, const SecretsFile& secrets) {
  return [identity = std::move(identity),
          &secrets](const store::NodeRecord& node) -> StatusOr<std::shared_ptr<grpc::Channel>> {
    ASSIGN_OR_RETURN(std::string token, secrets.NodeToken(node.name));
    return rpc::Dial(node.address, rpc::AgentCertificateName(node.name),
                     rpc::ChannelCredentials(identity, token));
  };
}

namespace {

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

std::string AttemptName(const store::RunningAttempt& attempt) {
  return "trial " + std::to_string(attempt.trial_id) + " attempt " +
         std::to_string(attempt.attempt);
}

// How the agent's outcome word maps to a trial state; `invalid` (the trainer refused its config)
// and anything unknown end the trial as failed.
store::TrialState OutcomeState(const std::string& outcome) {
  auto state = store::ParseTrialState(outcome);
  if (state.ok() && store::IsOutcome(*state)) return *state;
  return store::TrialState::kFailed;
}

// Codes with which PrepareHubModel cannot succeed however often it is retried.
bool IsPermanentPrepareFailure(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::DATA_LOSS:
    case grpc::StatusCode::INVALID_ARGUMENT:
      return true;
    default:
      return false;
  }
}

// What a run stopped with a checkpoint kept, from the worker's `result` event (empty when none
// came): the checkpoint of its last complete step (written, or the one it resumed from), or why
// there is none.
std::string DescribeStopCheckpoint(const std::string& result_json, int64_t experiment_id,
                                   const std::string& trial_name) {
  const nlohmann::json result =
      nlohmann::json::parse(result_json, nullptr, /*allow_exceptions=*/false);
  if (!result.is_object()) {
    return "no checkpoint: the worker ended without a result (killed when its grace ran out?)";
  }
  const auto checkpoint = result.find("checkpoint");
  if (checkpoint != result.end() && checkpoint->is_object() &&
      checkpoint->value("step", nlohmann::json()).is_number_integer() &&
      checkpoint->value("path", nlohmann::json()).is_string()) {
    // The event counts steps from 0; "after step N" and the directory step-N count completed ones.
    const std::string trial = std::to_string(experiment_id) + " '" + trial_name + "'";
    return "checkpoint after step " + std::to_string((*checkpoint)["step"].get<int64_t>() + 1) +
           " in " + (*checkpoint)["path"].get<std::string>() + " on the node (llmctl resume " +
           trial + " continues from it there; llmctl fetch " + trial +
           " copies the run's output while the node is up)";
  }
  const std::string error =
      result.value("error", nlohmann::json()).is_string() ? result["error"].get<std::string>() : "";
  return "no checkpoint" + (error.empty() ? std::string() : " (" + error + ")");
}

std::string FormatUtc(store::Time time) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(time);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%d %H:%M UTC", &tm);
  return buffer;
}

v1::InputTree ToProto(const digest::InputTree& tree) {
  v1::InputTree proto;
  proto.set_digest(tree.digest);
  proto.set_is_file(tree.is_file);
  for (const digest::TreeFile& file : tree.files) {
    v1::TreeFile* entry = proto.add_files();
    entry->set_path(file.path);
    entry->set_sha256(file.sha256);
    entry->set_size(file.size);
  }
  return proto;
}

}  // namespace

Dispatcher::Dispatcher(store::Store& store, const BlobStore& blobs, AgentConnector connect,
                       const Clock& clock, ChangeNotifier& changes, DispatcherOptions options)
    : store_(store),
      blobs_(blobs),
      connect_(std::move(connect)),
      clock_(clock),
      changes_(changes),
      options_(options) {}

Dispatcher::~Dispatcher() { Stop(); }

void Dispatcher::Start() {
  thread_ = std::thread([this] {
    while (true) {
      Tick();
      std::unique_lock lock(mutex_);
      wake_.wait_for(lock, UntilNextRound(), [&] { return stopping_ || wake_requested_; });
      if (stopping_) return;
      wake_requested_ = false;
    }
  });
}

std::chrono::milliseconds Dispatcher::UntilNextRound() const {
  const store::Time now = clock_.Now();
  store::Time next = now + options_.health_interval;
  // Only times still ahead: one already past (a node no longer listed) would make rounds spin.
  auto sooner = [&](store::Time at) {
    if (at > now && at < next) next = at;
  };
  for (const auto& [name, link] : links_) sooner(link->next_health_at);
  for (const auto& [key, stream] : streams_) {
    if (stream->done && !stream->settled) sooner(stream->retry_at);
  }
  return std::chrono::ceil<std::chrono::milliseconds>(next - now);
}

void Dispatcher::Stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::vector<AttemptKey> keys;
  std::vector<HubPreparation*> preparations;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [key, stream] : streams_) keys.push_back(key);
    for (const auto& [key, preparation] : hub_models_) {
      if (preparation->context != nullptr) preparation->context->TryCancel();
      preparations.push_back(preparation.get());
    }
  }
  for (const AttemptKey& key : keys) StopStream(key);
  for (HubPreparation* preparation : preparations) {
    if (preparation->thread.joinable()) preparation->thread.join();
  }
  // The stream readers that start copies have stopped, so no copy starts from here on; the running
  // ones see stopping_ at their next chunk.
  std::map<AttemptKey, std::pair<std::thread, bool>> copies;
  {
    std::lock_guard lock(mutex_);
    copies.swap(checkpoint_copies_);
  }
  for (auto& [key, copy] : copies) {
    if (copy.first.joinable()) copy.first.join();
  }
}

int Dispatcher::CheckpointCopiesInFlight() {
  std::lock_guard lock(mutex_);
  return static_cast<int>(std::count_if(checkpoint_copies_.begin(), checkpoint_copies_.end(),
                                        [](const auto& entry) { return !entry.second.second; }));
}

int Dispatcher::HubPreparationsInFlight() {
  std::lock_guard lock(mutex_);
  return static_cast<int>(std::count_if(hub_models_.begin(), hub_models_.end(), [](const auto& e) {
    return e.second->state == HubPreparation::State::kRunning;
  }));
}

std::string Dispatcher::NodeNotice(const std::string& node) {
  std::lock_guard lock(mutex_);
  auto notice = node_notices_.find(node);
  return notice == node_notices_.end() ? "" : notice->second;
}

std::string Dispatcher::NodeUnusable(const std::string& node) {
  std::lock_guard lock(mutex_);
  auto link = links_.find(node);
  return link == links_.end() || !link->second->connected ? "" : link->second->unusable;
}

std::string Dispatcher::QueuedNotice(int64_t trial_id) {
  std::lock_guard lock(mutex_);
  auto notice = queued_notices_.find(trial_id);
  return notice == queued_notices_.end() ? "" : notice->second;
}

void Dispatcher::Wake() {
  {
    std::lock_guard lock(mutex_);
    wake_requested_ = true;
  }
  wake_.notify_all();
}

int Dispatcher::ActiveStreams() {
  std::lock_guard lock(mutex_);
  return static_cast<int>(std::count_if(streams_.begin(), streams_.end(),
                                        [](const auto& entry) { return !entry.second->done; }));
}

std::unique_ptr<grpc::ClientContext> Dispatcher::CallContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + options_.call_deadline);
  return context;
}

void Dispatcher::Tick() {
  std::lock_guard tick(tick_mutex_);
  const store::Time now = clock_.Now();
  auto nodes = store_.ListNodes();
  if (!nodes.ok()) {
    spdlog::error("dispatcher: cannot list nodes: {}", nodes.status().ToString());
    return;
  }
  {
    // Links of removed nodes. Every Link* is used under tick_mutex_ (held here) or looked up
    // under mutex_, so erasing is safe.
    std::set<std::string> listed;
    for (const store::NodeRecord& node : *nodes) listed.insert(node.name);
    std::lock_guard lock(mutex_);
    std::erase_if(links_, [&](const auto& entry) { return !listed.contains(entry.first); });
  }
  for (const store::NodeRecord& node : *nodes) {
    if (node.address.empty()) continue;  // registered before its address is known
    Link* link = EnsureLink(node, now);
    bool due;
    {
      std::lock_guard lock(mutex_);
      due = now >= link->next_health_at;
    }
    if (due) CheckHealth(*link, now);
  }

  auto running = store_.ListRunningAttempts();
  if (!running.ok()) {
    spdlog::error("dispatcher: cannot list running attempts: {}", running.status().ToString());
    return;
  }
  std::vector<Link*> links;
  {
    std::lock_guard lock(mutex_);
    for (auto& [name, link] : links_) links.push_back(link.get());
  }
  for (Link* link : links) ReconcileRuns(*link, *running, now);
  RequeueLost(*running, now);
  running = store_.ListRunningAttempts();
  if (running.ok()) WatchLeases(*nodes, *running, now);

  running = store_.ListRunningAttempts();
  if (running.ok()) PlaceQueued(*running, now);
  running = store_.ListRunningAttempts();
  if (running.ok()) FollowRunning(*running, now);
}

Dispatcher::Link* Dispatcher::EnsureLink(const store::NodeRecord& node, store::Time now) {
  std::lock_guard lock(mutex_);
  std::unique_ptr<Link>& link = links_[node.name];
  // A removed node registered again before a round erased its old link starts afresh.
  if (link == nullptr || link->removed) {
    link = std::make_unique<Link>();
    link->name = node.name;
    link->address = node.address;
    link->last_seen = node.last_seen;
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

void Dispatcher::CheckHealth(Link& link, store::Time now) {
  store::NodeRecord record;
  record.name = link.name;
  record.address = link.address;
  std::shared_ptr<v1::Agent::Stub> stub;
  {
    std::lock_guard lock(mutex_);
    stub = link.stub;
  }
  if (stub == nullptr) {
    auto channel = connect_(record);
    if (channel.ok()) {
      stub = v1::Agent::NewStub(*channel);
    } else {
      spdlog::warn("node {}: cannot connect: {}", link.name, channel.status().ToString());
    }
  }
  Status health = UnavailableError("no channel");
  v1::NodeInfo info;
  if (stub != nullptr) {
    auto context = CallContext();
    health = rpc::FromGrpcStatus(stub->GetNodeInfo(context.get(), {}, &info));
  }
  std::lock_guard lock(mutex_);
  if (link.removed) return;  // RemoveNode ran meanwhile: keep its link disconnected
  link.health_backoff = health.ok() ? std::chrono::milliseconds(0)
                        : link.health_backoff.count() == 0
                            ? std::min(options_.backoff_initial, options_.health_interval)
                            : std::min(link.health_backoff * 2, options_.health_interval);
  link.next_health_at = now + (health.ok() ? options_.health_interval : link.health_backoff);
  // After a failure the next check dials a fresh channel, so the controller's schedule decides
  // when to try again, not gRPC's growing reconnect backoff: an agent that restarts is seen at the
  // next health check.
  link.stub = health.ok() ? stub : nullptr;
  if (health.ok()) {
    if (!link.connected) {
      spdlog::info("node {}: connected ({})", link.name, link.address);
      link.needs_reconcile = true;
    }
    link.connected = true;
    link.last_seen = now;
    link.devices.assign(info.devices().begin(), info.devices().end());
    const Status runs = CheckDriverRunsLibTorch(
        {.node = link.name,
         .gpus = static_cast<int>(
             std::count_if(link.devices.begin(), link.devices.end(),
                           [](const v1::Device& device) { return device.type() == "cuda"; })),
         .driver = info.nvidia_driver_version(),
         .driver_cuda = info.driver_cuda_version(),
         .libtorch = info.libtorch_version(),
         .libtorch_cuda = info.libtorch_cuda_version()});
    // Logged once per change, like connecting: the node is checked every health interval.
    if (runs.message() != link.unusable) {
      if (runs.ok()) {
        spdlog::info("node {}: usable again", link.name);
      } else {
        spdlog::error("{}; no trial is placed there", runs.message());
      }
    }
    link.unusable = runs.ok() ? "" : runs.message();
  } else {
    if (link.connected) spdlog::warn("node {}: unreachable: {}", link.name, health.ToString());
    link.connected = false;
  }
  record.devices_json = DevicesJson(link.devices);
  record.last_seen = link.last_seen;
  record.state = !link.connected ? "unreachable" : link.unusable.empty() ? "connected" : "unusable";
  if (Status stored = store_.UpsertNode(record); !stored.ok()) {
    spdlog::error("node {}: cannot store its state: {}", link.name, stored.ToString());
  }
}

void Dispatcher::ReconcileRuns(Link& link, const std::vector<store::RunningAttempt>& running,
                               store::Time now) {
  std::shared_ptr<v1::Agent::Stub> stub;
  {
    std::lock_guard lock(mutex_);
    if (!link.connected || !link.needs_reconcile) return;
    stub = link.stub;
  }
  auto context = CallContext();
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
    if (attempt.node != link.name) continue;
    auto trial = store_.GetTrial(attempt.trial_id);
    if (!trial.ok()) continue;
    if (known.contains({attempt.experiment_id, trial->name, attempt.attempt})) continue;
    // The agent came back without this run (its node was rebuilt, or its state lost): waiting
    // longer cannot bring it back.
    spdlog::warn("node {}: has no run for {} of experiment {}; requeueing it", link.name,
                 AttemptName(attempt), attempt.experiment_id);
    StopStream({attempt.trial_id, attempt.attempt});
    if (Status lost = store_.MarkAttemptLost(attempt.trial_id, attempt.attempt, now); !lost.ok()) {
      spdlog::warn("{}: {}", AttemptName(attempt), lost.ToString());
    }
    changes_.Notify();
  }
  std::lock_guard lock(mutex_);
  link.needs_reconcile = false;
}

void Dispatcher::RequeueLost(const std::vector<store::RunningAttempt>& running, store::Time now) {
  std::vector<scheduler::RunningAttempt> attempts;
  {
    std::lock_guard lock(mutex_);
    for (const store::RunningAttempt& attempt : running) {
      auto link = links_.find(attempt.node);
      const store::Time last_seen = link == links_.end()
                                        ? attempt.started_at
                                        : std::max(link->second->last_seen, attempt.started_at);
      attempts.push_back({.trial_id = attempt.trial_id,
                          .attempt = attempt.attempt,
                          .agent = attempt.node,
                          .agent_last_seen = last_seen});
    }
  }
  const scheduler::LostAgentDecision decision =
      scheduler::DecideLostAttempts(attempts, now, options_.requeue_after);
  for (const scheduler::RunningAttempt& attempt : decision.requeue) {
    spdlog::warn(
        "node {} silent for {} s: trial {} attempt {} is lost and requeued", attempt.agent,
        std::chrono::duration_cast<std::chrono::seconds>(now - attempt.agent_last_seen).count(),
        attempt.trial_id, attempt.attempt);
    StopStream({attempt.trial_id, attempt.attempt});
    if (Status lost = store_.MarkAttemptLost(attempt.trial_id, attempt.attempt, now); !lost.ok()) {
      spdlog::warn("trial {} attempt {}: {}", attempt.trial_id, attempt.attempt, lost.ToString());
    }
    changes_.Notify();
  }
}

void Dispatcher::PlaceQueued(const std::vector<store::RunningAttempt>& running, store::Time now) {
  auto queued = store_.NextQueuedTrials();
  if (!queued.ok()) {
    spdlog::error("dispatcher: cannot list queued trials: {}", queued.status().ToString());
    return;
  }
  if (queued->empty()) {
    std::lock_guard lock(mutex_);
    queued_notices_.clear();
    return;
  }

  // Which devices the running attempts hold, as the store recorded them when they started, so a
  // restarted controller sees the same occupancy. Attempts stored without indices (started before
  // the store kept them) are then taken to hold the lowest indices still free.
  std::map<std::string, std::vector<const store::RunningAttempt*>> running_on;
  for (const store::RunningAttempt& attempt : running) running_on[attempt.node].push_back(&attempt);
  // A node's labels are its lease's site and flavor; an experiment's `target:` must match them.
  std::map<std::string, std::map<std::string, std::string>> labels;
  std::set<std::string> registered;  // not removed
  if (auto nodes = store_.ListNodes(); nodes.ok()) {
    for (const store::NodeRecord& node : *nodes) {
      registered.insert(node.name);
      if (node.lease)
        labels[node.name] = {{"site", node.lease->site}, {"flavor", node.lease->flavor}};
    }
  }
  std::vector<scheduler::Agent> agents;
  std::map<std::string, Link*> connected;
  std::string unusable;  // why connected nodes take no trial, for the waiting trials' notices
  {
    std::lock_guard lock(mutex_);
    for (auto& [name, link] : links_) {
      if (link->connected && !link->unusable.empty()) unusable += "; " + link->unusable;
      // A node whose lease ends soon, or that cannot run llm-train, takes no new trial.
      if (!link->connected || !link->unusable.empty() || node_notices_.contains(name)) continue;
      connected[name] = link.get();
      scheduler::Agent& agent = agents.emplace_back();
      agent.name = name;
      agent.connected = true;
      agent.labels = labels[name];
      std::map<std::string, int64_t> counts;
      for (const v1::Device& device : link->devices) ++counts[device.type()];
      if (counts.empty()) counts["cpu"] = 1;
      for (const auto& [type, count] : counts)
        agent.pools.push_back({.type = type, .count = count, .busy = {}});
    }
  }
  for (scheduler::Agent& agent : agents) {
    std::vector<std::pair<scheduler::DevicePool*, int64_t>> unrecorded;  // (pool, device count)
    for (const store::RunningAttempt* attempt : running_on[agent.name]) {
      auto trial = store_.GetTrial(attempt->trial_id);
      if (!trial.ok()) continue;
      auto pool = std::find_if(
          agent.pools.begin(), agent.pools.end(),
          [&](const scheduler::DevicePool& p) { return p.type == trial->device_type; });
      if (pool == agent.pools.end()) continue;
      if (attempt->device_indices.empty()) {
        unrecorded.emplace_back(&*pool, trial->device_count);
      } else {
        pool->busy.insert(attempt->device_indices.begin(), attempt->device_indices.end());
      }
    }
    // After every recorded index, so a guess never lands on a device known to be busy.
    for (auto [pool, count] : unrecorded) {
      for (int64_t index = 0; index < pool->count && count > 0; ++index) {
        if (pool->busy.insert(index).second) --count;
      }
    }
  }

  std::vector<scheduler::QueuedTrial> queue;
  std::map<int64_t, const store::TrialRecord*> by_id;
  std::map<int64_t, std::map<std::string, std::string>> targets;  // by experiment
  for (const store::TrialRecord& trial : *queued) {
    if (!targets.contains(trial.experiment_id)) {
      // Only what a node's labels say (its lease's site and flavor) can be matched.
      std::map<std::string, std::string>& target = targets[trial.experiment_id];
      if (auto experiment = store_.GetExperiment(trial.experiment_id); experiment.ok()) {
        for (const char* key : {"site", "flavor"}) {
          if (auto value = experiment->target.find(key); value != experiment->target.end()) {
            target[key] = value->second;
          }
        }
      }
    }
    queue.push_back(
        {.trial_id = trial.id,
         .device_type = trial.device_type,
         .device_count = trial.device_count,
         .target = targets[trial.experiment_id],
         // Without the controller's copy of its checkpoint, only the node that
         // holds it can continue the trial.
         .only_agent = trial.resume && trial.resume->tree.empty() ? trial.resume->node : ""});
    by_id[trial.id] = &trial;
  }
  const scheduler::Placement placement = scheduler::PlaceTrials(queue, agents);
  // A trial that no connected node could ever run would otherwise wait without a word (say, an
  // experiment for GPUs submitted to the embedded CPU agent).
  std::map<int64_t, std::string> waiting;
  for (int64_t trial_id : placement.unsatisfiable) {
    const store::TrialRecord& trial = *by_id.at(trial_id);
    if (trial.resume && trial.resume->tree.empty()) {
      const std::string& node = trial.resume->node;
      const std::string from = "it resumes from a checkpoint on node " + node;
      waiting[trial_id] =
          !registered.contains(node)
              ? from + ", which has been removed: it cannot run (llmctl cancel " +
                    std::to_string(trial.experiment_id) + " --trial '" + trial.name + "')"
          : connected.contains(node)
              ? from + ", which has no " + std::to_string(trial.device_count) + " " +
                    trial.device_type + " device(s) now; it waits there"
              : from +
                    ", which is not connected or takes no new trials (its lease ends soon); "
                    "it waits for it (llmctl nodes)";
      continue;
    }
    std::string where = "no connected node";
    for (const auto& [name, value] : targets[trial.experiment_id]) {
      where += (where == "no connected node" ? " with " : ", ") + name + " " + value;
    }
    waiting[trial_id] =
        where + " has " + std::to_string(trial.device_count) + " " + trial.device_type +
        " device(s); the trial waits until one does (llmctl nodes, llmctl node up)" + unusable;
  }
  {
    std::lock_guard lock(mutex_);
    queued_notices_ = std::move(waiting);
  }
  for (const scheduler::Assignment& assignment : placement.assignments) {
    const store::TrialRecord& trial = *by_id.at(assignment.trial_id);
    Status launched =
        Launch(trial, *connected.at(assignment.agent), assignment.device_indices, now);
    if (!launched.ok()) {
      spdlog::warn("trial {} of experiment {} on node {}: {}", trial.name, trial.experiment_id,
                   assignment.agent, launched.ToString());
    }
  }
}

Status Dispatcher::Launch(const store::TrialRecord& trial, Link& link,
                          const std::vector<int64_t>& devices, store::Time now) {
  const int64_t attempt = trial.current_attempt + 1;
  std::shared_ptr<v1::Agent::Stub> stub;
  {
    std::lock_guard lock(mutex_);
    stub = link.stub;
  }
  if (stub == nullptr) return UnavailableError("node " + link.name + " is not connected");
  nlohmann::json config_json;
  try {
    config_json = nlohmann::json::parse(trial.config_json);
  } catch (const nlohmann::json::exception& e) {
    return DataLossError("stored config is damaged: " + std::string(e.what()));
  }
  ASSIGN_OR_RETURN(TrialConfig config, TrialConfig::FromJson(config_json));
  ASSIGN_OR_RETURN(auto inputs, store_.GetInputs(trial.experiment_id));
  if (const std::string model = config.GetString("model"); IsHubModelRef(model)) {
    StatusOr<bool> ready = EnsureHubModel(link, model, trial.experiment_id, now);
    if (!ready.ok()) {
      // Preparing cannot succeed: running the trial anywhere would fail the same way.
      ASSIGN_OR_RETURN(int64_t started, store_.StartAttempt(trial.id, link.name, now));
      RETURN_IF_ERROR(store_.FinishAttempt(trial.id, started, store::TrialState::kFailed,
                                           std::nullopt, ready.status().message(), now));
      changes_.Notify();
      return Status::Ok();
    }
    if (!*ready) return Status::Ok();  // still queued; placed again once the model is there
  }

  v1::RunTrialRequest request;
  request.mutable_key()->set_experiment_id(trial.experiment_id);
  request.mutable_key()->set_trial(trial.name);
  request.mutable_key()->set_attempt(static_cast<int32_t>(attempt));
  request.set_config_json(trial.config_json);
  for (const auto& [key, tree_digest] : TrialInputDigests(config, inputs)) {
    ASSIGN_OR_RETURN(digest::InputTree tree, blobs_.GetTree(tree_digest));
    RETURN_IF_ERROR(EnsureBlobs(*stub, tree).WithContext("sending input '" + key + "'"));
    (*request.mutable_inputs())[key] = ToProto(tree);
  }
  for (int64_t index : devices) request.add_device_indices(static_cast<int32_t>(index));
  if (trial.resume) {
    v1::RunKey* from = request.mutable_resume_from()->mutable_run();
    from->set_experiment_id(trial.experiment_id);
    from->set_trial(trial.name);
    from->set_attempt(static_cast<int32_t>(trial.resume->attempt));
    request.mutable_resume_from()->set_checkpoint(trial.resume->checkpoint);
    if (!trial.resume->tree.empty()) {
      // The controller's copy goes to the node like an input, whichever node it is.
      ASSIGN_OR_RETURN(digest::InputTree tree, blobs_.GetTree(trial.resume->tree));
      RETURN_IF_ERROR(EnsureBlobs(*stub, tree).WithContext("sending the checkpoint to resume"));
      *request.mutable_resume_from()->mutable_tree() = ToProto(tree);
    }
  }

  v1::RunState state;
  auto context = CallContext();
  const grpc::Status ran = stub->RunTrial(context.get(), request, &state);
  // The agent refuses the trial itself, or (for a resumed trial) no longer has its checkpoint:
  // running it again cannot help.
  const bool refused = ran.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
                       (trial.resume && ran.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  if (!ran.ok() && !refused) {
    if (const std::string model = config.GetString("model");
        IsHubModelRef(model) && ran.error_code() == grpc::StatusCode::NOT_FOUND) {
      // The agent lost its copy (a wiped cache): prepare it again.
      auto ref = ParseHubModelRef(model);
      std::lock_guard lock(mutex_);
      if (ref.ok()) {
        auto preparation = hub_models_.find({link.name, HubModelRefText(*ref)});
        if (preparation != hub_models_.end()) {
          preparation->second->state = HubPreparation::State::kIdle;
        }
      }
    }
    return rpc::FromGrpcStatus(ran).WithContext("RunTrial");
  }
  ASSIGN_OR_RETURN(int64_t started, store_.StartAttempt(trial.id, link.name, now, devices));
  if (!ran.ok()) {
    RETURN_IF_ERROR(store_.FinishAttempt(trial.id, started, store::TrialState::kFailed,
                                         std::nullopt,
                                         "the agent refused it: " + ran.error_message(), now));
    changes_.Notify();
    return Status::Ok();
  }
  spdlog::info("trial {} of experiment {}: attempt {} started on node {}", trial.name,
               trial.experiment_id, started, link.name);
  changes_.Notify();
  return Status::Ok();
}

StatusOr<bool> Dispatcher::EnsureHubModel(Link& link, const std::string& model,
                                          int64_t experiment_id, store::Time now) {
  ASSIGN_OR_RETURN(HubModelRef ref, ParseHubModelRef(model));
  HubPreparation* preparation = nullptr;
  std::shared_ptr<v1::Agent::Stub> stub;
  {
    std::lock_guard lock(mutex_);
    std::unique_ptr<HubPreparation>& entry = hub_models_[{link.name, HubModelRefText(ref)}];
    if (entry == nullptr) {
      entry = std::make_unique<HubPreparation>();
      entry->node = link.name;
      entry->model = HubModelRefText(ref);
    }
    preparation = entry.get();
    switch (preparation->state) {
      case HubPreparation::State::kReady:
        return true;
      case HubPreparation::State::kRunning:
        preparation->experiments.insert(experiment_id);
        return false;
      case HubPreparation::State::kFailed:
        // The trials that waited for it fail with its error; a later experiment tries again.
        if (preparation->experiments.contains(experiment_id)) return preparation->failure;
        preparation->experiments.clear();
        break;
      case HubPreparation::State::kIdle:
        if (now < preparation->retry_at) {
          preparation->experiments.insert(experiment_id);
          return false;
        }
        break;
    }
    stub = link.stub;
    if (stub == nullptr) return false;
    preparation->experiments.insert(experiment_id);
    preparation->state = HubPreparation::State::kRunning;
  }
  // Not running: any earlier thread has finished its work.
  if (preparation->thread.joinable()) preparation->thread.join();
  spdlog::info("node {}: preparing {}", link.name, preparation->model);
  preparation->thread = std::thread([this, preparation, stub = std::move(stub), ref] {
    PrepareHubModel(*preparation, stub, ref);
  });
  return false;
}

void Dispatcher::PrepareHubModel(HubPreparation& preparation, std::shared_ptr<v1::Agent::Stub> stub,
                                 HubModelRef ref) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options_.prepare_deadline);
  {
    std::lock_guard lock(mutex_);
    preparation.context = &context;
  }
  v1::PrepareHubModelRequest request;
  request.set_repo(ref.repo);
  request.set_revision(ref.revision);
  v1::PrepareHubModelResponse response;
  // Stop() may have cancelled the context before it was published: then this call is cut short by
  // the stopping flag below instead.
  bool stopping;
  {
    std::lock_guard lock(mutex_);
    stopping = stopping_;
  }
  const grpc::Status prepared =
      stopping ? grpc::Status(grpc::StatusCode::CANCELLED, "the controller is stopping")
               : stub->PrepareHubModel(&context, request, &response);
  {
    std::lock_guard lock(mutex_);
    preparation.context = nullptr;
    if (prepared.ok()) {
      preparation.state = HubPreparation::State::kReady;
      preparation.backoff = std::chrono::milliseconds(0);
      spdlog::info("node {}: {} is ready ({} bytes in {})", preparation.node, preparation.model,
                   response.bytes(), response.path());
    } else if (IsPermanentPrepareFailure(prepared.error_code())) {
      preparation.state = HubPreparation::State::kFailed;
      preparation.failure = rpc::FromGrpcStatus(prepared).WithContext(
          "preparing " + preparation.model + " on node " + preparation.node);
      spdlog::warn("{}", preparation.failure.message());
    } else {
      preparation.state = HubPreparation::State::kIdle;
      preparation.backoff = preparation.backoff.count() == 0
                                ? options_.backoff_initial
                                : std::min(preparation.backoff * 2, options_.backoff_max);
      preparation.retry_at = clock_.Now() + preparation.backoff;
      spdlog::warn("node {}: preparing {} failed, trying again in {} ms: {}", preparation.node,
                   preparation.model, preparation.backoff.count(), prepared.error_message());
    }
  }
  Wake();
}

void Dispatcher::WatchLeases(const std::vector<store::NodeRecord>& nodes,
                             const std::vector<store::RunningAttempt>& running, store::Time now) {
  std::map<std::string, std::string> notices;
  for (const store::NodeRecord& node : nodes) {
    if (!node.lease.has_value() || now < node.lease->ends - options_.lease_warning) continue;
    const std::string ends = "node " + node.name + "'s lease " + node.lease->name + " ends at " +
                             FormatUtc(node.lease->ends);
    const std::string notice = ends + "; its trials are stopped at " +
                               FormatUtc(node.lease->ends - options_.lease_stop_margin) +
                               " (llmctl lease extend " + node.lease->name + " gives it more time)";
    notices[node.name] = notice;
    {
      std::lock_guard lock(mutex_);
      if (!node_notices_.contains(node.name)) spdlog::warn("{}", notice);
    }
    if (now < node.lease->ends - options_.lease_stop_margin) continue;
    for (const store::RunningAttempt& attempt : running) {
      if (attempt.node != node.name) continue;
      std::shared_ptr<v1::Agent::Stub> stub;
      {
        std::lock_guard lock(mutex_);
        const AttemptKey key{attempt.trial_id, attempt.attempt};
        if (checkpoint_stops_.contains(key)) continue;
        checkpoint_stops_[key] = ends + ": stopped before it does";
        auto link = links_.find(node.name);
        if (link != links_.end()) stub = link->second->stub;
      }
      auto trial = store_.GetTrial(attempt.trial_id);
      if (!trial.ok()) continue;
      spdlog::warn("{} on node {}: {}: checkpointing and stopping it", AttemptName(attempt),
                   node.name, ends);
      // What is left of the lease but the reserve; 0 (the agent's own cancel grace) when nothing
      // is left.
      const auto grace = std::max(std::chrono::milliseconds(0),
                                  std::chrono::duration_cast<std::chrono::milliseconds>(
                                      node.lease->ends - now - options_.lease_stop_reserve));
      // Unreachable: the attempt is declared lost and requeued like any other.
      if (stub != nullptr) CancelRun(attempt, trial->name, *stub, grace);
    }
  }
  std::lock_guard lock(mutex_);
  node_notices_ = std::move(notices);
}

void Dispatcher::CancelRun(const store::RunningAttempt& attempt, const std::string& trial_name,
                           v1::Agent::Stub& stub,
                           std::optional<std::chrono::milliseconds> checkpoint_grace) {
  v1::CancelRunRequest request;
  request.mutable_key()->set_experiment_id(attempt.experiment_id);
  request.mutable_key()->set_trial(trial_name);
  request.mutable_key()->set_attempt(static_cast<int32_t>(attempt.attempt));
  if (checkpoint_grace) {
    request.set_checkpoint(true);
    request.set_checkpoint_grace_ms(checkpoint_grace->count());
  }
  v1::RunState state;
  auto context = CallContext();
  const grpc::Status cancelled = stub.CancelRun(context.get(), request, &state);
  if (!cancelled.ok()) {
    spdlog::warn("{} on node {}: CancelRun failed: {}", AttemptName(attempt), attempt.node,
                 cancelled.error_message());
  }
}

Status Dispatcher::EnsureBlobs(v1::Agent::Stub& stub, const digest::InputTree& tree) {
  v1::MissingBlobsRequest request;
  std::set<std::string> wanted;
  for (const digest::TreeFile& file : tree.files) {
    if (wanted.insert(file.sha256).second) request.add_sha256(file.sha256);
  }
  v1::MissingBlobsResponse missing;
  auto context = CallContext();
  RETURN_IF_ERROR(rpc::FromGrpcStatus(stub.MissingBlobs(context.get(), request, &missing)));
  for (const std::string& sha256 : missing.sha256()) {
    if (!wanted.contains(sha256))
      return InternalError("the agent asked for a blob it was not offered");
    const std::string path = blobs_.PathOf(sha256);
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return DataLossError("blob " + sha256 + " is gone from " + path);
    const auto size =
        std::find_if(tree.files.begin(), tree.files.end(), [&](const digest::TreeFile& f) {
          return f.sha256 == sha256;
        })->size;
    grpc::ClientContext upload_context;
    upload_context.set_deadline(std::chrono::system_clock::now() +
                                rpc::TransferDeadline(options_.call_deadline, size,
                                                      options_.min_transfer_bytes_per_second));
    v1::UploadBlobResponse response;
    auto writer = stub.UploadBlob(&upload_context, &response);
    std::string buffer(static_cast<size_t>(options_.upload_chunk_bytes), '\0');
    v1::BlobChunk chunk;
    chunk.set_sha256(sha256);
    chunk.set_size(size);
    // The first chunk carries the digest and size, even for an empty blob.
    bool first = true;
    Status read_status;
    while (true) {
      const ssize_t n = read(fd, buffer.data(), buffer.size());
      if (n < 0) {
        read_status = DataLossError("cannot read " + path);
        break;
      }
      if (n == 0 && !first) break;
      chunk.set_data(buffer.data(), static_cast<size_t>(n));
      if (!writer->Write(chunk) || n == 0) break;
      chunk.clear_sha256();
      chunk.clear_size();
      first = false;
    }
    close(fd);
    writer->WritesDone();
    const grpc::Status uploaded = writer->Finish();
    RETURN_IF_ERROR(read_status);
    RETURN_IF_ERROR(rpc::FromGrpcStatus(uploaded).WithContext("UploadBlob " + sha256));
  }
  return Status::Ok();
}

void Dispatcher::FollowRunning(const std::vector<store::RunningAttempt>& running, store::Time now) {
  std::set<AttemptKey> still_running;
  for (const store::RunningAttempt& attempt : running) {
    const AttemptKey key{attempt.trial_id, attempt.attempt};
    still_running.insert(key);
    std::shared_ptr<v1::Agent::Stub> stub;
    Stream* stream = nullptr;
    {
      std::lock_guard lock(mutex_);
      auto link = links_.find(attempt.node);
      if (link == links_.end() || !link->second->connected) continue;
      std::unique_ptr<Stream>& entry = streams_[key];
      if (entry == nullptr) entry = std::make_unique<Stream>();
      if (!entry->done || entry->settled || now < entry->retry_at) continue;
      if (link->second->stub == nullptr) continue;
      stream = entry.get();
      stub = link->second->stub;
      stream->done = false;
      stream->stop = false;
    }
    if (stream->thread.joinable()) stream->thread.join();
    if (stream->trial_name.empty()) {
      auto trial = store_.GetTrial(attempt.trial_id);
      if (!trial.ok()) {
        std::lock_guard lock(mutex_);
        stream->done = true;
        continue;
      }
      stream->trial_name = trial->name;
    }
    stream->attempt = attempt;
    stream->stub = std::move(stub);
    stream->thread = std::thread([this, stream] { ReadStream(*stream, *stream->stub); });
  }
  // Attempts that ended or were lost: their readers are no longer needed.
  std::vector<AttemptKey> gone;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [key, stream] : streams_) {
      if (!still_running.contains(key)) gone.push_back(key);
    }
  }
  for (const AttemptKey& key : gone) StopStream(key);
}

void Dispatcher::ReadStream(Stream& stream, v1::Agent::Stub& stub) {
  const store::RunningAttempt& attempt = stream.attempt;
  Status result;
  bool ended = false;
  bool received = false;
  auto last_seq = store_.LastSeq(attempt.trial_id, attempt.attempt);
  auto last_sample_seq = store_.LastDeviceSampleSeq(attempt.trial_id, attempt.attempt);
  grpc::ClientContext context;
  bool stopped;
  {
    std::lock_guard lock(mutex_);
    stopped = stream.stop;
    if (!stopped) stream.context = &context;
  }
  if (!last_seq.ok() || !last_sample_seq.ok()) {
    result = last_seq.ok() ? last_sample_seq.status() : last_seq.status();
  } else if (!stopped) {
    v1::StreamEventsRequest request;
    request.mutable_key()->set_experiment_id(attempt.experiment_id);
    request.mutable_key()->set_trial(stream.trial_name);
    request.mutable_key()->set_attempt(static_cast<int32_t>(attempt.attempt));
    request.set_from_seq(*last_seq + 1);
    request.set_from_sample_seq(*last_sample_seq + 1);
    auto reader = stub.StreamEvents(&context, request);
    v1::StreamEventsResponse response;
    while (reader->Read(&response)) {
      received = true;
      if (response.has_event()) {
        const store::Event event{.seq = response.event().seq(),
                                 .type = response.event().type(),
                                 .json = response.event().json()};
        if (event.type == "result") stream.result_json = event.json;
        auto appended = store_.AppendEvents(attempt.trial_id, attempt.attempt, {&event, 1});
        if (!appended.ok()) {
          result = appended.status();
          context.TryCancel();
          break;
        }
        if (*appended > 0) changes_.Notify();
      } else if (response.has_samples()) {
        auto stored = store_.AppendDeviceSamples(attempt.trial_id, attempt.attempt,
                                                 FromProto(response.samples()));
        if (!stored.ok() && stored.status().code() == StatusCode::kFailedPrecondition) {
          result = stored.status();  // fenced off, as its events are
          context.TryCancel();
          break;
        }
        // A batch the store refuses is lost, not the stream: samples only show how it runs.
        if (!stored.ok()) {
          spdlog::warn("{} on node {}: device samples dropped: {}", AttemptName(attempt),
                       attempt.node, stored.status().ToString());
        } else if (*stored > 0) {
          changes_.Notify();
        }
      } else if (response.has_ended()) {
        const v1::RunEnded& end = response.ended();
        std::string error = end.error();
        if (end.outcome() == "invalid" && error.empty()) error = "the trainer refused the config";
        bool stopped_with_checkpoint = false;
        {
          std::lock_guard lock(mutex_);
          auto stopped = checkpoint_stops_.find({attempt.trial_id, attempt.attempt});
          if (stopped != checkpoint_stops_.end() && end.outcome() == "cancelled") {
            stopped_with_checkpoint = true;
            error = stopped->second + "; " +
                    DescribeStopCheckpoint(stream.result_json, attempt.experiment_id,
                                           stream.trial_name);
          }
        }
        // At once: a lease stop leaves minutes before the node, and its checkpoint, are gone. And
        // before the trial ends, so whoever sees it ended also sees the copy under way.
        if (stopped_with_checkpoint) {
          StartCheckpointCopy(attempt, stream.trial_name, stream.result_json);
        }
        result =
            store_.FinishAttempt(attempt.trial_id, attempt.attempt, OutcomeState(end.outcome()),
                                 end.exit_code(), error, clock_.Now());
        ended = true;
        changes_.Notify();
        if (!result.ok()) break;
      }
    }
    const grpc::Status finished = reader->Finish();
    if (result.ok() && !ended) {
      result = finished.ok() ? UnavailableError("the event stream closed before the run ended")
                             : rpc::FromGrpcStatus(finished);
    }
  }
  if (!result.ok() && result.code() != StatusCode::kCancelled) {
    spdlog::warn("{} on node {}: event stream: {}", AttemptName(attempt), attempt.node,
                 result.ToString());
  }
  {
    std::lock_guard lock(mutex_);
    stream.context = nullptr;
    // Fenced off (a stale or lost attempt) or finished: nothing more to read.
    stream.settled = (ended && result.ok()) || result.code() == StatusCode::kFailedPrecondition;
    if (received) stream.backoff = std::chrono::milliseconds(0);
    if (!stream.settled) {
      stream.backoff = stream.backoff.count() == 0
                           ? options_.backoff_initial
                           : std::min(stream.backoff * 2, options_.backoff_max);
      stream.retry_at = clock_.Now() + stream.backoff;
    }
    stream.done = true;
  }
  changes_.Notify();
  Wake();
}

void Dispatcher::StartCheckpointCopy(const store::RunningAttempt& attempt,
                                     const std::string& trial_name,
                                     const std::string& result_json) {
  const nlohmann::json result =
      nlohmann::json::parse(result_json, nullptr, /*allow_exceptions=*/false);
  const nlohmann::json checkpoint =
      result.is_object() ? result.value("checkpoint", nlohmann::json()) : nlohmann::json();
  if (!checkpoint.is_object() || !checkpoint.value("step", nlohmann::json()).is_number_integer() ||
      !checkpoint.value("path", nlohmann::json()).is_string()) {
    return;  // nothing to copy; the trial's error says why
  }
  const std::string path = checkpoint["path"].get<std::string>();
  const int64_t step = checkpoint["step"].get<int64_t>();
  const AttemptKey key{attempt.trial_id, attempt.attempt};
  std::lock_guard lock(mutex_);
  if (stopping_ || checkpoint_copies_.contains(key)) return;
  auto& copy = checkpoint_copies_[key];
  copy.second = false;
  copy.first = std::thread([this, attempt, trial_name, path, step, key] {
    const auto started = std::chrono::steady_clock::now();
    StatusOr<std::string> tree = CopyCheckpoint(attempt, trial_name, path, step);
    if (tree.ok()) {
      spdlog::info(
          "{}: checkpoint after step {} copied from node {} in {:.1f} s (tree {}): any "
          "node can continue it",
          AttemptName(attempt), step + 1, attempt.node,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), *tree);
    } else {
      spdlog::warn(
          "{}: cannot copy its checkpoint {} from node {}: {}; only that node can "
          "continue it",
          AttemptName(attempt), path, attempt.node, tree.status().ToString());
    }
    std::lock_guard lock(mutex_);
    if (auto entry = checkpoint_copies_.find(key); entry != checkpoint_copies_.end()) {
      entry->second.second = true;
    }
  });
}

StatusOr<std::string> Dispatcher::CopyCheckpoint(const store::RunningAttempt& attempt,
                                                 const std::string& trial_name,
                                                 const std::string& checkpoint, int64_t step) {
  ASSIGN_OR_RETURN(const store::TrialRecord trial, store_.GetTrial(attempt.trial_id));
  if (trial.resume && !trial.resume->tree.empty() && trial.resume->step == step + 1) {
    // The attempt continued the controller's copy and wrote no newer checkpoint: its result names
    // the copy (as materialised on the node), which the controller already holds.
    RETURN_IF_ERROR(
        store_.SetCheckpointTree(attempt.trial_id, attempt.attempt, trial.resume->tree));
    return trial.resume->tree;
  }
  v1::RunKey key;
  key.set_experiment_id(attempt.experiment_id);
  key.set_trial(trial_name);
  key.set_attempt(static_cast<int32_t>(attempt.attempt));
  std::vector<digest::TreeFile> files;
  std::unique_ptr<ReceivedBlob> blob;
  Status received;
  const Status fetched = FetchArtifacts(
      attempt.node, key,
      [&](const v1::ArtifactChunk& chunk) {
        {
          std::lock_guard lock(mutex_);
          if (stopping_) {
            received = CancelledError("the controller is stopping");
            return false;
          }
        }
        if (!chunk.path().empty()) {
          if (const std::string problem = digest::RelativePathProblem(chunk.path());
              !problem.empty()) {
            received = DataLossError("the agent sent file '" + chunk.path() + "': " + problem);
            return false;
          }
          auto begun = blobs_.BeginReceive(chunk.size());
          if (!begun.ok()) {
            received = begun.status();
            return false;
          }
          blob = std::move(*begun);
          files.push_back({chunk.path(), "", chunk.size()});
        }
        if (blob == nullptr) {
          received = DataLossError("the agent sent data before naming its file");
          return false;
        }
        received = blob->Append(chunk.data());
        if (received.ok() && chunk.last()) {
          received = blob->Commit(chunk.sha256()).WithContext(files.back().path);
          files.back().sha256 = chunk.sha256();
          blob.reset();
        }
        return received.ok();
      },
      checkpoint);
  RETURN_IF_ERROR(received);  // why the sink stopped the download, before the download's own error
  RETURN_IF_ERROR(fetched);
  if (blob != nullptr) return DataLossError(files.back().path + " was cut short");
  std::sort(files.begin(), files.end(),
            [](const digest::TreeFile& a, const digest::TreeFile& b) { return a.path < b.path; });
  // What SaveCheckpoint writes last: without it the directory is no complete checkpoint.
  if (std::none_of(files.begin(), files.end(), [](const digest::TreeFile& file) {
        return file.path == "trainer_state.json";
      })) {
    return DataLossError("the agent sent no trainer_state.json: no complete checkpoint");
  }
  digest::InputTree tree{.digest = digest::TreeDigest(files), .files = files, .is_file = false};
  RETURN_IF_ERROR(digest::ValidateInputTree("checkpoint " + checkpoint, tree));
  RETURN_IF_ERROR(blobs_.PutTree(tree));
  RETURN_IF_ERROR(store_.SetCheckpointTree(attempt.trial_id, attempt.attempt, tree.digest));
  return tree.digest;
}

void Dispatcher::StopStream(const AttemptKey& key) {
  std::unique_ptr<Stream> stream;
  {
    std::lock_guard lock(mutex_);
    auto it = streams_.find(key);
    if (it == streams_.end()) return;
    it->second->stop = true;
    if (it->second->context != nullptr) it->second->context->TryCancel();
    stream = std::move(it->second);
    streams_.erase(it);
  }
  if (stream->thread.joinable()) stream->thread.join();
}

StatusOr<store::NodeRemoval> Dispatcher::RemoveNode(const std::string& node) {
  ASSIGN_OR_RETURN(store::NodeRemoval removal, store_.RemoveNode(node, clock_.Now()));
  for (const store::RunningAttempt& attempt : removal.lost) {
    spdlog::warn("node {} removed: {} is lost and requeued", node, AttemptName(attempt));
    StopStream({attempt.trial_id, attempt.attempt});
  }
  {
    std::lock_guard lock(mutex_);
    if (auto link = links_.find(node); link != links_.end()) {
      link->second->removed = true;
      link->second->connected = false;
      link->second->stub = nullptr;
    }
    node_notices_.erase(node);
    for (auto& [key, preparation] : hub_models_) {
      if (preparation->node != node) continue;
      if (preparation->context != nullptr) preparation->context->TryCancel();
      // A node registered again under this name starts with an empty cache.
      if (preparation->state == HubPreparation::State::kReady) {
        preparation->state = HubPreparation::State::kIdle;
      }
    }
  }
  if (removal.result == store::NodeRemoval::Result::kRemoved) {
    spdlog::info("node {} removed ({} running attempts requeued)", node, removal.lost.size());
  }
  changes_.Notify();
  Wake();
  return removal;
}

StatusOr<std::vector<std::string>> Dispatcher::Cancel(int64_t experiment_id, std::string_view trial,
                                                      bool checkpoint) {
  ASSIGN_OR_RETURN(std::vector<store::TrialRecord> trials, store_.ListTrials(experiment_id));
  std::vector<std::string> affected;
  std::map<int64_t, std::string> names;
  const store::TrialRecord* named = nullptr;
  for (const store::TrialRecord& record : trials) {
    names[record.id] = record.name;
    if (!trial.empty() && record.name != trial) continue;
    named = &record;
    if (!store::IsOutcome(record.state)) affected.push_back(record.name);
  }
  if (!trial.empty() && named == nullptr) {
    return NotFoundError("experiment " + std::to_string(experiment_id) + " has no trial '" +
                         std::string(trial) + "'");
  }
  ASSIGN_OR_RETURN(
      std::vector<store::RunningAttempt> running,
      trial.empty() ? store_.CancelExperiment(experiment_id) : store_.CancelTrial(named->id));
  for (const store::RunningAttempt& attempt : running) {
    std::shared_ptr<v1::Agent::Stub> stub;
    {
      std::lock_guard lock(mutex_);
      auto link = links_.find(attempt.node);
      if (link != links_.end()) stub = link->second->stub;
      if (checkpoint) {
        checkpoint_stops_.try_emplace({attempt.trial_id, attempt.attempt},
                                      "cancelled with a checkpoint (llmctl cancel --checkpoint)");
      }
    }
    if (stub == nullptr) continue;  // ends as cancelled when the attempt is declared lost
    CancelRun(attempt, names[attempt.trial_id], *stub,
              checkpoint ? std::optional(options_.cancel_checkpoint_grace) : std::nullopt);
  }
  changes_.Notify();
  Wake();
  return affected;
}

StatusOr<store::TrialResume> Dispatcher::Resume(int64_t experiment_id, std::string_view trial) {
  ASSIGN_OR_RETURN(std::vector<store::TrialRecord> trials, store_.ListTrials(experiment_id));
  auto named = std::find_if(trials.begin(), trials.end(),
                            [&](const store::TrialRecord& record) { return record.name == trial; });
  if (named == trials.end()) {
    return NotFoundError("experiment " + std::to_string(experiment_id) + " has no trial '" +
                         std::string(trial) + "'");
  }
  ASSIGN_OR_RETURN(store::TrialResume resume, store_.ResumeTrial(named->id));
  spdlog::info("trial {} of experiment {}: resuming attempt {}'s checkpoint on node {} ({})",
               named->name, experiment_id, resume.attempt, resume.node, resume.checkpoint);
  changes_.Notify();
  Wake();
  return resume;
}

Status Dispatcher::FetchArtifacts(const std::string& node, const v1::RunKey& key,
                                  const std::function<bool(const v1::ArtifactChunk&)>& sink,
                                  const std::string& path) {
  std::shared_ptr<v1::Agent::Stub> stub;
  {
    std::lock_guard lock(mutex_);
    auto link = links_.find(node);
    if (link != links_.end()) stub = link->second->stub;
  }
  if (stub == nullptr) return UnavailableError("node " + node + " is not connected");
  // The artifacts' total size is not known up front: no call deadline, an idle limit instead.
  grpc::ClientContext context;
  rpc::IdleCanceller idle(context, options_.call_deadline);
  v1::FetchArtifactsRequest request;
  *request.mutable_key() = key;
  request.set_path(path);
  auto reader = stub->FetchArtifacts(&context, request);
  v1::ArtifactChunk chunk;
  while (reader->Read(&chunk)) {
    if (!sink(chunk)) {
      context.TryCancel();
      reader->Finish();
      return CancelledError("the artifact download was abandoned");
    }
    // After the sink: time spent passing the chunk on is not the agent's silence.
    idle.Progress();
  }
  return idle.Explain(reader->Finish(), "fetching artifacts from node " + node);
}

}  // namespace llmctl::controller
