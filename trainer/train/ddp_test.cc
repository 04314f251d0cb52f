// strategy: ddp as a user runs it: `llm-train --nproc 2` on this CPU (Gloo), checked against one
// process with twice the micro-batch, and its per-rank memory against one device's.
#include "trainer/train/ddp.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trainer/testing/trial_runner.h"
#include "trainer/train/checkpoints.h"

namespace llmctl::trainer {
namespace {

struct DemoRun {
  int exit_code = -1;
  std::string output;
  std::vector<std::vector<nlohmann::json>> events;   // per rank
  std::map<std::string, torch::Tensor> final_model;  // rank 0's checkpoint after the last step
};

// A port nothing listened on a moment ago.
uint16_t FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

std::vector<nlohmann::json> ReadEvents(const std::string& path) {
  std::vector<nlohmann::json> events;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) events.push_back(nlohmann::json::parse(line));
  return events;
}

constexpr int64_t kSteps = 3;

// experiments/demo.yaml for kSteps steps with `sets`, as `ranks` processes (--nproc) or one.
DemoRun RunDemo(const std::string& name, int ranks, const std::vector<std::string>& sets) {
  const std::string dir = testing::FreshTempDir("ddp-" + name);
  std::string command =
      std::string(std::getenv("LLMCTL_BUILD_DIR") ? std::getenv("LLMCTL_BUILD_DIR") : "build") +
      "/trainer/llm-train --config " + testing::SourceDir() + "/experiments/demo.yaml --events " +
      dir + "/events.jsonl" + " --set train.max_steps=" + std::to_string(kSteps) +
      " --set checkpoint_every=" + std::to_string(kSteps) + " --set output_dir=" + dir +
      "/out --set snapshot_every=1";
  for (const std::string& set : sets) command += " --set " + set;
  if (ranks > 1) {
    command += " --set strategy=ddp --set devices=" + std::to_string(ranks) + " --nproc " +
               std::to_string(ranks) + " --master-port " + std::to_string(FreePort());
  }
  DemoRun run;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return run;
  std::array<char, 4096> buffer;
  for (size_t n; (n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) {
    run.output.append(buffer.data(), n);
  }
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  for (int rank = 0; rank < ranks; ++rank) {
    run.events.push_back(ReadEvents(RankEventsPath(dir + "/events.jsonl", rank)));
  }
  auto checkpoint = LoadCheckpoint(dir + "/out/checkpoints/step-" + std::to_string(kSteps));
  if (checkpoint.ok()) {
    for (auto& [tensor_name, tensor] : checkpoint->model) run.final_model[tensor_name] = tensor;
  }
  return run;
}

std::vector<nlohmann::json> OfType(const std::vector<nlohmann::json>& events,
                                   const std::string& type) {
  std::vector<nlohmann::json> found;
  for (const nlohmann::json& event : events) {
    if (event["type"] == type) found.push_back(event);
  }
  return found;
}

std::vector<double> Losses(const std::vector<nlohmann::json>& events) {
  std::vector<double> losses;
  for (const nlohmann::json& step : OfType(events, "step")) losses.push_back(step["loss"]);
  return losses;
}

// 2 ranks at micro-batch m against 1 process at 2m: the same examples in each step (the sampler
// interleaves them), so the same losses and, with the gradients averaged, the same weights.
void ExpectSameTraining(const std::string& name, const std::vector<std::string>& one,
                        const std::vector<std::string>& two) {
  const DemoRun single = RunDemo(name + "-1", 1, one);
  const DemoRun ddp = RunDemo(name + "-2", 2, two);
  ASSERT_EQ(single.exit_code, 0) << single.output;
  ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
  const std::vector<double> expected = Losses(single.events[0]);
  ASSERT_EQ(expected.size(), static_cast<size_t>(kSteps));
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<double> losses = Losses(ddp.events[rank]);
    ASSERT_EQ(losses.size(), expected.size()) << "rank " << rank;
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_NEAR(losses[i], expected[i], 1e-5) << "rank " << rank << ", step " << i;
    }
    const nlohmann::json start = OfType(ddp.events[rank], "start").at(0);
    EXPECT_EQ(start["rank"], rank);
    EXPECT_EQ(start["world_size"], 2);
  }
  // The loss must move, or equal losses would say nothing about the updates.
  EXPECT_GT(std::abs(expected.front() - expected.back()), 1e-3);
  ASSERT_FALSE(single.final_model.empty());
  ASSERT_EQ(ddp.final_model.size(), single.final_model.size());
  for (const auto& [tensor_name, tensor] : single.final_model) {
    const torch::Tensor& other = ddp.final_model.at(tensor_name);
    EXPECT_LE((other - tensor).abs().max().item<double>(), 1e-5) << tensor_name;
  }
}

TEST(DdpTest, TwoRanksTrainLikeOneProcessWithTwiceTheMicroBatch) {
  ExpectSameTraining("adamw", {"train.micro_batch_size=4", "train.global_batch_size=4"},
                     {"train.micro_batch_size=2", "train.global_batch_size=4"});
}

// With accumulation (only the last micro-batch communicates), and with SGD, whose update scales
// with the gradient: ranks that summed instead of averaging would take steps twice as long. Small
// buckets put the model's gradients in several, started from the hooks in turn.
TEST(DdpTest, AccumulatedStepsAverageTheGradientsAcrossRanks) {
  const std::vector<std::string> sgd = {"optimizer=sgd", "train.lr=0.5", "train.warmup_steps=0"};
  std::vector<std::string> one = sgd, two = sgd;
  one.insert(one.end(), {"train.micro_batch_size=4", "train.global_batch_size=8"});
  two.insert(two.end(),
             {"train.micro_batch_size=2", "train.global_batch_size=8", "ddp.bucket_size=64KiB"});
  ExpectSameTraining("sgd-accumulation", one, two);
}

// Every rank's memory is one device's at the same micro-batch plus the comm buffers: the buckets,
// which hold one copy of the trainable parameters' gradients, and the slots the ranks sum their
// token counts and losses in. Examples cut to one length give every micro-batch
// the same shape, so the activations are the same bytes on every rank.
TEST(DdpTest, PerRankMemoryIsOneDevicesPlusTheBuckets) {
  const std::vector<std::string> shape = {"data.max_seq_length=24", "data.mask_prompt=false",
                                          "train.micro_batch_size=2"};
  std::vector<std::string> one = shape, two = shape;
  one.push_back("train.global_batch_size=2");
  two.insert(two.end(), {"train.global_batch_size=4", "ddp.bucket_size=64KiB"});
  const DemoRun single = RunDemo("memory-1", 1, one);
  const DemoRun ddp = RunDemo("memory-2", 2, two);
  ASSERT_EQ(single.exit_code, 0) << single.output;
  ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
  const std::vector<nlohmann::json> expected = OfType(single.events[0], "snapshot");
  ASSERT_EQ(expected.size(), static_cast<size_t>(kSteps * 4));
  const uint64_t grads = expected.back()["grads_bytes"];
  ASSERT_GT(grads, 0u);
  const uint64_t comm = grads + DataParallel::kMaxSummedValues * sizeof(double);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(OfType(ddp.events[rank], "start").at(0)["comm_bytes"], comm);
    const std::vector<nlohmann::json> snapshots = OfType(ddp.events[rank], "snapshot");
    ASSERT_EQ(snapshots.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      const nlohmann::json& s = snapshots[i];
      const nlohmann::json& e = expected[i];
      const std::string where = "rank " + std::to_string(rank) + ", step " + s["step"].dump() +
                                " " + s["phase"].get<std::string>();
      EXPECT_EQ(s["comm_bytes"], comm) << where;
      EXPECT_EQ(e["comm_bytes"], 0) << where;
      for (const char* same :
           {"params_bytes", "grads_bytes", "optim_device_bytes", "other_bytes"}) {
        EXPECT_EQ(s[same], e[same]) << where << " " << same;
      }
      EXPECT_EQ(s["allocated_bytes"].get<uint64_t>(), e["allocated_bytes"].get<uint64_t>() + comm)
          << where;
    }
  }
}

TEST(DdpTest, ARankWithoutItsPeersSaysHowToStartThem) {
  const DemoRun run =
      RunDemo("no-ranks", 1, {"strategy=ddp", "devices=2", "train.global_batch_size=8"});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--nproc 2"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace llmctl::trainer
