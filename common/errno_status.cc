#include "common/errno_status.h"

#include <cerrno>
#include <cstring>

namespace llmctl {

// Unavailable only where the same call may succeed when tried again (a signal, a descriptor not
// ready): its readers take Unavailable for "retry" (llmctl: "is the controller running?", exit 3).
// What else the system refuses is the file's own failure, neither its name's nor the caller's
// rights'.
Status ErrnoStatus(int err, const std::string& message) {
  const std::string text = message + ": " + std::strerror(err);
  if (err == ENOENT) return NotFoundError(text);
  if (err == EACCES || err == EPERM) return Status(StatusCode::kPermissionDenied, text);
  if (err == EINTR || err == EAGAIN) return UnavailableError(text);  // EAGAIN is EWOULDBLOCK
  return Status(StatusCode::kUnknown, text);
}

}  // namespace llmctl
