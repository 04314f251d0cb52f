// Writing a file so that a crash or a concurrent writer never leaves a half-written file under its
// name.
#ifndef LLMCTL_COMMON_ATOMIC_FILE_H_
#define LLMCTL_COMMON_ATOMIC_FILE_H_

#include <cstddef>
#include <functional>
#include <string>

#include "common/status.h"

namespace llmctl {

// Calls `write(fd)` on a temporary file beside `path` (named uniquely per process and call, so two
// processes preparing the same file never share one), fsyncs it, renames it over `path` and fsyncs
// `path`'s directory, so that the new file survives a power loss once this returns OK. On a failure
// before the rename the temporary is removed and `path` is untouched; one in the directory's sync
// is reported though `path` already has the new content.
Status WriteFileAtomically(const std::string& path, const std::function<Status(int fd)>& write);

// fsyncs the directory that holds `path`, so that a rename into `path` (or its creation) survives a
// power loss: the name lives in the directory, and until the directory is synced a power loss can
// bring back the old entry. Unavailable naming the directory when it cannot be opened or synced.
Status SyncDirectoryOf(const std::string& path);

// A new name beside `path` for a temporary file of a write of `path`: <path>.tmp.<pid>.<n>, unique
// per process and call, the name RemoveAtomicWriteLeftovers(path) removes. WriteFileAtomically's
// temporaries and any other scratch file of writing `path` take it, so that one rule clears what
// a crash left of them.
std::string AtomicWriteTemporaryName(const std::string& path);

// Removes the temporaries WriteFileAtomically left beside `path` when a crash came between their
// creation and their rename: regular files in `path`'s directory named exactly
// <name>.tmp.<pid>.<n>. Only for a directory no other process writes `path` in at the same time
// (one that would be mid-write loses its temporary and fails). Returns how many it removed; the
// first error (an unreadable directory, a file it cannot remove) after trying the rest.
StatusOr<int> RemoveAtomicWriteLeftovers(const std::string& path);

// RemoveAtomicWriteLeftovers for a `path` other processes may be writing at the same time (a file a
// user named for a command's output, which two commands may write at once): removes only the
// temporaries whose writer, the <pid> in their name, no longer runs on this machine (Ctrl-C or
// kill -9 mid-write), and leaves a running writer's alone. On a file system shared with other
// machines a writer there counts as ended unless a process here has its pid; its write then fails.
StatusOr<int> RemoveAtomicWriteLeftoversOfEndedWriters(const std::string& path);

// write(2) in a loop (partial writes, EINTR).
Status WriteAll(int fd, const void* data, size_t size);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_ATOMIC_FILE_H_
