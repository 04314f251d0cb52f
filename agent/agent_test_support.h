// What the agent's end-to-end tests (agent_test.cc, multinode_test.cc) share: files, run keys,
// event streams and the real trainer's inputs and processes.
#ifndef LLMCTL_AGENT_AGENT_TEST_SUPPORT_H_
#define LLMCTL_AGENT_AGENT_TEST_SUPPORT_H_

#include <gtest/gtest.h>
#include <signal.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/digest/digest.h"
#include "common/files.h"
#include "common/trial_config.h"
#include "llmctl/v1/agent.grpc.pb.h"

namespace llmctl::agent::test_support {

namespace fs = std::filesystem;
namespace pb = llmctl::v1;

inline constexpr char kToken[] = "node1-token-0123456789";
inline constexpr auto kCallTimeout = std::chrono::seconds(120);

inline std::string BuildDir() {
  const char* dir = std::getenv("LLMCTL_BUILD_DIR");
  return dir != nullptr ? dir : "build";
}

inline std::string ReadAll(const fs::path& path) {
  auto text = ReadFileToString(path.string());
  return text.ok() ? *text : "";
}

inline std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

inline void WriteFile(const fs::path& path, const std::string& text, fs::perms perms) {
  std::ofstream(path) << text;
  fs::permissions(path, perms);
}

inline pb::RunKey Key(int64_t experiment, const std::string& trial, int attempt) {
  pb::RunKey key;
  key.set_experiment_id(experiment);
  key.set_trial(trial);
  key.set_attempt(attempt);
  return key;
}

inline void Deadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() + kCallTimeout);
}

struct Streamed {
  std::vector<pb::TrialEvent> events;
  std::optional<pb::RunEnded> ended;
  grpc::Status status;
};

// Streams `key`'s events from `from_seq` (rank 0's; other ranks' from `from_rank_seq`); stops after
// `max_events` events when given, else at the end.
inline Streamed StreamRun(pb::Agent::Stub& stub, const pb::RunKey& key, int64_t from_seq,
                          size_t max_events = SIZE_MAX,
                          const std::map<int, int64_t>& from_rank_seq = {}) {
  pb::StreamEventsRequest request;
  *request.mutable_key() = key;
  request.set_from_seq(from_seq);
  for (const auto& [rank, seq] : from_rank_seq) (*request.mutable_from_rank_seq())[rank] = seq;
  grpc::ClientContext context;
  Deadline(&context);
  auto reader = stub.StreamEvents(&context, request);
  Streamed streamed;
  pb::StreamEventsResponse item;
  while (streamed.events.size() < max_events && reader->Read(&item)) {
    if (item.has_event()) streamed.events.push_back(item.event());
    if (item.has_ended()) streamed.ended = item.ended();
  }
  if (streamed.events.size() >= max_events) context.TryCancel();
  streamed.status = reader->Finish();
  return streamed;
}

// The events of one rank, in the order they came.
inline std::vector<pb::TrialEvent> OfRank(const std::vector<pb::TrialEvent>& events, int rank) {
  std::vector<pb::TrialEvent> of_rank;
  for (const pb::TrialEvent& event : events) {
    if (event.rank() == rank) of_rank.push_back(event);
  }
  return of_rank;
}

inline void ExpectSameAsFile(const std::vector<pb::TrialEvent>& events, const fs::path& file,
                             int64_t first_seq = 1) {
  const std::vector<std::string> lines = Lines(ReadAll(file));
  ASSERT_EQ(static_cast<int64_t>(events.size()),
            static_cast<int64_t>(lines.size()) - first_seq + 1);
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].seq(), first_seq + static_cast<int64_t>(i));
    EXPECT_EQ(events[i].json(), lines[first_seq - 1 + i]);
  }
}

// Rank `rank`'s step losses, by step.
inline std::map<int64_t, double> Losses(const std::vector<pb::TrialEvent>& events, int rank) {
  std::map<int64_t, double> losses;
  for (const auto& event : OfRank(events, rank)) {
    if (event.type() != "step") continue;
    const nlohmann::json json = nlohmann::json::parse(event.json());
    losses[json.at("step").get<int64_t>()] = json.at("loss").get<double>();
  }
  return losses;
}

// Uploads the trial's data and tokenizer through `stub` and names them in `request` as input
// trees, as the controller does.
inline void UploadInputs(pb::Agent::Stub& stub, const TrialConfig& config,
                         pb::RunTrialRequest* request) {
  for (const std::string input : {"data.path", "tokenizer"}) {
    const std::string path = config.GetString(input);
    const std::string bytes = ReadAll(path);
    ASSERT_FALSE(bytes.empty()) << path;
    pb::UploadBlobResponse uploaded;
    grpc::ClientContext context;
    Deadline(&context);
    auto writer = stub.UploadBlob(&context, &uploaded);
    pb::BlobChunk chunk;
    chunk.set_sha256(digest::Sha256Hex(bytes));
    chunk.set_size(static_cast<int64_t>(bytes.size()));
    chunk.set_data(bytes);
    ASSERT_TRUE(writer->Write(chunk));
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok());
    const std::string name = fs::path(path).filename().string();
    pb::InputTree& tree = (*request->mutable_inputs())[input];
    tree.set_is_file(true);
    pb::TreeFile* file = tree.add_files();
    file->set_path(name);
    file->set_sha256(digest::Sha256Hex(bytes));
    file->set_size(static_cast<int64_t>(bytes.size()));
    tree.set_digest(digest::TreeDigest(std::vector<digest::TreeFile>{
        {name, digest::Sha256Hex(bytes), static_cast<int64_t>(bytes.size())}}));
  }
}

// The ranks' pids from a run's ranks.json and the launcher's (the worker's) from worker.json.
inline std::vector<pid_t> JobPids(const fs::path& run_dir) {
  const nlohmann::json ranks = nlohmann::json::parse(ReadAll(run_dir / "ranks.json"));
  std::vector<pid_t> pids = ranks.at("pids").get<std::vector<pid_t>>();
  const nlohmann::json worker = nlohmann::json::parse(ReadAll(run_dir / "worker.json"));
  pids.push_back(worker.at("pid").get<pid_t>());
  return pids;
}

// Every pid is gone, reaped: the launcher's children (the ranks) are reaped by the launcher or,
// once it is gone, by init, which may take a moment after the run's end; the wait is bounded by
// the call deadline, not a measured time.
inline void ExpectGone(const std::vector<pid_t>& pids) {
  const auto deadline = std::chrono::steady_clock::now() + kCallTimeout;
  for (const pid_t pid : pids) {
    while (::kill(pid, 0) == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(::kill(pid, 0), -1) << "pid " << pid << " is still there";
    EXPECT_EQ(errno, ESRCH);
  }
}

}  // namespace llmctl::agent::test_support

#endif  // LLMCTL_AGENT_AGENT_TEST_SUPPORT_H_
