#include "controller/dispatch/launcher.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "common/model_config.h"
#include "common/trial_config.h"
#include "controller/submission.h"
#include "rpc/status.h"
#include "rpc/transfer.h"

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

Status Launcher::Launch(const store::TrialRecord& trial, AgentLinks::Link& link,
                        const std::vector<int64_t>& devices, store::Time now) {
  store::Store& store = shared_.store;
  const int64_t attempt = trial.current_attempt + 1;
  std::shared_ptr<v1::Agent::Stub> stub;
  {
    std::lock_guard lock(shared_.mutex);
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
  ASSIGN_OR_RETURN(auto inputs, store.GetInputs(trial.experiment_id));
  if (const std::string model = config.GetString("model"); IsHubModelRef(model)) {
    StatusOr<bool> ready = hub_models_.Ensure(link, model, trial.experiment_id, now);
    if (!ready.ok()) {
      // Preparing cannot succeed: running the trial anywhere would fail the same way.
      ASSIGN_OR_RETURN(int64_t started, store.StartAttempt(trial.id, link.name, now));
      RETURN_IF_ERROR(store.FinishAttempt(trial.id, started, store::TrialState::kFailed,
                                          std::nullopt, ready.status().message(), now));
      shared_.changes.Notify();
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
    ASSIGN_OR_RETURN(digest::InputTree tree, shared_.blobs.GetTree(tree_digest));
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
      ASSIGN_OR_RETURN(digest::InputTree tree, shared_.blobs.GetTree(trial.resume->tree));
      RETURN_IF_ERROR(EnsureBlobs(*stub, tree).WithContext("sending the checkpoint to resume"));
      *request.mutable_resume_from()->mutable_tree() = ToProto(tree);
    }
  }

  v1::RunState state;
  auto context = shared_.CallContext();
  const grpc::Status ran = stub->RunTrial(context.get(), request, &state);
  // The agent refuses the trial itself, or (for a resumed trial) no longer has its checkpoint:
  // running it again cannot help.
  const bool refused = ran.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
                       (trial.resume && ran.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  if (!ran.ok() && !refused) {
    if (const std::string model = config.GetString("model");
        IsHubModelRef(model) && ran.error_code() == grpc::StatusCode::NOT_FOUND) {
      // The agent lost its copy (a wiped cache): prepare it again.
      hub_models_.Forget(link.name, model);
    }
    return rpc::FromGrpcStatus(ran).WithContext("RunTrial");
  }
  ASSIGN_OR_RETURN(int64_t started, store.StartAttempt(trial.id, link.name, now, devices));
  if (!ran.ok()) {
    RETURN_IF_ERROR(store.FinishAttempt(trial.id, started, store::TrialState::kFailed, std::nullopt,
                                        "the agent refused it: " + ran.error_message(), now));
    shared_.changes.Notify();
    return Status::Ok();
  }
  spdlog::info("trial {} of experiment {}: attempt {} started on node {}", trial.name,
               trial.experiment_id, started, link.name);
  shared_.changes.Notify();
  return Status::Ok();
}

Status Launcher::EnsureBlobs(v1::Agent::Stub& stub, const digest::InputTree& tree) {
  const DispatcherOptions& options = shared_.options;
  v1::MissingBlobsRequest request;
  std::set<std::string> wanted;
  for (const digest::TreeFile& file : tree.files) {
    if (wanted.insert(file.sha256).second) request.add_sha256(file.sha256);
  }
  v1::MissingBlobsResponse missing;
  auto context = shared_.CallContext();
  RETURN_IF_ERROR(rpc::FromGrpcStatus(stub.MissingBlobs(context.get(), request, &missing)));
  for (const std::string& sha256 : missing.sha256()) {
    if (!wanted.contains(sha256))
      return InternalError("the agent asked for a blob it was not offered");
    const std::string path = shared_.blobs.PathOf(sha256);
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return DataLossError("blob " + sha256 + " is gone from " + path);
    const auto size =
        std::find_if(tree.files.begin(), tree.files.end(), [&](const digest::TreeFile& f) {
          return f.sha256 == sha256;
        })->size;
    grpc::ClientContext upload_context;
    upload_context.set_deadline(
        std::chrono::system_clock::now() +
        rpc::TransferDeadline(options.call_deadline, size, options.min_transfer_bytes_per_second));
    v1::UploadBlobResponse response;
    auto writer = stub.UploadBlob(&upload_context, &response);
    std::string buffer(static_cast<size_t>(options.upload_chunk_bytes), '\0');
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

}  // namespace llmctl::controller::dispatch
