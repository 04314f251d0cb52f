#include "common/estimate/trainer_runs.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>

#include "common/estimate/chunked_loss.h"
#include "common/estimate/model_state.h"
#include "common/estimate/rate_probe.h"
#include "common/estimate/step_memory.h"
#include "common/experiment.h"
#include "common/rank_files.h"
#include "common/snapshot_event.h"
#include "common/trainer_exit.h"
#include "tests/support/shell_command.h"

namespace llmctl::estimate::testing {

std::string SourceDir() { return llmctl::testing::SourceDir().string(); }

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string FilePath(const Case& c) { return SourceDir() + "/experiments/" + c.file; }

std::vector<json> ReadEvents(const fs::path& path) {
  std::vector<json> events;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) events.push_back(json::parse(line));
  return events;
}

}  // namespace

Sets With(Sets a, const Sets& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string Describe(const Case& c) {
  std::string text = c.file + (c.trial.empty() ? "" : " --trial " + c.trial);
  for (const auto& [key, value] : c.sets) text += " " + key + "=" + value;
  if (c.nproc > 1) text += " --nproc " + std::to_string(c.nproc);
  return text;
}

StatusOr<TrialConfig> LoadCaseConfig(const Case& c, const Sets& common) {
  ASSIGN_OR_RETURN(Experiment experiment, LoadExperimentFile(FilePath(c)));
  const Trial* trial = &experiment.trials.front();
  for (const Trial& t : experiment.trials) {
    if (t.name == c.trial) trial = &t;
  }
  TrialConfig config = trial->config;
  for (const auto& [key, value] : common) RETURN_IF_ERROR(config.SetFromText(key, value));
  for (const auto& [key, value] : c.sets) RETURN_IF_ERROR(config.SetFromText(key, value));
  LocalizeNodePaths(config);
  ApplyLabSpellings(config);
  return config;
}

StatusOr<CaseConfig> LoadCase(const Case& c, const Sets& common) {
  CaseConfig loaded;
  ASSIGN_OR_RETURN(loaded.config, LoadCaseConfig(c, common));
  ASSIGN_OR_RETURN(loaded.model, ResolveModel(loaded.config.settings().model.name));
  return loaded;
}

TrainerRun RunLlmTrain(const Case& c, const Sets& common, const fs::path& dir, int index) {
  const fs::path events = dir / ("events-" + std::to_string(index) + ".jsonl");
  TrainerRun run;
  run.command = (llmctl::testing::BuildDir() / "trainer/llm-train").string() + " --config " +
                FilePath(c) + " --events " + events.string();
  if (!c.trial.empty()) run.command += " --trial " + c.trial;
  for (const auto& sets : {common, c.sets}) {
    for (const auto& [key, value] : sets) run.command += " --set '" + key + "=" + value + "'";
  }
  if (c.nproc > 1) run.command += " --nproc " + std::to_string(c.nproc) + " --master-port 0";
  const llmctl::testing::CommandResult result = llmctl::testing::RunShellCommand(run.command);
  run.exit_code = result.exit_code;
  run.output = result.out;
  for (int rank = 0; rank < c.nproc; ++rank) {
    run.ranks.push_back(ReadEvents(RankEventsPath(events.string(), rank)));
  }
  return run;
}

namespace {

// The exit code a process of its own ends with for the outcome of `events`' result; -1 without one.
int ExitCodeOfResult(const std::vector<json>& events) {
  for (const json& event : events) {
    if (event["type"] != "result" || !event.contains("outcome")) continue;
    for (int code = trainer_exit::kOk; code <= trainer_exit::kCancelled; ++code) {
      if (event["outcome"] == trainer_exit::OutcomeName(code)) return code;
    }
  }
  return -1;
}

}  // namespace

std::vector<TrainerRun> RunLlmTrainSeries(const std::vector<Case>& cases, const Sets& common,
                                          const fs::path& dir, int first_index) {
  const fs::path runs_path = dir / ("runs-" + std::to_string(first_index) + ".jsonl");
  std::vector<fs::path> events;
  {
    std::ofstream runs(runs_path);
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      if (c.nproc != 1 || c.file != cases.front().file) {
        ADD_FAILURE() << "RunLlmTrainSeries runs one-rank cases of one file: " << Describe(c);
        return {};
      }
      events.push_back(dir /
                       ("events-" + std::to_string(first_index + static_cast<int>(i)) + ".jsonl"));
      json line = {{"events", events.back().string()}, {"set", json::array()}};
      if (!c.trial.empty()) line["trial"] = c.trial;
      for (const auto& [key, value] : c.sets) line["set"].push_back(key + "=" + value);
      runs << line.dump() << "\n";
    }
  }
  if (cases.empty()) return {};
  std::string command = (llmctl::testing::BuildDir() / "trainer/llm-train").string() +
                        " --config " + FilePath(cases.front()) + " --runs " + runs_path.string();
  for (const auto& [key, value] : common) command += " --set '" + key + "=" + value + "'";
  const llmctl::testing::CommandResult result = llmctl::testing::RunShellCommand(command);
  std::vector<TrainerRun> runs;
  for (const fs::path& path : events) {
    TrainerRun& run = runs.emplace_back();
    run.command = command;
    run.output = result.out;
    run.ranks.push_back(ReadEvents(path));
    run.exit_code = ExitCodeOfResult(run.ranks.front());
  }
  return runs;
}

std::vector<TrainerRun> RunLlmTrainCases(const std::vector<Case>& cases, const Sets& common,
                                         const fs::path& dir, int first_index) {
  std::vector<Case> one_rank;
  for (const Case& c : cases) {
    if (c.nproc == 1) one_rank.push_back(c);
  }
  std::vector<TrainerRun> series = RunLlmTrainSeries(one_rank, common, dir, first_index);
  if (series.size() != one_rank.size()) return {};
  std::vector<TrainerRun> runs;
  size_t next_in_series = 0;
  int next_index = first_index + static_cast<int>(one_rank.size());
  for (const Case& c : cases) {
    runs.push_back(c.nproc == 1 ? std::move(series[next_in_series++])
                                : RunLlmTrain(c, common, dir, next_index++));
  }
  return runs;
}

StatusOr<std::vector<std::vector<json>>> RunLlmTrainOk(const Case& c, const Sets& common,
                                                       const fs::path& dir, int index) {
  TrainerRun run = RunLlmTrain(c, common, dir, index);
  if (run.exit_code != 0) {
    return InternalError(run.command + " exited with " + std::to_string(run.exit_code) + "\n" +
                         run.output);
  }
  return std::move(run.ranks);
}

void ExpectModelStateExact(const Case& c, const CaseConfig& loaded,
                           const std::vector<std::vector<json>>& ranks) {
  ExpectModelStateExact(
      c, [&](int64_t rank) { return EstimateModelState(loaded.config, loaded.model, rank); },
      ranks);
}

void ExpectModelStateExact(const Case& c,
                           const std::function<StatusOr<ModelStateEstimate>(int64_t)>& estimate_of,
                           const std::vector<std::vector<json>>& ranks) {
  ASSERT_EQ(ranks.size(), static_cast<size_t>(c.nproc));
  for (int rank = 0; rank < c.nproc; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    StatusOr<ModelStateEstimate> estimate = estimate_of(rank);
    ASSERT_TRUE(estimate.ok()) << estimate.status().message();
    ASSERT_EQ(estimate->world_size, c.nproc);
    json start, after_step;
    for (const json& event : ranks[static_cast<size_t>(rank)]) {
      if (event["type"] == "start") start = event;
      if (event["type"] == std::string(snapshot_event::kType) &&
          event[snapshot_event::kStep] == 0 &&
          event[snapshot_event::kPhase] == std::string(snapshot_event::kAfterOptimizerStep)) {
        after_step = event;
      }
    }
    ASSERT_FALSE(start.is_null());
    ASSERT_FALSE(after_step.is_null());
    EXPECT_EQ(start["parameters_total"].get<int64_t>(), estimate->parameters_total);
    EXPECT_EQ(start["parameters_trainable"].get<int64_t>(), estimate->parameters_trainable);
    EXPECT_EQ(after_step[snapshot_event::kParamsBytes].get<uint64_t>(), estimate->params_bytes);
    EXPECT_EQ(after_step[snapshot_event::kGradsBytes].get<uint64_t>(), estimate->grads_bytes);
    EXPECT_EQ(after_step[snapshot_event::kOptimDeviceBytes].get<uint64_t>(),
              estimate->optim_device_bytes);
    EXPECT_EQ(after_step[snapshot_event::kOptimHostBytes].get<uint64_t>(),
              estimate->optim_host_bytes);
    EXPECT_EQ(after_step[snapshot_event::kCommBytes].get<uint64_t>(), estimate->comm_bytes);
  }
}

fs::path WriteLongExamples(const fs::path& dir) {
  const std::vector<std::string> words = {"the",   "river", "ran",  "past",  "a",    "quiet",
                                          "house", "where", "nine", "birds", "sang", "all",
                                          "day",   "and",   "some", "night"};
  const fs::path path = dir / "long-examples.jsonl";
  std::ofstream out(path);
  for (int example = 0; example < 64; ++example) {
    std::string text;
    for (int w = 0; w < 400; ++w) {
      text += (w > 0 ? " " : "") + words[static_cast<size_t>((w * 7 + example * 3) % 16)];
    }
    out << json{{"instruction", "Write a story."}, {"input", ""}, {"output", text}}.dump() << "\n";
  }
  return path;
}

Sets PeakRunSets(const fs::path& dir) {
  return {{"train.max_steps", "2"},
          {"snapshot_every", "1"},
          {"data.path", WriteLongExamples(dir).string()},
          {"data.mask_prompt", "false"},
          {"device_memory", ""},
          {"output_dir", ""},
          {"checkpoint_every", "0"},
          {"profile.steps", "0"}};
}

uint64_t MeasuredPeak(const std::vector<json>& events) {
  uint64_t peak = 0;
  for (const json& e : events) {
    if (e.contains("peak_bytes")) peak = std::max(peak, e["peak_bytes"].get<uint64_t>());
  }
  return peak;
}

Case AtMostMicroBatches(const Case& c, const TrialConfig& config, int micro_batches) {
  const int64_t micro = config.settings().train.micro_batch_size;
  const int64_t global = config.settings().train.global_batch_size;
  const int64_t most = micro_batches * micro * c.nproc;
  if (global <= most) return c;
  Case shorter = c;
  shorter.sets.emplace_back("train.global_batch_size", std::to_string(most));
  return shorter;
}

namespace {

// A case ExpectPeaksWithin checks: its configuration, the estimate its run is compared with and
// the case that runs (AtMostMicroBatches' of two, whose estimate is the case's to the byte).
struct PeakPlan {
  Case c;
  std::string label;
  CaseConfig loaded;
  StepMemoryEstimate estimate;
  Case run_case;
};

// `c`'s plan, or none: then a failure is recorded.
void PlanPeak(const Case& c, const Sets& common, const std::string& label,
              const MatmulBuffers& buffers, std::optional<PeakPlan>& plan) {
  SCOPED_TRACE(Describe(c));
  StatusOr<CaseConfig> loaded = LoadCase(c, common);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  StatusOr<StepMemoryEstimate> estimate =
      EstimateStepMemory(loaded->config, loaded->model, buffers);
  ASSERT_TRUE(estimate.ok()) << estimate.status().message();
  // The run's estimate is the case's to the byte, at the same moment: what runs is what is checked.
  const Case run_case = AtMostMicroBatches(c, loaded->config, /*micro_batches=*/2);
  if (run_case.sets.size() != c.sets.size()) {
    StatusOr<CaseConfig> run_loaded = LoadCase(run_case, common);
    ASSERT_TRUE(run_loaded.ok()) << run_loaded.status().message();
    StatusOr<StepMemoryEstimate> run_estimate =
        EstimateStepMemory(run_loaded->config, run_loaded->model, buffers);
    ASSERT_TRUE(run_estimate.ok()) << run_estimate.status().message();
    ASSERT_EQ(run_estimate->peak_bytes, estimate->peak_bytes) << Describe(run_case);
    ASSERT_EQ(run_estimate->peak_phase, estimate->peak_phase) << Describe(run_case);
  }
  plan = PeakPlan{c, label, std::move(*loaded), std::move(*estimate), run_case};
}

// The training time of a run's rank 0, from its result event (0 without one).
double TrainSeconds(const std::vector<json>& events) {
  for (const json& e : events) {
    if (e["type"] == "result" && e.contains("elapsed_ms"))
      return e["elapsed_ms"].get<double>() / 1e3;
  }
  return 0;
}

// The largest buffer the estimate added for the chunked loss' head products of a 16-bit run
// (step_memory.cc's choice, by the products' dtype and the head's vocabulary); 0 where it added
// none: no probe's buffers, no chunked loss, a 32-bit run.
uint64_t AddedHeadBuffer(const CaseConfig& loaded, const std::optional<MatmulBuffers>& buffers) {
  const trial::Precision precision = loaded.config.settings().memory.precision;
  if (!buffers || precision == trial::Precision::k32True || !UsesChunkedLoss(loaded.config)) {
    return 0;
  }
  return ChunkedLossBuffers(*buffers, precision, /*sixteen_bit_products=*/true,
                            loaded.model.vocab_size)
      .Largest();
}

// The run's model state equals the plan's estimate to the byte and its peak lies within `bound`.
void CheckPeak(const PeakPlan& plan, const TrainerRun& run, PeakBound bound) {
  SCOPED_TRACE(Describe(plan.c));
  ASSERT_EQ(run.exit_code, 0) << run.command << " exited with " << run.exit_code << "\n"
                              << run.output;
  ExpectModelStateExact(plan.c, plan.loaded, run.ranks);
  const uint64_t measured = MeasuredPeak(run.ranks.front());
  ASSERT_GT(measured, 0u);
  const uint64_t predicted = plan.estimate.peak_bytes;
  const double error = (static_cast<double>(predicted) - static_cast<double>(measured)) /
                       static_cast<double>(measured);
  // oneDNN packs a 16-bit CPU matmul's operands into buffers it takes from LibTorch's allocator for
  // the call, whose sizes follow the CPU's vector unit and threads: an estimate without a probe
  // leaves them out (docs/estimate.md), so a run below the 32-bit precision may lie that much
  // further under it (kCpuSixteenBitMatmulWorkspace: measured up to 450 KiB on the Zen 4 and 777
  // KiB on a Xeon with AMX, at the demo model's loss).
  const double workspace =
      bound.measured_buffers ||
              plan.loaded.config.settings().memory.precision == trial::Precision::k32True
          ? 0.0
          : static_cast<double>(kCpuSixteenBitMatmulWorkspace) / static_cast<double>(measured);
  const std::string shortened =
      plan.run_case.sets.size() != plan.c.sets.size() ? " (run at 2 micro-batches a step)" : "";
  std::printf(
      "%s%s predicted %llu measured %llu error %+.2f%% (%s; model state %.0f%%) trained in %.1f "
      "s\n",
      plan.label.c_str(), shortened.c_str(), static_cast<unsigned long long>(predicted),
      static_cast<unsigned long long>(measured), 100.0 * error, plan.estimate.peak_phase.c_str(),
      100.0 * static_cast<double>(plan.estimate.state.device_bytes()) /
          static_cast<double>(measured),
      TrainSeconds(run.ranks.front()));
  EXPECT_GE(error, -bound.under - workspace)
      << "predicted " << predicted << " B, measured " << measured << " B";
  const uint64_t added_buffer = AddedHeadBuffer(plan.loaded, bound.measured_buffers);
  EXPECT_LE(error, bound.over + static_cast<double>(added_buffer) / static_cast<double>(measured))
      << "predicted " << predicted << " B, measured " << measured << " B";
}

}  // namespace

void ExpectPeaksWithin(const std::vector<Case>& cases, const Sets& common, const fs::path& dir,
                       PeakBound bound, const std::vector<std::string>& labels) {
  std::vector<PeakPlan> plans;
  for (size_t i = 0; i < cases.size(); ++i) {
    std::optional<PeakPlan> plan;
    PlanPeak(cases[i], common, i < labels.size() ? labels[i] : Describe(cases[i]),
             bound.measured_buffers.value_or(MatmulBuffers{}), plan);
    if (plan) plans.push_back(std::move(*plan));
  }
  std::vector<Case> run_cases;
  for (const PeakPlan& plan : plans) run_cases.push_back(plan.run_case);
  const std::vector<TrainerRun> runs = RunLlmTrainCases(run_cases, common, dir, 0);
  ASSERT_EQ(runs.size(), plans.size());
  for (size_t i = 0; i < runs.size(); ++i) CheckPeak(plans[i], runs[i], bound);
}

std::optional<MatmulBuffers> ProbedMatmulBuffers(const fs::path& dir) {
  const fs::path output = dir / "probe.json";
  const std::string command = (llmctl::testing::BuildDir() / "trainer/llm-train").string() +
                              " --probe --probe-output " + output.string();
  const llmctl::testing::CommandResult result = llmctl::testing::RunShellCommand(command);
  if (result.exit_code != 0) {
    ADD_FAILURE() << command << " exited with " << result.exit_code << "\n" << result.out;
    return std::nullopt;
  }
  std::ifstream in(output);
  const json document = json::parse(in, nullptr, /*allow_exceptions=*/false);
  StatusOr<RateProbe> probe = RateProbe::FromJson(document);
  if (!probe.ok()) {
    ADD_FAILURE() << output << ": " << probe.status().message();
    return std::nullopt;
  }
  return probe->HeadBuffers();
}

std::string Outcome(const TrainerRun& run) {
  for (const json& e : run.ranks.front()) {
    if (e["type"] == "result") return e["outcome"];
  }
  return "no result event (exit " + std::to_string(run.exit_code) + "): " + run.output;
}

std::string RowTestName(const ::testing::TestParamInfo<const char*>& info) {
  std::string name = info.param;
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

fs::path TestDir() {
  // A parameterized test's name holds a "/".
  std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::replace(name.begin(), name.end(), '/', '-');
  const fs::path dir =
      fs::temp_directory_path() / ("llmctl-estimate-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

}  // namespace llmctl::estimate::testing
