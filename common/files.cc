#include "common/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <vector>

#include "common/atomic_file.h"
#include "common/byte_size.h"
#include "common/checked_math.h"
#include "common/errno_status.h"
#include "common/text.h"

namespace llmctl {
namespace {

std::string_view FileTypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a named pipe (FIFO)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISREG(mode)) return "a regular file";
  return "a file of an unknown type";
}

// True when group `gid` is this user's private group (named after the user, no other members):
// a directory writable by it is writable by no one else.
bool IsPrivateGroup(gid_t gid) {
  std::vector<char> buffer(16384);
  struct passwd user {};
  struct passwd* found_user = nullptr;
  if (::getpwuid_r(::geteuid(), &user, buffer.data(), buffer.size(), &found_user) != 0 ||
      found_user == nullptr || found_user->pw_name == nullptr || *found_user->pw_name == '\0') {
    return false;
  }
  const std::string name = found_user->pw_name;
  struct group entry {};
  struct group* found = nullptr;
  if (::getgrgid_r(gid, &entry, buffer.data(), buffer.size(), &found) != 0 || found == nullptr) {
    return false;
  }
  if (found->gr_name == nullptr || name != found->gr_name) return false;
  for (char** member = found->gr_mem; member != nullptr && *member != nullptr; ++member) {
    if (name != *member) return false;
  }
  return true;
}

Status DirectoryRefusal(const std::string& dir, std::string_view reason) {
  return FailedPreconditionError(std::string(dir).append(": ").append(reason));
}

std::string OctalMode(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof(text), "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

// Makes `dir` with `mode` and the missing directories above it; `info` describes what is at `dir`
// then. One that another process made meanwhile is described as it is, to be checked as one that
// was there.
Status MakeDirectory(const std::string& dir, mode_t mode, struct stat& info) {
  const std::filesystem::path parent = std::filesystem::path(dir).parent_path();
  if (!parent.empty()) {
    std::error_code error;
    std::filesystem::create_directories(parent, error);
    if (error) return DirectoryRefusal(dir, std::string("cannot create: ").append(error.message()));
  }
  const bool made = ::mkdir(dir.c_str(), mode) == 0;
  if (!made && errno != EEXIST) {
    return DirectoryRefusal(dir, std::string("cannot create: ").append(std::strerror(errno)));
  }
  if (::lstat(dir.c_str(), &info) != 0) {
    return DirectoryRefusal(dir, std::string("cannot create: ").append(std::strerror(errno)));
  }
  // The umask narrowed what mkdir made; only a directory made here is changed.
  if (made && S_ISDIR(info.st_mode) && (info.st_mode & mode) != mode) {
    const mode_t wanted = (info.st_mode & 07777) | mode;
    if (::chmod(dir.c_str(), wanted) != 0) {
      return DirectoryRefusal(dir, std::string("cannot make it mode ")
                                       .append(OctalMode(mode))
                                       .append(": ")
                                       .append(std::strerror(errno)));
    }
    info.st_mode = (info.st_mode & ~mode_t{07777}) | wanted;
  }
  return Status::Ok();
}

// O_NONBLOCK: opening a FIFO would otherwise wait for a writer, and reading /dev/zero would never
// end; for a regular file the flag changes nothing.
StatusOr<UniqueFd> OpenRegular(int dir_fd, const std::string& path, const std::string& shown,
                               struct stat& st, bool follow_links) {
  UniqueFd fd(::openat(dir_fd, path.c_str(),
                       O_RDONLY | O_CLOEXEC | O_NONBLOCK | (follow_links ? 0 : O_NOFOLLOW)));
  if (!fd.valid()) {
    if (errno == ELOOP && !follow_links) {
      return InvalidArgumentError(shown + " is a symbolic link, not a regular file");
    }
    return ErrnoStatus(errno, "cannot open " + shown);
  }
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "cannot stat " + shown);
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgumentError(shown + " is " + std::string(FileTypeName(st.st_mode)) +
                                ", not a regular file");
  }
  return fd;
}

// A live mapping as the SIGBUS handler sees it. `begin` is 0 while the slot is free; it is set
// last and cleared first, so that the handler never reads a half-made entry. Lock-free atomics: a
// signal handler may read them.
struct FaultSlot {
  std::atomic<bool> taken{false};
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<const char*> message{nullptr};
  std::atomic<size_t> message_size{0};
};
static_assert(std::atomic<uintptr_t>::is_always_lock_free &&
              std::atomic<size_t>::is_always_lock_free &&
              std::atomic<const char*>::is_always_lock_free);

// More files than any trainer maps at once (a 405B model has 191 shards).
constexpr size_t kFaultSlots = 4096;
std::array<FaultSlot, kFaultSlots> g_fault_slots;

// Set once by ReportShrunkMappedFiles, before the mappings whose messages name it.
std::string& ProgramName() {
  static std::string name = "this process";
  return name;
}
std::atomic<int> g_shrunk_exit_code{1};

// SA_RESETHAND has put the default action back: a SIGBUS outside every mapping (another's kill,
// a fault in memory that is no file of ours) kills the process as before, raised again here
// since returning would not repeat one that was sent.
void OnBusError(int, siginfo_t* info, void*) {
  const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const FaultSlot& slot : g_fault_slots) {
    const uintptr_t begin = slot.begin.load(std::memory_order_acquire);
    if (begin == 0 || address < begin || address >= slot.end.load(std::memory_order_relaxed)) {
      continue;
    }
    const char* message = slot.message.load(std::memory_order_relaxed);
    size_t left = slot.message_size.load(std::memory_order_relaxed);
    while (left > 0) {
      const ssize_t n = ::write(STDERR_FILENO, message, left);
      if (n <= 0 && errno != EINTR) break;
      if (n > 0) {
        message += n;
        left -= static_cast<size_t>(n);
      }
    }
    ::_exit(g_shrunk_exit_code.load(std::memory_order_relaxed));
  }
  ::raise(SIGBUS);
}

// The free slot now holding `begin` .. `end` and `message`; -1 when all are taken.
int TakeFaultSlot(const void* begin, size_t size, const std::string& message) {
  for (size_t i = 0; i < kFaultSlots; ++i) {
    FaultSlot& slot = g_fault_slots[i];
    bool free = false;
    if (!slot.taken.compare_exchange_strong(free, true)) continue;
    slot.message.store(message.c_str(), std::memory_order_relaxed);
    slot.message_size.store(message.size(), std::memory_order_relaxed);
    slot.end.store(reinterpret_cast<uintptr_t>(begin) + size, std::memory_order_relaxed);
    slot.begin.store(reinterpret_cast<uintptr_t>(begin), std::memory_order_release);
    return static_cast<int>(i);
  }
  return -1;
}

void FreeFaultSlot(int index) {
  FaultSlot& slot = g_fault_slots[static_cast<size_t>(index)];
  slot.begin.store(0, std::memory_order_release);
  slot.taken.store(false, std::memory_order_release);
}

}  // namespace

StatusOr<UniqueFd> OpenRegularFile(const std::string& path, struct stat& st, bool follow_links) {
  return OpenRegular(AT_FDCWD, path, path, st, follow_links);
}

StatusOr<UniqueFd> OpenRegularFileAt(int dir_fd, const std::string& name, const std::string& shown,
                                     struct stat& st) {
  return OpenRegular(dir_fd, name, shown, st, /*follow_links=*/false);
}

namespace {

// `fd`'s bytes from where it stands to its end, at most kFilePieceBytes at a time (see
// ReadFileInPieces); `path` names it in errors.
Status ReadPieces(int fd, const std::string& path,
                  const std::function<Status(std::string_view piece)>& on_piece) {
  char buf[kFilePieceBytes];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot read " + path);
    }
    if (n == 0) return Status::Ok();
    RETURN_IF_ERROR(on_piece(std::string_view(buf, static_cast<size_t>(n))));
  }
}

Status TooLarge(const std::string& path, size_t max_bytes) {
  return DataLossError(path + " is larger than " + std::to_string(max_bytes) + " bytes");
}

}  // namespace

StatusOr<std::string> ReadFileToString(const std::string& path, size_t max_bytes) {
  struct stat st;
  ASSIGN_OR_RETURN(const UniqueFd fd, OpenRegularFile(path, st));
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) return TooLarge(path, max_bytes);
  std::string data;
  // The size it has now (it may still change while read): grown by appending, the string reached
  // up to twice the file (a 37 MiB tokenizer.json held 64 MiB, and 102 MiB at its peak).
  data.reserve(static_cast<size_t>(size));
  RETURN_IF_ERROR(ReadPieces(fd.get(), path, [&](std::string_view piece) {
    data.append(piece);
    return data.size() > max_bytes ? TooLarge(path, max_bytes) : Status::Ok();
  }));
  return data;
}

Status ReadFileInPieces(const std::string& path,
                        const std::function<Status(std::string_view piece)>& on_piece) {
  struct stat st;
  ASSIGN_OR_RETURN(const UniqueFd fd, OpenRegularFile(path, st));
  return ReadPieces(fd.get(), path, on_piece);
}

StatusOr<std::string> ReadFileRange(int fd, const std::string& shown, uint64_t offset,
                                    size_t size) {
  std::string bytes(size, '\0');
  size_t done = 0;
  while (done < size) {
    const ssize_t n =
        ::pread(fd, bytes.data() + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot read " + shown);
    }
    if (n == 0) {
      return DataLossError(std::string(shown)
                               .append(" ends at byte ")
                               .append(std::to_string(offset + done))
                               .append(", before the ")
                               .append(std::to_string(size))
                               .append(" bytes from byte ")
                               .append(std::to_string(offset))
                               .append(": it shrank while being read (another process truncated it "
                                       "or is writing over it in place)"));
    }
    done += static_cast<size_t>(n);
  }
  return bytes;
}

StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  struct stat st;
  // Closed on return: the mapping keeps the file referenced.
  ASSIGN_OR_RETURN(const UniqueFd fd, OpenRegularFile(path, st));
  std::unique_ptr<MappedFile> file(new MappedFile());
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ == 0) return file;  // mmap refuses length 0; an empty file is an empty span
  const std::string& program = ProgramName();
  file->shrank_message_ = std::string(program)
                              .append(": ")
                              .append(OnOneLine(path))
                              .append(" shrank while ")
                              .append(program)
                              .append(
                                  " read it: another process truncated it or wrote over it in "
                                  "place; run again once it is whole\n");
  void* data = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (data == MAP_FAILED) return ErrnoStatus(errno, "cannot mmap " + path);
  file->data_ = data;
  file->fault_slot_ = TakeFaultSlot(data, file->size_, file->shrank_message_);
  if (file->fault_slot_ < 0) {
    return ResourceExhaustedError(std::string("cannot map ")
                                      .append(path)
                                      .append(": ")
                                      .append(std::to_string(kFaultSlots))
                                      .append(" files are mapped already"));
  }
  return file;
}

MappedFile::~MappedFile() {
  if (fault_slot_ >= 0) FreeFaultSlot(fault_slot_);
  if (data_ != nullptr) ::munmap(data_, size_);
}

void ReportShrunkMappedFiles(std::string_view program, int exit_code) {
  ProgramName() = program;
  g_shrunk_exit_code.store(exit_code);
  struct sigaction action {};
  action.sa_sigaction = OnBusError;
  action.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGBUS, &action, nullptr);
}

std::string PathInside(const std::string& path, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::path resolved_dir = fs::weakly_canonical(dir, error);
  if (error || resolved_dir.empty()) return "";
  const fs::path resolved = fs::weakly_canonical(path, error);
  if (error) return "";
  const fs::path inside = resolved.lexically_relative(resolved_dir);
  if (inside.empty() || inside == "." || *inside.begin() == "..") return "";
  return inside.string();
}

Status AppendWholeLines(int fd, std::string_view lines, bool& cut_off) {
  const off_t end = ::lseek(fd, 0, SEEK_END);
  const Status written = WriteAll(fd, lines.data(), lines.size());
  if (!written.ok()) cut_off = end >= 0 && ::ftruncate(fd, end) == 0;
  return written;
}

StatusOr<int> RemoveLeftoverFiles(const std::string& dir,
                                  const std::function<bool(std::string_view name)>& is_leftover) {
  DIR* listing = ::opendir(dir.c_str());
  if (listing == nullptr) return ErrnoStatus(errno, "cannot list " + dir);
  int removed = 0;
  Status first_error = Status::Ok();
  while (const dirent* entry = ::readdir(listing)) {
    if (!is_leftover(entry->d_name)) continue;
    struct stat info;
    if (::fstatat(::dirfd(listing), entry->d_name, &info, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(info.st_mode)) {
      continue;
    }
    if (::unlinkat(::dirfd(listing), entry->d_name, 0) == 0) {
      ++removed;
    } else if (first_error.ok()) {
      first_error = ErrnoStatus(
          errno, std::string("cannot remove ").append(dir).append("/").append(entry->d_name));
    }
  }
  ::closedir(listing);
  if (!first_error.ok()) return first_error;
  return removed;
}

Status EnsureOwnDirectory(const std::string& dir_as_given, mode_t mode, OthersMay others) {
  // Without its trailing slashes: mkdir of "a/b/" after create_directories made "a/b" (the parent
  // path of "a/b/") with the umask's mode would find it there and never set `mode`, and lstat of
  // "link/" follows the link.
  std::string dir = dir_as_given;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  struct stat info {};
  if (::lstat(dir.c_str(), &info) != 0) {
    RETURN_IF_ERROR(MakeDirectory(dir, mode, info));
  }
  if (!S_ISDIR(info.st_mode)) {
    return DirectoryRefusal(dir,
                            std::string(FileTypeName(info.st_mode)).append(", not a directory"));
  }
  if (info.st_uid != ::geteuid()) {
    return DirectoryRefusal(
        dir,
        std::string("owned by another user (uid ").append(std::to_string(info.st_uid)).append(")"));
  }
  switch (others) {
    case OthersMay::kAnything:
      break;
    case OthersMay::kRead:
      if ((info.st_mode & S_IWOTH) != 0 ||
          ((info.st_mode & S_IWGRP) != 0 && !IsPrivateGroup(info.st_gid))) {
        return DirectoryRefusal(dir, std::string("writable by other users (mode ")
                                         .append(OctalMode(info.st_mode))
                                         .append(")"));
      }
      break;
    case OthersMay::kNothing:
      if ((info.st_mode & 077) != 0) {
        return DirectoryRefusal(
            dir,
            std::string("open to other users (mode ").append(OctalMode(info.st_mode)).append(")"));
      }
      break;
  }
  return Status::Ok();
}

StatusOr<uint64_t> AvailableBytes(std::string_view what, const std::string& dir) {
  struct statvfs filesystem {};
  if (::statvfs(dir.c_str(), &filesystem) != 0) {
    return ErrnoStatus(errno, std::string(what) + ": cannot read the free space of " + dir);
  }
  return static_cast<uint64_t>(filesystem.f_bavail) * filesystem.f_frsize;
}

StatusOr<uint64_t> AvailableBytesForNewPath(std::string_view what, const std::string& path) {
  std::error_code error;
  std::filesystem::path existing = std::filesystem::absolute(path, error);
  if (error) existing = path;
  while (!std::filesystem::exists(existing, error) && existing.has_parent_path() &&
         existing != existing.parent_path()) {
    existing = existing.parent_path();
  }
  return AvailableBytes(what, existing.string());
}

Status CheckRoomIn(std::string_view what, const std::string& dir, uint64_t available, int64_t size,
                   int64_t keep_free, int64_t promised) {
  size = std::max<int64_t>(size, 0);
  keep_free = std::max<int64_t>(keep_free, 0);
  promised = std::max<int64_t>(promised, 0);
  if (static_cast<uint64_t>(SaturatingAdd(SaturatingAdd(size, keep_free), promised)) <= available) {
    return Status::Ok();
  }
  std::string message = std::string(what) + ": " + FormatBytes(static_cast<uint64_t>(size)) +
                        " do not fit in " + dir + ", whose filesystem has " +
                        FormatBytes(available) + " available";
  if (keep_free > 0) {
    message += ", of which llmctl keeps " + FormatBytes(static_cast<uint64_t>(keep_free)) + " free";
  }
  if (promised > 0) {
    message += std::string(keep_free > 0 ? " and " : ", of which ")
                   .append(FormatBytes(static_cast<uint64_t>(promised)))
                   .append(" are promised to writes in progress");
  }
  return ResourceExhaustedError(std::move(message));
}

Status CheckRoomFor(std::string_view what, const std::string& dir, int64_t size,
                    int64_t keep_free) {
  ASSIGN_OR_RETURN(const uint64_t available, AvailableBytes(what, dir));
  return CheckRoomIn(what, dir, available, size, keep_free);
}

}  // namespace llmctl
