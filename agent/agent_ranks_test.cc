// llm-agent end to end with 2-rank trials (ddp, fsdp): the stand-in for llm-train playing its
// launcher and both ranks, and the real llm-train's ranks on the CPU (Gloo) when it has been built.
// The fixture is agent_test_support.h's (AgentTest, RealTrainerFixture), as agent_runs_test.cc's.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "agent/agent_test_support.h"
#include "llmctl/v1/agent.grpc.pb.h"
#include "tests/support/one_thread_per_process.h"

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;
namespace pb = llmctl::v1;
using namespace test_support;  // NOLINT(build/namespaces): the tests' shared vocabulary

TEST_F(AgentTest, ATwoRankTrialRunsThroughTheLauncherAndStreamsEveryRank) {
  StartAgent();
  const pb::RunKey key = Key(5, "ddp", 1);
  RunTrial(key, 0, nullptr, /*ddp_devices=*/2);
  const Streamed streamed = Stream(key, 0);
  ASSERT_TRUE(streamed.status.ok()) << streamed.status.error_message();
  ASSERT_TRUE(streamed.ended.has_value());
  EXPECT_EQ(streamed.ended->outcome(), "ok");
  const std::vector<std::string> argv = Lines(ReadAll(RunDir(key) / "argv"));
  const std::string joined = [&] {
    std::string all;
    for (const std::string& arg : argv) all += arg + " ";
    return all;
  }();
  EXPECT_NE(joined.find("--nproc 2 --master-port 0 --ranks-file " +
                        (RunDir(key) / "ranks.json").string()),
            std::string::npos)
      << joined;
  ASSERT_EQ(streamed.events.size(), 8u);
  ExpectSameAsFile(OfRank(streamed.events, 0), RunDir(key) / "events.jsonl");
  ExpectSameAsFile(OfRank(streamed.events, 1), RunDir(key) / "events.rank1.jsonl");
  EXPECT_EQ(OfRank(streamed.events, 1).back().type(), "result");

  // Each rank resumes from its own seq.
  const Streamed rest = Stream(key, 3, SIZE_MAX, {{1, 4}});
  ASSERT_TRUE(rest.ended.has_value());
  ExpectSameAsFile(OfRank(rest.events, 0), RunDir(key) / "events.jsonl", 3);
  ExpectSameAsFile(OfRank(rest.events, 1), RunDir(key) / "events.rank1.jsonl", 4);
  EXPECT_EQ(rest.events.size(), 3u);
  EXPECT_EQ(Stream(key, 0, SIZE_MAX, {{0, 1}}).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(AgentTest, TheFirstFailedRankDecidesTheOutcomeAndIsNamed) {
  StartAgent();
  const pb::RunKey oom = Key(5, "oom", 1);
  RunTrial(oom, 503, nullptr, /*ddp_devices=*/2);
  const Streamed oom_streamed = Stream(oom, 0);
  ASSERT_TRUE(oom_streamed.ended.has_value());
  EXPECT_EQ(oom_streamed.ended->outcome(), "oom");
  EXPECT_EQ(oom_streamed.ended->exit_code(), 3);
  EXPECT_EQ(oom_streamed.ended->error(), "rank 1 of 2: out of memory at step 1");

  const pb::RunKey killed = Key(5, "killed", 1);
  RunTrial(killed, 600 + SIGSEGV, nullptr, /*ddp_devices=*/2);
  const Streamed killed_streamed = Stream(killed, 0);
  ASSERT_TRUE(killed_streamed.ended.has_value());
  EXPECT_EQ(killed_streamed.ended->outcome(), "failed");
  EXPECT_EQ(killed_streamed.ended->exit_code(), -SIGSEGV);
  EXPECT_THAT(killed_streamed.ended->error(),
              ::testing::StartsWith("rank 1 of 2: killed by SIGSEGV"));

  // After a restart the outcome is decided again from the same files, with the same result.
  server_.reset();
  fs::remove(RunDir(oom) / "ended.json");
  StartAgent();
  const Streamed again = Stream(oom, 0);
  ASSERT_TRUE(again.ended.has_value());
  EXPECT_EQ(again.ended->outcome(), "oom");
  EXPECT_EQ(again.ended->error(), "rank 1 of 2: out of memory at step 1");
}

TEST_F(AgentTest, KilledAgentReadoptsATwoRankRunAndLosesOrRepeatsNoEvent) {
  StartAgentProcess();
  const pb::RunKey key = Key(4, "ddp-survivor", 1);
  RunTrial(key, 300, nullptr, /*ddp_devices=*/2);
  // Some of the 6 events written before `go`, of either rank.
  const Streamed before = Stream(key, 0, 4);
  ASSERT_EQ(before.events.size(), 4u);

  KillAgentProcess();
  StartAgentProcess();
  WriteFile(RunDir(key) / "go", "", fs::perms::owner_read | fs::perms::owner_write);
  // Each rank from the line after the last one received, as the controller resumes.
  std::map<int, int64_t> next = {{0, 1}, {1, 1}};
  for (const pb::TrialEvent& event : before.events) next[event.rank()] = event.seq() + 1;
  const Streamed after = Stream(key, next[0], SIZE_MAX, {{1, next[1]}});
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  ASSERT_TRUE(after.ended.has_value());
  EXPECT_EQ(after.ended->outcome(), "ok");
  std::vector<pb::TrialEvent> all = before.events;
  all.insert(all.end(), after.events.begin(), after.events.end());
  ExpectSameAsFile(OfRank(all, 0), RunDir(key) / "events.jsonl");
  ExpectSameAsFile(OfRank(all, 1), RunDir(key) / "events.rank1.jsonl");
  EXPECT_EQ(all.size(), 12u);
}

// The real trainer's 2-rank runs: their strategy, their progress, their processes.
class RealTrainerTest : public RealTrainerFixture {
 protected:
  // Sets `strategy` over 2 ranks, global batch 8, and `max_steps`.
  void TwoRanks(const std::string& strategy, int64_t max_steps) {
    for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{
             {"strategy", strategy},
             {"devices", "2"},
             {"train.global_batch_size", "8"},
             {"train.max_steps", std::to_string(max_steps)}}) {
      ASSERT_TRUE(config_.SetFromText(name, value).ok()) << name;
    }
  }

  // Streams `key`'s events until every one of `ranks` has taken `steps` steps (the job is under
  // way); the run must not have ended by then.
  Streamed StreamUntilSteps(const pb::RunKey& key, int64_t steps, int ranks = 2) {
    Streamed streamed;
    pb::StreamEventsRequest request;
    *request.mutable_key() = key;
    grpc::ClientContext context;
    Deadline(&context);
    auto stub = Stub();
    auto reader = stub->StreamEvents(&context, request);
    std::map<int, int64_t> taken;
    pb::StreamEventsResponse item;
    while (reader->Read(&item)) {
      if (item.has_ended()) streamed.ended = item.ended();
      if (!item.has_event()) continue;
      streamed.events.push_back(item.event());
      if (item.event().type() == "step") ++taken[item.event().rank()];
      bool all = true;
      for (int rank = 0; rank < ranks; ++rank) all = all && taken[rank] >= steps;
      if (all) break;
    }
    context.TryCancel();
    reader->Finish();
    return streamed;
  }

  std::vector<pid_t> JobPids(const pb::RunKey& key) { return test_support::JobPids(RunDir(key)); }

  // Cancels `key` (plainly) and returns all its events once it ended.
  Streamed CancelAndStream(const pb::RunKey& key) {
    pb::CancelRunRequest request;
    *request.mutable_key() = key;
    pb::RunState state;
    EXPECT_TRUE(Cancel(request, &state).ok());
    return Stream(key, 0);
  }

  // A 2-rank `strategy` trial stopped with `cancel --checkpoint` mid-run ends cancelled with a
  // complete checkpoint of its last complete step; the agent's resume from it continues with the
  // losses of an uninterrupted run.
  void ExpectCheckpointStopResumesExactly(const std::string& strategy);
};

void RealTrainerTest::ExpectCheckpointStopResumesExactly(const std::string& strategy) {
  // Three runs' losses are compared bit for bit: their ranks' matmuls must not depend on how many
  // threads MKL takes.
  const llmctl::testing::OneThreadPerProcess one_thread;
  StartAgent(llm_train_);
  // The schedule decays to max_steps, so every run here has the same one; none gets that far.
  TwoRanks(strategy, 100000);
  const pb::RunKey key = Key(9, strategy + "-stopped", 1);
  Start(key, 2);
  ASSERT_FALSE(StreamUntilSteps(key, 2).ended.has_value());
  const std::vector<pid_t> pids = JobPids(key);
  pb::CancelRunRequest cancel;
  *cancel.mutable_key() = key;
  cancel.set_checkpoint(true);
  cancel.set_checkpoint_grace_ms(60'000);
  pb::RunState state;
  ASSERT_TRUE(Cancel(cancel, &state).ok());

  const Streamed stopped = Stream(key, 0);
  ASSERT_TRUE(stopped.ended.has_value());
  const std::string stderr_log = ReadAll(RunDir(key) / "stderr.log");
  EXPECT_EQ(stopped.ended->outcome(), "cancelled") << stopped.ended->error() << "\n" << stderr_log;
  EXPECT_EQ(stopped.ended->exit_code(), 5) << stopped.ended->error() << "\n" << stderr_log;
  ExpectGone(pids);
  // Rank 0's result names the checkpoint of the steps it completed.
  const std::vector<pb::TrialEvent> rank0 = OfRank(stopped.events, 0);
  ASSERT_FALSE(rank0.empty());
  ASSERT_EQ(rank0.back().type(), "result") << stderr_log;
  const nlohmann::json result = nlohmann::json::parse(rank0.back().json());
  ASSERT_TRUE(result.contains("checkpoint")) << result.dump() << "\n" << stderr_log;
  const int64_t completed = result["checkpoint"].at("step").get<int64_t>() + 1;
  const fs::path checkpoint = result["checkpoint"].at("path").get<std::string>();
  EXPECT_EQ(checkpoint,
            RunDir(key) / "output" / "checkpoints" / ("step-" + std::to_string(completed)));
  EXPECT_GE(completed, 2);
  EXPECT_EQ(Losses(stopped.events, 0).size(), static_cast<size_t>(completed));
  for (int rank : {0, 1}) {
    ExpectSameAsFile(OfRank(stopped.events, rank), RunDir(key) / RankEventsFile(rank));
  }
  // Complete: the renamed directory (no staging one left) with the state, the model and every
  // optimizer shard.
  for (const char* file : {"trainer_state.json", "model.safetensors", "optimizer.safetensors"}) {
    EXPECT_TRUE(fs::exists(checkpoint / file)) << file;
  }
  EXPECT_EQ(fs::exists(checkpoint / "optimizer.rank1.safetensors"), strategy == "fsdp");
  for (const auto& entry : fs::directory_iterator(checkpoint.parent_path())) {
    EXPECT_EQ(entry.path(), checkpoint) << "only the one checkpoint";
  }

  // Resumed through the agent: two more steps each rank, then a plain cancel.
  const pb::RunKey resumed_key = Key(9, strategy + "-stopped", 2);
  Start(resumed_key, 2, &key, checkpoint.string());
  ASSERT_FALSE(StreamUntilSteps(resumed_key, 2).ended.has_value());
  const Streamed resumed = CancelAndStream(resumed_key);
  ASSERT_TRUE(resumed.ended.has_value());
  EXPECT_EQ(resumed.ended->outcome(), "cancelled") << resumed.ended->error();

  // The uninterrupted run, to past the resumed steps.
  const pb::RunKey whole_key = Key(9, strategy + "-whole", 1);
  Start(whole_key, 2);
  ASSERT_FALSE(StreamUntilSteps(whole_key, completed + 2).ended.has_value());
  const Streamed whole = CancelAndStream(whole_key);
  for (int rank : {0, 1}) {
    const std::map<int64_t, double> all = Losses(whole.events, rank);
    const std::map<int64_t, double> before = Losses(stopped.events, rank);
    const std::map<int64_t, double> after = Losses(resumed.events, rank);
    ASSERT_GE(after.size(), 2u) << "rank " << rank;
    EXPECT_EQ(after.begin()->first, completed) << "rank " << rank;
    // One line a rank naming every step that differs, so the end of a log CI keeps shows them all.
    // A step before `completed` differing is two uninterrupted runs of one trial differing, which
    // no checkpoint caused; the values in full, as 6 digits rarely tell them apart.
    std::ostringstream differing;
    differing << std::setprecision(17);
    for (const auto* part : {&before, &after}) {
      for (const auto& [step, loss] : *part) {
        if (!all.count(step) || loss == all.at(step)) continue;  // past the whole run's cancel
        differing << " step " << step << (step < completed ? " (before the stop)" : "") << ": "
                  << loss << " against " << all.at(step) << ";";
      }
    }
    EXPECT_EQ(differing.str(), "") << "rank " << rank << "'s losses differ from the uninterrupted "
                                   << "run's; the checkpoint is of step " << completed - 1;
    for (int64_t step = completed; step < completed + 2; ++step) {
      EXPECT_TRUE(all.count(step) && after.count(step)) << "rank " << rank << " step " << step;
    }
  }
}

// strategy: ddp over 2 ranks on the CPU (Gloo), through the agent: both ranks' events arrive, each
// rank's in its file's order, and the run is ok.
TEST_F(RealTrainerTest, ATwoRankDdpTrialEndsOkWithEveryRanksEvents) {
  StartAgent(llm_train_);
  TwoRanks("ddp", /*max_steps=*/2);
  ASSERT_TRUE(config_.SetFromText("snapshot_every", "1").ok());
  const pb::RunKey key = Key(9, "ddp", 1);
  Start(key, 2);
  const Streamed streamed = Stream(key, 0);
  ASSERT_TRUE(streamed.ended.has_value());
  EXPECT_EQ(streamed.ended->outcome(), "ok") << streamed.ended->error() << "\n"
                                             << ReadAll(RunDir(key) / "stderr.log");
  for (int rank : {0, 1}) {
    const std::vector<pb::TrialEvent> events = OfRank(streamed.events, rank);
    ASSERT_FALSE(events.empty()) << "rank " << rank;
    EXPECT_EQ(events.front().type(), "start") << "rank " << rank;
    EXPECT_EQ(nlohmann::json::parse(events.front().json()).value("rank", -1), rank);
    EXPECT_EQ(events.back().type(), "result") << "rank " << rank;
    int steps = 0;
    int snapshots = 0;
    for (const auto& event : events) {
      steps += event.type() == "step";
      snapshots += event.type() == "snapshot";
    }
    EXPECT_EQ(steps, 2) << "rank " << rank;
    EXPECT_GT(snapshots, 0) << "rank " << rank;
    ExpectSameAsFile(events, RunDir(key) / RankEventsFile(rank));
  }
  EXPECT_EQ(OfRank(streamed.events, 2).size(), 0u);
}

// kill -9 of rank 1 mid-run: the launcher stops rank 0, nothing of the job is left, and the
// attempt's outcome names rank 1 (a SIGKILL while the kernel's OOM kill count stayed is no OOM).
TEST_F(RealTrainerTest, KillingOneRankEndsTheAttemptNamingItWithNoProcessLeft) {
  StartAgent(llm_train_);
  TwoRanks("ddp", /*max_steps=*/100000);
  const pb::RunKey key = Key(9, "ddp-killed", 1);
  Start(key, 2);
  const Streamed first = StreamUntilSteps(key, 1);
  ASSERT_FALSE(first.ended.has_value()) << first.ended->error();
  const std::vector<pid_t> pids = JobPids(key);  // rank 0, rank 1, the launcher
  ASSERT_EQ(pids.size(), 3u);
  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);

  const Streamed streamed = Stream(key, 0);
  ASSERT_TRUE(streamed.ended.has_value());
  EXPECT_EQ(streamed.ended->outcome(), "failed");
  EXPECT_EQ(streamed.ended->exit_code(), -SIGKILL);
  EXPECT_EQ(streamed.ended->error(),
            "rank 1 of 2: killed by SIGKILL, not by the kernel's out-of-memory killer");
  const nlohmann::json after = nlohmann::json::parse(ReadAll(RunDir(key) / "ranks.json"));
  EXPECT_EQ(after.at("first_failure"), (nlohmann::json{{"rank", 1}, {"signal", SIGKILL}}));
  ExpectGone(pids);
}

// A plain cancel of a running 2-rank ddp trial: SIGTERM to the worker's group reaches the launcher
// and both ranks; the attempt ends cancelled, every event either rank wrote is streamed, and
// neither rank nor the launcher is left.
TEST_F(RealTrainerTest, CancellingATwoRankTrialEndsItCancelledWithNoProcessLeft) {
  StartAgent(llm_train_);
  TwoRanks("ddp", 100000);
  const pb::RunKey key = Key(9, "ddp-cancelled", 1);
  Start(key, 2);
  ASSERT_FALSE(StreamUntilSteps(key, 1).ended.has_value());
  const std::vector<pid_t> pids = JobPids(key);
  ASSERT_EQ(pids.size(), 3u);

  pb::CancelRunRequest request;
  *request.mutable_key() = key;
  pb::RunState state;
  ASSERT_TRUE(Cancel(request, &state).ok());
  ASSERT_EQ(state.status(), pb::RUN_STATUS_ENDED);
  EXPECT_EQ(state.ended().outcome(), "cancelled") << state.ended().error();
  const Streamed streamed = Stream(key, 0);
  ASSERT_TRUE(streamed.ended.has_value());
  EXPECT_EQ(streamed.ended->outcome(), "cancelled") << streamed.ended->error();
  ExpectGone(pids);
  for (int rank : {0, 1}) {
    const std::vector<pb::TrialEvent> events = OfRank(streamed.events, rank);
    ASSERT_FALSE(events.empty()) << "rank " << rank;
    EXPECT_EQ(events.front().type(), "start") << "rank " << rank;
    EXPECT_GE(Losses(streamed.events, rank).size(), 1u) << "rank " << rank;
    ExpectSameAsFile(events, RunDir(key) / RankEventsFile(rank));
  }
}

// The ranks stop at one step, whichever of them the signal reached: SIGUSR1 to rank 1 alone (not
// the group) stops both ranks of an fsdp trial, whose checkpoint every rank writes its shard of,
// and the job ends cancelled with that checkpoint.
TEST_F(RealTrainerTest, ACheckpointSignalToOneRankStopsEveryRankAtTheSameStep) {
  StartAgent(llm_train_);
  TwoRanks("fsdp", 100000);
  const pb::RunKey key = Key(9, "fsdp-one-rank", 1);
  Start(key, 2);
  ASSERT_FALSE(StreamUntilSteps(key, 1).ended.has_value());
  const std::vector<pid_t> pids = JobPids(key);
  ASSERT_EQ(::kill(pids[1], SIGUSR1), 0);

  const Streamed streamed = Stream(key, 0);
  ASSERT_TRUE(streamed.ended.has_value());
  const std::string stderr_log = ReadAll(RunDir(key) / "stderr.log");
  EXPECT_EQ(streamed.ended->outcome(), "cancelled") << streamed.ended->error() << "\n"
                                                    << stderr_log;
  EXPECT_EQ(streamed.ended->exit_code(), 5) << stderr_log;
  ExpectGone(pids);
  int64_t stopped_at = -1;
  for (int rank : {0, 1}) {
    const std::vector<pb::TrialEvent> events = OfRank(streamed.events, rank);
    ASSERT_FALSE(events.empty()) << "rank " << rank;
    ASSERT_EQ(events.back().type(), "result") << "rank " << rank << "\n" << stderr_log;
    const nlohmann::json result = nlohmann::json::parse(events.back().json());
    EXPECT_EQ(result.value("outcome", ""), "cancelled") << "rank " << rank << ": " << result.dump();
    // Both ranks completed the same steps.
    const int64_t steps = static_cast<int64_t>(Losses(streamed.events, rank).size());
    if (rank == 0) stopped_at = steps;
    EXPECT_EQ(steps, stopped_at) << "rank " << rank;
    EXPECT_EQ(result.value("error", ""), "cancelled at step " + std::to_string(stopped_at))
        << "rank " << rank;
  }
  const fs::path checkpoint =
      RunDir(key) / "output" / "checkpoints" / ("step-" + std::to_string(stopped_at));
  for (const char* file : {"trainer_state.json", "model.safetensors", "optimizer.safetensors",
                           "optimizer.rank1.safetensors"}) {
    EXPECT_TRUE(fs::exists(checkpoint / file)) << checkpoint / file;
  }
}

TEST_F(RealTrainerTest, ACheckpointStopOfATwoRankDdpTrialResumesExactly) {
  ExpectCheckpointStopResumesExactly("ddp");
}

TEST_F(RealTrainerTest, ACheckpointStopOfATwoRankFsdpTrialResumesExactly) {
  ExpectCheckpointStopResumesExactly("fsdp");
}

}  // namespace
}  // namespace llmctl::agent
