// The node's rates (agent/node_rates.h) measured again on request (Agent.MeasureRates, `llmctl
// nodes --measure NODE`): once the node is idle, the rates before serving meanwhile and on when the
// probe fails, an ask cutting a busy machine's wait, and the agents that refuse.
#include <gtest/gtest.h>

#include "agent/node_rates.h"
#include "agent/node_rates_test_support.h"

namespace llmctl::agent::node_rates_test {
namespace {

// `llmctl nodes --measure NODE`: a node measured once measures again when asked, once idle, the
// rates before serving meanwhile; the new ones are reported and kept for the next start. An ask
// while the probe is waited for or measured is that probe's.
TEST_F(NodeRatesTest, AskedToMeasureAgainTheNodeDoesOnceIdleAndTheRatesBeforeServeMeanwhile) {
  std::atomic<bool> trial_running = false;
  NodeRates rates(Options(), [&] { return trial_running.load(); });
  rates.Start(facts_);
  ASSERT_EQ(Settled(rates).pending, "");
  ASSERT_EQ(Runs(), 1);
  estimate::RateProbe faster = FixedProbe();
  faster.memory_bytes_per_s = 2e10;
  WriteTrainer(faster.ToJson().dump());

  trial_running = true;
  StatusOr<std::string> asked = rates.MeasureAgain();
  ASSERT_TRUE(asked.ok()) << asked.status().ToString();
  EXPECT_EQ(*asked, "waiting for the running trial to end");
  StatusOr<std::string> asked_again = rates.MeasureAgain();
  ASSERT_TRUE(asked_again.ok());
  EXPECT_EQ(*asked_again, "waiting for the running trial to end");
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(Runs(), 1) << "not while a trial runs";
  EXPECT_EQ(Reported(rates), FixedProbe().ToJson()) << "the rates before serve meanwhile";
  trial_running = false;
  EXPECT_EQ(Settled(rates).pending, "");
  EXPECT_EQ(Runs(), 2) << "two asks, one probe";
  EXPECT_EQ(Reported(rates), faster.ToJson());

  // Idle: measured at once.
  WriteTrainer(FixedProbe().ToJson().dump(), "0.3");
  asked = rates.MeasureAgain();
  ASSERT_TRUE(asked.ok());
  EXPECT_EQ(*asked, "measuring");
  EXPECT_EQ(Reported(rates), faster.ToJson());
  EXPECT_EQ(Settled(rates).pending, "");
  EXPECT_EQ(Runs(), 3);
  EXPECT_EQ(Reported(rates), FixedProbe().ToJson());
  rates.Stop();

  NodeRates next(Options(), [] { return false; });
  next.Start(facts_);
  EXPECT_EQ(next.Current().pending, "") << "kept, not measured again";
  EXPECT_EQ(Reported(next), FixedProbe().ToJson());
  EXPECT_EQ(Runs(), 3);
}

// A probe asked for again that fails leaves the rates before reported and kept, and says so: a
// broken one at once, a busy machine's after its attempts.
TEST_F(NodeRatesTest, AProbeAskedForAgainThatFailsLeavesTheRatesBefore) {
  {
    NodeRates rates(Options(), [] { return false; });
    rates.Start(facts_);
    ASSERT_EQ(Settled(rates).pending, "");
    WriteTrainer("not a probe");
    ASSERT_TRUE(rates.MeasureAgain().ok());
    const NodeRates::Report report = Settled(rates);
    EXPECT_EQ(report.pending, "not measured again: llm-train --probe wrote no JSON");
    EXPECT_EQ(Reported(rates), FixedProbe().ToJson());

    WriteBusyTrainer(100);
    ASSERT_TRUE(rates.MeasureAgain().ok());
    EXPECT_EQ(Settled(rates).pending,
              "not measured again: " + (dir_ / "llm-train").string() +
                  " --probe exited with 1: llm-train: " + kBusy +
                  "; that was attempt 3 of 3; the rates measured before serve on");
    EXPECT_EQ(Reported(rates), FixedProbe().ToJson());
  }
  NodeRates next(Options(), [] { return false; });
  next.Start(facts_);
  EXPECT_EQ(next.Current().pending, "");
  EXPECT_EQ(Reported(next), FixedProbe().ToJson());
}

// An ask while a busy machine's probe waits to be retried measures it once the node is idle,
// rather than after the wait.
TEST_F(NodeRatesTest, AnAskCutsTheWaitBeforeABusyMachinesNextAttempt) {
  WriteBusyTrainer(1);
  NodeRatesOptions options = Options();
  options.retry_after = {std::chrono::hours(1), std::chrono::hours(1)};
  NodeRates rates(options, [] { return false; });
  rates.Start(facts_);
  ASSERT_TRUE(Says(rates, NotMeasuredBusy() + "; measuring again in 60 min (attempt 2 of 3)"))
      << rates.Current().pending;
  const StatusOr<std::string> asked = rates.MeasureAgain();
  ASSERT_TRUE(asked.ok());
  EXPECT_TRUE(asked->starts_with(NotMeasuredBusy() + "; measuring again ")) << *asked;
  EXPECT_EQ(Settled(rates).pending, "");
  EXPECT_EQ(Runs(), 2);
  EXPECT_EQ(Reported(rates), FixedProbe().ToJson());
}

// Nothing is measured where nothing may be: before the node is described, with the probe off, and
// on the embedded agent, whose rates are llmctl's probe.json (llmctl measures that again).
TEST_F(NodeRatesTest, AnAskIsRefusedWhereTheAgentMeasuresNothing) {
  {
    NodeRates rates(Options(), [] { return false; });
    EXPECT_EQ(rates.MeasureAgain().status().code(), StatusCode::kUnavailable);
  }
  {
    NodeRates rates(Options(/*measure=*/false), [] { return false; });
    rates.Start(facts_);
    const Status refused = rates.MeasureAgain().status();
    EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(refused.message().find("LLMCTL_RATE_PROBE=off"), std::string::npos);
  }
  {
    estimate::RateProbe this_machines = FixedProbe();
    this_machines.device_name = CpuModelName();
    const fs::path probe = WriteThisMachinesProbe(this_machines);
    NodeRates rates(Options(true, probe.string()), [] { return false; });
    rates.Start(facts_);
    ASSERT_EQ(Reported(rates), this_machines.ToJson()) << "taken, not measured";
    const Status refused = rates.MeasureAgain().status();
    EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(refused.message().find("llmctl nodes --measure local"), std::string::npos)
        << refused.message();
  }
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(Runs(), 0);
}

}  // namespace
}  // namespace llmctl::agent::node_rates_test
