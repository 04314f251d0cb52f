#include "common/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <string_view>

#include "common/files.h"

namespace llmctl {
namespace {

std::atomic<uint64_t> g_temp_counter{0};

Status ErrnoError(int error, const std::string& what) {
  return UnavailableError(what + ": " + std::strerror(error));
}

// Whether `text` is one or more decimal digits.
bool AllDigits(std::string_view text) {
  return !text.empty() && text.find_first_not_of("0123456789") == std::string_view::npos;
}

// The <pid> of `name` when it is "<base>.tmp.<pid>.<n>", as WriteFileAtomically names its
// temporaries: "" when it is not one.
std::string_view WriterOf(std::string_view name, std::string_view base) {
  const std::string_view marker = ".tmp.";
  if (name.size() <= base.size() + marker.size() || !name.starts_with(base) ||
      name.substr(base.size(), marker.size()) != marker) {
    return {};
  }
  const std::string_view numbers = name.substr(base.size() + marker.size());
  const size_t dot = numbers.find('.');
  if (dot == std::string_view::npos || !AllDigits(numbers.substr(0, dot)) ||
      !AllDigits(numbers.substr(dot + 1))) {
    return {};
  }
  return numbers.substr(0, dot);
}

// Whether no process of this machine has the pid `digits` (one too large for a pid has none).
bool NoProcessHas(std::string_view digits) {
  pid_t pid = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
  if (error == std::errc::result_out_of_range) return true;
  if (error != std::errc() || end != digits.data() + digits.size() || pid <= 0) return false;
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

// The last component of `path`: the file's name in its directory.
std::string NameOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The directory `path` is in: "." for a bare name, "/" for a file at the root.
std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

std::string AtomicWriteTemporaryName(const std::string& path) {
  return path + ".tmp." + std::to_string(::getpid()) + "." +
         std::to_string(g_temp_counter.fetch_add(1));
}

StatusOr<int> RemoveAtomicWriteLeftovers(const std::string& path) {
  const std::string base = NameOf(path);
  return RemoveLeftoverFiles(DirectoryOf(path),
                             [&](std::string_view name) { return !WriterOf(name, base).empty(); });
}

StatusOr<int> RemoveAtomicWriteLeftoversOfEndedWriters(const std::string& path) {
  const std::string base = NameOf(path);
  return RemoveLeftoverFiles(DirectoryOf(path), [&](std::string_view name) {
    const std::string_view writer = WriterOf(name, base);
    return !writer.empty() && NoProcessHas(writer);
  });
}

Status WriteAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return UnavailableError(std::strerror(errno));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status WriteFileAtomically(const std::string& path, const std::function<Status(int fd)>& write) {
  const std::string tmp = AtomicWriteTemporaryName(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "cannot create " + tmp);
  Status status = write(fd);
  // fsync before rename: otherwise a crash can leave the new name pointing at unwritten blocks.
  if (status.ok() && ::fsync(fd) != 0) status = ErrnoError(errno, "fsync");
  if (::close(fd) != 0 && status.ok()) status = ErrnoError(errno, "close");
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = ErrnoError(errno, "rename to " + path);
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return Status(status.code(), "cannot write " + path + ": " + status.message());
  }
  // Until the directory is synced, a power loss can bring back the old file (a node's old token)
  // although this call said the new one was written.
  return SyncDirectoryOf(path).WithContext("cannot write " + path);
}

Status SyncDirectoryOf(const std::string& path) {
  const std::string dir = DirectoryOf(path);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return ErrnoError(errno, "open " + dir + " to sync it");
  const bool synced = ::fsync(dir_fd) == 0;
  const int sync_error = errno;
  ::close(dir_fd);
  if (!synced) return ErrnoError(sync_error, "fsync " + dir);
  return Status::Ok();
}

}  // namespace llmctl
