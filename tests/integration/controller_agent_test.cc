// The controller with real llm-agent processes (the binary this build made), over mutual TLS on
// unix sockets, with a real SQLite file; a shell script stands in for llm-train (the trainer's own
// tests cover it) so that a run can be held mid-way, killed, or made to fail. The dispatcher's
// rounds run by hand on a manual clock.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "common/digest/digest.h"
#include "common/files.h"
#include "tests/integration/controller_agent_fixture.h"

namespace llmctl::controller {
namespace {

using namespace testing_support;  // NOLINT: the fixture's helpers
namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

TEST_F(ControllerAgentTest, TwoAgentsTenTrialsEachRunsExactlyOnce) {
  AddAgent("n1");
  AddAgent("n2");
  std::vector<std::pair<std::string, int>> trials;
  for (int i = 0; i < 10; ++i) trials.emplace_back(std::string("t").append(std::to_string(i)), 0);
  const int64_t experiment = Submit(Experiment(trials));
  ASSERT_TRUE(RoundsUntil([&] { return AllEnded(experiment); }));

  std::map<std::string, int> per_node;
  for (const store::TrialRecord& trial : Trials(experiment)) {
    SCOPED_TRACE(trial.name);
    EXPECT_EQ(trial.state, store::TrialState::kOk);
    EXPECT_EQ(trial.current_attempt, 1);
    std::string node;
    for (const std::string candidate : {"n1", "n2"}) {
      if (fs::exists(RunDir(candidate, experiment, trial.name, 1))) {
        EXPECT_TRUE(node.empty()) << "ran on both nodes";
        node = candidate;
      }
    }
    ASSERT_FALSE(node.empty());
    ++per_node[node];
    const int64_t lines = FileLines(RunDir(node, experiment, trial.name, 1) / "events.jsonl");
    EXPECT_EQ(lines, 4);
    EXPECT_EQ(*daemon_->store().LastSeq(trial.id, 1), lines);
  }
  EXPECT_EQ(per_node["n1"] + per_node["n2"], 10);
  EXPECT_GT(per_node["n1"], 0);
  EXPECT_GT(per_node["n2"], 0);
}

TEST_F(ControllerAgentTest, AKilledAgentIsRestartedAndItsTrialCompletesWithNoGapOrDuplicate) {
  AddAgent("n1");
  const int64_t experiment = Submit(Experiment({{"held", 300}}));
  const store::TrialRecord trial = Trials(experiment).front();
  ASSERT_TRUE(RoundsUntil([&] { return *daemon_->store().LastSeq(trial.id, 1) == 3; }));

  Kill("n1");
  daemon_->dispatcher().Tick();
  StartAgent("n1");
  WriteFile(RunDir("n1", experiment, "held", 1) / "go", "",
            fs::perms::owner_read | fs::perms::owner_write);
  ASSERT_TRUE(RoundsUntil([&] { return AllEnded(experiment); }));

  const store::TrialRecord done = Trials(experiment).front();
  EXPECT_EQ(done.state, store::TrialState::kOk);
  EXPECT_EQ(done.current_attempt, 1);
  const int64_t lines = FileLines(RunDir("n1", experiment, "held", 1) / "events.jsonl");
  EXPECT_EQ(lines, 5);
  EXPECT_EQ(*daemon_->store().LastSeq(trial.id, 1), lines);
}

// The same for a 2-rank ddp trial: both ranks' events reach the store, each rank's once and in
// order, across a kill -9 of the agent.
TEST_F(ControllerAgentTest, AKilledAgentLosesAndRepeatsNoEventOfATwoRankTrial) {
  AddAgent("n1");
  const int64_t experiment = Submit(Experiment({{"ddp-held", 300}}));
  const store::TrialRecord trial = Trials(experiment).front();
  ASSERT_TRUE(RoundsUntil([&] { return BothRanksStoredUpTo(trial.id, 3); }));

  Kill("n1");
  daemon_->dispatcher().Tick();
  StartAgent("n1");
  WriteFile(RunDir("n1", experiment, "ddp-held", 1) / "go", "",
            fs::perms::owner_read | fs::perms::owner_write);
  ASSERT_TRUE(RoundsUntil([&] { return AllEnded(experiment); }));

  const store::TrialRecord done = Trials(experiment).front();
  EXPECT_EQ(done.state, store::TrialState::kOk);
  EXPECT_EQ(done.current_attempt, 1);
  const fs::path run = RunDir("n1", experiment, "ddp-held", 1);
  EXPECT_EQ(FileLines(run / "events.jsonl"), 5);
  EXPECT_EQ(FileLines(run / "events.rank1.jsonl"), 5);
  EXPECT_TRUE(BothRanksStoredUpTo(trial.id, 5));
}

// The device samples llm-agent takes of a running trial (here the fake trainer's processes, read
// from /proc once a second) reach the store through the real stream; after the agent is killed and
// started again the readings go on in the same file and none is stored twice.
TEST_F(ControllerAgentTest, DeviceSamplesReachTheStoreOnceAcrossAnAgentRestart) {
  AddAgent("n1");
  const int64_t experiment = Submit(Experiment({{"held", 300}}));
  const store::TrialRecord trial = Trials(experiment).front();
  const auto stored = [&] { return *daemon_->store().LastDeviceSampleSeq(trial.id, 1); };
  ASSERT_TRUE(RoundsUntil([&] { return stored() >= 2; }));
  Kill("n1");
  daemon_->dispatcher().Tick();
  StartAgent("n1");
  const int64_t before_restart = stored();
  ASSERT_TRUE(RoundsUntil([&] { return stored() >= before_restart + 2; }));
  WriteFile(RunDir("n1", experiment, "held", 1) / "go", "",
            fs::perms::owner_read | fs::perms::owner_write);
  ASSERT_TRUE(RoundsUntil([&] { return AllEnded(experiment); }));

  auto samples = daemon_->store().DeviceSamples(experiment, "held");
  ASSERT_TRUE(samples.ok()) << samples.status().ToString();
  // One row per reading streamed (readings taken after the run's end may stay on the node).
  EXPECT_EQ(static_cast<int64_t>(samples->size()), stored());
  EXPECT_LE(stored(), FileLines(RunDir("n1", experiment, "held", 1) / "samples.jsonl"));
  const double most_percent = 100.0 * std::thread::hardware_concurrency() * 1.1;
  for (size_t i = 0; i < samples->size(); ++i) {
    const store::DeviceSample& sample = (*samples)[i];
    SCOPED_TRACE("sample " + std::to_string(i));
    EXPECT_EQ(sample.device, "cpu");
    EXPECT_EQ(sample.count, 1);
    EXPECT_GT(sample.memory_used_bytes, 0);
    EXPECT_GT(sample.memory_total_bytes, sample.memory_used_bytes);
    if (sample.utilization_percent) {
      EXPECT_GE(*sample.utilization_percent, 0.0);
      EXPECT_LE(*sample.utilization_percent, most_percent);
    }
    if (i > 0) {
      EXPECT_GT(sample.time, (*samples)[i - 1].time);
    }
  }
}

// A worker killed by SIGKILL while the kernel's out-of-memory killer killed nothing (its oom_kill
// count in /proc/vmstat did not rise) failed: it was reported as out of memory, the kernel's doing,
// until 12-01. The next trial runs either way.
TEST_F(ControllerAgentTest, ATrialKilledBySigkillFailsSayingSoAndTheNextTrialRuns) {
  AddAgent("n1");
  const int64_t experiment = Submit(Experiment({{"killed", 109}, {"next", 0}}));
  ASSERT_TRUE(RoundsUntil([&] { return AllEnded(experiment); }));
  const std::vector<store::TrialRecord> trials = Trials(experiment);
  EXPECT_EQ(trials[0].state, store::TrialState::kFailed);
  EXPECT_EQ(trials[1].state, store::TrialState::kOk);

  const v1::ReportResponse report = Report(experiment);
  ASSERT_GT(report.trials_size(), 0);
  EXPECT_EQ(report.trials(0).outcome(), "failed");
  EXPECT_NE(
      report.trials(0).error().find("killed by SIGKILL, not by the kernel's out-of-memory killer"),
      std::string::npos)
      << report.trials(0).error();
}

// Issue 37: one bad line crashed the agent (a number for a type) or froze the trial and its node
// (the controller refused the line and asked for it again, every second). Now each goes through as
// a refused_line under its own seq, the trial ends with its real outcome, the next one runs, and
// the report counts the refused lines.
TEST_F(ControllerAgentTest, BadEventLinesAreCountedAndTheTrialEndsWithItsRealOutcome) {
  AddAgent("n1");
  const int64_t experiment = Submit(Experiment({{"bad-lines", 120}, {"next", 0}}));
  ASSERT_TRUE(RoundsUntil([&] { return AllEnded(experiment); }));
  const std::vector<store::TrialRecord> trials = Trials(experiment);
  EXPECT_EQ(trials[0].state, store::TrialState::kOk);
  EXPECT_EQ(trials[1].state, store::TrialState::kOk);
  const v1::ReportResponse report = Report(experiment);
  ASSERT_EQ(report.trials_size(), 2);
  EXPECT_EQ(report.trials(0).refused_event_lines(), 4);
  EXPECT_EQ(report.trials(0).final_loss(), 1.0) << "its result, the line after the refused ones";
  EXPECT_EQ(report.trials(1).refused_event_lines(), 0);
}

// A lease's end with the real llm-train: the trial is stopped with a checkpoint on n1, the
// controller copies the checkpoint, n1 goes (`llmctl node down`), and the resumed trial runs on n2
// from the copy, its losses exactly those of the same run uninterrupted.
TEST_F(ControllerAgentTest, ATrialStoppedWithACheckpointResumesOnAnotherNodeExactly) {
  const fs::path llm_train = BuildDir() / "trainer/llm-train";
  ASSERT_TRUE(fs::exists(llm_train)) << llm_train << " is not built (its target: llm-train)";
  trainer_ = llm_train.string();
  const fs::path source = llmctl::testing::SourceDir();
  // The user's inputs, uploaded as submit does: each file a tree of one.
  std::map<std::string, v1::InputTree> inputs;
  for (const auto& [name, path] : std::map<std::string, fs::path>{
           {"train.jsonl", source / "experiments/data/alpaca-demo.jsonl"},
           {"tokenizer.json", source / "experiments/tokenizers/demo/tokenizer.json"}}) {
    auto content = ReadFileToString(path.string());
    ASSERT_TRUE(content.ok()) << path;
    const std::string sha = digest::Sha256Hex(*content);
    grpc::ClientContext context;
    v1::UploadBlobResponse response;
    auto writer = controller_->UploadBlob(&context, &response);
    v1::BlobChunk chunk;
    chunk.set_sha256(sha);
    chunk.set_size(static_cast<int64_t>(content->size()));
    chunk.set_data(*content);
    writer->Write(chunk);
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok()) << name;
    const std::vector<digest::TreeFile> files = {
        {name, sha, static_cast<int64_t>(content->size())}};
    v1::InputTree& tree = inputs[name];
    tree.set_is_file(true);
    tree.set_digest(digest::TreeDigest(files));
    v1::TreeFile* file = tree.add_files();
    file->set_path(name);
    file->set_sha256(sha);
    file->set_size(static_cast<int64_t>(content->size()));
  }
  constexpr int kSteps = 24;
  const auto submit = [&] {
    v1::SubmitRequest request;
    request.set_filename("long.yaml");
    request.set_yaml_text(
        "model: llmctl-demo\ninit: random\ntokenizer: tokenizer.json\n"
        "data: {path: train.jsonl, max_seq_length: 64}\n"
        "train: {micro_batch_size: 2, max_steps: " +
        std::to_string(kSteps) + "}\ntrials:\n  - {name: long, expect: ok}\n");
    for (const auto& [name, tree] : inputs) (*request.mutable_inputs())[name] = tree;
    v1::SubmitResponse response;
    grpc::ClientContext context;
    const grpc::Status status = controller_->Submit(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.experiment_id();
  };
  // Rounds until `done`, with a wall-clock bound roomy enough for LibTorch starting on a busy
  // machine.
  const auto until = [&](auto done) {
    for (int i = 0; i < 6000 && !done(); ++i) {
      clock_.Advance(milliseconds(100));
      daemon_->dispatcher().Tick();
      std::this_thread::sleep_for(milliseconds(20));
    }
    return done();
  };

  AddAgent("n1");
  const int64_t experiment = submit();
  const int64_t trial = Trials(experiment).front().id;
  ASSERT_TRUE(until([&] { return Losses(experiment).size() >= 3; }));
  ASSERT_TRUE(daemon_->dispatcher().Cancel(experiment, "long", /*checkpoint=*/true).ok());
  ASSERT_TRUE(until([&] { return AllEnded(experiment); }));
  ASSERT_EQ(Trials(experiment).front().state, store::TrialState::kCancelled)
      << "the run ended before the stop; the machine is faster than this test assumes";
  ASSERT_TRUE(until([&] { return daemon_->dispatcher().CheckpointCopiesInFlight() == 0; }));

  AddAgent("n2");
  ASSERT_TRUE(daemon_->dispatcher().RemoveNode("n1").ok());
  Kill("n1");
  auto resume = daemon_->dispatcher().Resume(experiment, "long");
  ASSERT_TRUE(resume.ok()) << resume.status().ToString();
  ASSERT_FALSE(resume->tree.empty()) << "the controller has no copy of the checkpoint";
  ASSERT_TRUE(until([&] { return AllEnded(experiment); }));
  const store::TrialRecord resumed = daemon_->store().GetTrial(trial).value();
  ASSERT_EQ(resumed.state, store::TrialState::kOk);
  EXPECT_TRUE(fs::exists(RunDir("n2", experiment, "long", 2) / "events.jsonl"));

  const int64_t reference = submit();
  ASSERT_TRUE(until([&] { return AllEnded(reference); }));
  ExpectResumedLossesAreTheReferences(experiment, reference, kSteps);
}

// llmctld as a process of its own, killed with SIGKILL mid-experiment and started again on the same
// data directory: it goes on from its store, and what finished is not run again.
TEST_F(ControllerAgentTest, AKilledControllerContinuesAndRunsNothingTwice) {
  daemon_.reset();  // this test's controller is the real binary
  const fs::path data = dir_ / "llmctld-data";
  WriteFile(dir_ / "llmctld.yaml", "health_interval: 100ms\nagent_call_deadline: 10s\n",
            fs::perms::owner_read | fs::perms::owner_write);
  const std::string address = "unix:" + (dir_ / "llmctld.sock").string();
  auto start_controller = [&]() -> pid_t {
    return StartLogged({(BuildDir() / "controller/llmctld").string(), "--data-dir", data.string(),
                        "--listen", address, "--config", (dir_ / "llmctld.yaml").string()},
                       dir_ / "llmctld.log");
  };
  pid_t controller = start_controller();
  ASSERT_GT(controller, 0);
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  ASSERT_TRUE(channel->WaitForConnected(std::chrono::system_clock::now() + seconds(30)));
  controller_ = v1::Controller::NewStub(channel);
  AddAgent("n1");
  const int64_t experiment = Submit(Experiment({{"quick", 0}, {"held", 300}}));

  // The experiment's status; nullopt while the controller is away (a call in flight when it was
  // killed fails with UNAVAILABLE, which the CLI retries).
  auto status = [&]() -> std::optional<v1::ExperimentStatus> {
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(std::chrono::system_clock::now() + seconds(30));
    v1::GetExperimentRequest which;
    which.set_experiment_id(experiment);
    v1::ExperimentStatus experiment_status;
    const grpc::Status got = controller_->GetExperiment(&context, which, &experiment_status);
    if (got.error_code() == grpc::StatusCode::UNAVAILABLE) return std::nullopt;
    EXPECT_TRUE(got.ok()) << got.error_message();
    return experiment_status;
  };
  auto eventually = [&](auto done) {
    for (int i = 0; i < 1500 && !done(); ++i) std::this_thread::sleep_for(milliseconds(20));
    return done();
  };
  ASSERT_TRUE(eventually([&] {
    const auto now = status();
    return now && now->trials_size() == 2 && now->trials(0).state() == "ok" &&
           now->trials(1).state() == "running" && now->trials(1).step() == 2;
  }));

  kill(controller, SIGKILL);
  waitpid(controller, nullptr, 0);
  WriteFile(RunDir("n1", experiment, "held", 1) / "go", "",
            fs::perms::owner_read | fs::perms::owner_write);
  controller = start_controller();
  ASSERT_TRUE(eventually([&] {
    const auto now = status();
    return now && now->state() == "ended";
  }));
  const v1::ExperimentStatus ended = *status();
  kill(controller, SIGTERM);
  int exit_status = 0;
  waitpid(controller, &exit_status, 0);
  EXPECT_TRUE(WIFEXITED(exit_status) && WEXITSTATUS(exit_status) == 0);

  for (const v1::TrialStatus& trial : ended.trials()) {
    SCOPED_TRACE(trial.name());
    EXPECT_EQ(trial.state(), "ok");
    EXPECT_EQ(trial.attempt(), 1);
    EXPECT_FALSE(fs::exists(RunDir("n1", experiment, trial.name(), 2)));
  }
  EXPECT_EQ(ended.trials(1).step(), 3);
}

}  // namespace
}  // namespace llmctl::controller
