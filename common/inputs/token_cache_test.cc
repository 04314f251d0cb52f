#include "common/inputs/token_cache.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/data/token_file.h"

namespace llmctl {
namespace {

namespace fs = std::filesystem;

// A cached file whose contents were corrupted after it was written (a flipped byte in its tokens,
// which the header alone does not show) is written again, not handed to every run that then
// refuses it: llm-train --prepare's advice to run it again must work.
TEST(TokenCacheTest, ACorruptCachedFileIsWrittenAgain) {
  const fs::path dir = fs::temp_directory_path() / ("token_cache_test_" + std::to_string(getpid()));
  fs::remove_all(dir);
  ASSERT_EQ(setenv("LLMCTL_CACHE_DIR", dir.c_str(), 1), 0);
  int prepared = 0;
  const auto prepare = [&prepared](const std::string& path) {
    ++prepared;
    std::vector<data::TokenizedExample> examples(3);
    for (auto& example : examples) {
      example.input_ids = {5, 6, 7, 8};
      example.labels = {-100, 6, 7, 8};
    }
    return data::WriteTokenFile(path, "fingerprint-a", 1, 2, examples);
  };
  StatusOr<std::string> path = CachedTokenFile("fingerprint-a", prepare);
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  EXPECT_EQ(prepared, 1);
  ASSERT_TRUE(CachedTokenFile("fingerprint-a", prepare).ok());
  EXPECT_EQ(prepared, 1) << "a whole file is used as it is";

  {
    // The first token id: after the 64-byte header, the fingerprint padded to 16 bytes and the 4
    // offsets (token_file.h's layout).
    constexpr std::streamoff kFirstId = 64 + 16 + 4 * 8;
    std::fstream file(*path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(kFirstId);
    const char id = static_cast<char>(file.get());
    file.seekp(kFirstId);
    file.put(static_cast<char>(id ^ 0x01));
  }
  EXPECT_FALSE(data::TokenFile::Open(*path).ok());
  ASSERT_TRUE(CachedTokenFile("fingerprint-a", prepare).ok());
  EXPECT_EQ(prepared, 2);
  EXPECT_TRUE(data::TokenFile::Open(*path).ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace llmctl
