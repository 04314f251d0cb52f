// deploy/gpu-check's parts that run without a GPU: the trainer-only CMake configuration it builds,
// its lab rows (deploy/gpu_check.py) and its command line.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "common/estimate/rate_probe.h"
#include "common/files.h"
#include "tests/support/shell_command.h"

namespace llmctl {
namespace {

namespace fs = std::filesystem;

using testing::SourceDir;

fs::path FreshDir(const std::string& name) {
  std::string pattern =
      (fs::temp_directory_path() / ("llmctl-gpu-check-" + name + "-XXXXXX")).string();
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr) << pattern;
  return pattern;
}

std::string Read(const fs::path& path) {
  StatusOr<std::string> text = ReadFileToString(path.string());
  EXPECT_TRUE(text.ok()) << text.status().message();
  return text.ok() ? *text : "";
}

// The value of KEY:TYPE=VALUE in a CMakeCache.txt, "" when absent.
std::string CacheValue(const std::string& cache, const std::string& key) {
  std::istringstream lines(cache);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with(key + ":")) return line.substr(line.find('=') + 1);
  }
  return "";
}

TEST(TrainerOnlyConfigurationTest, HasLlmTrainAndNoneOfTheOrchestratorsPackages) {
  const std::string torch_dir =
      CacheValue(Read(testing::BuildDir() / "CMakeCache.txt"), "Torch_DIR");
  ASSERT_FALSE(torch_dir.empty()) << "no Torch_DIR in the build's CMakeCache.txt";
  const fs::path build = FreshDir("configure");
  const testing::CommandResult configure = testing::RunShellCommand(
      "cmake -S '" + SourceDir().string() + "' -B '" + build.string() +
      "' -G Ninja -DLLMCTL_TRAINER_ONLY=ON -DTorch_DIR='" + torch_dir + "'");
  ASSERT_EQ(configure.exit_code, 0) << configure.out;

  const testing::CommandResult targets =
      testing::RunShellCommand("cmake --build '" + build.string() + "' --target help");
  ASSERT_EQ(targets.exit_code, 0) << targets.out;
  EXPECT_NE(targets.out.find("\nllm-train: "), std::string::npos) << targets.out;
  // GoogleTest is on this machine: the DEVICE tests (the kernels stage's) are built, no others.
  EXPECT_NE(targets.out.find("\nfused_ops_test: "), std::string::npos) << targets.out;
  for (const char* absent :
       {"llmctld:", "llm-agent:", "llmctl_bin:", "trainer_test:", "quant_bench:"}) {
    EXPECT_EQ(targets.out.find(std::string("\n") + absent), std::string::npos) << absent;
  }
  // find_package leaves <Package>_DIR (or pkg-config's <PREFIX>_FOUND) in the cache when it is
  // called.
  const std::string cache = Read(build / "CMakeCache.txt");
  for (const char* never_looked_for : {"gRPC_DIR", "SQLITE3_FOUND", "CURL_FOUND"}) {
    EXPECT_EQ(CacheValue(cache, never_looked_for), "") << never_looked_for;
  }
  EXPECT_EQ(CacheValue(cache, "LLMCTL_TRAINER_ONLY"), "ON");

  // The one way to build without the CUDA kernels says so in the cache, which the kernels stage
  // reads (GpuCheckCommandTest.TheKernelsStageRefusesABuildWithoutTheCudaKernelsOnAGpu).
  const testing::CommandResult without_kernels =
      testing::RunShellCommand("cmake -S '" + SourceDir().string() + "' -B '" + build.string() +
                               "' -DLLMCTL_CUDA_KERNELS=OFF");
  ASSERT_EQ(without_kernels.exit_code, 0) << without_kernels.out;
  EXPECT_EQ(CacheValue(Read(build / "CMakeCache.txt"), "LLMCTL_CUDA_KERNELS_BUILT"),
            "no: LLMCTL_CUDA_KERNELS=OFF");
  fs::remove_all(build);
}

// A run's events as llm-train writes them: step 0 is slow (it creates the optimizer state).
void WriteEvents(const fs::path& path) {
  std::ofstream out(path);
  out << R"({"type":"start","parameters_total":1000,"parameters_trainable":1000,"load_peak_bytes":10})"
      << "\n"
      << R"({"type":"snapshot","step":0,"micro_batch":0,"phase":"phase3_after_opt_step","params_bytes":2000,)"
      << R"("grads_bytes":2000,"optim_device_bytes":4004,"optim_host_bytes":0,"other_bytes":96,)"
      << R"("allocated_bytes":8100,"peak_bytes":9000,"reserved_bytes":12000})"
      << "\n"
      << R"({"type":"step","step":0,"loss":7.0,"lr":1e-4,"tokens":100,"seconds":5.0})"
      << "\n"
      << R"({"type":"step","step":1,"loss":6.9,"lr":1e-4,"tokens":300,"seconds":1.0})"
      << "\n"
      << R"({"type":"step","step":2,"loss":6.8,"lr":1e-4,"tokens":300,"seconds":2.0})"
      << "\n"
      << R"({"type":"result","outcome":"ok","peak_bytes":9000,"tokens_per_second":100,"error":""})"
      << "\n";
}

testing::CommandResult Helper(const std::string& args) {
  return testing::RunShellCommand("python3 '" + (SourceDir() / "deploy/gpu_check.py").string() +
                                  "' " + args);
}

nlohmann::json LastRow(const fs::path& jsonl) {
  std::istringstream lines(Read(jsonl));
  std::string line, last;
  while (std::getline(lines, line)) last = line;
  return nlohmann::json::parse(last);
}

TEST(GpuCheckLabRowTest, TimesTheStepsAfterTheFirstAndSetsThePublishedFigureBeside) {
  const fs::path out = FreshDir("lab");
  fs::create_directories(out / "lab");
  WriteEvents(out / "lab/bf16-true.events.jsonl");
  const testing::CommandResult row =
      Helper("lab-row '" + out.string() + "' experiments/single-llama-a100.yaml bf16-true ok 0");
  ASSERT_EQ(row.exit_code, 0) << row.out;

  const nlohmann::json r = LastRow(out / "lab.jsonl");
  EXPECT_EQ(r["observed"], "ok");
  EXPECT_EQ(r["matches"], true);
  EXPECT_DOUBLE_EQ(r["tokens_per_second"].get<double>(), 600.0 / 3.0);  // steps 1 and 2 only
  EXPECT_EQ(r["peak_bytes"], 9000);
  EXPECT_EQ(r["reserved_peak_bytes"], 12000);
  EXPECT_EQ(r["at_peak"]["optim_device_bytes"], 4004);
  EXPECT_DOUBLE_EQ(r["published"]["peak_gb"].get<double>(), 20.10);  // deploy/lab-published.json
  EXPECT_EQ(Helper("has-row '" + (out / "lab.jsonl").string() + "' bf16-true").exit_code, 0);
  EXPECT_EQ(Helper("has-row '" + (out / "lab.jsonl").string() + "' bf16-mixed").exit_code, 1);

  const testing::CommandResult table =
      Helper("lab-table '" + out.string() + "' experiments/single-llama-a100.yaml bf16-mixed");
  ASSERT_EQ(table.exit_code, 0) << table.out;
  const std::string markdown = Read(out / "lab.md");
  EXPECT_NE(markdown.find("| bf16-true | ok | ok | 0.00 |"), std::string::npos) << markdown;
  EXPECT_NE(markdown.find("20.10 GB, 12,506 tok/s"), std::string::npos) << markdown;
  EXPECT_NE(markdown.find("| bf16-mixed | | skipped: out of time |"), std::string::npos)
      << markdown;
  fs::remove_all(out);
}

TEST(GpuCheckLabRowTest, ATrialStoppedAtTheBudgetStatesNoOutcomeAndIsMeasuredAgain) {
  const fs::path out = FreshDir("budget");
  fs::create_directories(out / "lab");
  WriteEvents(out / "lab/sgd.events.jsonl");
  ASSERT_EQ(Helper("lab-row '" + out.string() + "' experiments/cpu-lab.yaml sgd ok 124").exit_code,
            0);
  const nlohmann::json r = LastRow(out / "lab.jsonl");
  EXPECT_EQ(r["observed"], "stopped: time budget");
  EXPECT_TRUE(r["matches"].is_null());
  EXPECT_TRUE(r["published"].is_null());  // cpu-lab.yaml has no published figures
  EXPECT_EQ(Helper("has-row '" + (out / "lab.jsonl").string() + "' sgd").exit_code, 1);
  fs::remove_all(out);
}

TEST(GpuCheckLabRowTest, ATrialKilledBeforeTheBudgetIsAFailedRowNotAStoppedOne) {
  const fs::path out = FreshDir("killed");
  fs::create_directories(out / "lab");
  WriteEvents(out / "lab/lora.events.jsonl");
  ASSERT_EQ(Helper("lab-row '" + out.string() + "' experiments/cpu-lab.yaml lora ok 137").exit_code,
            0);
  const nlohmann::json r = LastRow(out / "lab.jsonl");
  EXPECT_EQ(r["observed"], "killed");
  EXPECT_EQ(r["matches"], false);
  EXPECT_EQ(Helper("has-row '" + (out / "lab.jsonl").string() + "' lora").exit_code, 0);
  fs::remove_all(out);
}

// The product file on an 80 GB card: the lab's 93.6 GiB and the 13B row's 79.2 GiB caps are more
// than the card, which llm-train refuses, so they are dropped; on an H200 nothing is.
TEST(GpuCheckProductFileTest, CapsLargerThanTheGpuAreDropped) {
  const fs::path out = FreshDir("product-file");
  const std::string file = (SourceDir() / "experiments/gpu-product.yaml").string();
  const std::string copy = (out / "copy.yaml").string();
  const testing::CommandResult small =
      Helper("product-file '" + file + "' " + std::to_string(78ull << 30) + " '" + copy + "'");
  ASSERT_EQ(small.exit_code, 0) << small.out;
  EXPECT_EQ(small.out, "93.6GiB 79.2GiB\n");
  const std::string text = Read(copy);
  EXPECT_EQ(text.find("device_memory: 93.6GiB"), std::string::npos);
  EXPECT_EQ(text.find("device_memory: 79.2GiB"), std::string::npos);
  EXPECT_NE(text.find("device_memory: \"\""), std::string::npos);
  const testing::CommandResult large =
      Helper("product-file '" + file + "' " + std::to_string(139ull << 30) + " '" + copy + "'");
  ASSERT_EQ(large.exit_code, 0) << large.out;
  EXPECT_EQ(large.out, "\n");
  EXPECT_EQ(Read(copy), Read(file));
  fs::remove_all(out);
}

TEST(GpuCheckCommandTest, AnUnknownStageIsAUsageError) {
  const fs::path out = FreshDir("usage");
  const testing::CommandResult run = testing::RunShellCommand(
      (SourceDir() / "deploy/gpu-check").string() + " '" + out.string() + "' build nosuch");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.out.find("gpu-check: unknown stage 'nosuch'"), std::string::npos) << run.out;
  fs::remove_all(out);
}

// The kernels stage runs the build's fused_ops_test on the stage's device, here the CPU instances
// of the full build's binary, and records the stage; without the binary it says so and fails.
TEST(GpuCheckCommandTest, TheKernelsStageRunsTheFusedOpsTestsOnItsDevice) {
  const fs::path out = FreshDir("kernels");
  const std::string command = "GPU_CHECK_BUILD_DIR='" + testing::BuildDir().string() + "' " +
                              (SourceDir() / "deploy/gpu-check").string() + " --device cpu '" +
                              out.string() + "' kernels";
  const testing::CommandResult run = testing::RunShellCommand(command);
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const std::string report = Read(out / "kernels.txt");
  EXPECT_NE(report.find("[       OK ] Devices/FusedOpsOn.CrossEntropyGradMatchesCrossEntropyAndIts"
                        "Gradient/cpu"),
            std::string::npos)
      << report;
  EXPECT_EQ(report.find("/cuda"), std::string::npos) << "only the stage's device runs";
  EXPECT_NE(run.out.find("kernels on cpu: 8 ran, 0 failed, 0 skipped"), std::string::npos)
      << run.out;
  EXPECT_TRUE(fs::exists(out / "kernels.json"));
  EXPECT_NE(Read(out / "stages.jsonl").find(R"("stage": "kernels", "status": "ok")"),
            std::string::npos)
      << Read(out / "stages.jsonl");

  const fs::path missing = FreshDir("kernels-missing");
  const testing::CommandResult absent = testing::RunShellCommand(
      "GPU_CHECK_BUILD_DIR='" + missing.string() + "' " +
      (SourceDir() / "deploy/gpu-check").string() + " --device cpu '" + out.string() + "' kernels");
  EXPECT_EQ(absent.exit_code, 1) << absent.out;
  EXPECT_NE(absent.out.find("fused_ops_test not built"), std::string::npos) << absent.out;
  fs::remove_all(out);
  fs::remove_all(missing);
}

// The probe stage runs the build's llm-train --probe on the stage's device (here the CPU: its CUDA
// path is the same call with --probe-device cuda) into OUT/probe.json, a document the estimator
// reads, and tabulates it; a probe document the estimator would refuse fails the stage.
TEST(GpuCheckCommandTest, TheProbeStageMeasuresItsDeviceIntoAProbeTheEstimatorReads) {
  const fs::path out = FreshDir("probe");
  const std::string command = "GPU_CHECK_BUILD_DIR='" + testing::BuildDir().string() + "' " +
                              (SourceDir() / "deploy/gpu-check").string() + " --device cpu '" +
                              out.string() + "' probe";
  const testing::CommandResult run = testing::RunShellCommand(command);
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const nlohmann::json probe = nlohmann::json::parse(Read(out / "probe.json"));
  EXPECT_EQ(probe["version"], estimate::kRateProbeVersion);
  EXPECT_EQ(probe["identity"]["device"], "cpu");
  const std::string table = Read(out / "probe.md");
  EXPECT_NE(table.find("| fp32 | 256 | 32 |"), std::string::npos) << table;
  EXPECT_NE(Read(out / "stages.jsonl").find(R"("stage": "probe", "status": "ok")"),
            std::string::npos)
      << Read(out / "stages.jsonl");

  std::ofstream(out / "broken.json") << R"({"version": 1, "matmul": []})";
  const testing::CommandResult refused = testing::RunShellCommand(
      "cd '" + SourceDir().string() + "' && python3 deploy/gpu_check.py probe-summary '" +
      (out / "broken.json").string() + "'");
  EXPECT_EQ(refused.exit_code, 1) << refused.out;
  EXPECT_NE(
      refused.out.find("not a version " + std::to_string(estimate::kRateProbeVersion) + " probe"),
      std::string::npos)
      << refused.out;
  fs::remove_all(out);
}

// A build directory for the kernels stage with a stand-in fused_ops_test: a shell script that
// prints `transcript` and writes `results` (GoogleTest's JSON, none when empty) where
// --gtest_output asks, and a CMakeCache.txt that records `cuda_kernels` as trainer/CMakeLists.txt
// does.
fs::path FakeKernelsBuild(const std::string& name, const std::string& cuda_kernels,
                          const std::string& transcript, const std::string& results) {
  const fs::path build = FreshDir(name);
  fs::create_directories(build / "trainer");
  std::ofstream(build / "CMakeCache.txt")
      << "LLMCTL_CUDA_KERNELS_BUILT:INTERNAL=" << cuda_kernels << "\n";
  std::ofstream(build / "results.json") << results;
  const fs::path test = build / "trainer/fused_ops_test";
  std::ofstream(test) << "#!/bin/sh\n"
                      << "printf '%s\\n' '" << transcript << "'\n"
                      << "for arg; do case $arg in --gtest_output=json:*) "
                      << (results.empty() ? ":"
                                          : "cp '" + (build / "results.json").string() +
                                                "' \"${arg#--gtest_output=json:}\"")
                      << " ;; esac; done\n";
  fs::permissions(test, fs::perms::owner_all);
  return build;
}

testing::CommandResult RunKernelsStage(const fs::path& build, const std::string& device,
                                       const fs::path& out) {
  return testing::RunShellCommand("GPU_CHECK_BUILD_DIR='" + build.string() + "' " +
                                  (SourceDir() / "deploy/gpu-check").string() + " --device " +
                                  device + " '" + out.string() + "' kernels");
}

// GoogleTest's JSON for one test that ran and passed.
constexpr const char* kOneTestPassed = R"({"tests": 1, "testsuites": [{"name": "Devices/FusedOpsOn",
  "testsuite": [{"name": "RopeMatchesTheAtenCompositionAndItsGradients/cuda", "status": "RUN",
  "result": "COMPLETED"}]}]})";

// A filter that matches no test (a renamed instance, a device no instance is made for) runs
// nothing and exits 0, as GoogleTest does; so does a binary that writes no results. Neither
// passes the stage.
TEST(GpuCheckCommandTest, TheKernelsStageFailsWhenNoTestRan) {
  const fs::path out = FreshDir("kernels-none");
  const fs::path empty = FakeKernelsBuild(
      "kernels-empty-filter", "yes", "[==========] 0 tests from 0 test suites ran. (0 ms total)",
      R"({"tests": 0, "failures": 0, "disabled": 0, "errors": 0, "testsuites": []})");
  const testing::CommandResult none = RunKernelsStage(empty, "cpu", out);
  EXPECT_EQ(none.exit_code, 1) << none.out;
  EXPECT_NE(none.out.find("kernels on cpu: 0 ran, 0 failed, 0 skipped"), std::string::npos)
      << none.out;
  EXPECT_NE(Read(out / "stages.jsonl").find(R"("stage": "kernels", "status": "failed")"),
            std::string::npos)
      << Read(out / "stages.jsonl");

  const fs::path silent = FakeKernelsBuild("kernels-no-results", "yes", "", "");
  const testing::CommandResult no_results = RunKernelsStage(silent, "cpu", out);
  EXPECT_EQ(no_results.exit_code, 1) << no_results.out;
  EXPECT_NE(
      no_results.out.find("kernels on cpu: no test results in " + (out / "kernels.json").string()),
      std::string::npos)
      << no_results.out;
  fs::remove_all(out);
  fs::remove_all(empty);
  fs::remove_all(silent);
}

// On a GPU the stage needs the CUDA kernels in the build: without them every fused op runs ATen on
// the GPU, and the CUDA instances would compare ATen with itself. The same passing tests pass the
// stage only from a build that has them.
TEST(GpuCheckCommandTest, TheKernelsStageRefusesABuildWithoutTheCudaKernelsOnAGpu) {
  const fs::path out = FreshDir("kernels-cuda");
  const fs::path without = FakeKernelsBuild("kernels-without", "no: LLMCTL_CUDA_KERNELS=OFF",
                                            "[  PASSED  ] 1 test.", kOneTestPassed);
  const testing::CommandResult refused = RunKernelsStage(without, "cuda", out);
  EXPECT_EQ(refused.exit_code, 1) << refused.out;
  EXPECT_NE(refused.out.find("has no CUDA kernels (no: LLMCTL_CUDA_KERNELS=OFF)"),
            std::string::npos)
      << refused.out;
  EXPECT_NE(refused.out.find("GPU_CHECK_CMAKE_ARGS='-DCMAKE_CUDA_COMPILER="), std::string::npos)
      << refused.out;
  EXPECT_FALSE(fs::exists(out / "kernels.txt")) << "the tests are not run";
  EXPECT_NE(Read(out / "stages.jsonl").find(R"("stage": "kernels", "status": "no CUDA kernels")"),
            std::string::npos)
      << Read(out / "stages.jsonl");

  const fs::path with =
      FakeKernelsBuild("kernels-with", "yes", "[  PASSED  ] 1 test.", kOneTestPassed);
  const testing::CommandResult passed = RunKernelsStage(with, "cuda", out);
  EXPECT_EQ(passed.exit_code, 0) << passed.out;
  EXPECT_NE(passed.out.find("kernels on cuda: 1 ran, 0 failed, 0 skipped"), std::string::npos)
      << passed.out;
  fs::remove_all(out);
  fs::remove_all(without);
  fs::remove_all(with);
}

// A stage whose budget is spent still bounds its next command: `timeout 0` would mean no limit, so
// the command gets a second and the stage ends "timed out", not after the command's own time.
TEST(GpuCheckCommandTest, AStageWithItsBudgetSpentStillStopsItsCommand) {
  const fs::path out = FreshDir("kernels-spent");
  const fs::path build = FakeKernelsBuild("kernels-slow", "yes", "", kOneTestPassed);
  std::ofstream(build / "trainer/fused_ops_test", std::ios::trunc) << "#!/bin/sh\nexec sleep 30\n";
  const testing::CommandResult run = testing::RunShellCommand(
      "GPU_CHECK_BUDGET_KERNELS=0 GPU_CHECK_BUILD_DIR='" + build.string() + "' " +
      (SourceDir() / "deploy/gpu-check").string() + " --device cpu '" + out.string() + "' kernels");
  EXPECT_EQ(run.exit_code, 1) << run.out;
  EXPECT_NE(Read(out / "stages.jsonl").find(R"("stage": "kernels", "status": "timed out")"),
            std::string::npos)
      << Read(out / "stages.jsonl");
  fs::remove_all(out);
  fs::remove_all(build);
}

}  // namespace
}  // namespace llmctl
