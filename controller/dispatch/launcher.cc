#include "controller/dispatch/launcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "common/model_config.h"
#include "common/trial_config.h"
#include "controller/dispatch/cancellation.h"
#include "controller/store/stored_config.h"
#include "controller/submission.h"
#include "rpc/grpc_status.h"

namespace llmctl::controller::dispatch {

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

std::string RendezvousHost(const std::string& agent_address) {
  std::string address = agent_address;
  for (const char* scheme : {"dns:///", "ipv4:", "ipv6:"}) {
    if (address.starts_with(scheme)) address = address.substr(std::string_view(scheme).size());
  }
  // An agent on a Unix socket is on the controller's own host, as are its peers.
  if (address.starts_with("unix:") || address.starts_with("unix-abstract:")) return "127.0.0.1";
  if (address.starts_with("[")) {
    const size_t close = address.find(']');
    return close == std::string::npos ? address : address.substr(1, close - 1);
  }
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

StatusOr<Launcher::Readiness> Launcher::Prepare(const store::TrialRecord& trial,
                                                const TrialConfig& config, AgentLinks::Link& link,
                                                const std::shared_ptr<v1::Agent::Stub>& stub,
                                                v1::RunTrialRequest& request, std::string& failure,
                                                std::string& waiting) {
  const MonotonicTime now = core_.clock.Monotonic();
  store::Store& store = core_.store;
  ASSIGN_OR_RETURN(auto inputs, store.GetInputs(trial.experiment_id));
  if (const std::string& model = config.settings().model.name; IsHubModelRef(model)) {
    StatusOr<bool> ready = hub_models_.Ensure(link, model, trial.experiment_id, now);
    if (!ready.ok()) {
      failure = ready.status().message();
      return Readiness::kFailed;
    }
    if (!*ready) {  // placed again once the model is there
      waiting = "node " + link.name + " is downloading " + model + " from the Hugging Face hub";
      return Readiness::kWaiting;
    }
  }
  request.mutable_key()->set_experiment_id(trial.experiment_id);
  request.mutable_key()->set_trial(trial.name);
  request.mutable_key()->set_attempt(static_cast<int32_t>(trial.current_attempt + 1));
  request.set_config_json(trial.config_json);
  // Every tree's delivery is asked for before any wait, so that large ones go side by side.
  bool delivered = true;
  const auto deliver = [&](const digest::InputTree& tree, const std::string& what) -> Status {
    StatusOr<bool> sent = deliveries_.Ensure(link, stub, tree, now);
    if (!sent.ok()) return sent.status().WithContext(what);
    if (!*sent) {
      delivered = false;
      if (waiting.empty()) waiting = deliveries_.WaitingFor(link.name, tree.digest);
    }
    return Status::Ok();
  };
  for (const auto& [key, tree_digest] : TrialInputDigests(config, inputs)) {
    ASSIGN_OR_RETURN(digest::InputTree tree, core_.blobs.GetTree(tree_digest));
    RETURN_IF_ERROR(deliver(tree, "sending input '" + key + "'"));
    (*request.mutable_inputs())[key] = ToProto(tree);
  }
  if (trial.resume) {
    v1::RunKey* from = request.mutable_resume_from()->mutable_run();
    from->set_experiment_id(trial.experiment_id);
    from->set_trial(trial.name);
    from->set_attempt(static_cast<int32_t>(trial.resume->attempt));
    request.mutable_resume_from()->set_checkpoint(trial.resume->checkpoint);
    if (!trial.resume->tree.empty()) {
      // The controller's copy goes to the node like an input, whichever node it is.
      ASSIGN_OR_RETURN(digest::InputTree tree, core_.blobs.GetTree(trial.resume->tree));
      RETURN_IF_ERROR(deliver(tree, "sending the checkpoint to resume"));
      *request.mutable_resume_from()->mutable_tree() = ToProto(tree);
    }
  }
  if (!delivered) {
    if (waiting.empty()) waiting = "its inputs are to be sent to node " + link.name + " again";
    return Readiness::kWaiting;
  }
  return Readiness::kReady;
}

std::shared_ptr<v1::Agent::Stub> Launcher::StubOf(AgentLinks::Link& link) {
  MutexLock lock(core_.mutex);
  return link.stub;
}

bool Launcher::Refused(const store::TrialRecord& trial, const grpc::Status& ran) {
  // The agent refuses the trial itself, or (for a resumed trial) no longer has its checkpoint:
  // running it again cannot help.
  return ran.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
         (trial.resume && ran.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
}

void Launcher::ForgetLostHubModel(const TrialConfig& config, AgentLinks::Link& link,
                                  const grpc::Status& ran) {
  if (const std::string& model = config.settings().model.name;
      IsHubModelRef(model) && ran.error_code() == grpc::StatusCode::NOT_FOUND) {
    // The agent lost its copy (a wiped cache): prepare it again.
    hub_models_.Forget(link.name, model);
  }
}

Status Launcher::Launch(const store::TrialRecord& trial, AgentLinks::Link& link,
                        const std::vector<int64_t>& devices, store::Time now,
                        std::string& waiting) {
  store::Store& store = core_.store;
  std::shared_ptr<v1::Agent::Stub> stub = StubOf(link);
  if (stub == nullptr) return UnavailableError("node " + link.name + " is not connected");
  ASSIGN_OR_RETURN(const TrialConfig config, store::StoredConfig(trial));
  v1::RunTrialRequest request;
  std::string failure;
  ASSIGN_OR_RETURN(const Readiness readiness,
                   Prepare(trial, config, link, stub, request, failure, waiting));
  if (readiness == Readiness::kWaiting) return Status::Ok();
  if (readiness == Readiness::kFailed) {
    // Preparing cannot succeed: running the trial anywhere would fail the same way.
    ASSIGN_OR_RETURN(int64_t started, store.StartAttempt(trial.id, link.name, now));
    RETURN_IF_ERROR(store.FinishAttempt(trial.id, started, store::TrialState::kFailed, std::nullopt,
                                        failure, now));
    core_.changes.Notify();
    return Status::Ok();
  }
  for (int64_t index : devices) request.add_device_indices(static_cast<int32_t>(index));

  v1::RunState state;
  auto context = core_.CallContext();
  const grpc::Status ran = stub->RunTrial(context.get(), request, &state);
  const bool refused = Refused(trial, ran);
  if (ran.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    // Unanswered, not refused: the agent may have started it. Recorded as started there, it is
    // followed like any other attempt, and ListRuns finds it lost (the trial queued again) if it
    // does not run; placed elsewhere meanwhile, it would hold this node's devices unknown.
    ASSIGN_OR_RETURN(int64_t started, store.StartAttempt(trial.id, link.name, now, devices));
    spdlog::warn(
        "trial {} of experiment {}: RunTrial on node {} went unanswered ({}); attempt {} "
        "is taken as started there",
        trial.name, trial.experiment_id, link.name, ran.error_message(), started);
    core_.changes.Notify();
    return Status::Ok();
  }
  if (!ran.ok() && !refused) {
    ForgetLostHubModel(config, link, ran);
    return rpc::FromGrpcStatus(ran).WithContext("RunTrial");
  }
  ASSIGN_OR_RETURN(int64_t started, store.StartAttempt(trial.id, link.name, now, devices));
  if (!ran.ok()) {
    RETURN_IF_ERROR(store.FinishAttempt(trial.id, started, store::TrialState::kFailed, std::nullopt,
                                        "the agent refused it: " + ran.error_message(), now));
    core_.changes.Notify();
    return Status::Ok();
  }
  spdlog::info("trial {} of experiment {}: attempt {} started on node {}", trial.name,
               trial.experiment_id, started, link.name);
  core_.changes.Notify();
  return Status::Ok();
}

Status Launcher::LaunchMultiNode(const store::TrialRecord& trial,
                                 const std::vector<AgentLinks::Link*>& links,
                                 const std::vector<std::vector<int64_t>>& devices, store::Time now,
                                 std::string& waiting) {
  ASSIGN_OR_RETURN(TrialConfig config, store::StoredConfig(trial));
  MultiNodeStart start{.trial = trial, .config = std::move(config), .links = links, .now = now};
  ASSIGN_OR_RETURN(const Readiness readiness, PrepareNodes(start, devices, waiting));
  if (readiness != Readiness::kReady) return Status::Ok();
  // Recorded before any node runs it, unlike a one-node attempt: node rank 0 must start first to
  // tell the others its rendezvous port, so a crash half-way leaves runs that no retry of the same
  // attempt could join. A run recorded here but never started is found missing by the agent's
  // reconciliation and the attempt is lost (and its other runs stopped); a run started but not yet
  // recorded cannot exist.
  ASSIGN_OR_RETURN(start.attempt, core_.store.StartMultiNodeAttempt(trial.id, start.nodes, now));
  return StartNodes(start);
}

StatusOr<Launcher::Readiness> Launcher::PrepareNodes(
    MultiNodeStart& start, const std::vector<std::vector<int64_t>>& devices, std::string& waiting) {
  const store::TrialRecord& trial = start.trial;
  const int nodes = static_cast<int>(start.links.size());
  start.requests.resize(nodes);
  // Every node is readied before any wait, so that their deliveries and downloads go side by side.
  Readiness readiness = Readiness::kReady;
  for (int rank = 0; rank < nodes; ++rank) {
    AgentLinks::Link& link = *start.links[rank];
    start.stubs.push_back(StubOf(link));
    if (start.stubs.back() == nullptr) {
      return UnavailableError("node " + link.name + " is not connected");
    }
    std::string failure;
    std::string node_waiting;
    ASSIGN_OR_RETURN(const Readiness node, Prepare(trial, start.config, link, start.stubs.back(),
                                                   start.requests[rank], failure, node_waiting));
    if (node == Readiness::kWaiting) {
      if (waiting.empty()) waiting = node_waiting;
      readiness = Readiness::kWaiting;
      continue;
    }
    if (node == Readiness::kFailed) {
      store::Store& store = core_.store;
      ASSIGN_OR_RETURN(int64_t started,
                       store.StartAttempt(trial.id, start.links[0]->name, start.now));
      RETURN_IF_ERROR(store.FinishAttempt(trial.id, started, store::TrialState::kFailed,
                                          std::nullopt, "node " + link.name + ": " + failure,
                                          start.now));
      core_.changes.Notify();
      return Readiness::kFailed;
    }
    for (int64_t index : devices[rank]) {
      start.requests[rank].add_device_indices(static_cast<int32_t>(index));
    }
    start.nodes.push_back(
        {.node_rank = rank, .node = link.name, .device_indices = devices[rank], .ended = false});
  }
  return readiness;
}

Status Launcher::StartNodes(MultiNodeStart& start) {
  const int nodes = static_cast<int>(start.links.size());
  v1::RunState state;
  const std::string master_addr = RendezvousHost(start.links[0]->address);
  v1::NodeGroup* first = start.requests[0].mutable_node_group();
  first->set_node_rank(0);
  first->set_nodes(nodes);
  // Node rank 0 listens on all of its addresses; its own tells its agent which interface the other
  // nodes reach it through.
  first->set_master_addr(master_addr);
  {
    auto context = core_.CallContext();
    const grpc::Status ran = start.stubs[0]->RunTrial(context.get(), start.requests[0], &state);
    if (!ran.ok()) return Abandon(start, 0, ran, "RunTrial: " + ran.error_message());
    start.started.push_back(0);
    if (state.master_port() <= 0 || state.master_port() > 65535) {
      return Abandon(start, 0, grpc::Status::OK, "its ranks did not report their rendezvous port");
    }
  }
  for (int rank = 1; rank < nodes; ++rank) {
    v1::NodeGroup* group = start.requests[rank].mutable_node_group();
    group->set_node_rank(rank);
    group->set_nodes(nodes);
    group->set_master_addr(master_addr);
    group->set_master_port(state.master_port());
    v1::RunState joined;
    auto context = core_.CallContext();
    const grpc::Status ran =
        start.stubs[rank]->RunTrial(context.get(), start.requests[rank], &joined);
    if (!ran.ok()) return Abandon(start, rank, ran, "RunTrial: " + ran.error_message());
    start.started.push_back(rank);
  }
  spdlog::info("trial {} of experiment {}: attempt {} started on {} nodes, rendezvous at {}:{}",
               start.trial.name, start.trial.experiment_id, start.attempt, nodes, master_addr,
               state.master_port());
  core_.changes.Notify();
  return Status::Ok();
}

Status Launcher::Abandon(const MultiNodeStart& start, int rank, const grpc::Status& ran,
                         const std::string& what) {
  const store::TrialRecord& trial = start.trial;
  store::Store& store = core_.store;
  const std::string where = "node " + start.links[rank]->name + " (node rank " +
                            std::to_string(rank) + " of " + std::to_string(start.links.size()) +
                            ")";
  // A refusal is never NOT_FOUND: only a lost hub model is forgotten here.
  ForgetLostHubModel(start.config, *start.links[rank], ran);
  // Node rank 0 answered without starting anything (say, it began measuring its rates between
  // two health checks): nothing of the attempt ran, so it is taken back, as a one-node trial an
  // agent turns away stays queued, and the next attempt has its number.
  if (start.started.empty() && !ran.ok() &&
      ran.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED && !Refused(trial, ran)) {
    const Status withdrawn = store.WithdrawAttempt(trial.id, start.attempt);
    if (withdrawn.ok()) {
      core_.changes.Notify();
      return UnavailableError(where + ": " + what + "; the trial stays queued");
    }
    spdlog::warn("trial {} of experiment {}: attempt {} cannot be withdrawn: {}", trial.name,
                 trial.experiment_id, start.attempt, withdrawn.ToString());
  }
  const store::RunningAttempt running{.trial_id = trial.id,
                                      .experiment_id = trial.experiment_id,
                                      .attempt = start.attempt,
                                      .node = start.links[0]->name,
                                      .started_at = start.now,
                                      .device_indices = start.nodes[0].device_indices,
                                      .nodes = start.nodes};
  for (int other : start.started) {
    CancelRun(core_, running, start.links[other]->name, trial.name, *start.stubs[other],
              std::nullopt);
  }
  // A call that ran out of time may have started the run on that node all the same.
  if (ran.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    CancelRun(core_, running, start.links[rank]->name, trial.name, *start.stubs[rank],
              std::nullopt);
  }
  if (Refused(trial, ran)) {
    RETURN_IF_ERROR(
        store.FinishAttempt(trial.id, start.attempt, store::TrialState::kFailed, std::nullopt,
                            where + ": the agent refused it: " + ran.error_message(), start.now));
    core_.changes.Notify();
    return Status::Ok();
  }
  RETURN_IF_ERROR(store.MarkAttemptLost(trial.id, start.attempt, start.now));
  core_.changes.Notify();
  return UnavailableError(where + ": " + what + "; the attempt is lost and the trial queued again");
}

}  // namespace llmctl::controller::dispatch
