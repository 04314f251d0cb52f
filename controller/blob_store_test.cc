#include "controller/blob_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <limits>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

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

TEST_F(BlobStoreTest, StoresAVerifiedBlobAndReportsWhatIsMissing) {
  const std::string data = "hello, blob";
  const std::string sha = digest::Sha256Hex(data);
  const std::vector<std::string> wanted = {sha, digest::Sha256Hex("other")};
  EXPECT_EQ(*blobs_->Missing(wanted), wanted);

  auto writer = blobs_->BeginWrite(sha, static_cast<int64_t>(data.size()));
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Append(data.substr(0, 5)).ok());
  ASSERT_TRUE((*writer)->Append(data.substr(5)).ok());
  ASSERT_TRUE((*writer)->Commit(sha).ok());

  EXPECT_TRUE(blobs_->Has(sha));
  EXPECT_EQ(*ReadFileToString(blobs_->PathOf(sha)), data);
  EXPECT_EQ(*blobs_->Missing(wanted), std::vector<std::string>{wanted[1]});
}

TEST_F(BlobStoreTest, RefusesBytesThatDoNotMatchTheDeclaredDigestOrSize) {
  const std::string sha = digest::Sha256Hex("expected");
  {
    auto writer = *blobs_->BeginWrite(sha, 8);
    ASSERT_TRUE(writer->Append("tampered").ok());
    Status status = writer->Commit(sha);
    EXPECT_EQ(status.code(), StatusCode::kDataLoss);
    EXPECT_NE(status.message().find("sha256"), std::string::npos);
  }
  {
    auto writer = *blobs_->BeginWrite(sha, 8);
    ASSERT_TRUE(writer->Append("expe").ok());
    EXPECT_EQ(writer->Commit(sha).code(), StatusCode::kDataLoss);
  }
  {
    auto writer = *blobs_->BeginWrite(sha, 3);
    EXPECT_EQ(writer->Append("expected").code(), StatusCode::kDataLoss);
  }
  EXPECT_FALSE(blobs_->Has(sha));
  // No temporary file is left behind.
  EXPECT_TRUE(std::filesystem::is_empty(root_ + "/data/blobs"));
}

TEST_F(BlobStoreTest, ReceivesABlobNamedAtItsEndOnlyWhenTheBytesMatchTheName) {
  const std::string data = "checkpoint bytes";
  const std::string sha = digest::Sha256Hex(data);
  {
    auto received = *blobs_->BeginReceive(static_cast<int64_t>(data.size()));
    ASSERT_TRUE(received->Append(data).ok());
    // The sender names another blob's digest: nothing is published under either name.
    EXPECT_EQ(received->Commit(digest::Sha256Hex("other")).code(), StatusCode::kDataLoss);
  }
  EXPECT_TRUE(std::filesystem::is_empty(root_ + "/data/blobs"));
  auto received = *blobs_->BeginReceive(static_cast<int64_t>(data.size()));
  ASSERT_TRUE(received->Append(data).ok());
  ASSERT_TRUE(received->Commit(sha).ok());
  received.reset();
  EXPECT_EQ(*ReadFileToString(blobs_->PathOf(sha)), data);
  EXPECT_EQ(blobs_->BeginReceive(-1).status().code(), StatusCode::kInvalidArgument);
  // Only the blob is left.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(root_ + "/data/blobs"),
                          std::filesystem::directory_iterator()),
            1);
}

TEST_F(BlobStoreTest, ABlobThatWouldFillTheDiskIsRefusedBeforeItsFirstByte) {
  // Everything this filesystem has is to be kept free: no blob fits, however small.
  auto full = BlobStore::Open(root_ + "/full", std::numeric_limits<int64_t>::max());
  ASSERT_TRUE(full.ok());
  const std::string sha = digest::Sha256Hex("x");
  for (const Status& refused :
       {(*full)->BeginWrite(sha, 1).status(), (*full)->BeginReceive(1).status()}) {
    EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
    EXPECT_NE(refused.message().find("1 B do not fit in " + root_ +
                                     "/full/blobs, whose filesystem "
                                     "has "),
              std::string::npos)
        << refused.message();
    EXPECT_NE(refused.message().find("of which llmctl keeps"), std::string::npos)
        << refused.message();
  }
  EXPECT_TRUE(std::filesystem::is_empty(root_ + "/full/blobs")) << "no temporary file is left";
  // The default keeps 1 GiB: a small blob fits on any disk these tests run on.
  EXPECT_TRUE(blobs_->BeginWrite(sha, 1).ok());
}

TEST_F(BlobStoreTest, PartialBlobsACrashLeftAreRemovedAtOpenAndNothingElse) {
  namespace fs = std::filesystem;
  const std::string blobs = root_ + "/data/blobs";
  const std::string sha = digest::Sha256Hex("kept");
  auto write = [](const std::string& path) {
    FILE* out = fopen(path.c_str(), "w");
    ASSERT_NE(out, nullptr) << path;
    fputs("partial", out);
    fclose(out);
  };
  // What BeginWrite and BeginReceive leave when the process dies mid-write.
  for (const char* partial : {".upload-a1B2c3", ".receive-Zz0099", ".receive-Zz0099.checked"}) {
    write(blobs + "/" + partial);
  }
  // Not theirs: a blob, names that only look alike, a directory and a link of the pattern, and a
  // partial blob outside the blobs directory.
  write(blobs + "/" + sha);
  const std::vector<std::string> kept = {sha,
                                         ".upload-a1B2c",
                                         ".upload-a1B2c3.old",
                                         ".uploads-a1B2c3",
                                         "upload-a1B2c3",
                                         ".upload-a1B2c3.checked",
                                         ".receive-Zz0099.checkedx"};
  for (const std::string& name : kept) {
    if (name != sha) write(blobs + "/" + name);
  }
  ASSERT_TRUE(fs::create_directory(blobs + "/.upload-dir123"));
  fs::create_symlink(blobs + "/" + sha, blobs + "/.receive-link12");
  write(root_ + "/data/.upload-a1B2c3");

  ASSERT_TRUE(BlobStore::Open(root_ + "/data").ok());
  std::set<std::string> left;
  for (const fs::directory_entry& entry : fs::directory_iterator(blobs)) {
    left.insert(entry.path().filename().string());
  }
  std::set<std::string> expected(kept.begin(), kept.end());
  expected.insert(".upload-dir123");
  expected.insert(".receive-link12");
  EXPECT_EQ(left, expected);
  EXPECT_TRUE(fs::exists(root_ + "/data/.upload-a1B2c3"));
  EXPECT_TRUE(blobs_->Has(sha));
}

TEST_F(BlobStoreTest, BlobsWrittenTogetherCannotEachTakeTheSameRoom) {
  // The filesystem reports 10 B beyond what is kept free, whatever is written: a fake, so the
  // figure holds still while the writes are checked against it.
  constexpr int64_t kKeep = 1000;
  auto blobs = *BlobStore::Open(root_ + "/small", kKeep,
                                [](std::string_view, const std::string&) -> StatusOr<uint64_t> {
                                  return uint64_t{kKeep + 10};
                                });
  const std::string first = digest::Sha256Hex("first!");
  const std::string second = digest::Sha256Hex("second");
  auto writing = blobs->BeginWrite(first, 6);
  ASSERT_TRUE(writing.ok()) << writing.status().ToString();
  // 6 B are free now, but 6 of the 10 are promised to the first upload.
  for (const Status& refused :
       {blobs->BeginWrite(second, 6).status(), blobs->BeginReceive(6).status()}) {
    EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
    EXPECT_NE(refused.message().find("and 6 B are promised to writes in progress"),
              std::string::npos)
        << refused.message();
  }
  EXPECT_TRUE(blobs->BeginWrite(second, 4).ok()) << "what is left fits (and is released)";

  // An abandoned write gives its room back.
  writing->reset();
  auto receiving = blobs->BeginReceive(6);
  ASSERT_TRUE(receiving.ok()) << receiving.status().ToString();
  EXPECT_EQ(blobs->BeginWrite(second, 6).status().code(), StatusCode::kResourceExhausted);
  // So does a committed one (the free space then counts it).
  ASSERT_TRUE((*receiving)->Append("first!").ok());
  ASSERT_TRUE((*receiving)->Commit(first).ok());
  auto after_commit = blobs->BeginWrite(second, 6);
  ASSERT_TRUE(after_commit.ok()) << after_commit.status().ToString();
  ASSERT_TRUE((*after_commit)->Append("second").ok());
  ASSERT_TRUE((*after_commit)->Commit(second).ok());
  EXPECT_TRUE(blobs->Has(first));
  EXPECT_TRUE(blobs->Has(second));

  // Writers that start at once: only one finds the room.
  std::mutex mutex;
  std::vector<std::unique_ptr<BlobWriter>> started;
  std::vector<std::thread> writers;
  for (int i = 0; i < 8; ++i) {
    writers.emplace_back([&, i] {
      auto writer = blobs->BeginWrite(digest::Sha256Hex("writer " + std::to_string(i)), 6);
      if (!writer.ok()) return;
      std::lock_guard lock(mutex);
      started.push_back(std::move(*writer));  // held until every writer has tried
    });
  }
  for (std::thread& writer : writers) writer.join();
  EXPECT_EQ(started.size(), 1u);
}

TEST_F(BlobStoreTest, RefusesBadDigests) {
  EXPECT_EQ(blobs_->BeginWrite("../../etc/passwd", 1).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(blobs_->BeginWrite(digest::Sha256Hex("x"), -1).status().code(),
            StatusCode::kInvalidArgument);
  const std::vector<std::string> bad = {"nothex"};
  EXPECT_EQ(blobs_->Missing(bad).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(BlobStoreTest, DirectoriesArePrivate) {
  struct stat info;
  ASSERT_EQ(stat((root_ + "/data/blobs").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0700u);
}

// One that is there is checked, never narrowed: another user may have read or put blobs in it.
TEST_F(BlobStoreTest, AnExistingDirectoryOthersMayEnterIsRefusedAndLeftAsItIs) {
  const std::string blobs = root_ + "/open/blobs";
  ASSERT_TRUE(std::filesystem::create_directories(blobs));
  ASSERT_EQ(chmod((root_ + "/open").c_str(), 0700), 0);
  ASSERT_EQ(chmod(blobs.c_str(), 0755), 0);
  auto refused = BlobStore::Open(root_ + "/open");
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(),
            blobs +
                ": open to other users (mode 0755); the blob store keeps the inputs uploaded "
                "to it there, which no one else may read");
  struct stat info;
  ASSERT_EQ(stat(blobs.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0755u);
}

digest::InputTree MakeTree(std::vector<digest::TreeFile> files, bool is_file) {
  digest::InputTree tree{.digest = "", .files = std::move(files), .is_file = is_file};
  tree.digest = digest::TreeDigest(tree.files);
  return tree;
}

TEST_F(BlobStoreTest, KeepsTreesAndRefusesTheSameDigestAsAnotherKind) {
  const digest::InputTree file = MakeTree({{"train.jsonl", digest::Sha256Hex("x"), 1}}, true);
  ASSERT_TRUE(blobs_->PutTree(file).ok());
  ASSERT_TRUE(blobs_->PutTree(file).ok());
  auto kept = blobs_->GetTree(file.digest);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_TRUE(kept->is_file);
  ASSERT_EQ(kept->files.size(), 1u);
  EXPECT_EQ(kept->files[0].path, "train.jsonl");

  digest::InputTree as_directory = file;
  as_directory.is_file = false;
  EXPECT_EQ(blobs_->PutTree(as_directory).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(blobs_->GetTree(digest::Sha256Hex("never kept")).status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace llmctl::controller
