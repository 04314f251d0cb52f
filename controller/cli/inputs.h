// What `llmctl submit` sends besides the file's text: the trees of every local file or directory a
// trial reads, and the blobs the controller does not have yet.
#ifndef LLMCTL_CONTROLLER_CLI_INPUTS_H_
#define LLMCTL_CONTROLLER_CLI_INPUTS_H_

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/experiment.h"
#include "common/status.h"
#include "controller/cli/input_tree.h"
#include "llmctl/v1/controller.grpc.pb.h"

namespace llmctl::cli {

// Upload chunk size (the proto's limit is "≤ 1 MiB").
inline constexpr size_t kBlobChunkBytes = 1 << 20;

struct SubmitInputs {
  std::map<std::string, v1::InputTree> trees;  // path as written in the file -> its tree
  std::map<std::string, HashedFile> blobs;     // sha256 -> a local file with those bytes
  // One line per input directory whose hidden entries (.git, .env) were left out, naming them.
  std::vector<std::string> notices;
};

// For every trial of `as_written` (parsed with resolve_local_paths = false, so values are as the
// file writes them) and every input path value (IsInputPathValue), the tree of what it names on
// this machine (ResolveLocalPath against `filename`). Each file is hashed once. NotFound when such
// a value names nothing here (a path on the node is written node:/abs/path and is not an input
// path value); errors from InputTreeBuilder, prefixed with the trial, the key and the path as
// written, and so are the notices of hidden entries it left out.
StatusOr<SubmitInputs> CollectInputs(const Experiment& as_written, std::string_view filename);

// What CollectInputs would refuse, and nothing else: the same walk, with no file's bytes read
// (FileContents::kWalkedOnly). For a file that is written and not sent (plan --write).
Status CheckInputPaths(const Experiment& as_written, std::string_view filename);

// Checks the contents of every local input of every trial of `checked` (parsed with
// resolve_local_paths = true) as llm-train will read them (TrialInputsChecker): records parsed and
// counted, tokenizer loaded, model config and safetensors headers read, not the weights. Errors
// name the experiment file, the trial, the key and the input's file and line.
Status CheckLocalInputs(const Experiment& checked, std::string_view filename);

// OK when `request` (its ByteSizeLong) fits in the one message the controller receives
// (rpc::kDefaultMaxReceiveBytes); else InvalidArgument naming `filename`, the request's size, its
// input files' count and the limit. Checked before anything is uploaded or provisioned: a request
// of 30,000 files was refused by the controller only after every upload. MissingBlobs asks for
// fewer bytes than this request holds (each blob's sha256 once, against each file's sha256,
// size and path), so it fits when this does.
Status CheckSubmitRequestFits(const v1::SubmitRequest& request, std::string_view filename);

struct UploadSummary {
  int blobs = 0;      // distinct blobs in the inputs
  int uploaded = 0;   // those the controller lacked
  int64_t bytes = 0;  // bytes uploaded
};

// Asks MissingBlobs for `blobs` and uploads only what is missing, in chunks of kBlobChunkBytes (the
// first message carries sha256 and size). Each file is sent only when it is still the file that
// was hashed (OpenHashedFile); else FailedPrecondition naming it, and nothing more is sent. Each
// upload's deadline is kCallDeadline plus the blob's size at `min_bytes_per_second`
// (rpc::TransferDeadline).
StatusOr<UploadSummary> UploadMissingBlobs(v1::Controller::StubInterface& stub,
                                           const std::map<std::string, HashedFile>& blobs,
                                           int64_t min_bytes_per_second);

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_INPUTS_H_
