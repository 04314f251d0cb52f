#include "agent/artifact_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <string_view>

#include "common/files.h"
#include "common/rank_files.h"

namespace llmctl::agent {

namespace fs = std::filesystem;

// The regular files under `dir` (symbolic links are not followed), relative to `relative_to`,
// sorted.
std::vector<std::string> FilesBelow(const std::string& dir, const std::string& relative_to) {
  std::vector<std::string> paths;
  std::error_code error;
  for (auto it = fs::recursive_directory_iterator(dir, error);
       !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (it->is_regular_file(error) && !it->is_symlink(error)) {
      paths.push_back(fs::relative(it->path(), relative_to, error).string());
    }
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

std::vector<std::string> FilesBelow(const std::string& dir) { return FilesBelow(dir, dir); }

// `path` (absolute, or relative to the run's directory) as a directory inside the run's output
// directory: only what the worker wrote may be fetched this way, never the agent's other files.
StatusOr<std::string> OutputSubdirectory(const std::string& run_dir, const std::string& path) {
  const std::string output = run_dir + "/output";
  const std::string inside = PathInside((fs::path(run_dir) / path).string(), output);
  if (inside.empty()) {
    return InvalidArgumentError(path + " is not inside the run's output directory");
  }
  const std::string wanted = output + "/" + inside;
  std::error_code error;
  if (!fs::is_directory(wanted, error)) {
    return NotFoundError(path + " is not a directory of the run (gone?)");
  }
  return wanted;
}

// Up to `wanted` bytes of `fd` into `buffer`: fewer only at the end of the file or on an error.
int64_t ReadFull(int fd, char* buffer, int64_t wanted) {
  int64_t got = 0;
  while (got < wanted) {
    const ssize_t n = ::read(fd, buffer + got, static_cast<size_t>(wanted - got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += n;
  }
  return got;
}

// `root`/`path` opened for reading when it is a regular file that lies inside `root`: the file is
// opened without following a final link, and the path the kernel gives the open descriptor is
// checked, so no link, ".." or directory swapped in since the listing takes the read elsewhere.
// Invalid when it is not such a file (or was removed meanwhile); `size` is its size then.
UniqueFd OpenArtifact(const std::string& root, const std::string& path, int64_t& size) {
  UniqueFd fd(::open((root + "/" + path).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  struct stat info;
  if (!fd.valid() || ::fstat(fd.get(), &info) != 0 || !S_ISREG(info.st_mode)) return UniqueFd();
  std::error_code error;
  const fs::path opened = fs::read_symlink("/proc/self/fd/" + std::to_string(fd.get()), error);
  if (error || PathInside(opened.string(), root).empty()) return UniqueFd();
  size = static_cast<int64_t>(info.st_size);
  return fd;
}

// Whether the path (relative to the run directory) lies in a checkpoint still being written, or
// left half written by a failed or killed run: llm-train writes output/checkpoints/step-<N>.tmp and
// renames it step-<N> once whole (trainer/train/checkpoints.h).
bool InCheckpointStaging(std::string_view path) {
  constexpr std::string_view kCheckpoints = "output/checkpoints/";
  if (!path.starts_with(kCheckpoints)) return false;
  const std::string_view below = path.substr(kCheckpoints.size());
  const size_t slash = below.find('/');
  if (slash == std::string_view::npos) return false;
  const std::string_view dir = below.substr(0, slash);
  return dir.starts_with("step-") && dir.ends_with(".tmp");
}

// The run's artifacts: every regular file under output/ but checkpoints being written, then the
// logs, as paths relative to the run directory.
std::vector<std::string> ArtifactPaths(const std::string& run_dir, const RunRanks& ranks) {
  std::vector<std::string> paths = FilesBelow((fs::path(run_dir) / "output").string(), run_dir);
  std::erase_if(paths, [](const std::string& path) { return InCheckpointStaging(path); });
  std::error_code error;
  for (const char* log : {"trial.yaml", kEventsFile, "stdout.log", "stderr.log"}) {
    if (fs::is_regular_file(fs::path(run_dir) / log, error)) paths.push_back(log);
  }
  // A multi-rank run's other ranks' events on this node (global ranks) and the launcher's record.
  for (int rank = std::max(1, ranks.first); rank < ranks.first + ranks.count; ++rank) {
    const std::string events = RankEventsFile(rank);
    if (fs::is_regular_file(fs::path(run_dir) / events, error)) paths.push_back(events);
  }
  if (fs::is_regular_file(fs::path(run_dir) / "ranks.json", error)) paths.push_back("ranks.json");
  return paths;
}

}  // namespace llmctl::agent
