#include "controller/cli/inputs.h"

#include <sys/stat.h>
#include <unistd.h>

#include <set>
#include <vector>

#include "common/files.h"
#include "common/inputs/trial_inputs.h"
#include "common/text.h"
#include "common/trial_keys.h"
#include "controller/cli/client.h"
#include "controller/cli/input_tree.h"
#include "rpc/blob_stream.h"
#include "rpc/connection.h"
#include "rpc/grpc_status.h"
#include "rpc/transfer.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

// A notice of hidden entries left out names at most this many.
constexpr size_t kHiddenNamesShown = 10;

Status UploadBlob(v1::Controller::StubInterface& stub, const std::string& sha256,
                  const HashedFile& file, int64_t min_bytes_per_second, int64_t& bytes_sent) {
  struct stat info {};
  // The file that was hashed, or a refusal naming it: never what a link swapped in leads to.
  ASSIGN_OR_RETURN(const UniqueFd fd, OpenHashedFile(file, info));
  const auto size = static_cast<int64_t>(info.st_size);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       rpc::TransferDeadline(kCallDeadline, size, min_bytes_per_second));
  v1::UploadBlobResponse response;
  std::unique_ptr<grpc::ClientWriterInterface<v1::BlobChunk>> writer =
      stub.UploadBlob(&context, &response);
  const Status sent =
      rpc::SendBlob(*writer, context, {.sha256 = sha256, .size = size, .fd = fd.get()},
                    kBlobChunkBytes, &bytes_sent);
  return sent.WithContext("uploading " + file.path.string());
}

// CollectInputs with `builder`.
StatusOr<SubmitInputs> CollectInputsWith(const Experiment& as_written, std::string_view filename,
                                         InputTreeBuilder& builder) {
  SubmitInputs inputs;
  std::set<std::string> looked_at;
  for (const Trial& trial : as_written.trials) {
    for (const KeySpec& spec : TrialKeys()) {
      if (spec.type != KeyType::kPath && spec.name != "model") continue;
      const std::string written = trial.config.GetString(spec.name);
      if (written.empty() || !IsInputPathValue(spec, written)) continue;
      if (!looked_at.insert(written).second) continue;
      const fs::path local = ResolveLocalPath(filename, written);
      std::error_code error;
      if (!fs::exists(fs::symlink_status(local, error))) {
        return NotFoundError(std::string(filename) + ": trial '" + OnOneLine(trial.name) + "', " +
                             std::string(spec.name) + " '" + OnOneLine(written) +
                             "': no such file or directory here (beside the experiment file or "
                             "in the current directory); a path on the node is written " +
                             std::string(kNodePathPrefix) + "/absolute/path");
      }
      std::vector<std::string> hidden;
      StatusOr<v1::InputTree> tree = builder.Build(local, &hidden);
      // The path as written names a directory of the user's, whose name may hold anything, and
      // the trial's name may be made of it (a sweep over `model:`): both printable, on one line.
      const std::string where = std::string(filename) + ": trial '" + OnOneLine(trial.name) +
                                "', " + std::string(spec.name) + " '" + OnOneLine(written) + "': ";
      if (!tree.ok()) return Status(tree.status().code(), where + tree.status().message());
      if (!hidden.empty()) {
        std::string names;
        for (size_t i = 0; i < hidden.size() && i < kHiddenNamesShown; ++i) {
          // A hidden name is the user's file's, whatever it holds: a line break or an escape would
          // forge or recolour the terminal's lines.
          names.append(i == 0 ? "" : ", ").append(OnOneLine(hidden[i]));
        }
        if (hidden.size() > kHiddenNamesShown) {
          names += " and " + std::to_string(hidden.size() - kHiddenNamesShown) + " more";
        }
        inputs.notices.push_back(where + "left out " + std::to_string(hidden.size()) +
                                 " hidden entries: " + names +
                                 " (a hidden file or directory is sent only when the experiment "
                                 "file names it)");
      }
      inputs.trees.emplace(written, std::move(*tree));
    }
  }
  inputs.blobs = builder.blobs();
  return inputs;
}

}  // namespace

StatusOr<SubmitInputs> CollectInputs(const Experiment& as_written, std::string_view filename) {
  InputTreeBuilder builder(FileContents::kHashed);
  return CollectInputsWith(as_written, filename, builder);
}

Status CheckInputPaths(const Experiment& as_written, std::string_view filename) {
  InputTreeBuilder builder(FileContents::kWalkedOnly);
  return CollectInputsWith(as_written, filename, builder).status();
}

Status CheckLocalInputs(const Experiment& checked, std::string_view filename) {
  TrialInputsChecker checker;
  std::map<std::string, StatusOr<ModelConfig>> models;
  for (const Trial& trial : checked.trials) {
    const std::string& model_name = trial.config.settings().model.name;
    const ModelConfig* model = nullptr;
    // BLIP-2 (its data imagefolder, as parsing checked) has no LLaMA shape to check inputs against.
    const bool blip2 = trial.config.settings().data.format == trial::DataFormat::kImagefolder;
    if (!blip2 && !IsHubModelRef(model_name) && !IsNodePath(model_name)) {
      auto it = models.find(model_name);
      if (it == models.end()) it = models.emplace(model_name, ResolveModel(model_name)).first;
      // Parsing resolved it already; a failure here is a file that changed meanwhile.
      if (!it->second.ok()) return it->second.status().WithContext(std::string(filename));
      model = &*it->second;
    }
    StatusOr<TrialInputsSummary> summary = checker.Check(trial.config, model);
    if (!summary.ok()) {
      return Status(summary.status().code(), std::string(filename) + ": trial '" + trial.name +
                                                 "': " + summary.status().message());
    }
  }
  return Status::Ok();
}

Status CheckSubmitRequestFits(const v1::SubmitRequest& request, std::string_view filename) {
  const size_t bytes = request.ByteSizeLong();
  constexpr auto kLimit = static_cast<size_t>(rpc::kDefaultMaxReceiveBytes);
  if (bytes <= kLimit) return Status::Ok();
  int64_t files = 0;
  for (const auto& [written, tree] : request.inputs()) files += tree.files_size();
  // The user's inputs, as they are, cannot be sent: theirs to change (exit 2).
  return InvalidArgumentError(
      std::string(filename)
          .append(": the submit request would be ")
          .append(std::to_string(bytes))
          .append(" bytes for its ")
          .append(std::to_string(files))
          .append(" input files in ")
          .append(std::to_string(request.inputs_size()))
          .append(" trees, over the controller's limit of ")
          .append(std::to_string(kLimit))
          .append(" bytes (4 MiB) per message; nothing was uploaded or provisioned. Pack many "
                  "small files into fewer (one JSON Lines file, say), or shorten their paths"));
}

StatusOr<UploadSummary> UploadMissingBlobs(v1::Controller::StubInterface& stub,
                                           const std::map<std::string, HashedFile>& blobs,
                                           int64_t min_bytes_per_second) {
  UploadSummary summary;
  summary.blobs = static_cast<int>(blobs.size());
  if (blobs.empty()) return summary;
  v1::MissingBlobsRequest request;
  for (const auto& [sha256, path] : blobs) request.add_sha256(sha256);
  v1::MissingBlobsResponse missing;
  RETURN_IF_ERROR(rpc::FromGrpcStatus(stub.MissingBlobs(UnaryContext().get(), request, &missing))
                      .WithContext("asking which inputs the controller lacks"));
  for (const std::string& sha256 : missing.sha256()) {
    auto it = blobs.find(sha256);
    if (it == blobs.end()) {
      return InternalError("the controller asked for blob " + sha256 + ", which was not offered");
    }
    RETURN_IF_ERROR(UploadBlob(stub, sha256, it->second, min_bytes_per_second, summary.bytes));
    ++summary.uploaded;
  }
  return summary;
}

}  // namespace llmctl::cli
