// End-to-end trainer tests on the demo model: exact memory accounting, the step anatomy, gradient
// accumulation, activation checkpointing, precision modes and outcomes. Each test runs in its own
// process (ctest runs each discovered test alone), so allocator figures are not shared between
// tests.
#include "trainer/train/trainer.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <map>
#include <utility>

#include "common/data/token_file.h"
#include "common/data/token_file_testing.h"
#include "common/estimate/rate_probe.h"
#include "common/files.h"
#include "common/model_config.h"
#include "common/safetensors/safetensors.h"
#include "trainer/model/weights.h"
#include "trainer/peft/lora.h"
#include "trainer/testing/trial_runner.h"
#include "trainer/train/batches.h"
#include "trainer/train/events.h"

namespace llmctl::trainer {
namespace {

using testing::DemoConfig;
using testing::RunAndRecord;
using testing::TrialRecord;

constexpr const char* kPhases[] = {"phase0_before_fwd", "phase1_after_fwd", "phase2_after_bwd"};

uint64_t DemoParameterCount() {
  const ModelConfig* preset = FindPreset("llmctl-demo");
  EXPECT_NE(preset, nullptr);
  return preset ? ParameterCount(*preset) : 0;
}

// Adapter parameters of the demo model with rank `r` on `targets`: r x (in + out) per projection.
uint64_t DemoAdapterCount(int64_t r, const std::vector<std::string>& targets) {
  const ModelConfig* c = FindPreset("llmctl-demo");
  EXPECT_NE(c, nullptr);
  if (c == nullptr) return 0;
  const int64_t q = c->num_attention_heads * c->head_dim;
  const int64_t kv = c->num_key_value_heads * c->head_dim;
  const int64_t hidden = c->hidden_size;
  const int64_t mlp = c->intermediate_size;
  const std::map<std::string, int64_t> per_layer = {
      {"q_proj", hidden + q},     {"k_proj", hidden + kv},     {"v_proj", hidden + kv},
      {"o_proj", q + hidden},     {"gate_proj", hidden + mlp}, {"up_proj", hidden + mlp},
      {"down_proj", mlp + hidden}};
  int64_t count = 0;
  for (const std::string& target : targets) {
    count += target == "lm_head" ? r * (hidden + c->vocab_size)
                                 : c->num_hidden_layers * r * per_layer.at(target);
  }
  return static_cast<uint64_t>(count);
}

uint64_t Field(const nlohmann::json& snapshot, const char* name) {
  return snapshot[name].get<uint64_t>();
}

// A file the disk cannot read (EIO; here /proc/self/mem at address 0, which nothing maps) is no
// fault of the input's: llm-train exits kFailed for it, not kInvalidInput.
TEST(InputsFaultTest, AReadTheDiskFailsIsNotTheInputsFault) {
  const StatusOr<std::string> read = ReadFileToString("/proc/self/mem");
  ASSERT_FALSE(read.ok());
  EXPECT_FALSE(IsInputsFault(read.status())) << read.status().ToString();
  EXPECT_TRUE(IsInputsFault(NotFoundError("no such file")));
}

TEST(MemoryAccountingTest, Fp32AdamWIsExactToTheByteAfterTheFirstStep) {
  TrialRecord run = RunAndRecord(DemoConfig({{"train.max_steps", "2"},
                                             {"train.micro_batch_size", "2"},
                                             {"train.global_batch_size", "2"}}));
  ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;
  const uint64_t params = 4 * DemoParameterCount();
  const nlohmann::json s = run.Snapshot(0, 0, "phase3_after_opt_step");
  EXPECT_EQ(Field(s, "params_bytes"), params);
  EXPECT_EQ(Field(s, "grads_bytes"), params);
  // Two fp32 moments per parameter plus the one fp32 step counter the fused kernel reads.
  EXPECT_EQ(Field(s, "optim_device_bytes"), 2 * params + 4);
  EXPECT_EQ(Field(s, "optim_host_bytes"), 0u);
  EXPECT_EQ(Field(s, "allocated_bytes"), Field(s, "params_bytes") + Field(s, "grads_bytes") +
                                             Field(s, "optim_device_bytes") +
                                             Field(s, "other_bytes"));
  EXPECT_GE(Field(s, "peak_bytes"), Field(s, "allocated_bytes"));
  EXPECT_EQ(Field(s, "reserved_bytes"), Field(s, "allocated_bytes"));  // CPU: nothing is cached

  // Before the first step there is no optimizer state and no gradient yet.
  const nlohmann::json before = run.Snapshot(0, 0, "phase0_before_fwd");
  EXPECT_EQ(Field(before, "params_bytes"), params);
  EXPECT_EQ(Field(before, "grads_bytes"), 0u);
  EXPECT_EQ(Field(before, "optim_device_bytes"), 0u);
  // After backward the gradients exist, the optimizer state not yet.
  const nlohmann::json after_backward = run.Snapshot(0, 0, "phase2_after_bwd");
  EXPECT_EQ(Field(after_backward, "grads_bytes"), params);
  EXPECT_EQ(Field(after_backward, "optim_device_bytes"), 0u);
  // Forward keeps activations for backward: more than anything before it.
  const nlohmann::json after_forward = run.Snapshot(0, 0, "phase1_after_fwd");
  EXPECT_GT(Field(after_forward, "other_bytes"), Field(before, "other_bytes"));
}

TEST(MemoryAccountingTest, Bf16TrueHalvesParamsGradsAndMoments) {
  TrialRecord run =
      RunAndRecord(DemoConfig({{"train.max_steps", "1"}, {"precision", "bf16-true"}}));
  ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;
  const uint64_t params = 2 * DemoParameterCount();
  const nlohmann::json s = run.Snapshot(0, 1, "phase3_after_opt_step");
  EXPECT_EQ(Field(s, "params_bytes"), params);
  EXPECT_EQ(Field(s, "grads_bytes"), params);
  EXPECT_EQ(Field(s, "optim_device_bytes"), 2 * params + 4);
}

TEST(MemoryAccountingTest, SgdWithoutMomentumKeepsNoOptimizerState) {
  TrialRecord run = RunAndRecord(DemoConfig({{"train.max_steps", "2"}, {"optimizer", "sgd"}}));
  ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;
  for (const auto& snapshot : run.OfType("snapshot")) {
    EXPECT_EQ(Field(snapshot, "optim_device_bytes"), 0u) << snapshot.dump();
    EXPECT_EQ(Field(snapshot, "optim_host_bytes"), 0u);
  }
}

TEST(StepAnatomyTest, SnapshotsEveryPhaseOfEveryMicroBatchOfSnapshotSteps) {
  // demo: micro 4, global 8 -> 2 micro-batches per step; snapshots at steps 0, 1 and every 3rd.
  TrialRecord run = RunAndRecord(DemoConfig({{"train.max_steps", "4"}, {"snapshot_every", "3"}}));
  ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;
  for (int64_t step : {0, 1, 3}) {
    for (int64_t mb : {0, 1}) {
      for (const char* phase : kPhases) run.Snapshot(step, mb, phase);
    }
    run.Snapshot(step, 1, "phase3_after_opt_step");
  }
  for (const auto& snapshot : run.OfType("snapshot"))
    EXPECT_NE(snapshot["step"], 2) << snapshot.dump();
  // 3 snapshot steps x (2 micro-batches x 3 phases + 1 optimizer phase)
  EXPECT_EQ(run.OfType("snapshot").size(), 3u * 7u);
}

TEST(StepAnatomyTest, EventLogStartsWithStartAndEndsWithResult) {
  TrialRecord run = RunAndRecord(DemoConfig({{"train.max_steps", "3"}}));
  ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;
  ASSERT_FALSE(run.events.empty());
  EXPECT_EQ(run.events.front()["type"], "start");
  EXPECT_EQ(run.events.front()["total_steps"], 3);
  EXPECT_EQ(run.events.front()["parameters_total"], DemoParameterCount());
  EXPECT_GT(run.events.front()["load_peak_bytes"].get<uint64_t>(), 4 * DemoParameterCount() - 1);
  EXPECT_EQ(run.events.back()["type"], "result");
  EXPECT_EQ(run.events.back()["outcome"], "ok");
  EXPECT_EQ(run.OfType("step").size(), 3u);
  EXPECT_EQ(run.OfType("result").size(), 1u);
  EXPECT_GT(run.result.tokens_per_second, 0.0);
  ASSERT_TRUE(run.result.final_loss.has_value());
  EXPECT_DOUBLE_EQ(*run.result.final_loss, run.Losses().back());
}

// A one-process trial's every step says what share of its CPUs' time other processes took
// meanwhile (whatever this machine's load, a share).
TEST(StepAnatomyTest, EachStepSaysWhatOthersTookOfTheMachinesCpu) {
  TrialRecord run = RunAndRecord(DemoConfig({{"train.max_steps", "3"}}));
  ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;
  ASSERT_EQ(run.OfType("step").size(), 3u);
  for (const nlohmann::json& step : run.OfType("step")) {
    ASSERT_TRUE(step.contains("others_cpu_share")) << step.dump();
    EXPECT_GE(step["others_cpu_share"].get<double>(), 0) << step.dump();
    EXPECT_LE(step["others_cpu_share"].get<double>(), 1) << step.dump();
  }
}

// A one-process CPU trial's every step says the machine's pace after it (the canary's seconds,
// within what a reader takes); a profiled run's steps do not, whose trace would show the canary.
TEST(StepAnatomyTest, EachCpuStepSaysTheMachinesPaceButAProfiledRunsDoNot) {
  TrialRecord run = RunAndRecord(DemoConfig({{"train.max_steps", "3"}}));
  ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;
  ASSERT_EQ(run.OfType("step").size(), 3u);
  for (const nlohmann::json& step : run.OfType("step")) {
    ASSERT_TRUE(step.contains("pace_seconds")) << step.dump();
    EXPECT_TRUE(estimate::IsPaceSeconds(step["pace_seconds"].get<double>())) << step.dump();
  }
  TrialRecord profiled =
      RunAndRecord(DemoConfig({{"train.max_steps", "2"},
                               {"profile.steps", "1"},
                               {"profile.memory_history", "false"},
                               {"output_dir", testing::FreshTempDir("pace-profiled")}}));
  ASSERT_EQ(profiled.result.outcome, Outcome::kOk) << profiled.result.error;
  for (const nlohmann::json& step : profiled.OfType("step")) {
    EXPECT_FALSE(step.contains("pace_seconds")) << step.dump();
  }
}

// Snapshots carry the milliseconds since the run's start on the monotonic clock, and the start
// event the wall clock of that zero, so that a reader can place them beside other clocks' readings.
TEST(StepAnatomyTest, SnapshotsCarryTheirTimeSinceTheRunsStart) {
  const int64_t before_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
  TrialRecord run = RunAndRecord(DemoConfig({{"train.max_steps", "2"}}));
  const int64_t after_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
  ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;
  const nlohmann::json& start = run.events.front();
  ASSERT_EQ(start["type"], "start");
  EXPECT_GE(start["started_unix_ms"].get<int64_t>(), before_ms);
  EXPECT_LE(start["started_unix_ms"].get<int64_t>(), after_ms);
  EXPECT_TRUE(start["device_limit_bytes"].is_null()) << "a CPU without device_memory has no limit";
  const auto snapshots = run.OfType("snapshot");
  ASSERT_EQ(snapshots.size(), 2u * 7u);
  double previous = 0;
  for (const auto& snapshot : snapshots) {
    const double elapsed = snapshot["elapsed_ms"].get<double>();
    EXPECT_GE(elapsed, previous) << snapshot.dump();
    EXPECT_LE(elapsed, static_cast<double>(after_ms - start["started_unix_ms"].get<int64_t>()) + 1);
    previous = elapsed;
  }
  EXPECT_GT(previous, 0.0);
  ASSERT_EQ(run.events.back()["type"], "result");
  EXPECT_GE(run.events.back()["elapsed_ms"].get<double>(), previous) << "the run ends last";
}

TEST(TrainingLoopTest, LossGoesDownOnTheDemoData) {
  TrialRecord run = RunAndRecord(DemoConfig({{"train.max_steps", "20"}}));
  ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;
  const std::vector<double> losses = run.Losses();
  ASSERT_EQ(losses.size(), 20u);
  EXPECT_LT(losses.back(), losses.front() - 1.0)
      << "first " << losses.front() << ", last " << losses.back();
}

// k micro-batches give the same update as one batch k times larger (plain SGD makes the update a
// direct function of the gradient, so any difference in the gradient shows in the next losses).
TEST(TrainingLoopTest, GradientAccumulationMatchesOneLargerBatch) {
  auto run_with = [](const std::string& micro) {
    return RunAndRecord(DemoConfig({{"train.max_steps", "4"},
                                    {"optimizer", "sgd"},
                                    {"train.lr", "0.5"},
                                    {"train.warmup_steps", "0"},
                                    {"train.global_batch_size", "8"},
                                    {"train.micro_batch_size", micro}}));
  };
  TrialRecord whole = run_with("8");
  TrialRecord halves = run_with("4");
  TrialRecord singles = run_with("1");
  ASSERT_EQ(whole.result.outcome, Outcome::kOk) << whole.result.error;
  ASSERT_EQ(halves.result.outcome, Outcome::kOk) << halves.result.error;
  ASSERT_EQ(singles.result.outcome, Outcome::kOk) << singles.result.error;
  const auto a = whole.Losses(), b = halves.Losses(), c = singles.Losses();
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  ASSERT_EQ(c.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], 1e-4) << "step " << i;
    EXPECT_NEAR(a[i], c[i], 1e-4) << "step " << i;
  }
  EXPECT_GT(std::abs(a[3] - a[0]), 1e-2)
      << "the updates must change the loss for this test to mean anything";
}

TEST(TrainingLoopTest, ActivationCheckpointingGivesTheSameLossesWithLessActivationMemory) {
  auto run_with = [](const std::string& checkpointing) {
    return RunAndRecord(
        DemoConfig({{"train.max_steps", "3"}, {"activation_checkpointing", checkpointing}}));
  };
  TrialRecord plain = run_with("false");
  TrialRecord checkpointed = run_with("true");
  ASSERT_EQ(plain.result.outcome, Outcome::kOk) << plain.result.error;
  ASSERT_EQ(checkpointed.result.outcome, Outcome::kOk) << checkpointed.result.error;
  const auto a = plain.Losses(), b = checkpointed.Losses();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << "step " << i;
  EXPECT_LT(Field(checkpointed.Snapshot(1, 0, "phase1_after_fwd"), "other_bytes"),
            Field(plain.Snapshot(1, 0, "phase1_after_fwd"), "other_bytes"));
}

// A token file's BOS and EOS ids are outside its content hash, and EOS pads the batches: one past
// the vocabulary is refused when the file is opened, not an embedding's index error mid-run.
TEST(TokenFileBatchesTest, AHeadersEosIdOutsideTheVocabularyIsRefused) {
  const std::string dir = testing::FreshTempDir("eos");
  std::vector<data::TokenizedExample> examples(4);
  for (auto& example : examples) {
    example.input_ids = {5, 6, 7};
    example.labels = {-100, 6, 7};
  }
  const std::string path = dir + "/t.tok";
  ASSERT_TRUE(data::WriteTokenFile(path, "fp", 1, 100000, examples).ok());
  const auto opened = OpenTokenFileBatches(path, DemoConfig({}), 512, -1, 0, 1);
  EXPECT_EQ(opened.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(opened.status().message(),
            path + ": eos_id 100000 is outside the model's vocabulary of 512");
  ASSERT_TRUE(data::WriteTokenFile(path, "fp", 1, 2, examples).ok());
  EXPECT_TRUE(OpenTokenFileBatches(path, DemoConfig({}), 512, -1, 0, 1).ok());
  std::filesystem::remove_all(dir);
}

TEST(PrecisionTest, MixedModesTrainWithFp32MasterWeights) {
  for (const char* precision : {"bf16-mixed", "16-mixed"}) {
    TrialRecord run =
        RunAndRecord(DemoConfig({{"train.max_steps", "3"}, {"precision", precision}}));
    ASSERT_EQ(run.result.outcome, Outcome::kOk) << precision << ": " << run.result.error;
    EXPECT_EQ(Field(run.Snapshot(0, 1, "phase3_after_opt_step"), "params_bytes"),
              4 * DemoParameterCount())
        << precision;
    for (double loss : run.Losses()) EXPECT_TRUE(std::isfinite(loss)) << precision;
  }
}

// The labs' first single-GPU rows in miniature, under a 64 MiB device_memory budget: the baseline
// batch runs out of memory, the reduced batch fits, accumulation stays close to the reduced batch,
// bf16-true needs much less and bf16-mixed sits between. As the lab files run them, with the ATen
// composition transformers runs (kernels: aten; the fused block's baseline fits 64 MiB). Measured
// here: 120 / 36 / 42 / 27 / 39 MiB peaks; the bounds leave at least 20% margin.
TEST(LabRowsTest, BudgetReproducesTheFirstRowsOfTheSingleGpuLab) {
  auto row = [](const std::string& micro, const std::string& global, const std::string& precision) {
    return RunAndRecord(DemoConfig({{"train.max_steps", "3"},
                                    {"kernels", "aten"},
                                    {"device_memory", "64MiB"},
                                    {"train.micro_batch_size", micro},
                                    {"train.global_batch_size", global},
                                    {"precision", precision}}));
  };
  TrialRecord baseline = row("16", "16", "32-true");
  TrialRecord reduced = row("4", "4", "32-true");
  TrialRecord accumulation = row("4", "16", "32-true");
  TrialRecord bf16_true = row("4", "16", "bf16-true");
  TrialRecord bf16_mixed = row("4", "16", "bf16-mixed");
  EXPECT_EQ(baseline.result.outcome, Outcome::kOom) << baseline.result.error;
  ASSERT_EQ(reduced.result.outcome, Outcome::kOk) << reduced.result.error;
  ASSERT_EQ(accumulation.result.outcome, Outcome::kOk) << accumulation.result.error;
  ASSERT_EQ(bf16_true.result.outcome, Outcome::kOk) << bf16_true.result.error;
  ASSERT_EQ(bf16_mixed.result.outcome, Outcome::kOk) << bf16_mixed.result.error;
  const double reduced_peak = static_cast<double>(reduced.result.peak_bytes);
  const double accumulation_peak = static_cast<double>(accumulation.result.peak_bytes);
  EXPECT_LE(reduced_peak, 0.8 * (64 << 20));
  EXPECT_LE(accumulation_peak, 1.5 * reduced_peak);
  EXPECT_LE(static_cast<double>(bf16_true.result.peak_bytes), 0.8 * accumulation_peak);
  EXPECT_GE(static_cast<double>(bf16_mixed.result.peak_bytes), 1.2 * bf16_true.result.peak_bytes);
}

// The agent reads llm-train's exit code back into the outcome (common/trainer_exit.h): every
// outcome must come back as the name the trainer gives it.
TEST(OutcomeTest, EveryExitCodeReadsBackAsItsOutcome) {
  for (Outcome outcome :
       {Outcome::kOk, Outcome::kOom, Outcome::kDiverged, Outcome::kFailed, Outcome::kCancelled}) {
    EXPECT_EQ(trainer_exit::OutcomeName(ExitCodeFor(outcome)), OutcomeName(outcome));
  }
  EXPECT_EQ(trainer_exit::OutcomeName(trainer_exit::kInvalidInput), "invalid");
  EXPECT_EQ(trainer_exit::OutcomeName(9), "");
}

TEST(OutcomeTest, BudgetExceededIsOomWithTheSnapshotAtTheFailingPoint) {
  TrialRecord run =
      RunAndRecord(DemoConfig({{"train.max_steps", "2"}, {"device_memory", "12MiB"}}));
  ASSERT_EQ(run.result.outcome, Outcome::kOom) << run.result.error;
  EXPECT_EQ(ExitCodeFor(run.result.outcome), trainer_exit::kOom);
  EXPECT_NE(run.result.error.find("device_memory budget exceeded"), std::string::npos)
      << run.result.error;
  ASSERT_EQ(run.events.front()["type"], "start");
  EXPECT_EQ(run.events.front()["device_limit_bytes"], 12u << 20);
  bool found = false;
  double latest_elapsed_ms = 0;
  for (const auto& snapshot : run.OfType("snapshot")) {
    if (snapshot["phase"] != "oom") {
      latest_elapsed_ms = snapshot["elapsed_ms"].get<double>();
      continue;
    }
    found = true;
    EXPECT_LE(Field(snapshot, "allocated_bytes"), 12u << 20);
    EXPECT_EQ(Field(snapshot, "params_bytes"), 4 * DemoParameterCount());
    EXPECT_GE(snapshot["elapsed_ms"].get<double>(), latest_elapsed_ms) << "the failure comes last";
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(run.events.back()["outcome"], "oom");
}

TEST(OutcomeTest, NonFiniteLossIsDiverged) {
  TrialRecord run = RunAndRecord(DemoConfig({{"train.max_steps", "10"},
                                             {"optimizer", "sgd"},
                                             {"train.lr", "1e12"},
                                             {"train.warmup_steps", "0"}}));
  ASSERT_EQ(run.result.outcome, Outcome::kDiverged) << run.result.error;
  EXPECT_EQ(ExitCodeFor(run.result.outcome), trainer_exit::kDiverged);
  EXPECT_NE(run.result.error.find("loss is"), std::string::npos) << run.result.error;
}

TEST(OutcomeTest, MicroBatchesWithoutTargetsAreNotDivergence) {
  // 16 tokens cannot get past the Alpaca prompt: no example keeps a trained token.
  TrialRecord run =
      RunAndRecord(DemoConfig({{"train.max_steps", "2"}, {"data.max_seq_length", "16"}}));
  EXPECT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;
  for (double loss : run.Losses()) EXPECT_EQ(loss, 0.0);
}

TEST(OutcomeTest, MissingDatasetIsInvalidInputBeforeAnythingRuns) {
  TrialRecord run = RunAndRecord(DemoConfig({{"data.path", "/nonexistent/data.jsonl"}}));
  EXPECT_EQ(run.result.outcome, Outcome::kFailed);
  EXPECT_TRUE(run.result.invalid_input);
  EXPECT_NE(run.result.error.find("/nonexistent/data.jsonl"), std::string::npos)
      << run.result.error;
  EXPECT_TRUE(run.OfType("start").empty());
  EXPECT_EQ(run.OfType("step").size(), 0u);
}

// The agent takes llm-train's exit code for the outcome and its events for the metrics and the
// checkpoints: a trial whose events file filled up must not end as ok.
TEST(OutcomeTest, ATrialWhoseEventsCannotBeWrittenFails) {
  RunOptions options;
  options.events_path = "/dev/full";  // every write fails with ENOSPC
  const TrialResult result = RunTrial(DemoConfig({{"train.max_steps", "1"}}), options);
  EXPECT_EQ(result.outcome, Outcome::kFailed);
  EXPECT_EQ(ExitCodeFor(result.outcome), trainer_exit::kFailed);
  EXPECT_NE(result.error.find("cannot write events file /dev/full: No space left on device"),
            std::string::npos)
      << result.error;
}

// The events file is the user's alone whatever the umask: under umask 000 it was made 0666, for
// any user to write events the agent would report as the trial's.
TEST(EventLogTest, TheFileIsMadeForItsUserAloneUnderAnOpenUmask) {
  const std::string path = testing::FreshTempDir("event-log-mode") + "/events.jsonl";
  const mode_t umask = ::umask(0);
  const StatusOr<std::unique_ptr<EventLog>> log = EventLog::Open(path);
  ::umask(umask);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  struct stat info {};
  ASSERT_EQ(::stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 07777, 0600u);
}

// A line cut short by a full disk or a file size limit is taken off the file again and nothing is
// written after it: the agent follows the file line by line and would read the part, or the part
// joined to a later line, as an event.
TEST(EventLogTest, ALineThatCannotBeWrittenWhollyIsCutOffAndNothingFollowsIt) {
  const std::string path = testing::FreshTempDir("event-log") + "/events.jsonl";
  const nlohmann::json first = {{"type", "first"}};
  const std::string first_line = first.dump() + "\n";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Writes past 20 bytes more than the first line fail with EFBIG (not the signal).
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{first_line.size() + 20, first_line.size() + 20};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(2);
    StatusOr<std::unique_ptr<EventLog>> log = EventLog::Open(path);
    if (!log.ok()) ::_exit(3);
    (*log)->Emit(first);
    (*log)->Emit({{"type", "second"}, {"text", std::string(100, 'x')}});  // 20 bytes fit
    (*log)->Emit({{"type", "c"}});  // would fit in those 20 bytes
    ::_exit(0);
  }
  int wait_status = 0;
  ASSERT_EQ(::waitpid(child, &wait_status, 0), child);
  ASSERT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) << wait_status;
  StatusOr<std::string> kept = ReadFileToString(path);
  ASSERT_TRUE(kept.ok()) << kept.status().message();
  EXPECT_EQ(*kept, first_line);
}

TEST(LoraTrainingTest, GradsAndOptimizerStateAreTheAdaptersOnly) {
  struct Case {
    std::string r;
    std::string targets_text;
    std::vector<std::string> targets;
  };
  const Case cases[] = {
      {"8", "[q_proj, v_proj]", {"q_proj", "v_proj"}},
      {"32",
       "[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head]",
       {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"}},
  };
  for (const Case& c : cases) {
    TrialRecord run = RunAndRecord(DemoConfig({{"train.max_steps", "1"},
                                               {"peft.method", "lora"},
                                               {"peft.r", c.r},
                                               {"peft.targets", c.targets_text}}));
    ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;
    const uint64_t adapter_count = DemoAdapterCount(std::stoll(c.r), c.targets);
    const uint64_t adapters = 4 * adapter_count;
    EXPECT_EQ(run.events.front()["parameters_trainable"], adapter_count) << c.targets_text;
    EXPECT_EQ(run.events.front()["parameters_total"], DemoParameterCount() + adapter_count);
    const nlohmann::json s = run.Snapshot(0, 1, "phase3_after_opt_step");
    EXPECT_EQ(Field(s, "params_bytes"), 4 * DemoParameterCount() + adapters) << c.targets_text;
    EXPECT_EQ(Field(s, "grads_bytes"), adapters) << c.targets_text;
    // Two fp32 moments per adapter parameter plus fused AdamW's shared fp32 step counter.
    EXPECT_EQ(Field(s, "optim_device_bytes"), 2 * adapters + 4) << c.targets_text;
    std::cout << "lora r " << c.r << " on " << c.targets_text << ": params "
              << Field(s, "params_bytes") << " B, grads " << Field(s, "grads_bytes") << " B, optim "
              << Field(s, "optim_device_bytes") << " B" << std::endl;
  }
}

TEST(LoraTrainingTest, TrainingChangesTheAdaptersAndNotTheBase) {
  const std::string out = testing::FreshTempDir("lora");
  const TrialConfig config = DemoConfig({{"train.max_steps", "3"},
                                         {"peft.method", "lora"},
                                         {"peft.targets", "[q_proj, v_proj, lm_head]"},
                                         {"peft.save_merged", "true"},
                                         {"checkpoint_every", "3"},
                                         {"output_dir", out}});
  TrialRecord run = RunAndRecord(config);
  ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;

  // The weights the run started from: the trainer seeds, builds and adds adapters in this order.
  torch::manual_seed(static_cast<uint64_t>(config.GetInt("seed")));
  auto start = BuildModel(*FindPreset("llmctl-demo"), "random", "", torch::kFloat32, torch::kCPU);
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  const std::optional<LoraConfig> lora = LoraConfigFor(config.settings().peft);
  ASSERT_TRUE(lora.has_value());
  ApplyLora(*start, *lora);

  auto trained = safetensors::SafetensorsFile::Open(out + "/checkpoints/step-3/model.safetensors");
  auto adapter = safetensors::SafetensorsFile::Open(out + "/adapter/adapter_model.safetensors");
  ASSERT_TRUE(trained.ok()) << trained.status().ToString();
  ASSERT_TRUE(adapter.ok()) << adapter.status().ToString();
  int adapters = 0;
  for (const auto& item : (*start)->named_parameters()) {
    const safetensors::TensorView* view = (*trained)->Find(item.key());
    ASSERT_NE(view, nullptr) << item.key();
    const torch::Tensor after = TensorFromView(*view);
    if (!IsAdapterParameter(item.key())) {
      EXPECT_TRUE(torch::equal(after, item.value())) << item.key() << " is frozen but changed";
      continue;
    }
    ++adapters;
    EXPECT_FALSE(torch::equal(after, item.value())) << item.key() << " did not train";
    const safetensors::TensorView* saved = (*adapter)->Find("base_model.model." + item.key());
    ASSERT_NE(saved, nullptr) << item.key();
    EXPECT_TRUE(torch::equal(TensorFromView(*saved), after)) << item.key();
  }
  EXPECT_EQ(adapters, 2 * (2 * 4 + 1));
  EXPECT_TRUE(std::filesystem::exists(out + "/adapter/adapter_config.json"));
  EXPECT_TRUE(std::filesystem::exists(out + "/merged/model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(out + "/merged/config.json"));
  std::filesystem::remove_all(out);
}

TEST(LoraTrainingTest, StartsFromASavedAdapter) {
  const std::string out = testing::FreshTempDir("lora-start");
  const std::vector<std::pair<std::string, std::string>> lora = {
      {"peft.method", "lora"}, {"peft.targets", "[q_proj, v_proj, lm_head]"}, {"train.lr", "1e-2"}};
  auto with = [&](std::vector<std::pair<std::string, std::string>> more) {
    more.insert(more.end(), lora.begin(), lora.end());
    return DemoConfig(more);
  };
  TrialRecord first = RunAndRecord(with({{"train.max_steps", "6"}, {"output_dir", out}}));
  ASSERT_EQ(first.result.outcome, Outcome::kOk) << first.result.error;
  TrialRecord next =
      RunAndRecord(with({{"train.max_steps", "1"}, {"peft.adapter", out + "/adapter"}}));
  ASSERT_EQ(next.result.outcome, Outcome::kOk) << next.result.error;
  // Same seed, same first batch: only the loaded adapter makes the first loss lower.
  EXPECT_LT(next.Losses().front(), first.Losses().front() - 0.1);

  TrialRecord other_rank = RunAndRecord(
      with({{"train.max_steps", "1"}, {"peft.r", "16"}, {"peft.adapter", out + "/adapter"}}));
  EXPECT_TRUE(other_rank.result.invalid_input);
  EXPECT_NE(
      other_rank.result.error.find(out + "/adapter/adapter_config.json: r is 8, but peft.r is 16"),
      std::string::npos)
      << other_rank.result.error;
  std::filesystem::remove_all(out);
}

constexpr const char* kAllTargets =
    "[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head]";

// QLoRA replaces each decoder projection's dense weight by its NF4 weight and changes nothing else:
// the adapters, their gradients and their optimizer state are the LoRA run's to the byte.
TEST(QloraTrainingTest, ParamsDropByTheDenseProjectionsLessTheirNf4Bytes) {
  const std::vector<std::pair<std::string, std::string>> common = {{"train.max_steps", "1"},
                                                                   {"precision", "bf16-true"},
                                                                   {"peft.r", "8"},
                                                                   {"peft.targets", kAllTargets}};
  auto run_with = [&](const std::string& method) {
    auto overrides = common;
    overrides.emplace_back("peft.method", method);
    return RunAndRecord(DemoConfig(overrides));
  };
  TrialRecord lora = run_with("lora");
  TrialRecord qlora = run_with("qlora");
  ASSERT_EQ(lora.result.outcome, Outcome::kOk) << lora.result.error;
  ASSERT_EQ(qlora.result.outcome, Outcome::kOk) << qlora.result.error;

  // Every decoder projection of the demo model, dense in bf16 (2 bytes a weight) or NF4.
  auto quantized = BuildModel(*FindPreset("llmctl-demo"), "random", "", torch::kBFloat16,
                              torch::kCPU, Nf4Options{});
  ASSERT_TRUE(quantized.ok()) << quantized.status().ToString();
  uint64_t dense_bytes = 0;
  uint64_t nf4_bytes = 0;
  for (auto& [name, projection] : (*quantized)->NamedProjections()) {
    if (!projection->is_quantized()) continue;
    dense_bytes += 2 * static_cast<uint64_t>(projection->nf4_weight().numel());
    nf4_bytes += static_cast<uint64_t>(projection->nf4_weight().bytes());
  }
  const nlohmann::json l = lora.Snapshot(0, 1, "phase3_after_opt_step");
  const nlohmann::json q = qlora.Snapshot(0, 1, "phase3_after_opt_step");
  EXPECT_EQ(Field(q, "params_bytes"), Field(l, "params_bytes") - dense_bytes + nf4_bytes);
  const uint64_t adapter_count = DemoAdapterCount(
      8, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"});
  EXPECT_EQ(Field(q, "grads_bytes"), 2 * adapter_count);
  EXPECT_EQ(Field(q, "grads_bytes"), Field(l, "grads_bytes"));
  EXPECT_EQ(Field(q, "optim_device_bytes"), Field(l, "optim_device_bytes"));
  EXPECT_EQ(qlora.events.front()["parameters_trainable"], adapter_count);
  EXPECT_EQ(qlora.events.front()["parameters_total"], DemoParameterCount() + adapter_count);
  // Loading never holds the dense decoder weights at once.
  EXPECT_LT(qlora.events.front()["load_peak_bytes"].get<uint64_t>(),
            lora.events.front()["load_peak_bytes"].get<uint64_t>());
  std::cout << "bf16-true, r 8 on every projection: params lora " << Field(l, "params_bytes")
            << " B, qlora " << Field(q, "params_bytes") << " B (decoder projections " << dense_bytes
            << " B dense, " << nf4_bytes << " B NF4); loading peak lora "
            << lora.events.front()["load_peak_bytes"] << " B, qlora "
            << qlora.events.front()["load_peak_bytes"] << " B" << std::endl;
}

TEST(QloraTrainingTest, TrainsTheAdaptersAndResumesExactly) {
  const std::string out = testing::FreshTempDir("qlora");
  const std::vector<std::pair<std::string, std::string>> qlora = {{"train.max_steps", "6"},
                                                                  {"train.lr", "1e-2"},
                                                                  {"peft.method", "qlora"},
                                                                  {"peft.targets", kAllTargets},
                                                                  {"peft.compute_dtype", "fp32"}};
  auto with = [&](std::vector<std::pair<std::string, std::string>> more) {
    more.insert(more.end(), qlora.begin(), qlora.end());
    return DemoConfig(more);
  };
  TrialRecord whole = RunAndRecord(
      with({{"checkpoint_every", "3"}, {"output_dir", out}, {"peft.save_merged", "true"}}));
  ASSERT_EQ(whole.result.outcome, Outcome::kOk) << whole.result.error;
  const std::vector<double> all = whole.Losses();
  ASSERT_EQ(all.size(), 6u);
  EXPECT_LT(all.back(), all.front() - 0.1) << "first " << all.front() << ", last " << all.back();

  // The checkpoint holds the NF4 buffers, not dense decoder weights.
  const std::string checkpoint = out + "/checkpoints/step-3";
  auto saved = safetensors::SafetensorsFile::Open(checkpoint + "/model.safetensors");
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_NE((*saved)->Find("model.layers.0.self_attn.q_proj.nf4_packed"), nullptr);
  EXPECT_NE((*saved)->Find("model.layers.0.self_attn.q_proj.nf4_offset"), nullptr);
  EXPECT_EQ((*saved)->Find("model.layers.0.self_attn.q_proj.weight"), nullptr);

  TrialRecord resumed = RunAndRecord(with({}), checkpoint);
  ASSERT_EQ(resumed.result.outcome, Outcome::kOk) << resumed.result.error;
  const std::vector<double> rest = resumed.Losses();
  ASSERT_EQ(rest.size(), 3u);
  for (size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i], all[i + 3]) << "step " << i + 3;

  EXPECT_TRUE(std::filesystem::exists(out + "/adapter/adapter_model.safetensors"));
  // The merged model is dense: every projection weight is there, in the run's dtype.
  auto merged = safetensors::SafetensorsFile::Open(out + "/merged/model.safetensors");
  ASSERT_TRUE(merged.ok()) << merged.status().ToString();
  const safetensors::TensorView* q_proj = (*merged)->Find("model.layers.3.self_attn.q_proj.weight");
  ASSERT_NE(q_proj, nullptr);
  EXPECT_EQ(q_proj->dtype, safetensors::DType::kF32);
  std::filesystem::remove_all(out);
}

}  // namespace
}  // namespace llmctl::trainer
