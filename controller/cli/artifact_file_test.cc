// ArtifactFile: a fetched file is refused before its first byte when it cannot fit on the user's
// disk, written whole when it can, and a write the disk refuses fails as this machine's error.
#include "controller/cli/artifact_file.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

#include "common/digest/digest.h"
#include "common/files.h"
#include "tests/support/file_size_limit.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

class ArtifactFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/artifact_file_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  static v1::ArtifactChunk FirstChunk(const std::string& path, int64_t size) {
    v1::ArtifactChunk chunk;
    chunk.set_path(path);
    chunk.set_size(size);
    return chunk;
  }

  fs::path dir_;
};

TEST_F(ArtifactFileTest, AFileLargerThanTheDiskIsRefusedBeforeItsFirstByte) {
  // 4 EiB: no disk these tests run on has that.
  auto refused = ArtifactFile::Begin(
      dir_, FirstChunk("output/checkpoint/model.safetensors", int64_t{1} << 62));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("output/checkpoint/model.safetensors: 4194304.00 TiB "
                                            "do not fit in " +
                                            (dir_ / "output/checkpoint").string()),
            std::string::npos)
      << refused.status().message();
  EXPECT_FALSE(fs::exists(dir_ / "output/checkpoint/model.safetensors.part"));
}

TEST_F(ArtifactFileTest, AFileThatFitsIsWrittenWhole) {
  auto file = ArtifactFile::Begin(dir_, FirstChunk("output/log.txt", 5));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ASSERT_TRUE((*file)->Append("hello").ok());
  ASSERT_TRUE((*file)->Finish(digest::Sha256Hex("hello")).ok());
  EXPECT_EQ(*ReadFileToString((dir_ / "output/log.txt").string()), "hello");
}

// A file the disk will not take (here past RLIMIT_FSIZE, which fails the write with EFBIG as a full
// disk fails it with ENOSPC) is this machine's failure: its Unavailable had llmctl fetch exit 3
// asking whether the controller was running.
TEST_F(ArtifactFileTest, AFileTheDiskWillNotTakeIsNotTheControllersFailure) {
  auto file = ArtifactFile::Begin(dir_, FirstChunk("output/log.txt", 8192));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  Status appended;
  {
    const llmctl::testing::ScopedFileSizeLimit four_kib(4096);
    ASSERT_TRUE(four_kib.ok());
    appended = (*file)->Append(std::string(8192, 'x'));
  }
  EXPECT_EQ(appended.code(), StatusCode::kFailedPrecondition) << appended.ToString();
  EXPECT_NE(appended.message().find("output/log.txt.part"), std::string::npos)
      << appended.message();
  EXPECT_NE(appended.message().find("File too large"), std::string::npos) << appended.message();
}

}  // namespace
}  // namespace llmctl::cli
