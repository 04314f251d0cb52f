#include "common/digest/digest.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/digest/verified_file.h"
#include "common/files.h"

namespace llmctl::digest {
namespace {

namespace fs = std::filesystem;

// sha256 of "abc" and of "" (FIPS 180-2 test vectors).
constexpr char kAbc[] = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
constexpr char kEmpty[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

TEST(Sha256Test, KnownDigests) {
  EXPECT_EQ(Sha256Hex(""), kEmpty);
  EXPECT_EQ(Sha256Hex("abc"), kAbc);
  Sha256 chunked;
  chunked.Update("a");
  chunked.Update("bc");
  EXPECT_EQ(chunked.HexDigest(), kAbc);
  EXPECT_TRUE(IsSha256Hex(Sha256Hex("x")));
  EXPECT_FALSE(IsSha256Hex("BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD"));
  EXPECT_FALSE(IsSha256Hex("abc"));
}

TEST(GitBlobIdTest, MatchesGitHashObject) {
  // `printf 'hello\n' | git hash-object --stdin` and the empty blob's well-known id.
  GitBlobId hello(6);
  hello.Update("hel");
  hello.Update("lo\n");
  EXPECT_EQ(hello.HexDigest(), "ce013625030ba8dba906f756967f9e9ca394464a");
  EXPECT_EQ(GitBlobId(0).HexDigest(), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
}

InputTree MakeTree(std::vector<TreeFile> files, bool is_file) {
  InputTree tree{.digest = "", .files = std::move(files), .is_file = is_file};
  tree.digest = TreeDigest(tree.files);
  return tree;
}

TEST(InputTreeTest, ManifestFollowsTheProtoRule) {
  const std::vector<TreeFile> files = {{"a.txt", Sha256Hex("a"), 1},
                                       {"d/b.txt", Sha256Hex("bb"), 2}};
  const std::string manifest = Sha256Hex("a") + " 1 a.txt\n" + Sha256Hex("bb") + " 2 d/b.txt\n";
  EXPECT_EQ(TreeManifest(files), manifest);
  EXPECT_EQ(TreeDigest(files), Sha256Hex(manifest));
  EXPECT_TRUE(ValidateInputTree("input 'x'", MakeTree(files, false)).ok());
}

TEST(InputTreeTest, RefusesBadTrees) {
  const std::string sha = Sha256Hex("a");
  struct Case {
    InputTree tree;
    std::string message;
  };
  InputTree wrong_digest = MakeTree({{"a", sha, 1}}, false);
  wrong_digest.digest = Sha256Hex("something else");
  const std::vector<Case> cases = {
      {MakeTree({}, false), "no files"},
      {MakeTree({{"a", sha, 1}, {"b", sha, 1}}, true), "exactly one entry"},
      {MakeTree({{"../a", sha, 1}}, false), "'..'"},
      {MakeTree({{"./a", sha, 1}}, false), "'.'"},
      {MakeTree({{"/etc/passwd", sha, 1}}, false), "absolute"},
      {MakeTree({{"a//b", sha, 1}}, false), "empty"},
      {MakeTree({{"a\nb", sha, 1}}, false), "line break"},
      {MakeTree({{std::string("a\0b", 3), sha, 1}}, false), "NUL"},
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

TEST(RunArtifactPathTest, OnlyTheRunsOutputAndItsOwnFiles) {
  for (const char* good :
       {"output/adapter/adapter_config.json", "stdout.log", "events.rank1.jsonl"}) {
    EXPECT_EQ(RunArtifactPathProblem(good), "") << good;
  }
  EXPECT_EQ(RunArtifactPathProblem("input/secret"), "a path outside the run's output/ directory");
  EXPECT_EQ(RunArtifactPathProblem("outputs/x"), "a path outside the run's output/ directory");
  EXPECT_EQ(RunArtifactPathProblem("output/../../x"), "an empty, '.' or '..' segment");
  EXPECT_EQ(RunArtifactPathProblem("/etc/passwd"), "an absolute path");
  EXPECT_EQ(RunArtifactPathProblem("output/"), "an empty, '.' or '..' segment");
  // Names a controller could make to reach past the download: a dotfile beside the run's files
  // (fetched into a home directory), one of the fetch's own partial files, a control character.
  EXPECT_EQ(RunArtifactPathProblem(".bashrc"), "a hidden name beside the run's own files");
  EXPECT_EQ(RunArtifactPathProblem("output/.keep"), "");
  EXPECT_EQ(RunArtifactPathProblem("stdout.log.part"),
            "a name ending in .part (the fetch's partial files)");
  EXPECT_EQ(RunArtifactPathProblem("output/a\x1b[2Jb"), "a path with a control character");
  EXPECT_EQ(RelativePathProblem("a\tb"), "a path with a control character");
}

class VerifiedFileWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/verified_file_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<VerifiedFileWriter> Begin(int64_t size) {
    const std::string temp = (dir_ / "file.part").string();
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    EXPECT_GE(fd, 0);
    return std::make_unique<VerifiedFileWriter>("upload of file", fd, temp,
                                                (dir_ / "file").string(), size);
  }

  fs::path dir_;
};

TEST_F(VerifiedFileWriterTest, PublishesBytesThatMatch) {
  auto writer = Begin(3);
  ASSERT_TRUE(writer->Append("a").ok());
  ASSERT_TRUE(writer->Append("bc").ok());
  ASSERT_TRUE(writer->Commit(kAbc).ok());
  EXPECT_EQ(*ReadFileToString((dir_ / "file").string()), "abc");
  EXPECT_EQ(writer->Commit(kAbc).code(), StatusCode::kFailedPrecondition);
  writer.reset();
  EXPECT_TRUE(fs::exists(dir_ / "file")) << "a committed file stays";
  EXPECT_FALSE(fs::exists(dir_ / "file.part"));
}

TEST_F(VerifiedFileWriterTest, RefusesAnotherDigestOrSizeAndLeavesNothing) {
  {
    auto tampered = Begin(3);
    ASSERT_TRUE(tampered->Append("abd").ok());
    const Status status = tampered->Commit(kAbc);
    EXPECT_EQ(status.code(), StatusCode::kDataLoss);
    EXPECT_NE(status.message().find("upload of file: "), std::string::npos) << status.message();
    EXPECT_NE(status.message().find(Sha256Hex("abd")), std::string::npos) << status.message();
    EXPECT_EQ(tampered->Commit(kAbc).code(), StatusCode::kFailedPrecondition);
  }
  {
    auto short_file = Begin(4);
    ASSERT_TRUE(short_file->Append("abc").ok());
    EXPECT_EQ(short_file->Commit(kAbc).code(), StatusCode::kDataLoss);
  }
  {
    auto long_file = Begin(2);
    EXPECT_EQ(long_file->Append("abc").code(), StatusCode::kDataLoss);
  }
  EXPECT_TRUE(fs::is_empty(dir_)) << "neither the file nor a temporary is left";
}

}  // namespace
}  // namespace llmctl::digest
