// The input cache: uploaded blobs verified and never half-written, its directories the agent's
// alone, uploads refused before a full disk, trees checked and then linked.
#include "agent/input_cache.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "agent/agent_test_support.h"
#include "common/digest/digest.h"
#include "common/status.h"

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;
using test_support::FreshTestDir;

class InputCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir("cache");
    auto cache = InputCache::Open(dir_.string());
    ASSERT_TRUE(cache.ok()) << cache.status().ToString();
    cache_ = std::move(*cache);
  }
  void TearDown() override { fs::remove_all(dir_); }

  Status Upload(const std::string& sha256, const std::string& data, int64_t size) {
    ASSIGN_OR_RETURN(auto upload, cache_->BeginUpload(sha256, size));
    RETURN_IF_ERROR(upload->Append(data.substr(0, data.size() / 2)));
    RETURN_IF_ERROR(upload->Append(data.substr(data.size() / 2)));
    return upload->Commit(sha256);
  }
  bool DirEmpty(const std::string& sub) { return fs::is_empty(dir_ / sub); }

  fs::path dir_;
  std::unique_ptr<InputCache> cache_;
};

TEST_F(InputCacheTest, UploadsAreVerifiedAndNothingHalfWrittenStays) {
  const std::string data = "hello world\n";
  const std::string sha = digest::Sha256Hex(data);
  EXPECT_EQ(*cache_->MissingBlobs({sha}), std::vector<std::string>{sha});
  EXPECT_EQ(Upload(digest::Sha256Hex("other"), data, data.size()).code(), StatusCode::kDataLoss);
  EXPECT_EQ(Upload(sha, data, data.size() + 1).code(), StatusCode::kDataLoss);
  EXPECT_EQ(Upload(sha, data, data.size() - 1).code(), StatusCode::kDataLoss);
  EXPECT_TRUE(DirEmpty("blobs"));
  EXPECT_TRUE(DirEmpty("tmp"));
  ASSERT_TRUE(Upload(sha, data, data.size()).ok());
  EXPECT_TRUE(cache_->MissingBlobs({sha})->empty());
  EXPECT_TRUE(DirEmpty("tmp"));
  EXPECT_EQ(cache_->MissingBlobs({"ABC"}).status().code(), StatusCode::kInvalidArgument);
}

// llm-train keeps its token files in the cache (LLMCTL_CACHE_DIR) and refuses one that other users
// may write, where they could plant tokens to be trained on: under umask 000 the cache was made
// 0777 and every trial failed. One made that way before is refused when the agent starts.
TEST_F(InputCacheTest, ItsDirectoriesAreWritableByTheAgentAloneWhateverTheUmask) {
  const fs::path made = dir_ / "made-under-umask-000";
  const mode_t umask_was = ::umask(0);
  auto cache = InputCache::Open(made.string());
  ::umask(umask_was);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  constexpr fs::perms kOthersWrite = fs::perms::group_write | fs::perms::others_write;
  for (const fs::path& dir : {made, made / "blobs", made / "trees", made / "tmp"}) {
    EXPECT_EQ(fs::status(dir).permissions() & kOthersWrite, fs::perms::none) << dir;
  }

  fs::permissions(made, fs::perms::all);
  const Status refused = InputCache::Open(made.string()).status();
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(refused.message().starts_with(made.string())) << refused.message();
}

TEST_F(InputCacheTest, AnUploadThatWouldFillTheDiskIsRefusedBeforeItsFirstByte) {
  const fs::path full_dir = FreshTestDir("full-cache");
  // Everything the filesystem has is to be kept free: no upload fits, however small.
  auto full = InputCache::Open(full_dir.string(), std::numeric_limits<int64_t>::max());
  ASSERT_TRUE(full.ok());
  const std::string sha = digest::Sha256Hex("x");
  const Status refused = (*full)->BeginUpload(sha, 1).status();
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("upload of " + sha + ": 1 B do not fit in " +
                                   (full_dir / "tmp").string()),
            std::string::npos)
      << refused.message();
  EXPECT_TRUE(fs::is_empty(full_dir / "tmp"));
  fs::remove_all(full_dir);
}

TEST_F(InputCacheTest, TreesAreCheckedThenLinked) {
  const std::string a = "alpha\n", b = "beta\n";
  ASSERT_TRUE(Upload(digest::Sha256Hex(a), a, a.size()).ok());
  digest::InputTree tree;
  tree.files = {{"a.txt", digest::Sha256Hex(a), static_cast<int64_t>(a.size())},
                {"sub/b.txt", digest::Sha256Hex(b), static_cast<int64_t>(b.size())}};
  tree.digest = digest::TreeDigest(tree.files);
  // The digest rule from common.proto, written out by hand.
  EXPECT_EQ(tree.digest, digest::Sha256Hex(digest::Sha256Hex(a) + " 6 a.txt\n" +
                                           digest::Sha256Hex(b) + " 5 sub/b.txt\n"));

  auto incomplete = cache_->Materialize(tree);
  EXPECT_EQ(incomplete.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(incomplete.status().message().find(digest::Sha256Hex(b)), std::string::npos);
  ASSERT_TRUE(Upload(digest::Sha256Hex(b), b, b.size()).ok());
  auto path = cache_->Materialize(tree);
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  std::ifstream in(*path + "/sub/b.txt");
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "beta");
  EXPECT_EQ(*cache_->Materialize(tree), *path) << "a second call finds the tree in place";

  digest::InputTree wrong = tree;
  wrong.digest = digest::Sha256Hex("x");
  EXPECT_EQ(cache_->Materialize(wrong).status().code(), StatusCode::kInvalidArgument);
  for (const std::string bad : {"../etc/passwd", "/etc/passwd", "a/../../b", "a//b", "./a"}) {
    digest::InputTree evil;
    evil.files = {{bad, digest::Sha256Hex(a), static_cast<int64_t>(a.size())}};
    evil.digest = digest::TreeDigest(evil.files);
    auto refused = cache_->Materialize(evil);
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(refused.status().message().find(bad), std::string::npos)
        << refused.status().message();
  }
  digest::InputTree clash;
  clash.files = {{"a", digest::Sha256Hex(a), 6}, {"a/b", digest::Sha256Hex(b), 5}};
  clash.digest = digest::TreeDigest(clash.files);
  EXPECT_EQ(cache_->Materialize(clash).status().code(), StatusCode::kInvalidArgument);

  digest::InputTree single;
  single.is_file = true;
  single.files = {{"data.jsonl", digest::Sha256Hex(a), 6}};
  single.digest = digest::TreeDigest(single.files);
  auto file = cache_->Materialize(single);
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE(fs::is_regular_file(*file));
  EXPECT_EQ(fs::path(*file).filename(), "data.jsonl");
  EXPECT_TRUE(DirEmpty("tmp"));
}

}  // namespace
}  // namespace llmctl::agent
