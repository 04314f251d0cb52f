#include "common/estimate/trainer_runs.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "common/estimate/model_state.h"
#include "common/estimate/step_memory.h"
#include "common/experiment.h"
#include "common/rank_files.h"
#include "common/snapshot_event.h"
#include "tests/support/shell_command.h"

namespace llmctl::estimate::testing {

std::string SourceDir() {
  const char* dir = std::getenv("LLMCTL_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

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

bool CpuHasSixteenBitMatmul() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags{std::istream_iterator<std::string>(words),
                                std::istream_iterator<std::string>()};
    return flags.contains("amx_bf16") || flags.contains("avx512_bf16") ||
           (flags.contains("avx512f") && flags.contains("avx512bw") && flags.contains("avx512vl") &&
            flags.contains("avx512dq"));
  }
  return false;
}

std::string SlowSixteenBitRun(const StatusOr<StepWork>& work, int steps) {
  if (!work.ok() || work->matmul_class != MatmulClass::kBf16) return "";
  const double run_flops = steps * work->matmul_flops;
  if (run_flops <= kSlowSixteenBitMatmulFlops || CpuHasSixteenBitMatmul()) return "";
  char why[200];
  std::snprintf(why, sizeof(why),
                "%.1e FLOPs of 16-bit matmuls, on a CPU without 16-bit matmul instructions "
                "(LibTorch's scalar bf16 GEMM: minutes)",
                run_flops);
  return why;
}

void ExpectPeakWithin(const Case& c, const Sets& common, const fs::path& dir, int index,
                      PeakBound bound, const std::string& label) {
  SCOPED_TRACE(Describe(c));
  StatusOr<CaseConfig> loaded = LoadCase(c, common);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  // Left out here, and said so: the rest of a sweep still runs, the test then reports a skip.
  if (const std::string slow =
          SlowSixteenBitRun(EstimateStepWork(loaded->config, loaded->model), /*steps=*/2);
      !slow.empty()) {
    GTEST_SKIP() << (label.empty() ? Describe(c) : label) << ": " << slow;
  }
  StatusOr<StepMemoryEstimate> estimate = EstimateStepMemory(loaded->config, loaded->model);
  ASSERT_TRUE(estimate.ok()) << estimate.status().message();
  // The run's estimate is the case's to the byte, at the same moment: what runs is what is checked.
  const Case run_case = AtMostMicroBatches(c, loaded->config, /*micro_batches=*/2);
  if (run_case.sets.size() != c.sets.size()) {
    StatusOr<CaseConfig> run_loaded = LoadCase(run_case, common);
    ASSERT_TRUE(run_loaded.ok()) << run_loaded.status().message();
    StatusOr<StepMemoryEstimate> run_estimate =
        EstimateStepMemory(run_loaded->config, run_loaded->model);
    ASSERT_TRUE(run_estimate.ok()) << run_estimate.status().message();
    ASSERT_EQ(run_estimate->peak_bytes, estimate->peak_bytes) << Describe(run_case);
    ASSERT_EQ(run_estimate->peak_phase, estimate->peak_phase) << Describe(run_case);
  }
  const auto start = std::chrono::steady_clock::now();
  auto ranks = RunLlmTrainOk(run_case, common, dir, index);
  const std::chrono::duration<double> wall = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(ranks.ok()) << ranks.status().message();
  ExpectModelStateExact(c, *loaded, *ranks);
  const uint64_t measured = MeasuredPeak(ranks->front());
  ASSERT_GT(measured, 0u);
  const double error = (static_cast<double>(estimate->peak_bytes) - static_cast<double>(measured)) /
                       static_cast<double>(measured);
  // oneDNN packs a 16-bit CPU matmul's operands into buffers it takes from LibTorch's allocator for
  // the call, whose sizes follow the CPU's vector unit: the estimate leaves them out (docs/
  // estimate.md), so a run below the 32-bit precision may lie that much further under it
  // (measured on Zen 4: up to 450 KiB, at the demo model's loss).
  const double workspace =
      loaded->config.settings().memory.precision == trial::Precision::k32True
          ? 0.0
          : static_cast<double>(kCpuSixteenBitMatmulWorkspace) / static_cast<double>(measured);
  const std::string shortened =
      run_case.sets.size() != c.sets.size() ? " (run at 2 micro-batches a step)" : "";
  std::printf(
      "%s%s predicted %llu measured %llu error %+.2f%% (%s; model state %.0f%%) %.1f s\n",
      (label.empty() ? Describe(c) : label).c_str(), shortened.c_str(),
      static_cast<unsigned long long>(estimate->peak_bytes),
      static_cast<unsigned long long>(measured), 100.0 * error, estimate->peak_phase.c_str(),
      100.0 * static_cast<double>(estimate->state.device_bytes()) / static_cast<double>(measured),
      wall.count());
  EXPECT_GE(error, -bound.under - workspace)
      << "predicted " << estimate->peak_bytes << " B, measured " << measured << " B";
  EXPECT_LE(error, bound.over) << "predicted " << estimate->peak_bytes << " B, measured "
                               << measured << " B";
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
