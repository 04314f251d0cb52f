// llm-train as a user meets it: bad input gets one clear message naming the file and the problem,
// exit code 2, no crash, and no events file that looks complete.
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <torch/version.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/child_process.h"
#include "common/cpu_model.h"
#include "common/cuda_version.h"
#include "common/nvml/gpu_probe.h"
#include "common/status.h"
#include "common/text.h"
#include "common/trainer_versions.h"
#include "common/unique_fd.h"
#include "common/version.h"
#include "tests/support/shell_command.h"
#include "trainer/testing/trial_runner.h"

namespace llmctl::trainer {
namespace {

namespace fs = std::filesystem;

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// The llm-train under test.
std::string LlmTrainPath() { return (llmctl::testing::BuildDir() / "trainer/llm-train").string(); }

// `shell_setup`: sh commands run before llm-train in its shell (limits, environment).
CommandResult RunLlmTrain(const std::string& args, const std::string& shell_setup = "") {
  const llmctl::testing::CommandResult run =
      llmctl::testing::RunShellCommand(shell_setup + LlmTrainPath() + " " + args);
  return {.exit_code = run.exit_code, .output = run.out};
}

std::string Demo() { return testing::SourceDir() + "/experiments/demo.yaml"; }

void WriteFile(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// A model directory whose config.json is fine and whose model.safetensors is `weights`.
std::string ModelDirWith(const std::string& name, const std::string& weights) {
  const fs::path dir = testing::FreshTempDir(name);
  fs::copy_file(testing::SourceDir() + "/tests/fixtures/models/tiny-llama/config.json",
                dir / "config.json");
  fs::copy_file(testing::SourceDir() + "/tests/fixtures/models/tiny-llama/tokenizer.json",
                dir / "tokenizer.json");
  WriteFile(dir / "model.safetensors", weights);
  return dir.string();
}

TEST(LlmTrainTest, DemoRunsAndWritesACompleteEventLog) {
  const std::string events = testing::FreshTempDir("cli-ok") + "/events.jsonl";
  CommandResult run =
      RunLlmTrain("--config " + Demo() + " --set train.max_steps=2 --events " + events);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("[step0_mb0_phase1_after_fwd] Params: "), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("[done] outcome ok | train time"), std::string::npos) << run.output;
  std::ifstream in(events);
  std::string line, last;
  while (std::getline(in, line)) last = line;
  EXPECT_NE(last.find("\"type\":\"result\""), std::string::npos) << last;
}

// The agent reads --version --json; the text's first line is the summary reports name the trainer
// by.
TEST(LlmTrainTest, VersionJsonIsWhatTheAgentParses) {
  const CommandResult json = RunLlmTrain("--version --json");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  // stderr is in `output` too: LibTorch may warn there; the JSON is the last line.
  std::string line = json.output.substr(0, json.output.size() - 1);
  line = line.substr(line.rfind('\n') + 1);
  auto versions = ParseTrainerVersions(line);
  ASSERT_TRUE(versions.ok()) << versions.status().ToString();
  EXPECT_EQ(versions->llmctl, kVersion);
  EXPECT_EQ(versions->libtorch, TORCH_VERSION);
#ifdef LLMCTL_HAVE_CUDA
  EXPECT_TRUE(ParseCudaVersion(versions->libtorch_cuda).ok()) << versions->libtorch_cuda;
#else
  EXPECT_EQ(versions->libtorch_cuda, "");
#endif
  // The driver's versions come from NVML, so exactly when NVML answers here.
  EXPECT_EQ(versions->nvidia_driver.empty(), !nvml::OpenNvml().ok());
  EXPECT_EQ(versions->driver_cuda.empty(), versions->nvidia_driver.empty());

  // How LibTorch computes here: this process's LibTorch, started in the same environment, counts
  // the same threads and takes the same kernels.
  EXPECT_EQ(versions->cpu_threads, at::get_num_threads());
  EXPECT_EQ(versions->aten_cpu_capability, at::get_cpu_capability());

  const CommandResult text = RunLlmTrain("--version");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find(versions->Summary() + "\n"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("CPU: " + versions->CpuKernels() + "\n"), std::string::npos)
      << text.output;
}

// What the environment changes of how LibTorch computes is reported, so that a rate probe measured
// otherwise is measured again: one thread asked for, ATen's AVX2 kernels and oneDNN capped at
// AVX2 (the variables as MKL, ATen and oneDNN read them).
TEST(LlmTrainTest, VersionJsonSaysTheThreadsAndKernelsTheEnvironmentSets) {
  const CommandResult json = RunLlmTrain(
      "--version --json",
      "env OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=avx2 ");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  std::string line = json.output.substr(0, json.output.size() - 1);
  line = line.substr(line.rfind('\n') + 1);
  auto versions = ParseTrainerVersions(line);
  ASSERT_TRUE(versions.ok()) << versions.status().ToString();
  EXPECT_EQ(versions->cpu_threads, 1);
  EXPECT_EQ(versions->onednn_isa_cap, "AVX2");
  // ATen takes AVX2 when asked on a CPU that has it; one without keeps what it has.
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_EQ(versions->aten_cpu_capability, "AVX2");
  }
  EXPECT_EQ(versions->CpuKernels(),
            "1 thread, ATen " + versions->aten_cpu_capability + ", oneDNN at most AVX2");
}

// The versions llm-train prints under `shell_setup` (a command prefix setting its environment).
StatusOr<TrainerVersions> VersionsUnder(const std::string& shell_setup) {
  const CommandResult json = RunLlmTrain("--version --json 2>/dev/null", shell_setup);
  if (json.exit_code != 0) return InternalError("exit " + std::to_string(json.exit_code));
  return ParseTrainerVersions(Trim(json.output));
}

// llmctl's count of LibTorch's threads (common/cpu_model.h, which links no LibTorch: the BLIP-2
// estimate's oneDNN scratchpads scale with it) is the count llm-train's LibTorch starts with, in
// each environment that sets it: MKL_NUM_THREADS before OMP_NUM_THREADS, a count above the cores
// cut to them unless MKL_DYNAMIC is false, and the cores a process may run on without either.
TEST(LlmTrainTest, LlmctlCountsTheThreadsLibTorchStartsWith) {
  const int many = 8 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  struct Environment {
    std::vector<std::pair<const char*, std::string>> set;
    bool first_cpu_only = false;
  };
  const std::vector<Environment> environments = {
      {{}},
      {{{"OMP_NUM_THREADS", "1"}}},
      {{{"OMP_NUM_THREADS", std::to_string(many)}}},
      {{{"MKL_NUM_THREADS", "1"}, {"OMP_NUM_THREADS", "2"}}},
      {{{"OMP_NUM_THREADS", std::to_string(many)}, {"MKL_DYNAMIC", "FALSE"}}},
      {{}, true},
      {{{"OMP_NUM_THREADS", std::to_string(many)}}, true},
  };
  const char* const kVariables[] = {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_DYNAMIC"};
  std::vector<std::optional<std::string>> saved;
  for (const char* name : kVariables) {
    const char* value = std::getenv(name);
    saved.push_back(value != nullptr ? std::optional<std::string>(value) : std::nullopt);
  }
  cpu_set_t original;
  ASSERT_EQ(::sched_getaffinity(0, sizeof original, &original), 0);
  int first_cpu = 0;
  while (first_cpu < CPU_SETSIZE && !CPU_ISSET(first_cpu, &original)) ++first_cpu;
  for (const Environment& environment : environments) {
    std::string setup = "env";
    for (const char* name : kVariables) {
      ::unsetenv(name);
      setup += std::string(" -u ") + name;
    }
    for (const auto& [name, value] : environment.set) {
      ::setenv(name, value.c_str(), 1);
      setup += std::string(" ") + name + "=" + value;
    }
    SCOPED_TRACE(setup + (environment.first_cpu_only ? " on one CPU" : ""));
    if (environment.first_cpu_only) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(first_cpu, &one);
      ASSERT_EQ(::sched_setaffinity(0, sizeof one, &one), 0);
      setup = "taskset -c " + std::to_string(first_cpu) + " " + setup;
    }
    const int counted = LibTorchDefaultThreads();
    ASSERT_EQ(::sched_setaffinity(0, sizeof original, &original), 0);
    const StatusOr<TrainerVersions> versions = VersionsUnder(setup + " ");
    ASSERT_TRUE(versions.ok()) << versions.status().ToString();
    EXPECT_EQ(counted, versions->cpu_threads);
  }
  for (size_t i = 0; i < saved.size(); ++i) {
    if (saved[i].has_value()) {
      ::setenv(kVariables[i], saved[i]->c_str(), 1);
    } else {
      ::unsetenv(kVariables[i]);
    }
  }
}

TEST(LlmTrainTest, UnknownKeySuggestsTheNearestOne) {
  CommandResult run = RunLlmTrain("--config " + Demo() + " --set train.micro_bach_size=2");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("train.micro_batch_size"), std::string::npos) << run.output;
}

// A --set is quoted at most 200 bytes (and its value again by the key's own error): a
// 100,000-byte value made a 200 KB error line.
TEST(LlmTrainTest, ALongSetIsQuotedShort) {
  const std::string value(100000, 'x');
  for (const std::string& set : {"train.micro_batch_size=" + value, "train.lr" + value}) {
    CommandResult run = RunLlmTrain("--config " + Demo() + " --set " + set);
    EXPECT_EQ(run.exit_code, 2) << run.output.substr(0, 400);
    EXPECT_LT(run.output.size(), 1000u) << run.output.substr(0, 400);
  }
}

TEST(LlmTrainTest, ImpossibleCombinationIsRejected) {
  CommandResult run = RunLlmTrain(
      "--config " + Demo() + " --set train.micro_batch_size=3 --set train.global_batch_size=8");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("global_batch_size"), std::string::npos) << run.output;
}

// A multi-node trial runs only as its hosts' shares, each launcher told its place: --nproc alone is
// refused before anything runs, rather than run as one host's ranks (ddp_test runs such trials).
TEST(LlmTrainTest, MultiNodeTrialsNeedEachNodesPlace) {
  CommandResult run =
      RunLlmTrain("--config " + Demo() + " --set strategy=ddp --set devices=2 --set nodes=2" +
                  " --set train.global_batch_size=16 --nproc 2");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("the trial has nodes: 2 but --nnodes is 1; pass --nnodes 2"),
            std::string::npos)
      << run.output;
}

// The launcher's stderr a pipe nobody reads (`llm-train ... 2>&1 | head -1` once head has gone):
// its ranks' lines are lost, and its exit code is still theirs (2: the data file is missing), where
// its own last line ended it by SIGPIPE.
TEST(LlmTrainTest, ALauncherWhoseStderrNobodyReadsEndsAsItsRanks) {
  const std::string llm_train = LlmTrainPath();
  const std::string demo = Demo();
  ChildSpec spec;
  spec.argv = {llm_train,
               "--config",
               demo,
               "--set",
               "strategy=ddp",
               "--set",
               "devices=2",
               "--set",
               "data.path=/nonexistent/train.jsonl",
               "--nproc",
               "2"};
  int unread[2];
  ASSERT_EQ(::pipe(unread), 0);
  ::close(unread[0]);
  const UniqueFd unread_write(unread[1]);
  const UniqueFd null(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  spec.stdout_fd = null.get();
  spec.stderr_fd = unread_write.get();
  spec.default_signals = {SIGPIPE};
  // One that cannot be executed exits 127 (its reason lost in the pipe), as from a shell.
  spec.exec_failure = ExecFailureReport::kStderrAndExitCode;
  const StatusOr<pid_t> started = StartChild(spec);
  const pid_t pid = started.ok() ? *started : -1;
  ASSERT_GE(pid, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  if (WIFEXITED(status)) {
    EXPECT_EQ(WEXITSTATUS(status), 2);
  }
}

TEST(LlmTrainTest, TruncatedSafetensorsHeaderNamesTheFile) {
  const std::string dir = ModelDirWith("truncated", std::string("\x10\x00\x00", 3));
  const std::string events = dir + "/events.jsonl";
  CommandResult run =
      RunLlmTrain("--config " + Demo() + " --set model=" + dir +
                  " --set init=pretrained --set tokenizer=" + dir + " --events " + events);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find(dir + "/model.safetensors"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("Segmentation"), std::string::npos);
  // The log records the failure, and nothing in it claims the trial ran.
  std::ifstream in(events);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.find("\"type\":\"start\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"outcome\":\"failed\""), std::string::npos) << text;
}

TEST(LlmTrainTest, LyingSafetensorsHeaderIsDataLossNotACrash) {
  // Header length 1 TB: larger than the file.
  const std::string dir =
      ModelDirWith("lying", std::string("\x00\x00\x00\x00\x00\x01\x00\x00{}", 10));
  CommandResult run = RunLlmTrain("--config " + Demo() + " --set model=" + dir +
                                  " --set init=pretrained --set tokenizer=" + dir);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("model.safetensors"), std::string::npos) << run.output;
}

TEST(LlmTrainTest, ConfigWithoutARequiredFieldNamesTheField) {
  const fs::path dir = testing::FreshTempDir("no-hidden");
  WriteFile(dir / "config.json",
            R"({"vocab_size": 2048, "intermediate_size": 64, "num_hidden_layers": 1,
                                     "num_attention_heads": 2})");
  CommandResult run = RunLlmTrain("--config " + Demo() + " --set model=" + dir.string());
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("hidden_size"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("config.json"), std::string::npos) << run.output;
}

TEST(LlmTrainTest, EmptyDatasetIsAnError) {
  const fs::path dir = testing::FreshTempDir("empty-data");
  WriteFile(dir / "empty.jsonl", "");
  CommandResult run =
      RunLlmTrain("--config " + Demo() + " --set data.path=" + (dir / "empty.jsonl").string());
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("empty.jsonl"), std::string::npos) << run.output;
}

// A token file that cannot be written (here RLIMIT_FSIZE, as a full disk) is the machine's failure,
// not bad input: exit 1 with the write's error, where bad input exits 2.
TEST(LlmTrainTest, PreparingOntoAFullDiskFailsAsNoFaultOfTheInput) {
  const fs::path cache = testing::FreshTempDir("prepare-fsize");
  CommandResult run =
      RunLlmTrain("--config " + Demo() + " --prepare",
                  "ulimit -f 1; trap '' XFSZ; LLMCTL_CACHE_DIR=" + cache.string() + " ");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("llm-train: cannot write " + cache.string()), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("File too large"), std::string::npos) << run.output;
}

// The same for a run, whose token file is prepared before training: exit 1, the [done] line naming
// the write that failed, where a bad dataset exits 2.
TEST(LlmTrainTest, ARunOntoAFullDiskFailsAsNoFaultOfTheInput) {
  const fs::path cache = testing::FreshTempDir("run-fsize");
  CommandResult run =
      RunLlmTrain("--config " + Demo() + " --set train.max_steps=1",
                  "ulimit -f 1; trap '' XFSZ; LLMCTL_CACHE_DIR=" + cache.string() + " ");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("outcome failed"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("cannot write " + cache.string()), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("File too large"), std::string::npos) << run.output;
}

// An events file that cannot be opened (here in a directory that is not there) is the machine's
// failure like a full disk's, not bad input: exit 1 with the open's error, where bad input exits 2.
TEST(LlmTrainTest, AnEventsFileThatCannotBeOpenedFailsAsNoFaultOfTheInput) {
  const std::string events = testing::FreshTempDir("events-unopened") + "/missing/events.jsonl";
  CommandResult run =
      RunLlmTrain("--config " + Demo() + " --set train.max_steps=1 --events " + events);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("cannot open events file " + events + ": No such file or directory"),
            std::string::npos)
      << run.output;
}

// nlohmann's message for a bad line quotes the line ("last read: '...'"): llm-train's error line
// and its [done] line show it without its C1 and bidirectional controls.
TEST(LlmTrainTest, AnErrorQuotingADatasetsBytesIsPrintedWithoutTheirControls) {
  const fs::path dir = testing::FreshTempDir("hostile-data");
  WriteFile(dir / "bad.jsonl", "{\"text\": \"x\u202e\u009b[2Jq\x01\"}\n");
  CommandResult run =
      RunLlmTrain("--config " + Demo() + " --set data.path=" + (dir / "bad.jsonl").string());
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("llm-train: data.path: "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("last read: '\"x  [2Jq<U+0001>'"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("\u202e"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("\u009b"), std::string::npos) << run.output;
}

// The agent runs trials on copies of the user's files in its cache; --input-name makes messages,
// on stderr and in the result event, name the path the user wrote instead.
TEST(LlmTrainTest, InputNamesReplaceCachePathsInMessages) {
  const fs::path cache = fs::path(testing::FreshTempDir("agent-cache")) / "trees" / "b498df";
  fs::create_directories(cache);
  WriteFile(cache / "bad_lines.jsonl", "{\"instruction\": \"a\", \"output\": \"b\"}\n{oops\n");
  const fs::path events = cache.parent_path() / "events.jsonl";
  CommandResult run = RunLlmTrain("--config " + Demo() +
                                  " --set data.path=" + (cache / "bad_lines.jsonl").string() +
                                  " --input-name " + (cache / "bad_lines.jsonl").string() +
                                  "=data/bad_lines.jsonl --events " + events.string());
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("data/bad_lines.jsonl:2: invalid JSON"), std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find(cache.string()), std::string::npos) << run.output;
  std::ifstream in(events);
  std::string line, result;
  while (std::getline(in, line)) {
    if (line.find("\"type\":\"result\"") != std::string::npos) result = line;
  }
  EXPECT_NE(result.find("data/bad_lines.jsonl:2: invalid JSON"), std::string::npos) << result;
  EXPECT_EQ(result.find(cache.string()), std::string::npos) << result;
}

// A file's own name may hold '=', and so may the path the user wrote: the copy's path still ends
// where the agent's --input-name argument says it does.
TEST(LlmTrainTest, InputNamesHoldingEqualsSignsReplaceCachePathsInMessages) {
  const fs::path cache = fs::path(testing::FreshTempDir("agent-cache-eq")) / "trees" / "c0ffee";
  fs::create_directories(cache);
  WriteFile(cache / "bad=lines.jsonl", "{\"instruction\": \"a\", \"output\": \"b\"}\n{oops\n");
  const std::string copy = (cache / "bad=lines.jsonl").string();
  CommandResult run =
      RunLlmTrain("--config " + Demo() + " --set data.path=" + copy + " --input-name '" +
                  InputNameArgument(copy, "data/a=b/bad=lines.jsonl") + "'");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("data/a=b/bad=lines.jsonl:2: invalid JSON"), std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find(cache.string()), std::string::npos) << run.output;

  // A bad form is refused, naming the flag and what it was given.
  const std::string unnamed = (cache / "x.jsonl").string() + "=";
  run = RunLlmTrain("--config " + Demo() + " --set data.path=" + copy + " --input-name " + unnamed);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--input-name expects PATH=NAME"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("got '" + unnamed + "'"), std::string::npos) << run.output;
}

// A device, FIFO or directory is refused at once instead of read until killed.
TEST(LlmTrainTest, NonRegularDataFilesAreRefusedAtOnce) {
  for (const char* path : {"/dev/zero", "/dev/urandom", "/tmp"}) {
    CommandResult run = RunLlmTrain("--config " + Demo() + " --set data.path=" + path);
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_NE(run.output.find("not a regular file"), std::string::npos) << run.output;
  }
}

TEST(LlmTrainTest, UnreadableTokenizerIsAnError) {
  const fs::path dir = testing::FreshTempDir("bad-tokenizer");
  WriteFile(dir / "tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": ");
  CommandResult run =
      RunLlmTrain("--config " + Demo() + " --set tokenizer=" + (dir / "tokenizer.json").string());
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("tokenizer.json"), std::string::npos) << run.output;
}

TEST(LlmTrainTest, TrialFileWithSeveralTrialsNeedsTrialFlag) {
  const fs::path dir = testing::FreshTempDir("two-trials");
  std::ifstream demo(Demo());
  std::string text((std::istreambuf_iterator<char>(demo)), std::istreambuf_iterator<char>());
  const std::string base = testing::SourceDir() + "/experiments/";
  // Absolute paths: the copy lives elsewhere.
  for (const std::string rel : {"tokenizers/demo/tokenizer.json", "data/alpaca-demo.jsonl"}) {
    text.replace(text.find(rel), rel.size(), base + rel);
  }
  text += "trials:\n  - name: a\n  - name: b\n    set: {precision: bf16-true}\n    expect: ok\n";
  WriteFile(dir / "two.yaml", text);
  CommandResult run = RunLlmTrain("--config " + (dir / "two.yaml").string());
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--trial"), std::string::npos) << run.output;
  CommandResult chosen =
      RunLlmTrain("--config " + (dir / "two.yaml").string() + " --trial b --set train.max_steps=1");
  EXPECT_EQ(chosen.exit_code, 0) << chosen.output;
  EXPECT_NE(chosen.output.find("bf16-true"), std::string::npos) << chosen.output;
  CommandResult listed = RunLlmTrain("--config " + (dir / "two.yaml").string() + " --list");
  EXPECT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_EQ(listed.output, "a\nb\tok\n");
}

TEST(LlmTrainTest, OutOfMemoryExitsWithCode3) {
  CommandResult run =
      RunLlmTrain("--config " + Demo() + " --set device_memory=12MiB --set train.max_steps=2");
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_NE(run.output.find("[oom] Params:"), std::string::npos) << run.output;
}

// Every event's memory figures (its type, phase, step, outcome and byte counts), in order.
std::vector<nlohmann::json> MemoryFigures(const fs::path& events) {
  std::vector<nlohmann::json> figures;
  std::ifstream in(events);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json event = nlohmann::json::parse(line);
    nlohmann::json kept;
    for (const auto& [key, value] : event.items()) {
      if (key == "type" || key == "phase" || key == "step" || key == "outcome" ||
          key.find("bytes") != std::string::npos) {
        kept[key] = value;
      }
    }
    if (kept["type"] != "log") figures.push_back(kept);
  }
  return figures;
}

// --runs: the estimate tests run their sweeps this way, so each run must report what a process of
// its own does, to the byte, whatever ran before it: QLoRA and 8-bit AdamW build process-wide
// tables on first use, and an out-of-memory run stops mid-step.
TEST(LlmTrainTest, RunsInOneProcessReportWhatProcessesOfTheirOwnDo) {
  const fs::path dir = testing::FreshTempDir("cli-runs");
  const std::string common =
      " --set train.max_steps=2 --set snapshot_every=1 --set data.max_seq_length=64"
      " --set data.mask_prompt=false --set train.micro_batch_size=2"
      " --set train.global_batch_size=4";
  const std::vector<std::vector<std::string>> runs = {{"peft.method=qlora"},
                                                      {"device_memory=12MiB"},
                                                      {"optimizer=adamw_8bit"},
                                                      {"kernels=aten"},
                                                      {"peft.method=qlora"}};
  {
    std::ofstream lines(dir / "runs.jsonl");
    for (size_t i = 0; i < runs.size(); ++i) {
      const std::string events = (dir / ("series-" + std::to_string(i) + ".jsonl")).string();
      lines << nlohmann::json{{"events", events}, {"set", runs[i]}}.dump() << "\n";
    }
  }
  const CommandResult series =
      RunLlmTrain("--config " + Demo() + common + " --runs " + (dir / "runs.jsonl").string());
  EXPECT_EQ(series.exit_code, 3) << "the first run that did not end ok ran out of memory\n"
                                 << series.output;
  for (size_t i = 0; i < runs.size(); ++i) {
    SCOPED_TRACE(runs[i].front());
    const fs::path alone = dir / ("alone-" + std::to_string(i) + ".jsonl");
    const CommandResult run = RunLlmTrain("--config " + Demo() + common + " --set " +
                                          runs[i].front() + " --events " + alone.string());
    EXPECT_EQ(run.exit_code, i == 1 ? 3 : 0) << run.output;
    const std::vector<nlohmann::json> expected = MemoryFigures(alone);
    const std::vector<nlohmann::json> got =
        MemoryFigures(dir / ("series-" + std::to_string(i) + ".jsonl"));
    ASSERT_GT(expected.size(), 3u);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t e = 0; e < got.size(); ++e) EXPECT_EQ(got[e], expected[e]) << "event " << e;
  }
}

// A bad line is refused with its file and line before anything runs.
TEST(LlmTrainTest, RunsFileIsCheckedWholeFirst) {
  const fs::path dir = testing::FreshTempDir("cli-runs-bad");
  const std::string first = (dir / "first.jsonl").string();
  WriteFile(dir / "runs.jsonl", nlohmann::json{{"events", first}}.dump() + "\n\n" +
                                    nlohmann::json{{"events", "x"}, {"set", {"nope=1"}}}.dump() +
                                    "\n");
  CommandResult run =
      RunLlmTrain("--config " + Demo() + " --runs " + (dir / "runs.jsonl").string());
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("runs.jsonl:3: --set nope=1"), std::string::npos) << run.output;
  EXPECT_FALSE(fs::exists(first));
  WriteFile(dir / "ranks.jsonl",
            nlohmann::json{{"events", first}, {"set", {"strategy=ddp", "devices=2"}}}.dump());
  run = RunLlmTrain("--config " + Demo() + " --runs " + (dir / "ranks.jsonl").string());
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("ranks.jsonl:1: a data-parallel trial"), std::string::npos)
      << run.output;
}

}  // namespace
}  // namespace llmctl::trainer
