// A system call's failure (its errno) as a Status: the one mapping of errno values to codes, so
// that readers of a code (llmctl's exit codes, "retry" on Unavailable) see the same code for the
// same failure whichever module made the call.
#ifndef LLMCTL_COMMON_ERRNO_STATUS_H_
#define LLMCTL_COMMON_ERRNO_STATUS_H_

#include <string>

#include "common/status.h"

namespace llmctl {

// "<message>: <strerror(err)>" with NotFound for ENOENT; PermissionDenied for EACCES and EPERM;
// Unavailable only where the same call may succeed when tried again (EINTR, EAGAIN); Unknown for
// anything else (a disk's EIO, a full disk, a read-only filesystem, a network file system's
// timeout), as absl's ErrnoToStatusCode gives an errno it has no code for.
Status ErrnoStatus(int err, const std::string& message);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_ERRNO_STATUS_H_
