// `llmctl fetch`'s receiving end: one trial artifact as the controller streams it (FetchArtifacts'
// ArtifactChunk messages), written to disk as it arrives and checked before it gets its name.
#ifndef LLMCTL_CONTROLLER_CLI_ARTIFACT_FILE_H_
#define LLMCTL_CONTROLLER_CLI_ARTIFACT_FILE_H_

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "common/digest/verified_file.h"
#include "common/status.h"
#include "llmctl/v1/controller.pb.h"

namespace llmctl::cli {

// One artifact file as it arrives: written to "<path>.part", renamed to its name once its size and
// sha256 check out, removed otherwise. Artifacts can be checkpoints of many GiB: nothing is held in
// memory.
class ArtifactFile {
 public:
  // The file `first` (the file's first chunk) opens, under `destination`; DataLoss when the
  // controller names a path that is not a run's artifact (digest::RunArtifactPathProblem: a plain
  // relative path under output/, or a top-level log); FailedPrecondition when a directory on the
  // way below `destination` is a symbolic link, or the file cannot be made; ResourceExhausted when
  // its announced size does not fit on that disk. "<path>.part" is created afresh, never through a
  // link.
  static StatusOr<std::unique_ptr<ArtifactFile>> Begin(const std::filesystem::path& destination,
                                                       const v1::ArtifactChunk& first);

  // DataLoss when more than the announced size arrives; FailedPrecondition when the file cannot be
  // written (a full disk).
  Status Append(std::string_view data);
  Status Finish(const std::string& expected_sha256) { return writer_->Commit(expected_sha256); }

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }

 private:
  ArtifactFile(std::string path, int64_t size, std::unique_ptr<digest::VerifiedFileWriter> writer)
      : path_(std::move(path)), size_(size), writer_(std::move(writer)) {}

  const std::string path_;  // as the controller named it
  const int64_t size_;
  const std::unique_ptr<digest::VerifiedFileWriter> writer_;
};

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_ARTIFACT_FILE_H_
