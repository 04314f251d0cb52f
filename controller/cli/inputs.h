// What `llmctl submit` sends besides the file's text: the trees of every local file or directory a
// trial reads, and the blobs the controller does not have yet.
#ifndef LLMCTL_CONTROLLER_CLI_INPUTS_H_
#define LLMCTL_CONTROLLER_CLI_INPUTS_H_

#include <filesystem>
#include <map>
#include <string>
#include <string_view>

#include "common/experiment.h"
#include "common/status.h"
#include "llmctl/v1/controller.grpc.pb.h"

namespace llmctl::cli {

// Upload chunk size (the proto's limit is "≤ 1 MiB").
inline constexpr size_t kBlobChunkBytes = 1 << 20;

struct SubmitInputs {
  std::map<std::string, v1::InputTree> trees;          // path as written in the file -> its tree
  std::map<std::string, std::filesystem::path> blobs;  // sha256 -> a local file with those bytes
};

// For every trial of `as_written` (parsed with resolve_local_paths = false, so values are as the
// file writes them) and every input path value (IsInputPathValue), the tree of what it names on
// this machine (ResolveLocalPath against `filename`); values that name nothing here are left to
// the controller and the agent (a preset, a directory on the node). Each file is hashed once.
// Errors from InputTreeBuilder, prefixed with the key and the path as written.
StatusOr<SubmitInputs> CollectInputs(const Experiment& as_written, std::string_view filename);

struct UploadSummary {
  int blobs = 0;      // distinct blobs in the inputs
  int uploaded = 0;   // those the controller lacked
  int64_t bytes = 0;  // bytes uploaded
};

// Asks MissingBlobs for `blobs` and uploads only what is missing, in chunks of kBlobChunkBytes (the
// first message carries sha256 and size). Each upload's deadline is kCallDeadline plus the blob's
// size at `min_bytes_per_second` (rpc::TransferDeadline).
StatusOr<UploadSummary> UploadMissingBlobs(
    v1::Controller::StubInterface& stub, const std::map<std::string, std::filesystem::path>& blobs,
    int64_t min_bytes_per_second);

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_INPUTS_H_
