#include "trainer/testing/ranked_demo.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/rank_files.h"
#include "trainer/testing/trial_runner.h"
#include "trainer/train/checkpoints.h"

namespace llmctl::trainer::testing {
namespace {

std::vector<nlohmann::json> ReadEvents(const std::string& path) {
  std::vector<nlohmann::json> events;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) events.push_back(nlohmann::json::parse(line));
  return events;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// llm-train and its arguments for the demo in `dir` (RunRankedDemo's, before the strategy's).
std::vector<std::string> DemoArgs(const std::string& dir, const std::vector<std::string>& sets,
                                  int64_t steps) {
  const char* build_dir = std::getenv("LLMCTL_BUILD_DIR");
  std::vector<std::string> args = {
      std::string(build_dir != nullptr ? build_dir : "build") + "/trainer/llm-train",
      "--config",
      SourceDir() + "/experiments/demo.yaml",
      "--events",
      dir + "/" + kEventsFile,
      "--set",
      "train.max_steps=" + std::to_string(steps),
      "--set",
      "output_dir=" + dir + "/out",
      "--set",
      "snapshot_every=1"};
  bool checkpoint_set = false;
  for (const std::string& set : sets) {
    args.insert(args.end(), {"--set", set});
    checkpoint_set |= set.starts_with("checkpoint_every=");
  }
  if (!checkpoint_set)
    args.insert(args.end(), {"--set", "checkpoint_every=" + std::to_string(steps)});
  return args;
}

// Every rank's events and the checkpoint after the last step, into `run`.
void ReadBack(RankedDemoRun& run, int ranks, int64_t steps) {
  for (int rank = 0; rank < ranks; ++rank) {
    run.events.push_back(ReadEvents(RankEventsPath(run.dir + "/" + kEventsFile, rank)));
  }
  auto checkpoint = LoadCheckpoint(run.dir + "/out/checkpoints/step-" + std::to_string(steps));
  if (checkpoint.ok()) {
    for (auto& [tensor_name, tensor] : checkpoint->model) run.final_model[tensor_name] = tensor;
  }
}

constexpr auto kPollInterval = std::chrono::milliseconds(20);

}  // namespace

RankedDemoRun RunRankedDemo(const std::string& strategy, const std::string& name, int ranks,
                            const std::vector<std::string>& sets, int64_t steps,
                            const std::string& extra_flags) {
  RankedDemoRun run;
  run.dir = FreshTempDir(strategy + "-" + name);
  std::string command;
  for (const std::string& arg : DemoArgs(run.dir, sets, steps)) {
    command += (command.empty() ? "" : " ") + arg;
  }
  command += extra_flags;
  if (ranks > 1) {
    command += " --set strategy=" + strategy + " --set devices=" + std::to_string(ranks) +
               " --nproc " + std::to_string(ranks) + " --master-port 0";
  }
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return run;
  std::array<char, 4096> buffer;
  for (size_t n; (n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) {
    run.output.append(buffer.data(), n);
  }
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  ReadBack(run, ranks, steps);
  return run;
}

MultiNodeDemo::MultiNodeDemo(const std::string& strategy, const std::string& name, int nodes,
                             int devices, const std::vector<std::string>& sets, int64_t steps)
    : nodes_(nodes),
      devices_(devices),
      steps_(steps),
      dir_(FreshTempDir(strategy + "-" + name)),
      launchers_(nodes, -1),
      exit_codes_(nodes, -1) {
  args_ = DemoArgs(dir_, sets, steps);
  args_.insert(args_.end(),
               {"--set", "strategy=" + strategy, "--set", "devices=" + std::to_string(devices),
                "--set", "nodes=" + std::to_string(nodes)});
  Start(0, 0);
  const nlohmann::json first = AwaitRanksFile(0);
  if (first.is_null()) return;  // Finish reports node rank 0's end
  for (int node = 1; node < nodes; ++node) Start(node, first["master_port"].get<int>());
}

MultiNodeDemo::~MultiNodeDemo() {
  for (int node = 0; node < nodes_; ++node) {
    if (launchers_[node] <= 0) continue;
    ::kill(launchers_[node], SIGKILL);
    ::waitpid(launchers_[node], nullptr, 0);
  }
}

void MultiNodeDemo::Start(int node, int master_port) {
  const std::string prefix = dir_ + "/node" + std::to_string(node);
  std::vector<std::string> args = args_;
  args.insert(args.end(),
              {"--nproc", std::to_string(devices_), "--nnodes", std::to_string(nodes_),
               "--node-rank", std::to_string(node), "--master-addr", "127.0.0.1", "--master-port",
               std::to_string(master_port), "--ranks-file", prefix + ".ranks.json"});
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const std::string log = prefix + ".log";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::dup2(fd, 1) < 0 || ::dup2(fd, 2) < 0) ::_exit(127);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ASSERT_GT(pid, 0) << "fork";
  launchers_[node] = pid;
}

bool MultiNodeDemo::Ended(int node) {
  if (launchers_[node] <= 0) return true;
  int status = 0;
  if (::waitpid(launchers_[node], &status, WNOHANG) == 0) return false;
  launchers_[node] = -1;
  exit_codes_[node] = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return true;
}

nlohmann::json MultiNodeDemo::AwaitRanksFile(int node) {
  const std::string path = dir_ + "/node" + std::to_string(node) + ".ranks.json";
  for (;;) {
    // Written atomically (renamed into place), so it is whole once it is there. Looked at once
    // more after the launcher ended: it may have written the file just before.
    const bool ended = Ended(node);
    if (std::filesystem::exists(path)) return nlohmann::json::parse(ReadFile(path));
    if (ended) return nullptr;
    std::this_thread::sleep_for(kPollInterval);
  }
}

bool MultiNodeDemo::AwaitStep(int rank) {
  const std::string path = RankEventsPath(dir_ + "/" + kEventsFile, rank);
  for (;;) {
    const bool ended = Ended(rank / devices_);
    if (ReadFile(path).find("\"type\":\"step\"") != std::string::npos) return true;
    if (ended) return false;
    std::this_thread::sleep_for(kPollInterval);
  }
}

RankedDemoRun MultiNodeDemo::Finish() {
  RankedDemoRun run;
  run.dir = dir_;
  run.exit_code = 0;
  for (int node = 0; node < nodes_; ++node) {
    if (launchers_[node] > 0) {
      int status = 0;
      ::waitpid(launchers_[node], &status, 0);
      launchers_[node] = -1;
      exit_codes_[node] = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    run.node_exit_codes.push_back(exit_codes_[node]);
    if (run.exit_code == 0) run.exit_code = exit_codes_[node];
    run.output += "node rank " + std::to_string(node) + ":\n" +
                  ReadFile(dir_ + "/node" + std::to_string(node) + ".log");
  }
  ReadBack(run, nodes_ * devices_, steps_);
  return run;
}

std::vector<nlohmann::json> EventsOfType(const std::vector<nlohmann::json>& events,
                                         const std::string& type) {
  std::vector<nlohmann::json> found;
  for (const nlohmann::json& event : events) {
    if (event["type"] == type) found.push_back(event);
  }
  return found;
}

std::vector<double> StepLosses(const std::vector<nlohmann::json>& events) {
  std::vector<double> losses;
  for (const nlohmann::json& step : EventsOfType(events, "step")) losses.push_back(step["loss"]);
  return losses;
}

void ExpectTwoRanksTrainLikeOneProcess(const std::string& strategy, const std::string& name,
                                       const std::vector<std::string>& one,
                                       const std::vector<std::string>& two, int64_t steps,
                                       double stray_fraction) {
  const RankedDemoRun single = RunRankedDemo(strategy, name + "-1", 1, one, steps);
  const RankedDemoRun ranked = RunRankedDemo(strategy, name + "-2", 2, two, steps);
  ASSERT_EQ(single.exit_code, 0) << single.output;
  ASSERT_EQ(ranked.exit_code, 0) << ranked.output;
  const std::vector<double> expected = StepLosses(single.events[0]);
  ASSERT_EQ(expected.size(), static_cast<size_t>(steps));
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<double> losses = StepLosses(ranked.events[rank]);
    ASSERT_EQ(losses.size(), expected.size()) << "rank " << rank;
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_NEAR(losses[i], expected[i], 1e-5) << "rank " << rank << ", step " << i;
    }
    const nlohmann::json start = EventsOfType(ranked.events[rank], "start").at(0);
    EXPECT_EQ(start["rank"], rank);
    EXPECT_EQ(start["world_size"], 2);
  }
  EXPECT_GT(std::abs(expected.front() - expected.back()), 1e-3);
  ASSERT_FALSE(single.final_model.empty());
  ASSERT_EQ(ranked.final_model.size(), single.final_model.size());
  for (const auto& [tensor_name, tensor] : single.final_model) {
    ASSERT_TRUE(ranked.final_model.contains(tensor_name)) << tensor_name;
    const torch::Tensor& other = ranked.final_model.at(tensor_name);
    ASSERT_TRUE(other.sizes().equals(tensor.sizes())) << tensor_name;
    const torch::Tensor beyond = (other - tensor).abs() > 1e-5;
    EXPECT_LE(beyond.sum().item<int64_t>(),
              static_cast<int64_t>(stray_fraction * static_cast<double>(tensor.numel())))
        << tensor_name << ": largest difference " << (other - tensor).abs().max().item<double>();
  }
}

}  // namespace llmctl::trainer::testing
