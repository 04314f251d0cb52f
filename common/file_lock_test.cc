#include "common/file_lock.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <optional>
#include <string>

namespace llmctl {
namespace {

namespace fs = std::filesystem;

fs::path FreshDir() {
  std::string pattern = (fs::temp_directory_path() / "file-lock-test-XXXXXX").string();
  return fs::path(::mkdtemp(pattern.data()));
}

// A lock another holds is waited for only as long as the caller allows, then named.
TEST(FileLockTest, ALockIsWaitedForWithinTheBound) {
  const fs::path dir = FreshDir();
  const fs::path path = dir / "probe.json.lock";
  std::optional<StatusOr<FileLock>> held(FileLock::Acquire(path));
  ASSERT_TRUE(held->ok()) << held->status().ToString();
  const StatusOr<FileLock> refused = FileLock::AcquireWithin(path, std::chrono::milliseconds(100));
  EXPECT_EQ(refused.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(refused.status().message().find(path.string() + ": another process has held its lock"),
            std::string::npos)
      << refused.status().message();
  held.reset();
  EXPECT_TRUE(FileLock::AcquireWithin(path, std::chrono::milliseconds(0)).ok());
  fs::remove_all(dir);
}

// The lock file is never taken through a symbolic link (a token cache's directory comes from the
// environment).
TEST(FileLockTest, ALinkInTheLockFilesPlaceIsRefused) {
  const fs::path dir = FreshDir();
  fs::create_symlink(dir / "elsewhere", dir / "x.lock");
  const StatusOr<FileLock> lock = FileLock::Acquire(dir / "x.lock");
  EXPECT_FALSE(lock.ok());
  EXPECT_FALSE(fs::exists(dir / "elsewhere"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace llmctl
