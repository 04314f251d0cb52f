// Profiled steps (profile.*) on the demo model: the Kineto trace is Chrome trace JSON holding the
// profiled steps' operators, profiling leaves the memory accounting byte for byte as it was, and
// the memory history opens in PyTorch's own memory_viz tools with the totals our snapshots report.
#include "trainer/train/profiling.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/byte_size.h"
#include "tests/support/shell_command.h"
#include "trainer/testing/trial_runner.h"

namespace llmctl::trainer {
namespace {

using nlohmann::json;
using testing::DemoConfig;
using testing::FreshTempDir;
using testing::RunAndRecord;
using testing::SourceDir;
using testing::TrialRecord;

constexpr const char* kByteFields[] = {"params_bytes",     "grads_bytes",   "optim_device_bytes",
                                       "optim_host_bytes", "other_bytes",   "allocated_bytes",
                                       "peak_bytes",       "reserved_bytes"};

// Steps 1 and 2 of a 3-step demo run, two micro-batches a step.
TrialRecord RunProfiled(const std::string& output_dir,
                        std::vector<std::pair<std::string, std::string>> more = {}) {
  std::vector<std::pair<std::string, std::string>> overrides = {
      {"train.max_steps", "3"}, {"train.micro_batch_size", "2"}, {"train.global_batch_size", "4"},
      {"profile.steps", "2"},   {"profile.first_step", "1"},     {"output_dir", output_dir}};
  overrides.insert(overrides.end(), more.begin(), more.end());
  TrialRecord record = RunAndRecord(DemoConfig(overrides));
  EXPECT_EQ(record.result.outcome, Outcome::kOk) << record.result.error;
  return record;
}

// The paths the run's log events name as written, by suffix.
std::string LoggedPath(const TrialRecord& record, const std::string& suffix) {
  for (const json& log : record.OfType("log")) {
    const std::string message = log["message"];
    std::smatch match;
    if (std::regex_search(message, match, std::regex("(/\\S+" + suffix + ")"))) return match[1];
  }
  ADD_FAILURE() << "no log event names a *" << suffix;
  return "";
}

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in, nullptr, /*allow_exceptions=*/false);
}

TEST(ProfilingTest, TraceIsChromeTraceJsonOfTheProfiledSteps) {
  const std::string dir = FreshTempDir("profile-trace");
  const TrialRecord record = RunProfiled(dir);
  const std::string path = LoggedPath(record, "trace-steps-1-2.json");
  EXPECT_EQ(path, dir + "/profile/trace-steps-1-2.json");
  const json trace = ReadJson(path);
  ASSERT_TRUE(trace.is_object()) << path << " is not JSON";
  ASSERT_TRUE(trace.contains("traceEvents") && trace["traceEvents"].is_array());

  // Every complete event ("X") has a name, a start and a duration; the spans the trainer opens
  // are there once per profiled step (and micro-batch), and none for the unprofiled steps.
  std::map<std::string, int> spans;
  std::vector<json> steps;
  std::set<std::string> ops;
  for (const json& event : trace["traceEvents"]) {
    ASSERT_TRUE(event.contains("ph") && event.contains("name")) << event.dump();
    if (event["ph"] != "X") continue;
    ASSERT_TRUE(event.contains("ts") && event.contains("dur")) << event.dump();
    const std::string name = event["name"];
    if (event.value("cat", "") == "user_annotation") ++spans[name];
    if (name.rfind("ProfilerStep#", 0) == 0) steps.push_back(event);
    ops.insert(name);
  }
  EXPECT_EQ(spans["ProfilerStep#1"], 1);
  EXPECT_EQ(spans["ProfilerStep#2"], 1);
  EXPECT_EQ(spans.count("ProfilerStep#0"), 0u);
  EXPECT_EQ(spans["forward"], 4);  // 2 steps x 2 micro-batches
  EXPECT_EQ(spans["backward"], 4);
  EXPECT_EQ(spans["optimizer step"], 2);
  // The model's operators, forward and backward.
  EXPECT_TRUE(ops.count("aten::mm") || ops.count("aten::matmul")) << "no matmul";
  EXPECT_TRUE(ops.count("aten::scaled_dot_product_attention")) << "no attention";
  bool backward_op = false;
  for (const std::string& name : ops) backward_op |= name.find("MmBackward0") != std::string::npos;
  EXPECT_TRUE(backward_op) << "no MmBackward0";
  // The fused ops the demo's LLaMA runs under `kernels: fused` (its default), each a span of its
  // own: their CPU loops are no ATen operator, and without it their time is under none.
  for (const char* fused :
       {"llmctl::rms_norm", "llmctl::rope", "llmctl::swiglu_linear", "llmctl::cross_entropy"}) {
    EXPECT_TRUE(ops.count(fused)) << "no " << fused;
  }
  ASSERT_EQ(steps.size(), 2u);
}

TEST(ProfilingTest, ProfilingLeavesTheMemoryAccountingAsItWas) {
  const std::vector<std::pair<std::string, std::string>> every_step = {{"snapshot_every", "1"}};
  const std::string plain_dir = FreshTempDir("profile-plain");
  std::vector<std::pair<std::string, std::string>> plain = {{"train.max_steps", "3"},
                                                            {"train.micro_batch_size", "2"},
                                                            {"train.global_batch_size", "4"},
                                                            {"snapshot_every", "1"},
                                                            {"output_dir", plain_dir}};
  const TrialRecord unprofiled = RunAndRecord(DemoConfig(plain));
  const TrialRecord profiled = RunProfiled(FreshTempDir("profile-accounting"), every_step);
  const std::vector<json> before = unprofiled.OfType("snapshot");
  const std::vector<json> after = profiled.OfType("snapshot");
  ASSERT_EQ(before.size(), after.size());
  ASSERT_EQ(before.size(), 3u * 7u);  // 3 steps x (2 micro-batches x 3 phases + the step's)
  for (size_t i = 0; i < before.size(); ++i) {
    for (const char* field : kByteFields) {
      EXPECT_EQ(before[i][field], after[i][field])
          << field << " at step " << before[i]["step"] << " " << before[i]["phase"];
    }
  }
  EXPECT_EQ(unprofiled.Losses(), profiled.Losses());
}

// What trainer/train/memory_viz_check.py reports of a memory history, read with PyTorch's tools.
json CheckWithPytorch(const std::string& pickle_path) {
  const std::string python = SourceDir() + "/.venv/bin/python";
  if (!std::filesystem::exists(python)) return json();
  const llmctl::testing::CommandResult result = llmctl::testing::RunShellCommand(
      python + " " + SourceDir() + "/trainer/train/memory_viz_check.py " + pickle_path + " " +
      FreshTempDir("memory-viz"));
  EXPECT_EQ(result.exit_code, 0) << result.out;
  // The report is the one line that is a JSON object; Python's warnings come on other lines.
  std::istringstream lines(result.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("{", 0) == 0) return json::parse(line, nullptr, /*allow_exceptions=*/false);
  }
  return json::object();
}

TEST(ProfilingTest, MemoryHistoryOpensInMemoryVizWithOurTotals) {
  const std::string dir = FreshTempDir("profile-memory");
  const TrialRecord record = RunProfiled(dir);
  const std::string path = LoggedPath(record, "memory-steps-1-2.pickle");
  EXPECT_EQ(path, dir + "/profile/memory-steps-1-2.pickle");
  const json report = CheckWithPytorch(path);
  ASSERT_FALSE(report.is_null()) << "no .venv/bin/python with torch (make setup makes it)";
  ASSERT_TRUE(report.is_object() && report.contains("markers")) << report.dump();

  // trace_plot and segment_plot built their HTML viewers, and the text tools read the file.
  EXPECT_GT(report["trace_plot_bytes"], 10000);
  EXPECT_GT(report["segment_plot_bytes"], 10000);
  EXPECT_GT(report["segsum_lines"], 1);
  EXPECT_GT(report["trace_lines"], 100);

  // Replaying the allocs and frees from the segments live at the end gives, at every phase
  // boundary of the profiled steps, exactly the allocated bytes of the snapshot taken there.
  std::vector<json> snapshots;
  for (const json& snapshot : record.OfType("snapshot")) {
    if (snapshot["step"] == 1 || snapshot["step"] == 2) snapshots.push_back(snapshot);
  }
  const json& markers = report["markers"];
  ASSERT_EQ(markers.size(), snapshots.size());
  ASSERT_EQ(snapshots.size(), 2u * 7u);
  for (size_t i = 0; i < snapshots.size(); ++i) {
    const std::string label = markers[i]["label"];
    const std::string expected_step = "step " + snapshots[i]["step"].dump() + ", ";
    EXPECT_EQ(label.rfind(expected_step, 0), 0u) << label;
    EXPECT_NE(label.find(snapshots[i]["phase"].get<std::string>()), std::string::npos) << label;
    EXPECT_EQ(markers[i]["replayed"], snapshots[i]["allocated_bytes"]) << label;
    EXPECT_EQ(markers[i]["recorded"], snapshots[i]["allocated_bytes"]) << label;
  }
  // The live allocations at the end carry their accounting category: the last snapshot's.
  const json& last = snapshots.back();
  EXPECT_EQ(report["categories"]["params"], last["params_bytes"]);
  EXPECT_EQ(report["categories"]["grads"], last["grads_bytes"]);
  EXPECT_EQ(report["categories"]["optimizer state"], last["optim_device_bytes"]);
  EXPECT_EQ(report["live_bytes"], last["allocated_bytes"]);
}

TEST(ProfilingTest, ARunOutOfMemoryKeepsTheHistoryUpToTheRefusal) {
  const std::string dir = FreshTempDir("profile-oom");
  const TrialRecord record = RunAndRecord(DemoConfig({{"train.max_steps", "3"},
                                                      {"profile.steps", "2"},
                                                      {"profile.first_step", "0"},
                                                      {"device_memory", "10MiB"},
                                                      {"output_dir", dir}}));
  ASSERT_EQ(record.result.outcome, Outcome::kOom) << record.result.error;
  const std::string path = LoggedPath(record, "memory-steps-0-0.pickle");
  EXPECT_TRUE(std::filesystem::exists(dir + "/profile/trace-steps-0-0.json"));
  const json report = CheckWithPytorch(path);
  ASSERT_FALSE(report.is_null()) << "no .venv/bin/python with torch (make setup makes it)";
  // The refused request is the history's "oom" entry, as CUDA's allocator records one.
  ASSERT_EQ(report["ooms"].size(), 1u) << report.dump();
  EXPECT_NE(record.result.error.find("tried to allocate " +
                                     FormatBytes(report["ooms"][0].get<uint64_t>())),
            std::string::npos)
      << record.result.error;
}

TEST(ProfilingTest, WithoutMemoryHistoryOnlyTheTraceIsWritten) {
  const std::string dir = FreshTempDir("profile-no-memory");
  RunProfiled(dir, {{"profile.memory_history", "false"}});
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/profile")) {
    files.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(files, std::vector<std::string>{"trace-steps-1-2.json"});
}

// A trace that cannot be written whole (RLIMIT_FSIZE 1 MiB against the demo's 3.6 MB trace here, a
// full disk elsewhere) leaves no part of itself, and the warning gives the system's reason once:
// Kineto reports none, and its temporary file of 1 MiB stayed while the warning said "No such file
// or directory" of the file it never renamed.
TEST(ProfilingTest, ATraceThatCannotBeWrittenLeavesNothingAndSaysWhy) {
  const std::string dir = FreshTempDir("profile-fsize");
  rlimit unlimited{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &unlimited), 0);
  // The token file (240 KB) and the events file fit; writes past the limit fail with EFBIG, not
  // the signal.
  const rlimit limit{1024 * 1024, unlimited.rlim_max};
  const sighandler_t handler = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  const TrialRecord record = RunProfiled(dir, {{"profile.memory_history", "false"}});
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &unlimited), 0);
  std::signal(SIGXFSZ, handler);
  std::vector<std::string> warnings;
  for (const json& log : record.OfType("log")) {
    if (log["level"] == "warning") warnings.push_back(log["message"]);
  }
  EXPECT_EQ(warnings, std::vector<std::string>{"profile: cannot write the profiler's trace " + dir +
                                               "/profile/trace-steps-1-2.json: File too large"});
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/profile")) {
    files.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(files, std::vector<std::string>{});
}

TEST(ProfilingTest, StepsPastTheRunsEndAreNamedInAWarning) {
  // 600 examples, 32 a step: 18 steps, of which 17 and 18 are asked for; 18 does not exist.
  const std::string dir = FreshTempDir("profile-epochs");
  const TrialRecord record = RunAndRecord(DemoConfig({{"train.max_steps", "0"},
                                                      {"train.micro_batch_size", "32"},
                                                      {"train.global_batch_size", "32"},
                                                      {"data.max_seq_length", "16"},
                                                      {"profile.steps", "2"},
                                                      {"profile.first_step", "17"},
                                                      {"profile.memory_history", "false"},
                                                      {"output_dir", dir}}));
  ASSERT_EQ(record.result.outcome, Outcome::kOk) << record.result.error;
  ASSERT_EQ(record.result.steps_done, 18);
  std::vector<std::string> warnings;
  for (const json& log : record.OfType("log")) {
    if (log["level"] == "warning") warnings.push_back(log["message"]);
  }
  EXPECT_EQ(warnings, std::vector<std::string>{"profile: steps 17-18 were asked for, but the run "
                                               "has 18 steps: only steps 17-17 are profiled"});
  EXPECT_TRUE(std::filesystem::exists(dir + "/profile/trace-steps-17-17.json"));
}

TEST(ProfilingTest, ARunResumedInsideItsProfiledStepsRecordsThoseLeft) {
  const std::string dir = FreshTempDir("profile-resume");
  const TrialRecord first = RunAndRecord(
      DemoConfig({{"train.max_steps", "2"}, {"checkpoint_every", "2"}, {"output_dir", dir}}));
  ASSERT_EQ(first.result.outcome, Outcome::kOk) << first.result.error;
  const TrialRecord resumed = RunAndRecord(DemoConfig({{"train.max_steps", "4"},
                                                       {"profile.first_step", "1"},
                                                       {"profile.steps", "2"},
                                                       {"output_dir", dir}}),
                                           dir + "/checkpoints/step-2");
  ASSERT_EQ(resumed.result.outcome, Outcome::kOk) << resumed.result.error;
  EXPECT_EQ(LoggedPath(resumed, "trace-steps-2-2.json"), dir + "/profile/trace-steps-2-2.json");
  EXPECT_EQ(LoggedPath(resumed, "memory-steps-2-2.pickle"),
            dir + "/profile/memory-steps-2-2.pickle");
}

TEST(ProfilingTest, ProfilingNeedsAnOutputDir) {
  const TrialRecord record =
      RunAndRecord(DemoConfig({{"train.max_steps", "3"}, {"profile.steps", "1"}}));
  EXPECT_EQ(record.result.outcome, Outcome::kFailed);
  EXPECT_TRUE(record.result.invalid_input);
  EXPECT_EQ(record.result.error, "profile.steps: profiles need output_dir to say where they go");
}

}  // namespace
}  // namespace llmctl::trainer
