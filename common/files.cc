#include "common/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "common/byte_size.h"
#include "common/checked_math.h"

namespace llmctl {
namespace {

Status ErrnoStatus(int err, const std::string& message) {
  const std::string text = message + ": " + std::strerror(err);
  if (err == ENOENT) return NotFoundError(text);
  if (err == EACCES || err == EPERM) return Status(StatusCode::kPermissionDenied, text);
  return UnavailableError(text);
}

std::string_view FileTypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a named pipe (FIFO)";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
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

}  // namespace

StatusOr<UniqueFd> OpenRegularFile(const std::string& path, struct stat& st, bool follow_links) {
  return OpenRegular(AT_FDCWD, path, path, st, follow_links);
}

StatusOr<UniqueFd> OpenRegularFileAt(int dir_fd, const std::string& name, const std::string& shown,
                                     struct stat& st) {
  return OpenRegular(dir_fd, name, shown, st, /*follow_links=*/false);
}

StatusOr<std::string> ReadFileToString(const std::string& path, size_t max_bytes) {
  std::string data;
  RETURN_IF_ERROR(ReadFileInPieces(path, [&](std::string_view piece) {
    data.append(piece);
    if (data.size() > max_bytes) {
      return DataLossError(path + " is larger than " + std::to_string(max_bytes) + " bytes");
    }
    return Status::Ok();
  }));
  return data;
}

Status ReadFileInPieces(const std::string& path,
                        const std::function<Status(std::string_view piece)>& on_piece) {
  struct stat st;
  ASSIGN_OR_RETURN(const UniqueFd fd, OpenRegularFile(path, st));
  char buf[kFilePieceBytes];
  while (true) {
    const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot read " + path);
    }
    if (n == 0) return Status::Ok();
    RETURN_IF_ERROR(on_piece(std::string_view(buf, static_cast<size_t>(n))));
  }
}

StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  struct stat st;
  // Closed on return: the mapping keeps the file referenced.
  ASSIGN_OR_RETURN(const UniqueFd fd, OpenRegularFile(path, st));
  std::unique_ptr<MappedFile> file(new MappedFile());
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {  // mmap refuses length 0; an empty file is an empty span
    void* data = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (data == MAP_FAILED) return ErrnoStatus(errno, "cannot mmap " + path);
    file->data_ = data;
  }
  return file;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
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

StatusOr<uint64_t> AvailableBytes(std::string_view what, const std::string& dir) {
  struct statvfs filesystem {};
  if (::statvfs(dir.c_str(), &filesystem) != 0) {
    return ErrnoStatus(errno, std::string(what) + ": cannot read the free space of " + dir);
  }
  return static_cast<uint64_t>(filesystem.f_bavail) * filesystem.f_frsize;
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
