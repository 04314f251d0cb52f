#include "trainer/testing/ranked_demo.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "trainer/testing/trial_runner.h"
#include "trainer/train/checkpoints.h"
#include "trainer/train/ddp.h"

namespace llmctl::trainer::testing {
namespace {

std::vector<nlohmann::json> ReadEvents(const std::string& path) {
  std::vector<nlohmann::json> events;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) events.push_back(nlohmann::json::parse(line));
  return events;
}

}  // namespace

RankedDemoRun RunRankedDemo(const std::string& strategy, const std::string& name, int ranks,
                            const std::vector<std::string>& sets, int64_t steps,
                            const std::string& extra_flags) {
  RankedDemoRun run;
  run.dir = FreshTempDir(strategy + "-" + name);
  const char* build_dir = std::getenv("LLMCTL_BUILD_DIR");
  std::string command = std::string(build_dir != nullptr ? build_dir : "build") +
                        "/trainer/llm-train --config " + SourceDir() +
                        "/experiments/demo.yaml --events " + run.dir + "/events.jsonl" +
                        " --set train.max_steps=" + std::to_string(steps) +
                        " --set output_dir=" + run.dir + "/out --set snapshot_every=1" +
                        extra_flags;
  bool checkpoint_set = false;
  for (const std::string& set : sets) {
    command += " --set " + set;
    checkpoint_set |= set.starts_with("checkpoint_every=");
  }
  if (!checkpoint_set) command += " --set checkpoint_every=" + std::to_string(steps);
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
  for (int rank = 0; rank < ranks; ++rank) {
    run.events.push_back(ReadEvents(RankEventsPath(run.dir + "/events.jsonl", rank)));
  }
  auto checkpoint = LoadCheckpoint(run.dir + "/out/checkpoints/step-" + std::to_string(steps));
  if (checkpoint.ok()) {
    for (auto& [tensor_name, tensor] : checkpoint->model) run.final_model[tensor_name] = tensor;
  }
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
                                       const std::vector<std::string>& two, int64_t steps) {
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
    EXPECT_LE((other - tensor).abs().max().item<double>(), 1e-5) << tensor_name;
  }
}

}  // namespace llmctl::trainer::testing
