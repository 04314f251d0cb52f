#include "controller/cli/input_tree.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/digest/digest.h"
#include "common/experiment.h"
#include "common/text.h"
#include "controller/cli/inputs.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

// sha256 of "abc" and of "" (FIPS 180-2 test vectors).
constexpr char kAbc[] = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
constexpr char kEmpty[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

class InputTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/llmctl-input-tree-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    root_ = pattern;
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const fs::path& relative, const std::string& text) {
    fs::create_directories((root_ / relative).parent_path());
    std::ofstream(root_ / relative, std::ios::binary) << text;
  }
  fs::path root_;
};

TEST_F(InputTreeTest, FileHashMatchesBytesAcrossReadPieces) {
  const std::string big(3 * (1 << 20) + 17, 'x');  // spans several 1 MiB read pieces
  Write("big.bin", big);
  StatusOr<std::string> sha = Sha256OfFile(root_ / "big.bin");
  ASSERT_TRUE(sha.ok()) << sha.status().message();
  EXPECT_EQ(*sha, digest::Sha256Hex(big));
  EXPECT_EQ(Sha256OfFile(root_ / "missing").status().code(), StatusCode::kNotFound);
}

TEST_F(InputTreeTest, SingleFileIsATreeOfOneNamedAfterIt) {
  Write("data.jsonl", "abc");
  InputTreeBuilder builder;
  StatusOr<v1::InputTree> tree = builder.Build(root_ / "data.jsonl");
  ASSERT_TRUE(tree.ok()) << tree.status().message();
  EXPECT_TRUE(tree->is_file());
  ASSERT_EQ(tree->files_size(), 1);
  EXPECT_EQ(tree->files(0).path(), "data.jsonl");
  EXPECT_EQ(tree->files(0).sha256(), kAbc);
  EXPECT_EQ(tree->files(0).size(), 3);
  // The digest rule of common.proto, spelled out.
  EXPECT_EQ(tree->digest(), digest::Sha256Hex(std::string(kAbc) + " 3 data.jsonl\n"));
  EXPECT_EQ(builder.blobs().at(kAbc).path, fs::canonical(root_ / "data.jsonl"));
}

TEST_F(InputTreeTest, DirectoryWalkSortsPathsInByteOrderAndRecurses) {
  Write("model/config.json", "abc");
  Write("model/b/weights.safetensors", "");
  Write("model/B.txt", "abc");
  Write("model/a b.txt", "abc");
  InputTreeBuilder builder;
  StatusOr<v1::InputTree> tree = builder.Build(root_ / "model");
  ASSERT_TRUE(tree.ok()) << tree.status().message();
  EXPECT_FALSE(tree->is_file());
  std::vector<std::string> paths;
  for (const v1::TreeFile& file : tree->files()) paths.push_back(file.path());
  EXPECT_EQ(paths,
            (std::vector<std::string>{"B.txt", "a b.txt", "b/weights.safetensors", "config.json"}));
  const std::string manifest = std::string(kAbc) + " 3 B.txt\n" + kAbc + " 3 a b.txt\n" + kEmpty +
                               " 0 b/weights.safetensors\n" + kAbc + " 3 config.json\n";
  EXPECT_EQ(tree->digest(), digest::Sha256Hex(manifest));
  EXPECT_EQ(tree->digest(), InputTreeDigest(*tree));
  EXPECT_EQ(builder.blobs().size(), 2u);  // three files with the same bytes are one blob
}

TEST_F(InputTreeTest, ContentChangesTheDigestButTheLocationDoesNot) {
  Write("one/tok/tokenizer.json", "abc");
  Write("two/tok/tokenizer.json", "abc");
  Write("three/tok/tokenizer.json", "abd");
  InputTreeBuilder builder;
  const std::string one = builder.Build(root_ / "one" / "tok")->digest();
  EXPECT_EQ(one, builder.Build(root_ / "two" / "tok")->digest());
  EXPECT_NE(one, builder.Build(root_ / "three" / "tok")->digest());
}

TEST_F(InputTreeTest, EachFileIsHashedOncePerBuilder) {
  Write("data.jsonl", "abc");
  InputTreeBuilder builder;
  const std::string first = builder.Build(root_ / "data.jsonl")->digest();
  Write("data.jsonl", "changed");  // a second hash would see this
  EXPECT_EQ(builder.Build(root_ / "data.jsonl")->digest(), first);
  EXPECT_NE(InputTreeBuilder().Build(root_ / "data.jsonl")->digest(), first);
}

TEST_F(InputTreeTest, SymlinksToFilesAreFollowedLikeAHuggingFaceSnapshot) {
  const fs::path repo = root_ / "hub" / "models--org--name";
  Write("hub/models--org--name/blobs/1234", "abc");
  fs::create_directories(repo / "snapshots" / "rev");
  fs::create_symlink("../../blobs/1234", repo / "snapshots" / "rev" / "config.json");
  StatusOr<v1::InputTree> tree = InputTreeBuilder().Build(repo / "snapshots" / "rev");
  ASSERT_TRUE(tree.ok()) << tree.status().message();
  ASSERT_EQ(tree->files_size(), 1);
  EXPECT_EQ(tree->files(0).path(), "config.json");
  EXPECT_EQ(tree->files(0).sha256(), kAbc);
}

// A link inside an input directory is followed only while it stays inside: a planted
// data/x -> ~/.ssh/id_rsa is refused, naming the link and its target, and so is a link out of a
// directory that merely looks like a snapshot.
TEST_F(InputTreeTest, LinksLeavingTheDirectoryAreRefusedNamingTheirTarget) {
  Write("secret/id_rsa", "private key");
  Write("data/train.jsonl", "abc");
  fs::create_symlink("train.jsonl", root_ / "data" / "copy.jsonl");  // inside: fine
  StatusOr<v1::InputTree> inside = InputTreeBuilder().Build(root_ / "data");
  ASSERT_TRUE(inside.ok()) << inside.status().message();
  EXPECT_EQ(inside->files_size(), 2);

  fs::create_symlink(root_ / "secret" / "id_rsa", root_ / "data" / "x");
  StatusOr<v1::InputTree> planted = InputTreeBuilder().Build(root_ / "data");
  EXPECT_EQ(planted.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(planted.status().message(),
            (root_ / "data" / "x").string() + ": a symbolic link to " +
                fs::canonical(root_ / "secret" / "id_rsa").string() + ", outside " +
                fs::canonical(root_ / "data").string() +
                "; only what lies inside an input directory is sent: copy the file in, or name "
                "it in the experiment file");

  Write("fake/snapshots/rev/config.json", "abc");  // no models--ORG--NAME repo around it
  Write("fake/blobs/1234", "abc");
  fs::create_symlink("../../blobs/1234", root_ / "fake" / "snapshots" / "rev" / "weights");
  EXPECT_EQ(InputTreeBuilder().Build(root_ / "fake" / "snapshots" / "rev").status().code(),
            StatusCode::kInvalidArgument);
}

// A snapshot's blobs/ must be a real directory of the repo: were it a link (to / or to ../..),
// every file would lie "inside" it and snapshots/rev/x -> ~/.ssh/id_rsa would be uploaded. A link
// must lead to a file directly in blobs/, as the hub lays them out.
TEST_F(InputTreeTest, ASnapshotsBlobsMustBeARealDirectoryAndLinksLeadDirectlyIntoIt) {
  Write("secret/id_rsa", "private key");
  const fs::path secret = fs::canonical(root_ / "secret" / "id_rsa");
  const fs::path repo = root_ / "hub" / "models--org--name";
  const fs::path rev = repo / "snapshots" / "rev";
  Write("hub/models--org--name/snapshots/rev/config.json", "abc");
  fs::create_symlink(secret, rev / "x");
  for (const fs::path& blobs_target : {fs::path("/"), fs::path("../.."), root_}) {
    SCOPED_TRACE(blobs_target.string());
    fs::remove_all(repo / "blobs");
    fs::create_directory_symlink(blobs_target, repo / "blobs");
    StatusOr<v1::InputTree> tree = InputTreeBuilder().Build(rev);
    EXPECT_EQ(tree.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(tree.status().message().find((rev / "x").string() + ": a symbolic link to " +
                                           secret.string() + ", outside"),
              std::string::npos)
        << tree.status().message();
  }
  // A real blobs/: a link into a folder inside it, or out of it through "..", is refused; one to
  // a file directly in it is sent.
  fs::remove(repo / "blobs");
  fs::remove(rev / "x");
  Write("hub/models--org--name/blobs/sub/5678", "abc");
  fs::create_symlink("../../blobs/sub/5678", rev / "nested");
  EXPECT_EQ(InputTreeBuilder().Build(rev).status().code(), StatusCode::kInvalidArgument);
  fs::remove(rev / "nested");
  fs::create_symlink("../../blobs/../../../secret/id_rsa", rev / "x");
  EXPECT_EQ(InputTreeBuilder().Build(rev).status().code(), StatusCode::kInvalidArgument);
  fs::remove(rev / "x");
  Write("hub/models--org--name/blobs/1234", "abc");
  fs::create_symlink("../../blobs/1234", rev / "weights");
  StatusOr<v1::InputTree> tree = InputTreeBuilder().Build(rev);
  ASSERT_TRUE(tree.ok()) << tree.status().message();
  EXPECT_EQ(tree->files_size(), 2);
}

// What is uploaded is the file that was hashed: replaced after the walk by a link to a secret, by
// another file, a FIFO, or grown, it is refused (and a FIFO is not waited on).
TEST_F(InputTreeTest, TheUploadOpensOnlyTheFileThatWasHashed) {
  Write("secret/id_rsa", "private key");
  Write("data/train.jsonl", "abc");
  Write("data/other.jsonl", "abd");
  InputTreeBuilder builder;
  ASSERT_TRUE(builder.Build(root_ / "data").ok());
  const HashedFile& hashed = builder.blobs().at(kAbc);
  const fs::path file = root_ / "data" / "train.jsonl";
  EXPECT_EQ(hashed.path, fs::canonical(file));
  EXPECT_EQ(hashed.size, 3);
  struct stat st {};
  ASSERT_TRUE(OpenHashedFile(hashed, st).ok());

  // Kept, so that no file made below reuses its inode number.
  fs::rename(file, root_ / "hashed.jsonl");
  fs::create_symlink(root_ / "secret" / "id_rsa", file);
  EXPECT_EQ(OpenHashedFile(hashed, st).status().code(), StatusCode::kFailedPrecondition);

  fs::remove(file);
  fs::copy_file(root_ / "data" / "other.jsonl", file);  // another inode
  EXPECT_EQ(OpenHashedFile(hashed, st).status().code(), StatusCode::kFailedPrecondition);

  fs::remove(file);
  ASSERT_EQ(::mkfifo(file.c_str(), 0600), 0);
  EXPECT_EQ(OpenHashedFile(hashed, st).status().code(), StatusCode::kFailedPrecondition);

  Write("data/grows.jsonl", "abc");
  InputTreeBuilder second;
  fs::remove(file);
  ASSERT_TRUE(second.Build(root_ / "data" / "grows.jsonl").ok());
  Write("data/grows.jsonl", "abcdef");  // the same inode, longer
  StatusOr<UniqueFd> grown = OpenHashedFile(second.blobs().at(kAbc), st);
  EXPECT_EQ(grown.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(grown.status().message().find("6 bytes now, 3 when it was hashed"), std::string::npos)
      << grown.status().message();
}

// A snapshot's links are opened in the blobs/ that was checked, and recorded there for the upload.
TEST_F(InputTreeTest, ASnapshotsLinkIsUploadedFromItsBlob) {
  const fs::path repo = root_ / "hub" / "models--org--name";
  Write("hub/models--org--name/blobs/1234", "abc");
  fs::create_directories(repo / "snapshots" / "rev");
  fs::create_symlink("../../blobs/1234", repo / "snapshots" / "rev" / "config.json");
  InputTreeBuilder builder;
  ASSERT_TRUE(builder.Build(repo / "snapshots" / "rev").ok());
  EXPECT_EQ(builder.blobs().at(kAbc).path, fs::canonical(repo / "blobs" / "1234"));
  struct stat st {};
  EXPECT_TRUE(OpenHashedFile(builder.blobs().at(kAbc), st).ok());
}

// `llmctl submit` prints these notices: the experiment file, the trial, the key and the value as
// written, then what was left out.
TEST_F(InputTreeTest, SubmitInputsNameTheHiddenEntriesLeftOut) {
  Write("exp/model/config.json", "{}");
  Write("exp/model/.git/HEAD", "ref: refs/heads/main");
  Write("exp/model/.env", "TOKEN=secret");
  Write("exp/train.jsonl", "abc");
  const std::string file = (root_ / "exp" / "lab.yaml").string();
  StatusOr<Experiment> as_written = ParseExperiment("model: model\ndata: {path: train.jsonl}\n",
                                                    file, {.resolve_local_paths = false});
  ASSERT_TRUE(as_written.ok()) << as_written.status().message();
  StatusOr<SubmitInputs> inputs = CollectInputs(*as_written, file);
  ASSERT_TRUE(inputs.ok()) << inputs.status().message();
  EXPECT_EQ(inputs->trees.at("model").files_size(), 1);
  EXPECT_EQ(inputs->notices, std::vector<std::string>{
                                 file + ": trial 'lab', model 'model': left out 2 hidden entries: "
                                        ".env, .git/ (a hidden file or directory is sent only when "
                                        "the experiment file names it)"});
}

// plan --write checks what submit will send without hashing it (submit hashes it again): the walk's
// files with their sizes and no digests, no blobs to upload, and the walk's refusals unchanged.
TEST_F(InputTreeTest, AWalkedOnlyBuilderReadsNoBytesAndRefusesWhatTheWalkRefuses) {
  Write("exp/model/config.json", "abc");
  Write("exp/model/weights.bin", std::string(5000, 'w'));
  Write("exp/train.jsonl", "abc");
  InputTreeBuilder walker(FileContents::kWalkedOnly);
  StatusOr<v1::InputTree> walked = walker.Build(root_ / "exp" / "model");
  ASSERT_TRUE(walked.ok()) << walked.status().message();
  ASSERT_EQ(walked->files_size(), 2);
  EXPECT_EQ(walked->files(0).path(), "config.json");
  EXPECT_EQ(walked->files(0).size(), 3);
  EXPECT_EQ(walked->files(0).sha256(), "");
  EXPECT_EQ(walked->files(1).size(), 5000);
  EXPECT_EQ(walked->files(1).sha256(), "");
  EXPECT_TRUE(walker.blobs().empty());

  const std::string file = (root_ / "exp" / "lab.yaml").string();
  StatusOr<Experiment> as_written = ParseExperiment("model: model\ndata: {path: train.jsonl}\n",
                                                    file, {.resolve_local_paths = false});
  ASSERT_TRUE(as_written.ok()) << as_written.status().message();
  EXPECT_TRUE(CheckInputPaths(*as_written, file).ok());
  Write("secret/id_rsa", "private key");
  fs::create_symlink(root_ / "secret" / "id_rsa", root_ / "exp" / "model" / "x");
  const Status checked = CheckInputPaths(*as_written, file);
  EXPECT_EQ(checked.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(checked.message(), CollectInputs(*as_written, file).status().message());
  EXPECT_NE(checked.message().find("a symbolic link to"), std::string::npos) << checked.message();
}

// A name the controller refuses (a line break, a control character) or that a proto string cannot
// hold (not UTF-8) fails the walk, naming the local path printably, before anything is uploaded:
// the controller refused it only after every upload, and protobuf's refusal had no message.
TEST_F(InputTreeTest, BadNamesAreRefusedDuringTheWalkNamingTheLocalPath) {
  struct Case {
    std::string name;
    std::string problem;
  };
  for (const Case& bad : {Case{"line\nbreak.txt", "a path with a line break"},
                          Case{"esc\x1b[31m.txt", "a path with a control character"},
                          Case{"latin1-\xe9.txt", "a name that is not valid UTF-8"}}) {
    SCOPED_TRACE(bad.problem);
    fs::remove_all(root_ / "data");
    Write("data/good.txt", "abc");
    Write("data/sub/" + bad.name, "abc");
    InputTreeBuilder builder;
    StatusOr<v1::InputTree> tree = builder.Build(root_ / "data");
    EXPECT_EQ(tree.status().code(), StatusCode::kInvalidArgument);
    const std::string path = (root_ / "data" / "sub" / bad.name).string();
    EXPECT_EQ(tree.status().message(), OnOneLine(path) + ": " + bad.problem +
                                           ", which an input's file may not have; rename it");
    EXPECT_EQ(FirstInvalidUtf8(tree.status().message()), std::string::npos);
    EXPECT_EQ(tree.status().message().find_first_of("\n\x1b"), std::string::npos);
    // Named itself, the file is refused the same way.
    EXPECT_EQ(InputTreeBuilder().Build(path).status().code(), StatusCode::kInvalidArgument);
  }
}

// The notice of hidden entries names them printably: a hidden name is the user's file's, and a
// line break or escape in it would forge or recolour the terminal's lines.
TEST_F(InputTreeTest, HiddenNamesInTheNoticeAreOnOneLine) {
  Write("exp/model/config.json", "{}");
  Write("exp/model/.x\x1b[2J\nforged\xff", "");
  Write("exp/train.jsonl", "abc");
  const std::string file = (root_ / "exp" / "lab.yaml").string();
  StatusOr<Experiment> as_written = ParseExperiment("model: model\ndata: {path: train.jsonl}\n",
                                                    file, {.resolve_local_paths = false});
  ASSERT_TRUE(as_written.ok()) << as_written.status().message();
  StatusOr<SubmitInputs> inputs = CollectInputs(*as_written, file);
  ASSERT_TRUE(inputs.ok()) << inputs.status().message();
  ASSERT_EQ(inputs->notices.size(), 1u);
  EXPECT_NE(inputs->notices[0].find("left out 1 hidden entries: .x [2J forged\xEF\xBF\xBD ("),
            std::string::npos)
      << inputs->notices[0];
}

// The notice names the path as written printably too: it names a directory of the user's, whose
// name may hold an escape sequence.
TEST_F(InputTreeTest, ThePathAsWrittenInTheNoticeIsOnOneLine) {
  Write("exp/m\x1b[2J/config.json", "{}");
  Write("exp/m\x1b[2J/.env", "");
  Write("exp/train.jsonl", "abc");
  const std::string file = (root_ / "exp" / "lab.yaml").string();
  StatusOr<Experiment> as_written = ParseExperiment(
      "model: \"m\\e[2J\"\ndata: {path: train.jsonl}\n", file, {.resolve_local_paths = false});
  ASSERT_TRUE(as_written.ok()) << as_written.status().message();
  StatusOr<SubmitInputs> inputs = CollectInputs(*as_written, file);
  ASSERT_TRUE(inputs.ok()) << inputs.status().message();
  ASSERT_EQ(inputs->notices.size(), 1u);
  EXPECT_EQ(inputs->notices[0].find('\x1b'), std::string::npos) << inputs->notices[0];
  EXPECT_NE(inputs->notices[0].find(": trial 'lab', model 'm [2J': left out 1 hidden"),
            std::string::npos)
      << inputs->notices[0];
}

TEST_F(InputTreeTest, HiddenEntriesAreLeftOutAndNamedUnlessNamedThemselves) {
  Write("data/train.jsonl", "abc");
  Write("data/.env", "TOKEN=secret");
  Write("data/.git/config", "[core]");
  Write("data/sub/.DS_Store", "");
  std::vector<std::string> hidden;
  StatusOr<v1::InputTree> tree = InputTreeBuilder().Build(root_ / "data", &hidden);
  ASSERT_TRUE(tree.ok()) << tree.status().message();
  ASSERT_EQ(tree->files_size(), 1);
  EXPECT_EQ(tree->files(0).path(), "train.jsonl");
  EXPECT_EQ(hidden, (std::vector<std::string>{".env", ".git/", "sub/.DS_Store"}));
  // Named itself, a hidden file or directory is sent.
  StatusOr<v1::InputTree> named = InputTreeBuilder().Build(root_ / "data" / ".env");
  ASSERT_TRUE(named.ok()) << named.status().message();
  EXPECT_EQ(named->files(0).path(), ".env");
  StatusOr<v1::InputTree> named_dir = InputTreeBuilder().Build(root_ / "data" / ".git");
  ASSERT_TRUE(named_dir.ok()) << named_dir.status().message();
  EXPECT_EQ(named_dir->files(0).path(), "config");
}

TEST_F(InputTreeTest, TheNamedPathMayItselfBeALink) {
  Write("real/tokenizer.json", "abc");
  fs::create_directory_symlink(root_ / "real", root_ / "link");
  StatusOr<v1::InputTree> tree = InputTreeBuilder().Build(root_ / "link");
  ASSERT_TRUE(tree.ok()) << tree.status().message();
  EXPECT_EQ(tree->files(0).path(), "tokenizer.json");
}

TEST_F(InputTreeTest, RefusesDirectoryLinksDanglingLinksSpecialFilesAndEmptyDirectories) {
  Write("loop/file.txt", "abc");
  fs::create_directory_symlink(root_ / "loop", root_ / "loop" / "again");
  StatusOr<v1::InputTree> loop = InputTreeBuilder().Build(root_ / "loop");
  EXPECT_EQ(loop.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(loop.status().message().find("loop/again: a symbolic link to a directory"),
            std::string::npos)
      << loop.status().message();

  Write("dangling/file.txt", "abc");
  fs::create_symlink(root_ / "nowhere", root_ / "dangling" / "gone");
  StatusOr<v1::InputTree> dangling = InputTreeBuilder().Build(root_ / "dangling");
  EXPECT_EQ(dangling.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dangling.status().message().find("gone: a symbolic link to nothing"),
            std::string::npos);

  fs::create_directories(root_ / "special");
  ASSERT_EQ(::mkfifo((root_ / "special" / "pipe").c_str(), 0600), 0);
  StatusOr<v1::InputTree> special = InputTreeBuilder().Build(root_ / "special");
  EXPECT_EQ(special.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(special.status().message().find("pipe: not a regular file or directory"),
            std::string::npos);
  EXPECT_EQ(InputTreeBuilder().Build(root_ / "special" / "pipe").status().code(),
            StatusCode::kInvalidArgument);

  fs::create_directories(root_ / "empty" / "sub");
  EXPECT_EQ(InputTreeBuilder().Build(root_ / "empty").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(InputTreeBuilder().Build(root_ / "absent").status().code(), StatusCode::kNotFound);
}

// A request the controller could not receive (over gRPC's 4 MiB) is refused before anything is
// sent, naming its files and the limit: 30,000 files failed at the controller after every upload.
TEST_F(InputTreeTest, ASubmitRequestOverTheControllersLimitIsRefusedNamingItsFiles) {
  v1::SubmitRequest request;
  v1::InputTree& tree = (*request.mutable_inputs())["data"];
  for (int i = 0; i < 40000; ++i) {
    v1::TreeFile* file = tree.add_files();
    file->set_path("shard-" + std::to_string(i) + "/records-of-the-lab.jsonl");
    file->set_sha256(std::string(64, 'a'));
    file->set_size(1 << 20);
  }
  const size_t bytes = request.ByteSizeLong();
  ASSERT_GT(bytes, size_t{4} << 20);
  const Status refused = CheckSubmitRequestFits(request, "lab.yaml");
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(
      refused.message().rfind("lab.yaml: the submit request would be " + std::to_string(bytes) +
                                  " bytes for its 40000 input files in 1 trees, over the "
                                  "controller's limit of 4194304 bytes (4 MiB) per message",
                              0),
      0u)
      << refused.message();
  tree.mutable_files()->DeleteSubrange(10000, 30000);
  EXPECT_TRUE(CheckSubmitRequestFits(request, "lab.yaml").ok());
}

}  // namespace
}  // namespace llmctl::cli
