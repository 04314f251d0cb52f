#include "controller/blob_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "common/files.h"

namespace llmctl::controller {
namespace {

class BlobStoreTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = testing::TempDir() + "/blob_store_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
    auto blobs = BlobStore::Open(root_ + "/data");
    ASSERT_TRUE(blobs.ok()) << blobs.status().ToString();
    blobs_ = std::move(*blobs);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::string root_;
  std::unique_ptr<BlobStore> blobs_;
};

TEST(Sha256Test, KnownDigests) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256 chunked;
  chunked.Update("a");
  chunked.Update("bc");
  EXPECT_EQ(chunked.HexDigest(), Sha256Hex("abc"));
  EXPECT_TRUE(IsSha256Hex(Sha256Hex("x")));
  EXPECT_FALSE(IsSha256Hex("BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD"));
  EXPECT_FALSE(IsSha256Hex("abc"));
}

TEST_F(BlobStoreTest, StoresAVerifiedBlobAndReportsWhatIsMissing) {
  const std::string data = "hello, blob";
  const std::string sha = Sha256Hex(data);
  const std::vector<std::string> wanted = {sha, Sha256Hex("other")};
  EXPECT_EQ(*blobs_->Missing(wanted), wanted);

  auto writer = blobs_->BeginWrite(sha, static_cast<int64_t>(data.size()));
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Append(data.substr(0, 5)).ok());
  ASSERT_TRUE((*writer)->Append(data.substr(5)).ok());
  ASSERT_TRUE((*writer)->Commit().ok());

  EXPECT_TRUE(blobs_->Has(sha));
  EXPECT_EQ(*ReadFileToString(blobs_->PathOf(sha)), data);
  EXPECT_EQ(*blobs_->Missing(wanted), std::vector<std::string>{wanted[1]});
}

TEST_F(BlobStoreTest, RefusesBytesThatDoNotMatchTheDeclaredDigestOrSize) {
  const std::string sha = Sha256Hex("expected");
  {
    auto writer = *blobs_->BeginWrite(sha, 8);
    ASSERT_TRUE(writer->Append("tampered").ok());
    Status status = writer->Commit();
    EXPECT_EQ(status.code(), StatusCode::kDataLoss);
    EXPECT_NE(status.message().find("sha256"), std::string::npos);
  }
  {
    auto writer = *blobs_->BeginWrite(sha, 8);
    ASSERT_TRUE(writer->Append("expe").ok());
    EXPECT_EQ(writer->Commit().code(), StatusCode::kDataLoss);
  }
  {
    auto writer = *blobs_->BeginWrite(sha, 3);
    EXPECT_EQ(writer->Append("expected").code(), StatusCode::kOutOfRange);
  }
  EXPECT_FALSE(blobs_->Has(sha));
  // No temporary file is left behind.
  EXPECT_TRUE(std::filesystem::is_empty(root_ + "/data/blobs"));
}

TEST_F(BlobStoreTest, RefusesBadDigests) {
  EXPECT_EQ(blobs_->BeginWrite("../../etc/passwd", 1).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(blobs_->BeginWrite(Sha256Hex("x"), -1).status().code(), StatusCode::kInvalidArgument);
  const std::vector<std::string> bad = {"nothex"};
  EXPECT_EQ(blobs_->Missing(bad).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(BlobStoreTest, DirectoriesArePrivate) {
  struct stat info;
  ASSERT_EQ(stat((root_ + "/data/blobs").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0700u);
}

InputTreeSpec MakeTree(std::vector<TreeEntry> files, bool is_file) {
  InputTreeSpec tree{.digest = "", .files = std::move(files), .is_file = is_file};
  tree.digest = Sha256Hex(TreeManifest(tree.files));
  return tree;
}

TEST(InputTreeTest, ManifestFollowsTheProtoRule) {
  const std::vector<TreeEntry> files = {{"a.txt", Sha256Hex("a"), 1},
                                        {"d/b.txt", Sha256Hex("bb"), 2}};
  EXPECT_EQ(TreeManifest(files), Sha256Hex("a") + " 1 a.txt\n" + Sha256Hex("bb") + " 2 d/b.txt\n");
  EXPECT_TRUE(ValidateInputTree("input 'x'", MakeTree(files, false)).ok());
}

TEST(InputTreeTest, RefusesBadTrees) {
  const std::string sha = Sha256Hex("a");
  struct Case {
    InputTreeSpec tree;
    std::string message;
  };
  InputTreeSpec wrong_digest = MakeTree({{"a", sha, 1}}, false);
  wrong_digest.digest = Sha256Hex("something else");
  const std::vector<Case> cases = {
      {MakeTree({}, false), "no files"},
      {MakeTree({{"a", sha, 1}, {"b", sha, 1}}, true), "exactly one entry"},
      {MakeTree({{"../a", sha, 1}}, false), "'..'"},
      {MakeTree({{"/etc/passwd", sha, 1}}, false), "absolute"},
      {MakeTree({{"a//b", sha, 1}}, false), "empty"},
      {MakeTree({{"b", sha, 1}, {"a", sha, 1}}, false), "path order"},
      {MakeTree({{"a", sha, 1}, {"a", sha, 1}}, false), "path order"},
      {MakeTree({{"a", "xyz", 1}}, false), "sha256"},
      {MakeTree({{"a", sha, -1}}, false), "negative size"},
      {wrong_digest, "does not match its manifest"},
  };
  for (const Case& c : cases) {
    Status status = ValidateInputTree("input 'x'", c.tree);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << c.message;
    EXPECT_NE(status.message().find("input 'x': "), std::string::npos) << status.message();
    EXPECT_NE(status.message().find(c.message), std::string::npos) << status.message();
  }
}

TEST_F(BlobStoreTest, KeepsTreesAndRefusesTheSameDigestAsAnotherKind) {
  const InputTreeSpec file = MakeTree({{"train.jsonl", Sha256Hex("x"), 1}}, true);
  ASSERT_TRUE(blobs_->PutTree(file).ok());
  ASSERT_TRUE(blobs_->PutTree(file).ok());
  auto kept = blobs_->GetTree(file.digest);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_TRUE(kept->is_file);
  ASSERT_EQ(kept->files.size(), 1u);
  EXPECT_EQ(kept->files[0].path, "train.jsonl");

  InputTreeSpec as_directory = file;
  as_directory.is_file = false;
  EXPECT_EQ(blobs_->PutTree(as_directory).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(blobs_->GetTree(Sha256Hex("never kept")).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace llmctl::controller
