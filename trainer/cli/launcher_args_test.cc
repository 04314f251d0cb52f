// The rules for llm-train's launcher flags (--nproc, --nnodes, --node-rank, --master-port) and a
// rank's place (launcher_args.h): each test fails when the rule it names is removed.
#include "trainer/cli/launcher_args.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/experiment.h"

namespace llmctl::llm_train {
namespace {

// The one trial of an experiment file holding `yaml`.
TrialConfig Config(std::string_view yaml) {
  StatusOr<Experiment> experiment = ParseExperiment(yaml, "lab.yaml");
  EXPECT_TRUE(experiment.ok()) << experiment.status().message();
  return experiment.ok() ? experiment->trials.front().config : TrialConfig();
}

constexpr std::string_view kOneRank = "data: {path: train.jsonl}\n";
// Each with a global batch that its ranks can share.
constexpr std::string_view kTwoRanks =
    "data: {path: train.jsonl}\ntrain: {global_batch_size: 4}\nstrategy: ddp\ndevices: 2\n";
constexpr std::string_view kTwoNodes =
    "data: {path: train.jsonl}\ntrain: {global_batch_size: 4}\nstrategy: fsdp\ndevices: 2\n"
    "nodes: 2\n";

LauncherFlags Launcher(int nproc, int nnodes = 1, int node_rank = 0) {
  LauncherFlags flags;
  flags.nproc = nproc;
  flags.nnodes = nnodes;
  flags.node_rank = node_rank;
  return flags;
}

TEST(CheckLauncherFlagsTest, FlagsThatFitTheTrialPass) {
  EXPECT_TRUE(CheckLauncherFlags(Launcher(2), Config(kTwoRanks)).ok());
  EXPECT_TRUE(CheckLauncherFlags(Launcher(2, 2, 1), Config(kTwoNodes)).ok());
}

TEST(CheckLauncherFlagsTest, NnodesMustBeTheTrialsNodes) {
  const Status status = CheckLauncherFlags(Launcher(2, 1), Config(kTwoNodes));
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(status.message().starts_with(
      "the trial has nodes: 2 but --nnodes is 1; pass --nnodes 2 --node-rank K"))
      << status.message();
}

TEST(CheckLauncherFlagsTest, NodeRankMustBeBelowNnodes) {
  const Status status = CheckLauncherFlags(Launcher(2, 2, 2), Config(kTwoNodes));
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "--node-rank 2 must be below --nnodes 2");
}

TEST(CheckLauncherFlagsTest, OnlyNodeRankZeroMayPickItsPort) {
  LauncherFlags flags = Launcher(2, 2, 1);
  flags.master_port = 0;
  const Status status = CheckLauncherFlags(flags, Config(kTwoNodes));
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      status.message().starts_with("--master-port 0 (a free port picked on this host) is "
                                   "for node rank 0 only"))
      << status.message();
  flags.node_rank = 0;
  EXPECT_TRUE(CheckLauncherFlags(flags, Config(kTwoNodes)).ok());
}

TEST(CheckLauncherFlagsTest, NprocStartsADataParallelTrialOfAsManyDevices) {
  Status status = CheckLauncherFlags(Launcher(2), Config(kOneRank));
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(status.message().starts_with("--nproc 2 starts the ranks of a data-parallel trial"))
      << status.message();
  EXPECT_NE(status.message().find("(the trial has strategy: auto, "), std::string::npos)
      << status.message();
  status = CheckLauncherFlags(Launcher(3), Config(kTwoRanks));
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("devices: 3 (the trial has strategy: ddp, devices: 2, nodes: 1)"),
            std::string::npos)
      << status.message();
}

// Each rank runs the launcher's own command line, less the flags that made it the launcher.
TEST(LaunchSpecForTest, RanksRunTheCommandWithoutTheLaunchersFlags) {
  std::vector<std::string> args = {"llm-train",    "--config",    "lab.yaml",
                                   "--nproc",      "2",           "--master-port=0",
                                   "--ranks-file", "ranks.json",  "--nnodes=2",
                                   "--node-rank",  "0",           "--master-addr",
                                   "10.0.0.1",     "--set",       "train.max_steps=1",
                                   "--events",     "events.jsonl"};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  LauncherFlags flags = Launcher(2, 2, 0);
  flags.master_port = 0;
  flags.master_addr = "10.0.0.1";
  flags.ranks_file = "ranks.json";
  const dist::LaunchSpec spec = LaunchSpecFor(flags, static_cast<int>(argv.size()), argv.data());
  EXPECT_EQ(spec.argv, (std::vector<std::string>{"llm-train", "--config", "lab.yaml", "--set",
                                                 "train.max_steps=1", "--events", "events.jsonl"}));
  EXPECT_EQ(spec.nproc_per_node, 2);
  EXPECT_EQ(spec.nnodes, 2);
  EXPECT_EQ(spec.node_rank, 0);
  EXPECT_EQ(spec.master_addr, "10.0.0.1");
  EXPECT_EQ(spec.master_port, 0);
  EXPECT_EQ(spec.status_file, "ranks.json");
}

TEST(RankEnvForTest, ATrialOfOneRankHasNoPlace) {
  StatusOr<std::optional<dist::RankEnv>> env = RankEnvFor(Config(kOneRank));
  ASSERT_TRUE(env.ok()) << env.status().message();
  EXPECT_FALSE(env->has_value());
}

// A rank started without the launcher's variables says how to start it.
TEST(RankEnvForTest, ARankWithoutItsPlaceIsToldHowToStartIt) {
  for (const char* variable : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    unsetenv(variable);
  }
  StatusOr<std::optional<dist::RankEnv>> env = RankEnvFor(Config(kTwoRanks));
  ASSERT_FALSE(env.ok());
  EXPECT_EQ(env.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(env.status().message().starts_with(
      "strategy: ddp with devices: 2 runs one rank per device; start them with --nproc 2 "
      "(or torchrun): "))
      << env.status().message();
  env = RankEnvFor(Config(kTwoNodes));
  ASSERT_FALSE(env.ok());
  EXPECT_NE(env.status().message().find("start each host's share with --nproc 2 --nnodes 2 "
                                        "--node-rank K"),
            std::string::npos)
      << env.status().message();
}

}  // namespace
}  // namespace llmctl::llm_train
