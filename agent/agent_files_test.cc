// llm-agent end to end, what goes into and out of a run: uploaded blobs, input trees, checkpoints
// a run resumes from (on this node, or sent from another as a tree) and the artifacts fetched from
// it. Real gRPC over mutual TLS on a unix socket, the real supervisor (the built llm-agent binary)
// and a shell script standing in for llm-train. A run's life is agent_runs_test.cc's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "agent/agent_test_support.h"
#include "common/digest/digest.h"
#include "llmctl/v1/agent.grpc.pb.h"

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;
namespace pb = llmctl::v1;
using namespace test_support;  // NOLINT(build/namespaces): the tests' shared vocabulary

TEST_F(AgentTest, AResumedRunGetsItsCheckpointOnlyWhileThisNodeHasIt) {
  StartAgent();
  const pb::RunKey first = Key(9, "long", 1);
  RunTrial(first, 0);
  ASSERT_TRUE(Stream(first, 0).ended.has_value());
  const fs::path checkpoint = RunDir(first) / "output" / "checkpoints" / "step-2";
  const auto resume = [&](const pb::RunKey& key, const pb::RunKey& from, const fs::path& path) {
    pb::RunTrialRequest request;
    *request.mutable_key() = key;
    request.set_config_json(
        nlohmann::json{{"seed", 0}, {"data", {{"path", "unused.jsonl"}}}}.dump());
    *request.mutable_resume_from()->mutable_run() = from;
    request.mutable_resume_from()->set_checkpoint(path.string());
    grpc::ClientContext context;
    Deadline(&context);
    pb::RunState state;
    return Stub()->RunTrial(&context, request, &state);
  };

  grpc::Status status = resume(Key(9, "long", 2), first, checkpoint);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("its checkpoint " + checkpoint.string() +
                                        " is gone from this node"),
            std::string::npos)
      << status.error_message();
  status = resume(Key(9, "long", 2), Key(9, "other", 1), checkpoint);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("this node has no such run"), std::string::npos)
      << status.error_message();
  EXPECT_FALSE(fs::exists(RunDir(Key(9, "long", 2)))) << "nothing started";

  fs::create_directories(checkpoint);
  WriteFile(checkpoint / "trainer_state.json", "{}",
            fs::perms::owner_read | fs::perms::owner_write);
  // llm-train, as root, reads what --resume names: only a checkpoint inside the trial's runs is
  // passed on, whatever ".." or links the path holds, and never another trial's.
  const fs::path outside = RunDir(first).parent_path().parent_path() / "planted";
  fs::create_directories(outside);
  WriteFile(outside / "trainer_state.json", "{}", fs::perms::owner_read | fs::perms::owner_write);
  fs::create_directory_symlink(outside, RunDir(first) / "output" / "link");
  for (const fs::path& planted :
       {outside, RunDir(first) / "output" / "link", RunDir(first) / "output/../../../planted"}) {
    status = resume(Key(9, "long", 2), first, planted);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << planted;
    EXPECT_NE(status.error_message().find("checkpoint " + planted.string() +
                                          " lies outside the trial's runs on this node"),
              std::string::npos)
        << status.error_message();
  }
  RunTrial(Key(9, "other", 1), 0);
  ASSERT_TRUE(Stream(Key(9, "other", 1), 0).ended.has_value());
  status = resume(Key(9, "long", 2), Key(9, "other", 1), checkpoint);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("another trial's run"), std::string::npos)
      << status.error_message();
  EXPECT_FALSE(fs::exists(RunDir(Key(9, "long", 2)))) << "nothing started";

  status = resume(Key(9, "long", 2), first, checkpoint);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_TRUE(Stream(Key(9, "long", 2), 0).ended.has_value());
  const std::vector<std::string> argv = Lines(ReadAll(RunDir(Key(9, "long", 2)) / "argv"));
  const auto flag = std::find(argv.begin(), argv.end(), "--resume");
  ASSERT_NE(flag, argv.end()) << ReadAll(RunDir(Key(9, "long", 2)) / "argv");
  ASSERT_NE(flag + 1, argv.end());
  EXPECT_EQ(*(flag + 1), checkpoint.string());
  // A run from step 0 gets no --resume.
  const std::vector<std::string> first_argv = Lines(ReadAll(RunDir(first) / "argv"));
  EXPECT_EQ(std::find(first_argv.begin(), first_argv.end(), "--resume"), first_argv.end());
}

TEST_F(AgentTest, ACheckpointIsFetchedByItsPathAndAnotherNodeResumesFromItAsATree) {
  StartAgent();
  const pb::RunKey first = Key(9, "moved", 1);
  RunTrial(first, 0);
  ASSERT_TRUE(Stream(first, 0).ended.has_value());
  const fs::path checkpoint = RunDir(first) / "output" / "checkpoints" / "step-2";
  fs::create_directories(checkpoint / "sub");
  const std::map<std::string, std::string> written = {
      {"model.safetensors", std::string(1500000, 'm')},
      {"sub/rng.safetensors", ""},
      {"trainer_state.json", R"({"next_step": 2})"}};
  for (const auto& [path, content] : written) {
    WriteFile(checkpoint / path, content, fs::perms::owner_read | fs::perms::owner_write);
  }
  // The checkpoint's directory alone, as the controller copies it: paths relative to it.
  const auto fetch = [&](const std::string& path, std::map<std::string, std::string>* files) {
    pb::FetchArtifactsRequest request;
    *request.mutable_key() = first;
    request.set_path(path);
    grpc::ClientContext context;
    Deadline(&context);
    auto stub = Stub();
    auto reader = stub->FetchArtifacts(&context, request);
    std::string current;
    pb::ArtifactChunk chunk;
    while (reader->Read(&chunk)) {
      if (!chunk.path().empty()) current = chunk.path();
      (*files)[current] += chunk.data();
      if (chunk.last()) {
        EXPECT_EQ(chunk.sha256(), digest::Sha256Hex((*files)[current]));
      }
    }
    return reader->Finish();
  };
  for (const std::string& path : {checkpoint.string(), std::string("output/checkpoints/step-2")}) {
    std::map<std::string, std::string> files;
    const grpc::Status fetched = fetch(path, &files);
    ASSERT_TRUE(fetched.ok()) << path << ": " << fetched.error_message();
    EXPECT_EQ(files, written) << path;
  }
  std::map<std::string, std::string> ignored;
  EXPECT_EQ(fetch(RunDir(first).string(), &ignored).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(fetch("output/../../../../..", &ignored).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(fetch("output/checkpoints/step-9", &ignored).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(ignored.empty());

  // Sent to a node as a tree (here the same agent, under another trial with no run of its own).
  std::vector<digest::TreeFile> files;
  pb::InputTree tree;
  for (const auto& [path, content] : written) {
    files.push_back({path, digest::Sha256Hex(content), static_cast<int64_t>(content.size())});
    pb::TreeFile* file = tree.add_files();
    file->set_path(path);
    file->set_sha256(digest::Sha256Hex(content));
    file->set_size(static_cast<int64_t>(content.size()));
  }
  tree.set_digest(digest::TreeDigest(files));
  const auto resume = [&](const pb::RunKey& key) {
    pb::RunTrialRequest request;
    *request.mutable_key() = key;
    request.set_config_json(
        nlohmann::json{{"seed", 0}, {"data", {{"path", "unused.jsonl"}}}}.dump());
    *request.mutable_resume_from()->mutable_run() = Key(9, "elsewhere", 1);
    request.mutable_resume_from()->set_checkpoint("/on/another/node");
    *request.mutable_resume_from()->mutable_tree() = tree;
    grpc::ClientContext context;
    Deadline(&context);
    pb::RunState state;
    return Stub()->RunTrial(&context, request, &state);
  };
  const pb::RunKey moved = Key(9, "elsewhere", 2);
  grpc::Status status = resume(moved);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << "its blobs are missing";
  EXPECT_FALSE(fs::exists(RunDir(moved)));
  for (const auto& [path, content] : written) {
    grpc::ClientContext context;
    Deadline(&context);
    pb::UploadBlobResponse response;
    auto stub = Stub();
    auto writer = stub->UploadBlob(&context, &response);
    pb::BlobChunk chunk;
    chunk.set_sha256(digest::Sha256Hex(content));
    chunk.set_size(static_cast<int64_t>(content.size()));
    chunk.set_data(content);
    writer->Write(chunk);
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok()) << path;
  }
  status = resume(moved);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_TRUE(Stream(moved, 0).ended.has_value());
  const std::vector<std::string> argv = Lines(ReadAll(RunDir(moved) / "argv"));
  const auto flag = std::find(argv.begin(), argv.end(), "--resume");
  ASSERT_NE(flag, argv.end());
  ASSERT_NE(flag + 1, argv.end());
  EXPECT_EQ(*(flag + 1), (dir_ / "data/cache/trees" / tree.digest()).string());
  EXPECT_EQ(ReadAll(fs::path(*(flag + 1)) / "trainer_state.json"),
            written.at("trainer_state.json"));
}

TEST_F(AgentTest, UploadsAreCheckedAndABadOneLeavesNothing) {
  StartAgent();
  const std::string data(3 << 20, 'x');
  const std::string sha = digest::Sha256Hex(data);
  auto upload = [&](const std::string& announced_sha, const std::string& bytes,
                    pb::UploadBlobResponse* response) {
    grpc::ClientContext context;
    Deadline(&context);
    auto stub = Stub();
    auto writer = stub->UploadBlob(&context, response);
    for (size_t offset = 0; offset < bytes.size() || offset == 0; offset += 1 << 20) {
      pb::BlobChunk chunk;
      if (offset == 0) {
        chunk.set_sha256(announced_sha);
        chunk.set_size(static_cast<int64_t>(bytes.size()));
      }
      chunk.set_data(bytes.substr(offset, 1 << 20));
      if (!writer->Write(chunk)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  };
  pb::UploadBlobResponse response;
  std::string corrupted = data;
  corrupted[12345] = 'y';
  EXPECT_EQ(upload(sha, corrupted, &response).error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_TRUE(fs::is_empty(dir_ / "data/cache/blobs"));
  EXPECT_TRUE(fs::is_empty(dir_ / "data/cache/tmp"));
  EXPECT_EQ(upload("not-a-sha", data, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  ASSERT_TRUE(upload(sha, data, &response).ok());
  EXPECT_FALSE(response.already_present());
  EXPECT_EQ(ReadAll(dir_ / "data/cache/blobs" / sha), data);
  ASSERT_TRUE(upload(sha, data, &response).ok());
  EXPECT_TRUE(response.already_present());

  pb::MissingBlobsRequest request;
  request.add_sha256(sha);
  request.add_sha256(digest::Sha256Hex("absent"));
  grpc::ClientContext context;
  Deadline(&context);
  pb::MissingBlobsResponse missing;
  ASSERT_TRUE(Stub()->MissingBlobs(&context, request, &missing).ok());
  ASSERT_EQ(missing.sha256_size(), 1);
  EXPECT_EQ(missing.sha256(0), digest::Sha256Hex("absent"));
}

TEST_F(AgentTest, UnsafeOrIncompleteInputTreesAreRefused) {
  StartAgent();
  auto run_with = [&](const std::string& path, grpc::Status* status) {
    pb::RunTrialRequest request;
    *request.mutable_key() = Key(5, "inputs", 1);
    request.set_config_json("{}");
    pb::InputTree& tree = (*request.mutable_inputs())["data.path"];
    tree.set_is_file(true);
    pb::TreeFile* file = tree.add_files();
    file->set_path(path);
    file->set_sha256(digest::Sha256Hex("data"));
    file->set_size(4);
    tree.set_digest(
        digest::TreeDigest(std::vector<digest::TreeFile>{{path, digest::Sha256Hex("data"), 4}}));
    grpc::ClientContext context;
    Deadline(&context);
    pb::RunState state;
    *status = Stub()->RunTrial(&context, request, &state);
  };
  grpc::Status status;
  run_with("../../etc/passwd", &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find(".."), std::string::npos) << status.error_message();
  run_with("data.jsonl", &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find(digest::Sha256Hex("data")), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ / "data/runs/5")) << "a refused run leaves no directory";
}

TEST_F(AgentTest, ArtifactsComeInChunksWithTheirSha256) {
  StartAgent();
  const pb::RunKey key = Key(6, "art", 1);
  RunTrial(key, 0);
  ASSERT_TRUE(Stream(key, 0).ended.has_value());
  pb::FetchArtifactsRequest request;
  *request.mutable_key() = key;
  grpc::ClientContext context;
  Deadline(&context);
  auto stub = Stub();
  auto reader = stub->FetchArtifacts(&context, request);
  std::map<std::string, std::string> files;
  std::map<std::string, std::string> sha256s;
  std::string current;
  int weight_chunks = 0;
  pb::ArtifactChunk chunk;
  while (reader->Read(&chunk)) {
    EXPECT_LE(chunk.data().size(), size_t{1} << 20);
    if (!chunk.path().empty()) current = chunk.path();
    if (current == "output/adapter/weights.bin") ++weight_chunks;
    files[current] += chunk.data();
    if (chunk.last()) sha256s[current] = chunk.sha256();
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_TRUE(files.count("output/adapter/weights.bin"));
  EXPECT_EQ(files["output/adapter/weights.bin"],
            ReadAll(RunDir(key) / "output/adapter/weights.bin"));
  EXPECT_EQ(files["output/adapter/weights.bin"].size(), 2500000u);
  EXPECT_EQ(weight_chunks, 3);
  for (const char* log : {"events.jsonl", "stderr.log", "stdout.log", "trial.yaml"}) {
    EXPECT_TRUE(files.count(log)) << log;
  }
  for (const auto& [path, bytes] : files)
    EXPECT_EQ(sha256s[path], digest::Sha256Hex(bytes)) << path;
}

// A checkpoint's staging directory (being written, or left by a failed or killed run) is no
// artifact: it is incomplete, and as large as the checkpoint.
TEST_F(AgentTest, ACheckpointsStagingDirectoryIsNoArtifact) {
  StartAgent();
  const pb::RunKey key = Key(6, "staging", 1);
  RunTrial(key, 0);
  ASSERT_TRUE(Stream(key, 0).ended.has_value());
  const fs::path checkpoints = RunDir(key) / "output" / "checkpoints";
  for (const char* dir : {"step-1", "step-2.tmp"}) {
    fs::create_directories(checkpoints / dir);
    WriteFile(checkpoints / dir / "model.safetensors", "m",
              fs::perms::owner_read | fs::perms::owner_write);
  }
  pb::FetchArtifactsRequest request;
  *request.mutable_key() = key;
  grpc::ClientContext context;
  Deadline(&context);
  auto stub = Stub();
  auto reader = stub->FetchArtifacts(&context, request);
  std::set<std::string> paths;
  pb::ArtifactChunk chunk;
  while (reader->Read(&chunk)) {
    if (!chunk.path().empty()) paths.insert(chunk.path());
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_TRUE(paths.contains("output/checkpoints/step-1/model.safetensors"));
  EXPECT_FALSE(paths.contains("output/checkpoints/step-2.tmp/model.safetensors"));
  EXPECT_TRUE(paths.contains("events.jsonl"));
}

}  // namespace
}  // namespace llmctl::agent
