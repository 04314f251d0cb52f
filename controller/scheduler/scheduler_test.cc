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

// What of an experiment's target a node's labels can match, and the match itself, as `llmctl
// estimate` also applies it to pick the node whose rates a trial is timed at.
TEST(PlacementTargetTest, SiteAndFlavorAreMatchedAndNodeTypeIsNot) {
  const std::map<std::string, std::string> target = PlacementTarget(
      {{"site", "CHI@UC"}, {"flavor", "gpu_a100_pcie"}, {"node_type", "gpu_a100_pcie"}});
  EXPECT_EQ(target, (std::map<std::string, std::string>{{"site", "CHI@UC"},
                                                         {"flavor", "gpu_a100_pcie"}}));
  EXPECT_TRUE(LabelsMatch({{"site", "CHI@UC"}, {"flavor", "gpu_a100_pcie"}}, target));
  EXPECT_FALSE(LabelsMatch({{"site", "CHI@UC"}, {"flavor", "g1.h100.pci.1"}}, target));
  EXPECT_FALSE(LabelsMatch({{"site", "CHI@UC"}}, target));
  EXPECT_FALSE(LabelsMatch({}, target));
  EXPECT_TRUE(LabelsMatch({}, {}));
  EXPECT_TRUE(LabelsMatch({{"site", "KVM@TACC"}}, PlacementTarget({{"node_type", "x"}})));
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

// An agent that holds the trial's inputs already (its hub model) comes before a fuller one and
// one first by name, so that nothing is sent again; among holders, and without one that fits, the
// usual order.
TEST(PlaceTrialsTest, AnAgentHoldingTheTrialsInputsComesFirst) {
  const std::vector<Agent> agents = {GpuAgent("b", 2, {0}), GpuAgent("m", 4), GpuAgent("z", 4),
                                     GpuAgent("full", 1, {0})};
  QueuedTrial trial = Cuda(1);
  trial.holding_agents = {"z"};
  EXPECT_THAT(Describe(PlaceTrials({trial}, agents)), ElementsAre("1@z:0"));
  trial.holding_agents = {"z", "m"};
  EXPECT_THAT(Describe(PlaceTrials({trial}, agents)), ElementsAre("1@m:0"));
  trial.holding_agents = {"full", "gone"};
  EXPECT_THAT(Describe(PlaceTrials({trial}, agents)), ElementsAre("1@b:1"));
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

// Multi-node trials.

QueuedTrial MultiCuda(int64_t id, int64_t nodes, int64_t per_node) {
  QueuedTrial trial = Cuda(id, per_node);
  trial.nodes = nodes;
  return trial;
}

// "trial@rank0agent:indices|rank1agent:indices|...", node ranks in order.
std::vector<std::string> DescribeMulti(const Placement& placement) {
  std::vector<std::string> lines;
  for (const MultiNodeAssignment& a : placement.multi_node_assignments) {
    std::string line = std::to_string(a.trial_id);
    char node_separator = '@';
    for (size_t rank = 0; rank < a.nodes.size(); ++rank) {
      const NodeAssignment& node = a.nodes[rank];
      EXPECT_EQ(node.node_rank, static_cast<int64_t>(rank));
      line += node_separator;
      line += node.agent;
      char separator = ':';
      for (int64_t index : node.device_indices) {
        line += separator;
        line += std::to_string(index);
        separator = ',';
      }
      node_separator = '|';
    }
    lines.push_back(line);
  }
  return lines;
}

TEST(MultiNodePlacementTest, SpansDistinctAgentsEachWithItsDevicesPerNode) {
  const Placement placement =
      PlaceTrials({MultiCuda(1, 2, 2)}, {GpuAgent("a", 4, {0}), GpuAgent("b", 2)});
  // b (2 free) before a (3 free): the single-node order; each node takes its lowest free indices.
  EXPECT_THAT(DescribeMulti(placement), ElementsAre("1@b:0,1|a:1,2"));
  EXPECT_THAT(placement.assignments, IsEmpty());
  EXPECT_THAT(placement.waiting, IsEmpty());
}

TEST(MultiNodePlacementTest, AllOrNothing) {
  // Needs 3 nodes with 2 free GPUs; only a and b have them now: nothing is taken, not even a's.
  const std::vector<Agent> agents = {GpuAgent("a", 2), GpuAgent("b", 2), GpuAgent("c", 2, {1})};
  const Placement placement = PlaceTrials({MultiCuda(1, 3, 2)}, agents);
  EXPECT_THAT(placement.multi_node_assignments, IsEmpty());
  EXPECT_THAT(placement.assignments, IsEmpty());
  EXPECT_THAT(placement.waiting, ElementsAre(1));
  EXPECT_EQ(placement.waiting_reasons.at(1),
            "needs 3 nodes with 2 free cuda devices each; 2 have them now (3 could run it)");
}

TEST(MultiNodePlacementTest, OneBigAgentIsNotTwoNodes) {
  // One agent with 8 GPUs cannot be both nodes of a 2 x 4 trial: it can never run here.
  const Placement placement = PlaceTrials({MultiCuda(1, 2, 4), Cuda(2)}, {GpuAgent("big", 8)});
  EXPECT_THAT(placement.unsatisfiable, ElementsAre(1));
  EXPECT_THAT(placement.waiting, IsEmpty());
  // It holds nothing back.
  EXPECT_THAT(Describe(placement), ElementsAre("2@big:0"));
}

TEST(MultiNodePlacementTest, OnlyNodesOfTheTargetCount) {
  auto labelled = [](std::string name, std::string flavor) {
    Agent agent = GpuAgent(std::move(name), 1);
    agent.labels = {{"site", "CHI@UC"}, {"flavor", std::move(flavor)}};
    return agent;
  };
  QueuedTrial trial = MultiCuda(1, 2, 1);
  trial.target = {{"site", "CHI@UC"}, {"flavor", "gpu_a100_pcie"}};
  const std::vector<Agent> agents = {labelled("a", "gpu_a100_pcie"), labelled("b", "gpu_v100"),
                                     labelled("c", "gpu_a100_pcie")};
  EXPECT_THAT(DescribeMulti(PlaceTrials({trial}, agents)), ElementsAre("1@a:0|c:0"));

  // With one A100 node busy it waits, saying for what; the V100 node stays free for others.
  std::vector<Agent> busy = agents;
  busy[2].pools[0].busy = {0};
  const Placement placement = PlaceTrials({trial, Cuda(2)}, busy);
  EXPECT_THAT(placement.waiting, ElementsAre(1));
  EXPECT_EQ(placement.waiting_reasons.at(1),
            "needs 2 nodes (flavor gpu_a100_pcie, site CHI@UC) with 1 free cuda device each; 1 "
            "has them now (2 could run it)");
  EXPECT_THAT(Describe(placement), ElementsAre("2@b:0"));

  // With one A100 node gone it can never run.
  EXPECT_THAT(PlaceTrials({trial}, {agents[0], agents[1]}).unsatisfiable, ElementsAre(1));
}

TEST(MultiNodePlacementTest, TwoTrialsNeedingTwoOfThreeNodesDoNotSplitThemTheOlderGoesFirst) {
  // Three 4-GPU nodes. Trials 1 (older) and 2 each need 2 nodes with 4 free GPUs.
  // Round 1: only a is free. Neither takes a node: trial 1 holds all three, trial 2 waits.
  Placement placement =
      PlaceTrials({MultiCuda(1, 2, 4), MultiCuda(2, 2, 4)},
                  {GpuAgent("a", 4), GpuAgent("b", 4, {0}), GpuAgent("c", 4, {3})});
  EXPECT_THAT(placement.multi_node_assignments, IsEmpty());
  EXPECT_THAT(placement.waiting, ElementsAre(1, 2));
  EXPECT_EQ(placement.waiting_reasons.at(2),
            "needs 2 nodes with 4 free cuda devices each; none have them now (3 could run it); "
            "1 more has them but is held for trial 1, queued before it and waiting");

  // Round 2: c frees. Trial 1 takes a and c whole; trial 2 keeps waiting for b.
  placement = PlaceTrials({MultiCuda(1, 2, 4), MultiCuda(2, 2, 4)},
                          {GpuAgent("a", 4), GpuAgent("b", 4, {0}), GpuAgent("c", 4)});
  EXPECT_THAT(DescribeMulti(placement), ElementsAre("1@a:0,1,2,3|c:0,1,2,3"));
  EXPECT_THAT(placement.waiting, ElementsAre(2));

  // A smaller later multi-node trial that would fit now does not overtake the waiting one on the
  // nodes it could use: trial 1 needs 2 x 4 and has only a; trial 2 (2 x 2) could take b and c.
  placement = PlaceTrials({MultiCuda(1, 2, 4), MultiCuda(2, 2, 2)},
                          {GpuAgent("a", 4), GpuAgent("b", 4, {0, 1}), GpuAgent("c", 4, {0, 1})});
  EXPECT_THAT(placement.multi_node_assignments, IsEmpty());
  EXPECT_THAT(placement.waiting, ElementsAre(1, 2));
  EXPECT_EQ(placement.waiting_reasons.at(2),
            "needs 2 nodes with 2 free cuda devices each; none have them now (3 could run it); "
            "3 more have them but are held for trial 1, queued before it and waiting");
}

TEST(MultiNodePlacementTest, IsNotStarvedByLaterSingleNodeTrials) {
  // The multi-node trial needs both 2-GPU nodes whole; a stream of 1-GPU trials queued after it
  // could always fill the GPU that frees, but may not take from the nodes it holds.
  const std::vector<QueuedTrial> queue = {MultiCuda(1, 2, 2), Cuda(2), Cuda(3), Cuda(4)};
  Placement placement =
      PlaceTrials(queue, {GpuAgent("a", 2, {0}), GpuAgent("b", 2), GpuAgent("small", 1)});
  // Only the 1-GPU node, which the multi-node trial could never use, takes a 1-GPU trial.
  EXPECT_THAT(Describe(placement), ElementsAre("2@small:0"));
  EXPECT_THAT(placement.waiting, ElementsAre(1, 3, 4));
  EXPECT_EQ(placement.waiting_reasons.at(3),
            "needs a node with 1 free cuda device; none has them now; 2 more have them but are "
            "held for trial 1, queued before it and waiting");

  // Next round a's GPU frees (and trial 2 still runs on small): the multi-node trial goes first.
  placement = PlaceTrials({MultiCuda(1, 2, 2), Cuda(3), Cuda(4)},
                          {GpuAgent("a", 2), GpuAgent("b", 2), GpuAgent("small", 1, {0})});
  EXPECT_THAT(DescribeMulti(placement), ElementsAre("1@a:0,1|b:0,1"));
  EXPECT_THAT(placement.assignments, IsEmpty());
  EXPECT_THAT(placement.waiting, ElementsAre(3, 4));
}

TEST(MultiNodePlacementTest, EarlierSingleNodeTrialsGoFirstAndLaterOnesUseWhatItCannot) {
  // Queue order is the rule: the earlier 2-GPU trial takes a (tie with b: by name), so the
  // multi-node trial waits for a and b; the later 1-GPU trial may not take a's or b's devices,
  // only the 1-GPU node's, which the multi-node trial could never use.
  const Placement placement =
      PlaceTrials({Cuda(1, 2), MultiCuda(2, 2, 2), Cuda(3)},
                  {GpuAgent("a", 2), GpuAgent("b", 2), GpuAgent("small", 1)});
  EXPECT_THAT(Describe(placement), ElementsAre("1@a:0,1", "3@small:0"));
  EXPECT_THAT(placement.multi_node_assignments, IsEmpty());
  EXPECT_THAT(placement.waiting, ElementsAre(2));
}

TEST(MultiNodePlacementTest, NodeRanksAreDeterministic) {
  // Rank order is the single-node pool order: fewest free devices first, ties by agent name;
  // the order in which agents are listed does not matter.
  const std::vector<Agent> agents = {GpuAgent("z", 4), GpuAgent("m", 4), GpuAgent("x", 4, {0}),
                                     GpuAgent("b", 4)};
  std::vector<Agent> reversed(agents.rbegin(), agents.rend());
  const std::vector<QueuedTrial> queue = {MultiCuda(1, 3, 2)};
  EXPECT_THAT(DescribeMulti(PlaceTrials(queue, agents)), ElementsAre("1@x:1,2|b:0,1|m:0,1"));
  EXPECT_THAT(DescribeMulti(PlaceTrials(queue, reversed)), ElementsAre("1@x:1,2|b:0,1|m:0,1"));
  // The same inputs, the same answer.
  EXPECT_THAT(DescribeMulti(PlaceTrials(queue, agents)), ElementsAre("1@x:1,2|b:0,1|m:0,1"));
}

TEST(MultiNodePlacementTest, AgentsHoldingTheTrialsInputsAreItsFirstNodes) {
  QueuedTrial trial = MultiCuda(1, 2, 2);
  trial.holding_agents = {"z"};
  EXPECT_THAT(DescribeMulti(PlaceTrials(
                  {trial}, {GpuAgent("b", 4, {0}), GpuAgent("m", 4), GpuAgent("z", 4)})),
              ElementsAre("1@z:0,1|b:1,2"));
}

TEST(MultiNodePlacementTest, ACheckpointsAgentIsNodeRankZero) {
  QueuedTrial resumed = MultiCuda(1, 2, 1);
  resumed.only_agent = "m";
  const std::vector<Agent> agents = {GpuAgent("a", 1), GpuAgent("m", 2), GpuAgent("z", 1)};
  EXPECT_THAT(DescribeMulti(PlaceTrials({resumed}, agents)), ElementsAre("1@m:0|a:0"));

  // m busy: it waits for m (and holds what it could use).
  std::vector<Agent> busy = agents;
  busy[1].pools[0].busy = {0, 1};
  Placement placement = PlaceTrials({resumed, Cuda(2)}, busy);
  EXPECT_THAT(placement.waiting, ElementsAre(1, 2));
  EXPECT_EQ(placement.waiting_reasons.at(1),
            "needs 2 nodes with 1 free cuda device each; 2 have them now (3 could run it); node "
            "rank 0 must be m, which has not");

  // m gone: it can never run.
  placement = PlaceTrials({resumed}, {agents[0], agents[2]});
  EXPECT_THAT(placement.unsatisfiable, ElementsAre(1));
}

TEST(MultiNodePlacementTest, SingleNodeTrialsLeaveTheMultiNodeShapeEmpty) {
  const Placement placement = PlaceTrials({Cuda(1), Cuda(2, 2)}, {GpuAgent("a", 4)});
  EXPECT_THAT(Describe(placement), ElementsAre("1@a:0", "2@a:1,2"));
  EXPECT_THAT(placement.multi_node_assignments, IsEmpty());
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
