// strategy: ddp as a user runs it: `llm-train --nproc 2` on this CPU (Gloo), checked against one
// process with twice the micro-batch, and its per-rank memory against one device's; and a
// multi-node trial as its hosts run it (`--nnodes 2 --node-rank K`, two launchers on loopback),
// checked against one node with as many ranks.
#include <gtest/gtest.h>
#include <signal.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/one_thread_per_process.h"
#include "trainer/parallel/rank_group.h"
#include "trainer/testing/ranked_demo.h"
#include "trainer/testing/trial_runner.h"
#include "trainer/train/checkpoints.h"

namespace llmctl::trainer {
namespace {

using DemoRun = testing::RankedDemoRun;
using testing::EventsOfType;
using testing::StepLosses;

constexpr int64_t kSteps = 3;

// experiments/demo.yaml for `steps` steps with `sets`, as `ranks` ddp ranks (--nproc) or one
// process; a checkpoint after the last step.
DemoRun RunDemo(const std::string& name, int ranks, const std::vector<std::string>& sets,
                int64_t steps = kSteps, const std::string& extra_flags = "") {
  return testing::RunRankedDemo("ddp", name, ranks, sets, steps, extra_flags);
}

// 2 ranks at micro-batch m against 1 process at 2m (testing/ranked_demo.h says what must agree).
void ExpectSameTraining(const std::string& name, const std::vector<std::string>& one,
                        const std::vector<std::string>& two) {
  testing::ExpectTwoRanksTrainLikeOneProcess("ddp", name, one, two, kSteps);
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
  const std::vector<nlohmann::json> expected = EventsOfType(single.events[0], "snapshot");
  ASSERT_EQ(expected.size(), static_cast<size_t>(kSteps * 4));
  const uint64_t grads = expected.back()["grads_bytes"];
  ASSERT_GT(grads, 0u);
  const uint64_t comm = grads + RankGroup::kMaxSummedValues * sizeof(double);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(EventsOfType(ddp.events[rank], "start").at(0)["comm_bytes"], comm);
    const std::vector<nlohmann::json> snapshots = EventsOfType(ddp.events[rank], "snapshot");
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

// `nodes` launchers of `devices` ranks each (testing::MultiNodeDemo) against one launcher of
// nodes x devices ranks: the same world size, so the same examples on every global rank and the
// same gradient average; exactly the same losses on every rank and the same final weights.
void ExpectNodesTrainLikeOneNode(const std::string& name, int nodes, int devices) {
  const llmctl::testing::OneThreadPerProcess one_thread;
  const int world_size = nodes * devices;
  const std::vector<std::string> sets = {
      "train.micro_batch_size=2", "train.global_batch_size=" + std::to_string(2 * world_size)};
  const DemoRun one_node = RunDemo(name + "-one-node", world_size, sets);
  testing::MultiNodeDemo demo("ddp", name + "-nodes", nodes, devices, sets, kSteps);
  const DemoRun multi = demo.Finish();
  ASSERT_EQ(one_node.exit_code, 0) << one_node.output;
  ASSERT_EQ(multi.node_exit_codes, std::vector<int>(nodes, 0)) << multi.output;
  const std::vector<double> expected = StepLosses(one_node.events[0]);
  ASSERT_EQ(expected.size(), static_cast<size_t>(kSteps));
  EXPECT_GT(std::abs(expected.front() - expected.back()), 1e-3);
  // Every rank says when the ranks met, which can only be once every rank has started and, on
  // each, after rank 0 did (rank 0 serves the store they meet through): read on this one host's
  // clock, rank 0's meeting comes after every rank's start, and every rank's after rank 0's start
  // (a millisecond for started_unix_ms's truncation).
  const nlohmann::json rank_zero = EventsOfType(multi.events[0], "start").at(0);
  ASSERT_TRUE(rank_zero["ranks_met_elapsed_ms"].is_number()) << rank_zero.dump();
  const double rank_zero_started = rank_zero["started_unix_ms"].get<double>();
  const double rank_zero_met = rank_zero_started + rank_zero["ranks_met_elapsed_ms"].get<double>();
  for (int rank = 0; rank < world_size; ++rank) {
    EXPECT_EQ(StepLosses(multi.events[rank]), expected) << "rank " << rank;
    const nlohmann::json start = EventsOfType(multi.events[rank], "start").at(0);
    EXPECT_EQ(start["rank"], rank);
    EXPECT_EQ(start["world_size"], world_size);
    ASSERT_TRUE(start["ranks_met_elapsed_ms"].is_number()) << start.dump();
    const double started = start["started_unix_ms"].get<double>();
    EXPECT_LE(started, rank_zero_met + 1) << "rank " << rank;
    EXPECT_GE(started + start["ranks_met_elapsed_ms"].get<double>() + 1, rank_zero_started)
        << "rank " << rank;
  }
  ASSERT_FALSE(one_node.final_model.empty());
  ASSERT_EQ(multi.final_model.size(), one_node.final_model.size());
  for (const auto& [tensor_name, tensor] : one_node.final_model) {
    ASSERT_TRUE(multi.final_model.contains(tensor_name)) << tensor_name;
    EXPECT_TRUE(torch::equal(multi.final_model.at(tensor_name), tensor)) << tensor_name;
  }
}

TEST(DdpMultiNodeTest, TwoNodesOfOneRankTrainLikeOneNodeOfTwo) {
  ExpectNodesTrainLikeOneNode("nodes-2x1", 2, 1);
}

TEST(DdpMultiNodeTest, TwoNodesOfTwoRanksTrainLikeOneNodeOfFour) {
  ExpectNodesTrainLikeOneNode("nodes-2x2", 2, 2);
}

// Whether process `pid` ignores `signal` (/proc/PID/status's SigIgn mask).
bool IgnoresSignal(pid_t pid, int signal) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("SigIgn:", 0) == 0) {
      return (std::stoull(line.substr(7), nullptr, 16) >> (signal - 1)) & 1;
    }
  }
  ADD_FAILURE() << "no SigIgn line for process " << pid;
  return false;
}

// Node rank 1's rank killed mid-run: its sockets close under node rank 0's rank, which fails, and
// node rank 0's launcher ends with it; no rank is left on either node.
TEST(DdpMultiNodeTest, ARankKilledOnOneNodeEndsTheOther) {
  testing::MultiNodeDemo demo("ddp", "nodes-kill", 2, 1,
                              {"train.micro_batch_size=2", "train.global_batch_size=4"}, 100000);
  const nlohmann::json node0 = demo.AwaitRanksFile(0);
  const nlohmann::json node1 = demo.AwaitRanksFile(1);
  ASSERT_FALSE(node0.is_null());
  ASSERT_FALSE(node1.is_null());
  EXPECT_EQ(node1["world_size"], 2);
  EXPECT_EQ(node1["master_port"], node0["master_port"]);
  ASSERT_TRUE(demo.AwaitStep(1));
  const pid_t rank0 = node0["pids"][0].get<pid_t>();
  // A rank ignores SIGPIPE, so a write to the dead peer's socket fails rather than killing it
  // (11-30: rank 0 once died of it instead of exiting with its code).
  EXPECT_TRUE(IgnoresSignal(rank0, SIGPIPE));
  ASSERT_EQ(::kill(node1["pids"][0].get<pid_t>(), SIGKILL), 0);
  const DemoRun run = demo.Finish();
  EXPECT_EQ(run.node_exit_codes[1], 1) << run.output;
  EXPECT_NE(run.node_exit_codes[0], 0) << run.output;
  EXPECT_NE(run.output.find("rank 1 of 2 was killed by SIGKILL (Killed)"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("rank 0 of 2 exited with code"), std::string::npos) << run.output;
  EXPECT_EQ(::kill(rank0, 0), -1);
  EXPECT_EQ(errno, ESRCH);
}

// A multi-node trial runs only as its nodes' shares, each launcher told its place; the flags that
// do not fit are refused before anything starts, naming what to pass.
TEST(DdpMultiNodeTest, FlagsThatDoNotFitTheTrialAreRefused) {
  const std::vector<std::string> two_nodes = {"strategy=ddp", "devices=1", "nodes=2",
                                              "train.global_batch_size=8"};
  struct Case {
    std::string name;
    std::vector<std::string> sets;
    std::string flags;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"no-nnodes", two_nodes, " --nproc 1",
       "the trial has nodes: 2 but --nnodes is 1; pass --nnodes 2 --node-rank K"},
      {"no-launcher", two_nodes, "", "--nproc 1 --nnodes 2 --node-rank K"},
      {"nnodes-not-nodes",
       {"strategy=ddp", "devices=2", "train.global_batch_size=8"},
       " --nproc 2 --nnodes 2 --node-rank 0",
       "the trial has nodes: 1 but --nnodes is 2; pass --nnodes 1"},
      {"port-zero-off-node-0", two_nodes, " --nproc 1 --nnodes 2 --node-rank 1 --master-port 0",
       "--master-port 0 (a free port picked on this host) is for node rank 0 only"},
      {"node-rank-too-big", two_nodes, " --nproc 1 --nnodes 2 --node-rank 2 --master-port 29500",
       "--node-rank 2 must be below --nnodes 2"},
      {"nnodes-without-nproc", two_nodes, " --nnodes 2", "--nnodes, --node-rank and --master-addr"},
  };
  for (const Case& c : cases) {
    const DemoRun run = RunDemo("refused-" + c.name, 1, c.sets, kSteps, c.flags);
    EXPECT_EQ(run.exit_code, 2) << c.name << ": " << run.output;
    EXPECT_NE(run.output.find(c.says), std::string::npos) << c.name << ": " << run.output;
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
