#include "controller/cli/artifact_file.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

#include "common/files.h"

namespace llmctl::cli {

namespace {

namespace fs = std::filesystem;

// Makes the directories of `relative`'s parent below `destination`, keeping those that are there
// when they are real directories: a symbolic link planted among them (output -> ~/.ssh) would
// take the download elsewhere, so it is refused.
Status MakeDirectoriesBelow(const fs::path& destination, const fs::path& relative) {
  fs::path dir = destination;
  for (const fs::path& part : relative.parent_path()) {
    dir /= part;
    if (::mkdir(dir.c_str(), 0755) == 0) continue;
    if (errno != EEXIST) return FailedPreconditionError(dir.string() + ": " + std::strerror(errno));
    struct stat info;
    if (::lstat(dir.c_str(), &info) != 0) {
      return FailedPreconditionError(dir.string() + ": " + std::strerror(errno));
    }
    if (S_ISLNK(info.st_mode)) {
      return FailedPreconditionError(dir.string() +
                                     ": a symbolic link; llmctl fetch writes only into real "
                                     "directories below " +
                                     destination.string());
    }
    if (!S_ISDIR(info.st_mode)) return FailedPreconditionError(dir.string() + ": not a directory");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<ArtifactFile>> ArtifactFile::Begin(const fs::path& destination,
                                                            const v1::ArtifactChunk& first) {
  if (std::string problem = digest::RunArtifactPathProblem(first.path()); !problem.empty()) {
    return DataLossError("the controller sent artifact '" + first.path() +
                         "', which is not a trial's artifact: " + problem);
  }
  std::error_code error;
  fs::create_directories(destination, error);  // the user's own choice, links and all
  if (error) return FailedPreconditionError(destination.string() + ": " + error.message());
  RETURN_IF_ERROR(MakeDirectoriesBelow(destination, first.path()));
  const fs::path target = destination / first.path();
  // A checkpoint may be tens of GiB: one that cannot fit is refused before its first byte.
  RETURN_IF_ERROR(CheckRoomFor(first.path(), target.parent_path().string(), first.size()));
  const fs::path part = target.string() + ".part";
  // A .part left by an interrupted fetch, or a link planted in its place, is removed, not written
  // through: the file is made afresh (O_EXCL), and O_NOFOLLOW refuses a link that appears
  // meanwhile.
  if (::unlink(part.c_str()) != 0 && errno != ENOENT) {
    return FailedPreconditionError(part.string() + ": " + std::strerror(errno));
  }
  const int fd = ::open(part.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return FailedPreconditionError(part.string() + ": " + std::strerror(errno));
  return std::unique_ptr<ArtifactFile>(new ArtifactFile(
      first.path(), first.size(),
      std::make_unique<digest::VerifiedFileWriter>(first.path(), fd, part, target, first.size())));
}

Status ArtifactFile::Append(std::string_view data) {
  const Status appended = writer_->Append(data);
  // The write's error is this machine's (a full disk), never the controller's: its Unavailable
  // would have llmctl ask whether the controller is running.
  if (appended.code() == StatusCode::kUnavailable) {
    return FailedPreconditionError(appended.message());
  }
  return appended;
}

}  // namespace llmctl::cli
