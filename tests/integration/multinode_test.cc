// Multi-node trials (the trial key `nodes`) through the controller and two real llm-agent
// processes on loopback: placed on both at once, node rank 0 started first and the other told its
// rendezvous, every rank's events stored once across an agent's kill -9, one node's failure
// stopping the other and naming it, a cancel reaching both. The fake trainer (the fixture's) stands
// in for llm-train's ranks; the last test runs the real llm-train, whose ranks meet over Gloo.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "common/files.h"
#include "common/text.h"
#include "tests/integration/controller_agent_fixture.h"
#include "tests/support/shell_command.h"

namespace llmctl::controller {
namespace {

using namespace testing_support;  // NOLINT: the fixture's helpers
namespace fs = std::filesystem;

class MultiNodeTest : public ControllerAgentTest {
 protected:
  std::string Argv(const std::string& node, int64_t experiment, const std::string& trial) {
    auto text = ReadFileToString((RunDir(node, experiment, trial, 1) / "argv.txt").string());
    return text.ok() ? *text : "";
  }

  // The run has ended on the node: its supervisor recorded how the worker exited.
  bool RunEnded(const std::string& node, int64_t experiment, const std::string& trial) {
    return fs::exists(RunDir(node, experiment, trial, 1) / "exit.json");
  }

  // The agents started from now on run the real llm-train.
  void UseTheRealTrainer() {
    trainer_ = (BuildDir() / "trainer/llm-train").string();
    ASSERT_TRUE(fs::exists(trainer_)) << trainer_ << " is built with this test";
  }

  // `yaml` (the demo's data and tokenizer beside it) submitted with the built llmctl, as a user
  // does, to this controller; the experiment's id.
  int64_t SubmitAsAUser(const std::string& name, const std::string& yaml) {
    const fs::path user = dir_ / "user";
    fs::create_directories(user);
    const fs::path source = llmctl::testing::SourceDir();
    fs::copy_file(source / "experiments/data/alpaca-demo.jsonl", user / "train.jsonl",
                  fs::copy_options::overwrite_existing);
    fs::copy_file(source / "experiments/tokenizers/demo/tokenizer.json", user / "tokenizer.json",
                  fs::copy_options::overwrite_existing);
    std::ofstream(user / name) << yaml;
    const llmctl::testing::CommandResult submitted = llmctl::testing::RunShellCommand(
        ShellWord("LLMCTL_CONTROLLER=unix:" + (dir_ / "controller.sock").string()) + " " +
        ShellWord((BuildDir() / "controller/cli/llmctl").string()) + " submit " +
        ShellWord((user / name).string()));
    EXPECT_EQ(submitted.exit_code, 0) << submitted.out;
    const std::string id = llmctl::testing::SubmittedExperimentId(submitted.out);
    EXPECT_NE(id, "") << submitted.out;
    return submitted.exit_code == 0 && !id.empty() ? std::stoll(id) : -1;
  }
};

TEST_F(MultiNodeTest, RunsOnTwoAgentsWithNodeRankZerosRendezvousAndStoresEveryRank) {
  AddAgent("n1");
  AddAgent("n2");
  const int64_t experiment = Submit(Experiment({{"mn-a", 0}}));
  ASSERT_TRUE(RoundsUntil([&] { return AllEnded(experiment); }));
  const store::TrialRecord trial = Trials(experiment).front();
  EXPECT_EQ(trial.state, store::TrialState::kOk);
  EXPECT_EQ(trial.current_attempt, 1);

  // Both nodes ran attempt 1, each once; which agent became node rank 0 is the scheduler's choice.
  const std::string zero =
      Argv("n1", experiment, "mn-a").find("--node-rank 0") != std::string::npos ? "n1" : "n2";
  const std::string one = zero == "n1" ? "n2" : "n1";
  const std::string argv_zero = Argv(zero, experiment, "mn-a");
  const std::string argv_one = Argv(one, experiment, "mn-a");
  EXPECT_NE(argv_zero.find("--nproc 1 --nnodes 2 --node-rank 0"), std::string::npos) << argv_zero;
  EXPECT_NE(argv_zero.find("--master-port 0"), std::string::npos) << argv_zero;
  EXPECT_NE(argv_one.find("--node-rank 1"), std::string::npos) << argv_one;
  // The port node rank 0's ranks file reported, and its host: the agents listen on unix sockets.
  EXPECT_NE(argv_one.find("--master-addr 127.0.0.1"), std::string::npos) << argv_one;
  EXPECT_NE(argv_one.find("--master-port 29400"), std::string::npos) << argv_one;

  // Rank 0's events are node rank 0's events.jsonl; rank 1's are on the other node only.
  const fs::path run_zero = RunDir(zero, experiment, "mn-a", 1);
  const fs::path run_one = RunDir(one, experiment, "mn-a", 1);
  EXPECT_EQ(FileLines(run_zero / "events.jsonl"), 4);
  EXPECT_FALSE(fs::exists(run_zero / "events.rank1.jsonl"));
  EXPECT_FALSE(fs::exists(run_one / "events.jsonl"));
  EXPECT_EQ(FileLines(run_one / "events.rank1.jsonl"), 4);
  EXPECT_TRUE(BothRanksStoredUpTo(trial.id, 4));
}

// Each node's agent samples its own share of the trial (the fake trainer's processes, from /proc
// once a second) and numbers its readings itself: the store keeps every node's, apart, and the
// status `llmctl watch` reads names both nodes' devices.
TEST_F(MultiNodeTest, EveryNodesDeviceSamplesAreStored) {
  AddAgent("n1");
  AddAgent("n2");
  const int64_t experiment = Submit(Experiment({{"mn-held", 300}}));
  const store::TrialRecord trial = Trials(experiment).front();
  const auto stored = [&](int64_t node_rank) {
    return *daemon_->store().LastDeviceSampleSeq(trial.id, 1, node_rank);
  };
  ASSERT_TRUE(RoundsUntil([&] { return stored(0) >= 2 && stored(1) >= 2; }));
  auto latest = daemon_->store().LatestDeviceSamples(trial.id, 1);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  ASSERT_EQ(latest->size(), 2u);
  EXPECT_EQ((*latest)[0].node_rank, 0);
  EXPECT_EQ((*latest)[1].node_rank, 1);
  for (const char* node : {"n1", "n2"}) {
    WriteFile(RunDir(node, experiment, "mn-held", 1) / "go", "",
              fs::perms::owner_read | fs::perms::owner_write);
  }
  ASSERT_TRUE(RoundsUntil([&] { return AllEnded(experiment); }));
  auto samples = daemon_->store().DeviceSamples(experiment, "mn-held");
  ASSERT_TRUE(samples.ok()) << samples.status().ToString();
  std::map<int64_t, int64_t> rows;  // node rank -> rows (one per reading: the run is short)
  for (const store::DeviceSample& sample : *samples) {
    EXPECT_EQ(sample.device, "cpu");
    EXPECT_GT(sample.memory_used_bytes, 0);
    ++rows[sample.node_rank];
  }
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& [node_rank, count] : rows) {
    SCOPED_TRACE("node rank " + std::to_string(node_rank));
    EXPECT_EQ(count, stored(node_rank));
    // Which agent is node rank 0 is the scheduler's choice: its readings are its own file's.
    const std::string zero =
        Argv("n1", experiment, "mn-held").find("--node-rank 0") != std::string::npos ? "n1" : "n2";
    const std::string node = node_rank == 0 ? zero : (zero == "n1" ? "n2" : "n1");
    EXPECT_LE(count, FileLines(RunDir(node, experiment, "mn-held", 1) / "samples.jsonl"));
  }
}

TEST_F(MultiNodeTest, ANodeOutOfMemoryStopsTheOtherAndTheTrialIsOomNamingIt) {
  AddAgent("n1");
  AddAgent("n2");
  const int64_t experiment = Submit(Experiment({{"mn-oom", 110}}));
  ASSERT_TRUE(RoundsUntil([&] { return AllEnded(experiment); }));
  EXPECT_EQ(Trials(experiment).front().state, store::TrialState::kOom);
  // The node that waited in its "collective" was stopped, not left running.
  EXPECT_TRUE(RunEnded("n1", experiment, "mn-oom"));
  EXPECT_TRUE(RunEnded("n2", experiment, "mn-oom"));

  const v1::ReportResponse report = Report(experiment);
  ASSERT_GT(report.trials_size(), 0);
  EXPECT_EQ(report.trials(0).outcome(), "oom");
  EXPECT_NE(report.trials(0).error().find("(node rank 1 of 2): rank 1 of 2"), std::string::npos)
      << report.trials(0).error();
}

TEST_F(MultiNodeTest, AKilledAgentLosesAndRepeatsNoEventOfEitherNode) {
  AddAgent("n1");
  AddAgent("n2");
  const int64_t experiment = Submit(Experiment({{"mn-held", 300}}));
  const store::TrialRecord trial = Trials(experiment).front();
  ASSERT_TRUE(RoundsUntil([&] { return BothRanksStoredUpTo(trial.id, 3); }));

  Kill("n2");
  daemon_->dispatcher().Tick();
  StartAgent("n2");
  for (const char* node : {"n1", "n2"}) {
    WriteFile(RunDir(node, experiment, "mn-held", 1) / "go", "",
              fs::perms::owner_read | fs::perms::owner_write);
  }
  ASSERT_TRUE(RoundsUntil([&] { return AllEnded(experiment); }));

  const store::TrialRecord done = Trials(experiment).front();
  EXPECT_EQ(done.state, store::TrialState::kOk);
  EXPECT_EQ(done.current_attempt, 1);
  EXPECT_TRUE(BothRanksStoredUpTo(trial.id, 5));
}

// The controller goes away mid-run and comes back: it follows both nodes' runs again from the last
// stored line of each rank, and starts nothing twice.
TEST_F(MultiNodeTest, ARestartedControllerResumesEveryNodesStreamAndRunsNothingTwice) {
  AddAgent("n1");
  AddAgent("n2");
  const int64_t experiment = Submit(Experiment({{"mn-held", 300}}));
  const int64_t trial_id = Trials(experiment).front().id;
  ASSERT_TRUE(RoundsUntil([&] { return BothRanksStoredUpTo(trial_id, 3); }));
  daemon_.reset();
  for (const char* node : {"n1", "n2"}) {
    WriteFile(RunDir(node, experiment, "mn-held", 1) / "go", "",
              fs::perms::owner_read | fs::perms::owner_write);
  }
  StartController();
  ASSERT_TRUE(RoundsUntil([&] { return AllEnded(experiment); }));
  const store::TrialRecord done = Trials(experiment).front();
  EXPECT_EQ(done.state, store::TrialState::kOk);
  EXPECT_EQ(done.current_attempt, 1);
  EXPECT_TRUE(BothRanksStoredUpTo(trial_id, 5));
  for (const char* node : {"n1", "n2"}) {
    EXPECT_FALSE(fs::exists(RunDir(node, experiment, "mn-held", 2))) << node;
  }
}

TEST_F(MultiNodeTest, ACancelStopsItOnEveryNode) {
  AddAgent("n1");
  AddAgent("n2");
  const int64_t experiment = Submit(Experiment({{"mn-held", 300}}));
  const store::TrialRecord trial = Trials(experiment).front();
  ASSERT_TRUE(RoundsUntil([&] { return BothRanksStoredUpTo(trial.id, 3); }));
  ASSERT_TRUE(daemon_->dispatcher().Cancel(experiment, "mn-held", /*checkpoint=*/false).ok());
  ASSERT_TRUE(RoundsUntil([&] { return AllEnded(experiment); }));
  EXPECT_EQ(Trials(experiment).front().state, store::TrialState::kCancelled);
  EXPECT_TRUE(RunEnded("n1", experiment, "mn-held"));
  EXPECT_TRUE(RunEnded("n2", experiment, "mn-held"));
}

// The real llm-train. A ddp trial over 2 nodes of 1 rank each, submitted with the built llmctl to
// this controller: its ranks meet over Gloo at node rank 0's rendezvous, across the two agents, and
// each rank's loss at every step is the one the same trial has on one node with 2 ranks (the same
// world size and data shards; only the ranks' CPU thread counts differ, so within 1e-5).
TEST_F(MultiNodeTest, TheRealTrainersRanksMeetAcrossTwoAgentsAndTrainAsOneNodesDo) {
  UseTheRealTrainer();
  AddAgent("n1");
  AddAgent("n2");
  const int64_t experiment =
      SubmitAsAUser("two-nodes.yaml",
                    "name: two-nodes\nmodel: llmctl-demo\ninit: random\ntokenizer: tokenizer.json\n"
                    "data: {path: train.jsonl, max_seq_length: 64}\n"
                    "train: {micro_batch_size: 2, global_batch_size: 4, max_steps: 3}\n"
                    "strategy: ddp\ntrials:\n"
                    "  - {name: two-nodes, set: {nodes: 2, devices: 1}, expect: ok}\n"
                    "  - {name: one-node, set: {devices: 2}, expect: ok}\n");
  ASSERT_GT(experiment, 0);
  ASSERT_TRUE(RoundsWhileItTrainsUntil(experiment, [&] { return AllEnded(experiment); }));
  const std::vector<store::TrialRecord> trials = Trials(experiment);
  ASSERT_EQ(trials.size(), 2u);
  EXPECT_EQ(trials[0].state, store::TrialState::kOk) << "see n1-data/ and n2-data/ in " << dir_;
  EXPECT_EQ(trials[1].state, store::TrialState::kOk);

  // (trial, rank) → the loss at each step, as the store's per-rank view has them.
  // Read in SQL, as users do: no Store call gives rank 1's steps (RunSteps gives rank 0's).
  std::map<std::pair<std::string, int64_t>, std::vector<double>> losses;
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2((dir_ / "controller" / "llmctl.db").c_str(), &db, SQLITE_OPEN_READONLY,
                            nullptr),
            SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db,
                               "SELECT trial, rank, loss FROM trial_rank_steps "
                               "WHERE experiment_id = ? ORDER BY trial, rank, step",
                               -1, &stmt, nullptr),
            SQLITE_OK);
  sqlite3_bind_int64(stmt, 1, experiment);
  while (sqlite3_step(stmt) == SQLITE_ROW) {
    losses[{reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)),
            sqlite3_column_int64(stmt, 1)}]
        .push_back(sqlite3_column_double(stmt, 2));
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  for (int64_t rank : {0, 1}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const std::vector<double>& across = losses[{"two-nodes", rank}];
    const std::vector<double>& together = losses[{"one-node", rank}];
    ASSERT_EQ(across.size(), 3u);
    ASSERT_EQ(together.size(), 3u);
    for (size_t step = 0; step < across.size(); ++step) {
      EXPECT_NEAR(across[step], together[step], 1e-5 * std::abs(together[step])) << "step " << step;
    }
  }
  // Each rank's events came from its own node: rank 1's file is on node rank 1's agent only.
  int rank_one_files = 0;
  for (const char* node : {"n1", "n2"}) {
    rank_one_files += fs::exists(RunDir(node, experiment, "two-nodes", 1) / "events.rank1.jsonl");
  }
  EXPECT_EQ(rank_one_files, 1);
}

// The real llm-train's fsdp over 2 nodes, stopped with a checkpoint: each node holds its rank's
// optimizer shard, the controller copies the checkpoint from both into one tree, both nodes go
// (`llmctl node down`), and the trial resumes on two other agents, its losses exactly those of the
// same trial run uninterrupted.
TEST_F(MultiNodeTest, AnFsdpCheckpointFromTwoNodesResumesOnTwoOtherAgentsExactly) {
  UseTheRealTrainer();
  AddAgent("n1");
  AddAgent("n2");
  constexpr int kSteps = 24;
  const std::string yaml =
      "model: llmctl-demo\ninit: random\ntokenizer: tokenizer.json\n"
      "data: {path: train.jsonl, max_seq_length: 64}\n"
      "train: {micro_batch_size: 2, global_batch_size: 4, max_steps: " +
      std::to_string(kSteps) +
      "}\nstrategy: fsdp\nnodes: 2\ndevices: 1\ntrials:\n  - {name: sharded, expect: ok}\n";
  const int64_t experiment = SubmitAsAUser("sharded.yaml", yaml);
  ASSERT_GT(experiment, 0);
  ASSERT_TRUE(RoundsWhileItTrainsUntil(experiment, [&] { return Losses(experiment).size() >= 3; }));
  ASSERT_TRUE(daemon_->dispatcher().Cancel(experiment, "sharded", /*checkpoint=*/true).ok());
  ASSERT_TRUE(RoundsWhileItTrainsUntil(experiment, [&] { return AllEnded(experiment); }));
  ASSERT_EQ(Trials(experiment).front().state, store::TrialState::kCancelled)
      << "the run ended before the stop; the machine is faster than this test assumes";
  ASSERT_TRUE(RoundsUntil([&] { return daemon_->dispatcher().CheckpointCopiesInFlight() == 0; }));
  // Each node kept its own rank's shard: rank 1's is on one node only.
  const size_t stopped_at = Losses(experiment).size();
  int rank_one_shards = 0;
  for (const char* node : {"n1", "n2"}) {
    rank_one_shards +=
        fs::exists(RunDir(node, experiment, "sharded", 1) / "output" / "checkpoints" /
                   ("step-" + std::to_string(stopped_at)) / "optimizer.rank1.safetensors");
  }
  EXPECT_EQ(rank_one_shards, 1);

  AddAgent("n3");
  AddAgent("n4");
  for (const char* node : {"n1", "n2"}) {
    ASSERT_TRUE(daemon_->dispatcher().RemoveNode(node).ok());
    Kill(node);
  }
  auto resume = daemon_->dispatcher().Resume(experiment, "sharded");
  ASSERT_TRUE(resume.ok()) << resume.status().ToString();
  ASSERT_FALSE(resume->tree.empty()) << "the controller has no copy of the checkpoint";
  ASSERT_TRUE(RoundsWhileItTrainsUntil(experiment, [&] { return AllEnded(experiment); }));
  ASSERT_EQ(Trials(experiment).front().state, store::TrialState::kOk)
      << "see n3-data/ and n4-data/ in " << dir_;
  for (const char* node : {"n3", "n4"}) {
    EXPECT_TRUE(fs::exists(RunDir(node, experiment, "sharded", 2) / "exit.json")) << node;
  }

  const int64_t reference = SubmitAsAUser("sharded.yaml", yaml);
  ASSERT_GT(reference, 0);
  ASSERT_TRUE(RoundsWhileItTrainsUntil(reference, [&] { return AllEnded(reference); }));
  ExpectResumedLossesAreTheReferences(experiment, reference, kSteps);
}

}  // namespace
}  // namespace llmctl::controller
