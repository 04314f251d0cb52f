#include "controller/controller_service.h"

#include <spdlog/spdlog.h>

#include <exception>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "common/digest/digest.h"
#include "common/foreign_json.h"
#include "common/version.h"
#include "controller/submission.h"
#include "rpc/blob_stream.h"
#include "rpc/grpc_status.h"
#include "rpc/version_check.h"

namespace llmctl::controller {

using nlohmann::json;

grpc::Status ControllerService::Guard(grpc::ServerContext* context, std::string_view method,
                                      const std::function<Status()>& body) const {
  rpc::AnnounceVersion(*context, kVersion);
  if (!api_token_.empty()) {
    grpc::Status authenticated = rpc::CheckBearerToken(context->client_metadata(), api_token_);
    if (authenticated.ok()) {
      authenticated = rpc::CheckClientVersion(context->client_metadata(), kVersion);
    }
    if (!authenticated.ok()) {
      spdlog::warn("{} from {}: refused: {}", method, context->peer(),
                   authenticated.error_message());
      return authenticated;
    }
  }
  try {
    return rpc::ToGrpcStatus(body());
  } catch (const std::exception& e) {
    spdlog::error("{}: unexpected exception: {}", method, e.what());
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string(method) + ": " + e.what());
  }
}

namespace {

digest::InputTree FromProto(const v1::InputTree& tree) {
  digest::InputTree spec{.digest = tree.digest(), .files = {}, .is_file = tree.is_file()};
  for (const v1::TreeFile& file : tree.files()) {
    spec.files.push_back({file.path(), file.sha256(), file.size()});
  }
  return spec;
}

}  // namespace

ControllerService::ControllerService(store::Store& store, const BlobStore& blobs,
                                     SecretsFile& secrets, const rpc::CertificateAuthority& ca,
                                     Dispatcher& dispatcher, const ChangeNotifier& changes,
                                     const Clock& clock, std::string api_token,
                                     rpc::TlsIdentity controller_identity)
    : store_(store),
      blobs_(blobs),
      secrets_(secrets),
      ca_(ca),
      dispatcher_(dispatcher),
      changes_(changes),
      clock_(clock),
      api_token_(std::move(api_token)),
      controller_identity_(std::move(controller_identity)) {}

grpc::Status ControllerService::MissingBlobs(grpc::ServerContext* context,
                                             const v1::MissingBlobsRequest* request,
                                             v1::MissingBlobsResponse* response) {
  return Guard(context, "MissingBlobs", [&]() -> Status {
    const std::vector<std::string> wanted(request->sha256().begin(), request->sha256().end());
    ASSIGN_OR_RETURN(std::vector<std::string> missing, blobs_.Missing(wanted));
    for (std::string& sha256 : missing) response->add_sha256(std::move(sha256));
    return Status::Ok();
  });
}

grpc::Status ControllerService::UploadBlob(grpc::ServerContext* context,
                                           grpc::ServerReader<v1::BlobChunk>* reader,
                                           v1::UploadBlobResponse* response) {
  return Guard(context, "UploadBlob", [&]() -> Status {
    ASSIGN_OR_RETURN(v1::BlobChunk first, rpc::ReadFirstBlobChunk(*reader));
    response->set_sha256(first.sha256());
    if (const std::optional<int64_t> held = blobs_.HeldBytes(first.sha256())) {
      response->set_already_present(true);
      return rpc::DrainHeldBlob(*reader, first, *held);
    }
    // The blob's room stays promised until `writer` goes, right after the blob is committed or
    // abandoned.
    ASSIGN_OR_RETURN(std::unique_ptr<BlobWriter> writer,
                     blobs_.BeginWrite(first.sha256(), first.size()));
    return rpc::ReceiveBlob(*reader, std::move(first), writer->file());
  });
}

grpc::Status ControllerService::Submit(grpc::ServerContext* context,
                                       const v1::SubmitRequest* request,
                                       v1::SubmitResponse* response) {
  return Guard(context, "Submit", [&]() -> Status {
    std::map<std::string, digest::InputTree> inputs;
    for (const auto& [path, tree] : request->inputs()) {
      if (path.empty()) return InvalidArgumentError("submit: an input has an empty path");
      inputs[path] = FromProto(tree);
    }
    ASSIGN_OR_RETURN(
        store::NewExperiment experiment,
        PrepareSubmission(request->yaml_text(), request->filename(), inputs, blobs_,
                          {request->only_trials().begin(), request->only_trials().end()}));
    std::map<std::string, json> predictions;
    for (const auto& [name, prediction] : request->predictions()) {
      predictions[name] = {{"peak_bytes", prediction.peak_bytes()},
                           {"activation_bytes", prediction.activation_bytes()},
                           {"model_state_bytes", prediction.model_state_bytes()},
                           {"peak_phase", prediction.peak_phase()},
                           {"device_memory_bytes", prediction.device_memory_bytes()},
                           {"verdict", prediction.verdict()}};
      if (prediction.step_seconds() > 0) {
        json& p = predictions[name];
        p["step_seconds"] = prediction.step_seconds();
        p["tokens_per_second"] = prediction.tokens_per_second();
        p["trial_seconds"] = prediction.trial_seconds();
        p["time_device"] = prediction.time_device();
        p["calibration"] = prediction.calibration();
        p["work"] = ParseForeignJson(prediction.work_json());
        if (prediction.pace_seconds() != 0) p["pace_seconds"] = prediction.pace_seconds();
      }
    }
    RETURN_IF_ERROR(AttachPredictions(predictions, experiment));
    for (const auto& [path, tree] : inputs) {
      RETURN_IF_ERROR(blobs_.PutTree(tree).WithContext("input '" + path + "'"));
    }
    ASSIGN_OR_RETURN(int64_t id, store_.CreateExperiment(experiment, clock_.Now()));
    spdlog::info("experiment {} ({}, {} trials) submitted from {}", id, experiment.name,
                 experiment.trials.size(), experiment.filename);
    response->set_experiment_id(id);
    response->set_name(experiment.name);
    for (const store::NewTrial& trial : experiment.trials) response->add_trials(trial.name);
    dispatcher_.Wake();
    return Status::Ok();
  });
}

}  // namespace llmctl::controller
