#include "controller/cli/artifact_file.h"

#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

namespace llmctl::cli {

namespace fs = std::filesystem;

StatusOr<std::unique_ptr<ArtifactFile>> ArtifactFile::Begin(const fs::path& destination,
                                                            const v1::ArtifactChunk& first) {
  if (std::string problem = digest::RelativePathProblem(first.path()); !problem.empty()) {
    return DataLossError(
        "the controller sent an artifact path that is not a safe relative path: '" + first.path() +
        "' (" + problem + ")");
  }
  const fs::path target = destination / first.path();
  std::error_code error;
  fs::create_directories(target.parent_path(), error);
  if (error) {
    return FailedPreconditionError(target.parent_path().string() + ": " + error.message());
  }
  const fs::path part = target.string() + ".part";
  const int fd = ::open(part.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return FailedPreconditionError(part.string() + ": " + std::strerror(errno));
  return std::unique_ptr<ArtifactFile>(new ArtifactFile(
      first.path(), first.size(),
      std::make_unique<digest::VerifiedFileWriter>(first.path(), fd, part, target, first.size())));
}

}  // namespace llmctl::cli
