// ArtifactFile: a fetched file is refused before its first byte when it cannot fit on the user's
// disk, and written whole when it can.
#include "controller/cli/artifact_file.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

#include "common/digest/digest.h"
#include "common/files.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

class ArtifactFileTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = testing::TempDir() + "/artifact_file_test_XXXXXX";
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

}  // namespace
}  // namespace llmctl::cli
