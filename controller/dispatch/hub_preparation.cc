#include "controller/dispatch/hub_preparation.h"

#include <spdlog/spdlog.h>

#include <vector>

#include "controller/dispatch/kept_work.h"
#include "controller/dispatch/unneeded_work.h"
#include "rpc/grpc_status.h"

namespace llmctl::controller::dispatch {

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

StatusOr<bool> HubPreparations::Ensure(AgentLinks::Link& link, const std::string& model,
                                       int64_t experiment_id, MonotonicTime now) {
  ASSIGN_OR_RETURN(HubModelRef ref, ParseHubModelRef(model));
  Preparation* preparation = nullptr;
  std::shared_ptr<v1::Agent::Stub> stub;
  UnneededWork<Preparation> done;
  {
    MutexLock lock(core_.mutex);
    TakeUnneededWork(preparations_, now, done);
    std::unique_ptr<Preparation>& entry = preparations_[{link.name, HubModelRefText(ref)}];
    if (entry == nullptr) {
      entry = std::make_unique<Preparation>();
      entry->node = link.name;
      entry->model = HubModelRefText(ref);
    }
    preparation = entry.get();
    preparation->asked_at = now;
    switch (preparation->state) {
      case Preparation::State::kReady:
        return true;
      case Preparation::State::kRunning:
        preparation->experiments.insert(experiment_id);
        return false;
      case Preparation::State::kFailed:
        // The trials that waited for it fail with its error; a later experiment tries again.
        if (preparation->experiments.contains(experiment_id)) return preparation->failure;
        preparation->experiments.clear();
        break;
      case Preparation::State::kIdle:
        if (now < preparation->retry_at) {
          preparation->experiments.insert(experiment_id);
          return false;
        }
        break;
    }
    stub = link.stub;
    if (stub == nullptr) return false;
    preparation->experiments.insert(experiment_id);
    preparation->state = Preparation::State::kRunning;
  }
  // Not running: any earlier thread has finished its work.
  if (preparation->thread.joinable()) preparation->thread.join();
  spdlog::info("node {}: preparing {}", link.name, preparation->model);
  preparation->thread = std::thread(
      [this, preparation, stub = std::move(stub), ref] { Prepare(*preparation, stub, ref); });
  return false;
}

void HubPreparations::Prepare(Preparation& preparation, std::shared_ptr<v1::Agent::Stub> stub,
                              HubModelRef ref) {
  const DispatcherOptions& options = core_.options;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options.prepare_deadline);
  {
    MutexLock lock(core_.mutex);
    preparation.context = &context;
  }
  v1::PrepareHubModelRequest request;
  request.set_repo(ref.repo);
  request.set_revision(ref.revision);
  v1::PrepareHubModelResponse response;
  // Stop() may have cancelled the context before it was published: then this call is cut short by
  // the stopping flag instead.
  const grpc::Status prepared =
      core_.Stopping() ? grpc::Status(grpc::StatusCode::CANCELLED, "the controller is stopping")
                       : stub->PrepareHubModel(&context, request, &response);
  {
    MutexLock lock(core_.mutex);
    preparation.context = nullptr;
    if (prepared.ok()) {
      preparation.state = Preparation::State::kReady;
      preparation.backoff = std::chrono::milliseconds(0);
      spdlog::info("node {}: {} is ready ({} bytes in {})", preparation.node, preparation.model,
                   response.bytes(), response.path());
    } else if (IsPermanentPrepareFailure(prepared.error_code())) {
      preparation.state = Preparation::State::kFailed;
      preparation.failure = rpc::FromGrpcStatus(prepared).WithContext(
          "preparing " + preparation.model + " on node " + preparation.node);
      spdlog::warn("{}", preparation.failure.message());
    } else {
      preparation.state = Preparation::State::kIdle;
      preparation.backoff =
          NextBackoff(preparation.backoff, options.backoff_initial, options.backoff_max);
      preparation.retry_at = core_.clock.Monotonic() + preparation.backoff;
      spdlog::warn("node {}: preparing {} failed, trying again in {} ms: {}", preparation.node,
                   preparation.model, preparation.backoff.count(), prepared.error_message());
    }
  }
  core_.Wake();
}

void HubPreparations::Forget(const std::string& node, const std::string& model) {
  auto ref = ParseHubModelRef(model);
  if (!ref.ok()) return;
  MutexLock lock(core_.mutex);
  auto preparation = preparations_.find({node, HubModelRefText(*ref)});
  // One under way is left to end: its download brings the model back, and turned idle it would be
  // started again beside itself by a round that first waits for its thread to end.
  if (preparation != preparations_.end() &&
      preparation->second->state != Preparation::State::kRunning) {
    preparation->second->state = Preparation::State::kIdle;
  }
}

void HubPreparations::ForgetNode(const std::string& node) {
  MutexLock lock(core_.mutex);
  ForgetNodesWork(preparations_, node);
}

std::set<std::string> HubPreparations::NodesWith(const std::string& model) {
  std::set<std::string> nodes;
  auto ref = ParseHubModelRef(model);
  if (!ref.ok()) return nodes;
  const std::string text = HubModelRefText(*ref);
  MutexLock lock(core_.mutex);
  for (const auto& [key, preparation] : preparations_) {
    if (key.second == text && !preparation->forgotten &&
        (preparation->state == Preparation::State::kReady ||
         preparation->state == Preparation::State::kRunning)) {
      nodes.insert(key.first);
    }
  }
  return nodes;
}

int HubPreparations::Held() {
  MutexLock lock(core_.mutex);
  return static_cast<int>(preparations_.size());
}

int HubPreparations::InFlight() {
  MutexLock lock(core_.mutex);
  return RunningWork(preparations_);
}

void HubPreparations::Stop() {
  MutexLock lock(core_.mutex);
  const std::vector<Preparation*> preparations = CancelAllWork(preparations_);
  lock.Unlock();
  JoinWork(preparations);
}

}  // namespace llmctl::controller::dispatch
