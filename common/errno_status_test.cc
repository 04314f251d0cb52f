#include "common/errno_status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace llmctl {
namespace {

TEST(ErrnoStatusTest, SaysWhatFailedAndTheSystemsReason) {
  const Status status = ErrnoStatus(ENOENT, "cannot open /x");
  EXPECT_EQ(status.message(), std::string("cannot open /x: ") + std::strerror(ENOENT));
}

// Unavailable tells its readers to try again (llmctl exits 3), so only the errors that a retry may
// cure map to it; the caller's rights and a missing name have codes of their own.
TEST(ErrnoStatusTest, MapsEachErrnoToOneCode) {
  EXPECT_EQ(ErrnoStatus(ENOENT, "x").code(), StatusCode::kNotFound);
  EXPECT_EQ(ErrnoStatus(EACCES, "x").code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoStatus(EPERM, "x").code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoStatus(EINTR, "x").code(), StatusCode::kUnavailable);
  EXPECT_EQ(ErrnoStatus(EAGAIN, "x").code(), StatusCode::kUnavailable);
  for (int other : {EIO, ENOSPC, EROFS, EISDIR, ENOTDIR, ELOOP}) {
    EXPECT_EQ(ErrnoStatus(other, "x").code(), StatusCode::kUnknown) << std::strerror(other);
  }
}

}  // namespace
}  // namespace llmctl
