#include "controller/scheduler/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace llmctl::scheduler {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

QueuedTrial Cuda(int64_t id, int64_t count = 1) {
  return {
      .trial_id = id, .device_type = "cuda", .device_count = count, .target = {}, .only_agent = {}};
}
QueuedTrial Cpu(int64_t id) {
  return {.trial_id = id, .device_type = "cpu", .device_count = 1, .target = {}, .only_agent = {}};
}

Agent GpuAgent(std::string name, int64_t gpus, std::set<int64_t> busy = {}) {
  return {.name = std::move(name),
          .connected = true,
          .labels = {},
          .pools = {{.type = "cuda", .count = gpus, .busy = std::move(busy)}}};
}
Agent CpuAgent(std::string name, std::set<int64_t> busy = {}) {
  return {.name = std::move(name),
          .connected = true,
          .labels = {},
          .pools = {{.type = "cpu", .count = 1, .busy = std::move(busy)}}};
}

// "trial@agent:indices", to compare whole placements at a glance.
std::vector<std::string> Describe(const Placement& placement) {
  std::vector<std::string> lines;
  for (const Assignment& a : placement.assignments) {
    std::string line = std::to_string(a.trial_id);
    line += '@';
    line += a.agent;
    char separator = ':';
    for (int64_t index : a.device_indices) {
      line += separator;
      line += std::to_string(index);
      separator = ',';
    }
    lines.push_back(line);
  }
  return lines;
}

TEST(PlaceTrialsTest, CpuAgentRunsOneTrialAtATimeInFileOrder) {
  const Placement placement = PlaceTrials({Cpu(1), Cpu(2), Cpu(3)}, {CpuAgent("a")});
  EXPECT_THAT(Describe(placement), ElementsAre("1@a:0"));
  EXPECT_THAT(placement.waiting, ElementsAre(2, 3));
  EXPECT_THAT(placement.unsatisfiable, IsEmpty());
}

TEST(PlaceTrialsTest, ATrialWithATargetRunsOnlyWhereTheNodesLeaseMatchesIt) {
  Agent a100 = GpuAgent("a100", 1);
  a100.labels = {{"site", "CHI@UC"}, {"flavor", "gpu_a100_pcie"}};
  Agent h100 = GpuAgent("h100", 1);
  h100.labels = {{"site", "KVM@TACC"}, {"flavor", "g1.h100.pci.1"}};
  QueuedTrial for_h100 = Cuda(1);
  for_h100.target = {{"site", "KVM@TACC"}, {"flavor", "g1.h100.pci.1"}};
  QueuedTrial anywhere = Cuda(2);
  // The A100 node comes first by name, yet the H100 trial goes to the H100 node.
  EXPECT_THAT(Describe(PlaceTrials({for_h100, anywhere}, {a100, h100})),
              ElementsAre("1@h100:0", "2@a100:0"));

  // With no node of its target connected, the trial cannot run anywhere and holds nothing back.
  const Placement placement = PlaceTrials({for_h100, anywhere}, {a100});
  EXPECT_THAT(placement.unsatisfiable, ElementsAre(1));
  EXPECT_THAT(Describe(placement), ElementsAre("2@a100:0"));
}

TEST(PlaceTrialsTest, AResumedTrialRunsOnlyOnTheAgentHoldingItsCheckpoint) {
  QueuedTrial resumed = Cuda(1);
  resumed.only_agent = "b";
  // Agent a is the emptier fit and first by name, yet the trial goes to b.
  EXPECT_THAT(Describe(PlaceTrials({resumed, Cuda(2)}, {GpuAgent("a", 2), GpuAgent("b", 4)})),
              ElementsAre("1@b:0", "2@a:0"));

  // b busy: it waits for b, holding b's devices, not a's.
  Placement placement = PlaceTrials({resumed, Cuda(2)}, {GpuAgent("a", 1), GpuAgent("b", 1, {0})});
  EXPECT_THAT(placement.waiting, ElementsAre(1));
  EXPECT_THAT(Describe(placement), ElementsAre("2@a:0"));

  // b gone: it cannot run now and holds nothing back.
  placement = PlaceTrials({resumed, Cuda(2)}, {GpuAgent("a", 1)});
  EXPECT_THAT(placement.unsatisfiable, ElementsAre(1));
  EXPECT_THAT(Describe(placement), ElementsAre("2@a:0"));
}

TEST(PlaceTrialsTest, BusyCpuAgentTakesNothing) {
  const Placement placement = PlaceTrials({Cpu(1)}, {CpuAgent("a", {0})});
  EXPECT_THAT(placement.assignments, IsEmpty());
  EXPECT_THAT(placement.waiting, ElementsAre(1));
}

TEST(PlaceTrialsTest, FourGpusRunFourOneGpuTrialsEachOnItsOwnIndex) {
  const Placement placement =
      PlaceTrials({Cuda(1), Cuda(2), Cuda(3), Cuda(4), Cuda(5)}, {GpuAgent("g", 4)});
  EXPECT_THAT(Describe(placement), ElementsAre("1@g:0", "2@g:1", "3@g:2", "4@g:3"));
  EXPECT_THAT(placement.waiting, ElementsAre(5));
}

TEST(PlaceTrialsTest, MultiGpuTrialTakesTheLowestFreeIndices) {
  const Placement placement = PlaceTrials({Cuda(1, 2), Cuda(2, 1)}, {GpuAgent("g", 4, {0, 2})});
  EXPECT_THAT(Describe(placement), ElementsAre("1@g:1,3"));
  EXPECT_THAT(placement.waiting, ElementsAre(2));
}

TEST(PlaceTrialsTest, SmallTrialsPackOntoTheFullestPoolThatFits) {
  // b has one GPU left, a has four: the 1-GPU trial fills b, and a stays whole for the 4-GPU one.
  const Placement placement =
      PlaceTrials({Cuda(1, 1), Cuda(2, 4)}, {GpuAgent("a", 4), GpuAgent("b", 2, {0})});
  EXPECT_THAT(Describe(placement), ElementsAre("1@b:1", "2@a:0,1,2,3"));
}

TEST(PlaceTrialsTest, TiesGoToTheFirstAgentByName) {
  const Placement placement = PlaceTrials({Cuda(1)}, {GpuAgent("z", 2), GpuAgent("m", 2)});
  EXPECT_THAT(Describe(placement), ElementsAre("1@m:0"));
}

TEST(PlaceTrialsTest, WaitingTrialIsNotOvertakenOnDevicesItCouldUse) {
  // Trial 1 needs both GPUs; one is busy. Trial 2 could take the free one, but that would let
  // it overtake trial 1, which then might wait forever.
  const Placement placement = PlaceTrials({Cuda(1, 2), Cuda(2, 1)}, {GpuAgent("g", 2, {1})});
  EXPECT_THAT(placement.assignments, IsEmpty());
  EXPECT_THAT(placement.waiting, ElementsAre(1, 2));
}

TEST(PlaceTrialsTest, LaterTrialMayUseDevicesTheWaitingTrialCannotUse) {
  // The waiting CUDA trial cannot use the CPU agent, nor the 1-GPU agent: both stay available.
  const Placement placement =
      PlaceTrials({Cuda(1, 2), Cpu(2), Cuda(3, 1)},
                  {GpuAgent("big", 2, {0}), GpuAgent("small", 1), CpuAgent("cpu")});
  EXPECT_THAT(Describe(placement), ElementsAre("2@cpu:0", "3@small:0"));
  EXPECT_THAT(placement.waiting, ElementsAre(1));
}

TEST(PlaceTrialsTest, UnsatisfiableTrialDoesNotBlockOthers) {
  // Nobody has 8 GPUs or a CPU pool: trials 1 and 2 can never run here and hold nothing back.
  const Placement placement = PlaceTrials({Cuda(1, 8), Cpu(2), Cuda(3, 2)}, {GpuAgent("g", 4)});
  EXPECT_THAT(Describe(placement), ElementsAre("3@g:0,1"));
  EXPECT_THAT(placement.unsatisfiable, ElementsAre(1, 2));
  EXPECT_THAT(placement.waiting, IsEmpty());
}

TEST(PlaceTrialsTest, DisconnectedAgentsGetNothingAndCountAsAbsent) {
  Agent gone = GpuAgent("gone", 8);
  gone.connected = false;
  const Placement placement = PlaceTrials({Cuda(1, 8), Cuda(2)}, {gone, GpuAgent("g", 1)});
  EXPECT_THAT(Describe(placement), ElementsAre("2@g:0"));
  EXPECT_THAT(placement.unsatisfiable, ElementsAre(1));
}

TEST(PlaceTrialsTest, AgentWithCpuAndGpuPoolsServesBoth) {
  Agent both = GpuAgent("node", 1);
  both.pools.push_back({.type = "cpu", .count = 1, .busy = {}});
  const Placement placement = PlaceTrials({Cuda(1), Cpu(2), Cuda(3)}, {both});
  EXPECT_THAT(Describe(placement), ElementsAre("1@node:0", "2@node:0"));
  EXPECT_THAT(placement.waiting, ElementsAre(3));
}

TEST(PlaceTrialsTest, NoAgentsMeansEverythingIsUnsatisfiable) {
  const Placement placement = PlaceTrials({Cpu(1), Cuda(2)}, {});
  EXPECT_THAT(placement.assignments, IsEmpty());
  EXPECT_THAT(placement.unsatisfiable, ElementsAre(1, 2));
}

const Time kT0 = Time(seconds(1'000'000));

TEST(DecideLostAttemptsTest, RequeuesExactlyAtTheTimeoutAndNotBefore) {
  const milliseconds timeout(60'000);
  const std::vector<RunningAttempt> running = {
      {.trial_id = 1, .attempt = 1, .agent = "a", .agent_last_seen = kT0},
  };
  LostAgentDecision before = DecideLostAttempts(running, kT0 + timeout - milliseconds(1), timeout);
  EXPECT_THAT(before.requeue, IsEmpty());
  ASSERT_EQ(before.keep_waiting.size(), 1u);
  EXPECT_EQ(before.decide_again_at, kT0 + timeout);

  LostAgentDecision at = DecideLostAttempts(running, kT0 + timeout, timeout);
  EXPECT_THAT(at.keep_waiting, IsEmpty());
  ASSERT_EQ(at.requeue.size(), 1u);
  EXPECT_EQ(at.requeue[0].trial_id, 1);
  EXPECT_EQ(at.requeue[0].attempt, 1);
  EXPECT_FALSE(at.decide_again_at.has_value());
}

TEST(DecideLostAttemptsTest, SortsSeveralAttemptsAndNamesTheNextDecisionTime) {
  const milliseconds timeout(10'000);
  const std::vector<RunningAttempt> running = {
      {.trial_id = 1, .attempt = 2, .agent = "silent", .agent_last_seen = kT0},
      {.trial_id = 2, .attempt = 1, .agent = "recent", .agent_last_seen = kT0 + seconds(8)},
      {.trial_id = 3, .attempt = 1, .agent = "fresh", .agent_last_seen = kT0 + seconds(12)},
  };
  const LostAgentDecision decision = DecideLostAttempts(running, kT0 + seconds(12), timeout);
  ASSERT_EQ(decision.requeue.size(), 1u);
  EXPECT_EQ(decision.requeue[0].agent, "silent");
  ASSERT_EQ(decision.keep_waiting.size(), 2u);
  EXPECT_EQ(decision.keep_waiting[0].agent, "recent");
  EXPECT_EQ(decision.keep_waiting[1].agent, "fresh");
  EXPECT_EQ(decision.decide_again_at, kT0 + seconds(18));
}

TEST(DecideLostAttemptsTest, AgentSeenInTheFutureIsKept) {
  const std::vector<RunningAttempt> running = {
      {.trial_id = 1, .attempt = 1, .agent = "skewed", .agent_last_seen = kT0 + seconds(5)},
  };
  const LostAgentDecision decision = DecideLostAttempts(running, kT0, milliseconds(0));
  EXPECT_THAT(decision.requeue, IsEmpty());
  EXPECT_EQ(decision.keep_waiting.size(), 1u);
}

TEST(DecideLostAttemptsTest, NothingRunningDecidesNothing) {
  const LostAgentDecision decision = DecideLostAttempts({}, kT0, milliseconds(1000));
  EXPECT_THAT(decision.keep_waiting, IsEmpty());
  EXPECT_THAT(decision.requeue, IsEmpty());
  EXPECT_FALSE(decision.decide_again_at.has_value());
}

}  // namespace
}  // namespace llmctl::scheduler
