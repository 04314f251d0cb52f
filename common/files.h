// Reading files: whole small files, read-only memory mappings of large ones, and regular files
// only; whether a file about to be written fits; appending whole lines to a file a reader follows;
// a directory of this user's, made or checked.
#ifndef LLMCTL_COMMON_FILES_H_
#define LLMCTL_COMMON_FILES_H_

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"
#include "common/unique_fd.h"

namespace llmctl {

// The whole file. NotFound when missing, PermissionDenied when unreadable, InvalidArgument for
// anything but a regular file (a directory, a device such as /dev/zero, a FIFO, a socket: refused
// at once, never read or waited on), DataLoss when it is larger than `max_bytes` (so a wrong path
// to a huge file fails fast). What else the system refuses names the file and the system's reason:
// Unavailable only when trying again may succeed (EINTR, EAGAIN), Unknown otherwise (a disk's EIO,
// a network file system's timeout), as for every function here.
StatusOr<std::string> ReadFileToString(const std::string& path,
                                       size_t max_bytes = std::numeric_limits<size_t>::max());

// The file's bytes in order, handed to `on_piece` at most kFilePieceBytes at a time, so that a
// file of any size is read in that much memory. Errors as ReadFileToString's (opening, reading),
// or the first that `on_piece` returns, which ends the reading.
inline constexpr size_t kFilePieceBytes = size_t{1} << 16;
Status ReadFileInPieces(const std::string& path,
                        const std::function<Status(std::string_view piece)>& on_piece);

// A descriptor (the caller closes it) of `path` opened read-only, and its stat in `st`, when it is
// a regular file: InvalidArgument for anything else (a FIFO, a device such as /dev/zero, a
// directory: refused at once, never waited on or read for ever) and, with `follow_links` false, for
// a symbolic link (O_NOFOLLOW); NotFound when missing.
StatusOr<UniqueFd> OpenRegularFile(const std::string& path, struct stat& st,
                                   bool follow_links = true);

// OpenRegularFile(name, st, /*follow_links=*/false) relative to the open directory `dir_fd`
// (openat), messages naming `shown`: a walk that holds each directory open reads what it listed,
// not whatever a link swapped into the path meanwhile leads to.
StatusOr<UniqueFd> OpenRegularFileAt(int dir_fd, const std::string& name, const std::string& shown,
                                     struct stat& st);

// `size` bytes of the open regular file `fd` from `offset` (pread: the descriptor's position stays
// where it was), errors naming `shown`. DataLoss when the file ends before them: another process
// truncated it after the caller took its size. How a program that must not end (llmctl, the
// daemons) reads the part of a file it needs, such as a safetensors header, where a mapping would
// kill it with SIGBUS (MappedFile).
StatusOr<std::string> ReadFileRange(int fd, const std::string& shown, uint64_t offset, size_t size);

// Where `path` lies inside the directory `dir`, both with their symbolic links resolved (those of
// the part that exists) and "." and ".." applied: the relative path below `dir`, or "" when `path`
// is `dir` itself, lies outside it, or either cannot be resolved. How the agent keeps what it
// serves and what it resumes from inside a run, whatever links or ".." a path holds.
std::string PathInside(const std::string& path, const std::string& dir);

// OK when `size` more bytes fit on the filesystem that holds the directory `dir` with `keep_free`
// bytes of it still available (statvfs's f_bavail: what an unprivileged writer may use); else
// ResourceExhausted starting with `what` and naming `dir` and both figures. Checked before a large
// file's first byte (an upload, a checkpoint copy, a model download), so one that cannot fit is
// refused at once instead of after filling the disk that the controller's store or the agent's
// runs write to as well. Another writer may still take the room meanwhile; a write that then fails
// reports itself as before.
Status CheckRoomFor(std::string_view what, const std::string& dir, int64_t size,
                    int64_t keep_free = 0);
// What an unprivileged writer may still use of the filesystem holding `dir` (statvfs's f_bavail in
// bytes); the error CheckRoomFor gives when it cannot be read.
StatusOr<uint64_t> AvailableBytes(std::string_view what, const std::string& dir);
// AvailableBytes of the filesystem that holds `path` or will hold it once created: its nearest
// existing ancestor is asked (a trial's output_dir may not exist yet).
StatusOr<uint64_t> AvailableBytesForNewPath(std::string_view what, const std::string& path);
// CheckRoomFor's decision and message for a filesystem with `available` bytes of which `promised`
// are already promised to writes in progress that have not written them yet (the caller keeps that
// count, so that writers that start together cannot each find the same room free).
Status CheckRoomIn(std::string_view what, const std::string& dir, uint64_t available, int64_t size,
                   int64_t keep_free, int64_t promised = 0);

// Appends `lines` (whole lines) to the end of the file open at `fd` with one WriteAll. When they
// cannot be written whole (a full disk, EFBIG) the part that was written is cut off again
// (ftruncate back to where the file ended), so that a reader following the file never takes it
// for a line, nor a later line joined to it; after such an error `cut_off` says whether the cut
// worked. The write's error. For a file that no other process appends to meanwhile.
Status AppendWholeLines(int fd, std::string_view lines, bool& cut_off);

// Removes the regular files directly in `dir` whose names `is_leftover` accepts (a link or a
// directory of such a name is left alone): what a crash left of a write that never finished, for a
// caller that alone writes there. Returns how many it removed; the first error (an unreadable
// directory, a file it cannot remove) after trying the rest.
StatusOr<int> RemoveLeftoverFiles(const std::string& dir,
                                  const std::function<bool(std::string_view name)>& is_leftover);

// What EnsureOwnDirectory lets users other than the owner do in a directory that is there already.
enum class OthersMay {
  kAnything,  // any mode: a directory the user named may be shared on purpose (LLMCTL_HOME)
  kRead,      // read and enter, never write, so nothing can be planted in it; a group may write
              // only when it is the user's private group (named after them, no other members),
              // as umask 002 makes directories
  kNothing,   // nothing: no group or other permission bit set (a socket's or secrets' directory)
};

// `dir` as a directory of this user's (the effective uid). Made when it is not there, with `mode`
// whatever the umask (the missing directories above it as create_directories makes them). One
// that is there is checked and never changed: chmodding a directory llmctl did not make (/tmp,
// named as root) would break it for everyone else. FailedPrecondition starting with `dir` when it
// cannot be made, or is a symbolic link (never followed: one in a shared place is its owner's to
// turn elsewhere after the check), not a directory, owned by another user, or more open than
// `others` allows.
Status EnsureOwnDirectory(const std::string& dir, mode_t mode, OthersMay others);

// A read-only MAP_PRIVATE mapping of a whole file, unmapped on destruction. Errors as
// ReadFileToString. An empty file maps to an empty span.
//
// Another process may shrink the file while it is mapped (cp, curl -o or a Python save_file
// writing over it in place, not beside it and renaming): touching a page past its new end raises
// SIGBUS, whose default kills the process without a word. A program that maps such files calls
// ReportShrunkMappedFiles first, so that the fault ends it with a message naming the file; a
// program that must not end (the daemons, llmctl) reads what it needs with pread instead.
class MappedFile {
 public:
  static StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {static_cast<const std::byte*>(data_), size_}; }

 private:
  MappedFile() = default;
  void* data_ = nullptr;
  size_t size_ = 0;
  std::string shrank_message_;  // what the SIGBUS handler writes; lives as long as the mapping
  int fault_slot_ = -1;         // the mapping's place in the handler's table; -1 for none
};

// From now on a SIGBUS inside a live MappedFile's mapping writes "<program>: <path> shrank while
// <program> read it ..." to standard error and ends the process with _exit(`exit_code`), before
// any destructor or atexit handler (the process is past saving: its file is gone under it); any
// other SIGBUS kills the process as before. For llm-train, whose token file and weights are worth
// mapping; call it before the first MappedFile::Open, once.
void ReportShrunkMappedFiles(std::string_view program, int exit_code);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_FILES_H_
