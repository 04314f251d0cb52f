// The node's rates (agent/node_rates.h) when the probe fails: a broken probe reported as not
// measured with its reason, a busy machine's probe measured again a few times, and a report that
// stays within what the controller takes.
#include <gtest/gtest.h>

#include "agent/node_rates.h"
#include "agent/node_rates_test_support.h"

namespace llmctl::agent::node_rates_test {
namespace {

TEST_F(NodeRatesTest, ABrokenProbeIsNotMeasuredAndNotKept) {
  WriteTrainer(R"({"version": 1, "matmul": []})");
  {
    NodeRates rates(Options(), [] { return false; });
    rates.Start(facts_);
    const NodeRates::Report report = Settled(rates);
    EXPECT_EQ(report.probe_json, "");
    EXPECT_TRUE(report.pending.starts_with("not measured: llm-train --probe: ")) << report.pending;
  }
  EXPECT_FALSE(fs::exists(dir_ / "data" / "rates.json"));
  EXPECT_EQ(Runs(), 1);  // this llm-train would write the same again: not measured again

  WriteTrainer("not json");
  NodeRates rates(Options(), [] { return false; });
  rates.Start(facts_);
  EXPECT_EQ(Settled(rates).pending, "not measured: llm-train --probe wrote no JSON");
  EXPECT_EQ(Runs(), 2);
}

// llm-train says why its probe failed on stderr, last: the report carries that line, on one line.
TEST_F(NodeRatesTest, AFailedProbesReportCarriesItsReason) {
  const fs::path trainer = dir_ / "llm-train";
  std::ofstream(trainer) << "#!/bin/sh\necho 'measuring' >&2\nprintf 'llm-train: the rates "
                            "measured disagree\\033[1m with each other\\n\\n' >&2\nexit 1\n";
  fs::permissions(trainer, fs::perms::owner_all);
  NodeRates rates(Options(), [] { return false; });
  rates.Start(facts_);
  EXPECT_EQ(Settled(rates).pending,
            "not measured: " + trainer.string() +
                " --probe exited with 1: llm-train: the rates measured disagree [1m with each "
                "other; that was attempt 3 of 3, measuring again at the agent's next start");
}

// A probe taken while other work held the machine (llm-train exits 1) is measured again after a
// wait, instead of leaving the node without rates until the agent's next start.
TEST_F(NodeRatesTest, ABusyMachinesProbeIsMeasuredAgain) {
  WriteBusyTrainer(1);
  {
    NodeRates rates(Options(), [] { return false; });
    rates.Start(facts_);
    const NodeRates::Report report = Settled(rates);
    EXPECT_EQ(report.pending, "");
    EXPECT_FALSE(report.probe_json.empty());
    EXPECT_EQ(Runs(), 2);
  }
  EXPECT_TRUE(fs::exists(dir_ / "data" / "rates.json"));
}

// A machine busy at every attempt: measured as often as NodeRatesOptions::retry_after allows, then
// reported as measured again at the agent's next start.
TEST_F(NodeRatesTest, ABusyMachineIsMeasuredAsManyTimesAsItsAttemptsThenAtTheNextStart) {
  WriteBusyTrainer(100);
  NodeRates rates(Options(), [] { return false; });
  rates.Start(facts_);
  EXPECT_EQ(
      Settled(rates).pending,
      NotMeasuredBusy() + "; that was attempt 3 of 3, measuring again at the agent's next start");
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(Runs(), 3);
  EXPECT_FALSE(fs::exists(dir_ / "data" / "rates.json"));
}

// While it waits to measure again the report says why, when and which attempt, trials start, and
// the agent stopping ends the wait: the agent does not wait out the hour, and measures no more.
TEST_F(NodeRatesTest, StoppingEndsTheWaitToMeasureAgain) {
  WriteBusyTrainer(100);
  NodeRatesOptions options = Options();
  options.retry_after = {std::chrono::hours(1), std::chrono::hours(1)};
  std::optional<NodeRates> rates;
  rates.emplace(options, [] { return false; });
  rates->Start(facts_);
  EXPECT_TRUE(Says(*rates, NotMeasuredBusy() + "; measuring again in 60 min (attempt 2 of 3)"))
      << rates->Current().pending;
  {
    const NodeRates::StartingTrial starting(
        *rates, std::chrono::steady_clock::now() + std::chrono::seconds(20));
    EXPECT_TRUE(starting.free());
  }
  rates->Stop();
  rates.reset();  // joins the probe's thread
  EXPECT_EQ(Runs(), 1);
}

// The attempt after the wait, as the first, waits for the running trial to end.
TEST_F(NodeRatesTest, AProbeIsMeasuredAgainOnlyOnceTheNodeIsIdle) {
  WriteBusyTrainer(1);
  // A trial starts once the first probe has failed, and runs until the test ends it.
  std::atomic<bool> trial_ended = false;
  NodeRates rates(Options(), [&] { return Runs() >= 1 && !trial_ended.load(); });
  rates.Start(facts_);
  EXPECT_TRUE(Says(
      rates, NotMeasuredBusy() + "; measuring again once the running trial ends (attempt 2 of 3)"))
      << rates.Current().pending;
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(Runs(), 1);
  trial_ended = true;
  EXPECT_EQ(Settled(rates).pending, "");
  EXPECT_EQ(Runs(), 2);
}

// Failures that waiting does not change are reported once: an llm-train that cannot run, one that
// refuses its input (exit 2, such as no CUDA device for --probe-device cuda), and a probe killed at
// its timeout (a hung probe holds trials off for the whole timeout at each attempt).
TEST_F(NodeRatesTest, AFailureWaitingCannotChangeIsNotMeasuredAgain) {
  {
    NodeRatesOptions options = Options();
    options.llm_train = (dir_ / "missing-llm-train").string();
    NodeRates rates(options, [] { return false; });
    rates.Start(facts_);
    EXPECT_EQ(Settled(rates).pending,
              "not measured: cannot run " + options.llm_train + ": No such file or directory");
  }
  const fs::path trainer = dir_ / "llm-train";
  const std::string runs = (dir_ / "runs.txt").string();
  std::ofstream(trainer)
      << "#!/bin/sh\necho \"$@\" >> '" << runs
      << "'\necho 'llm-train: --probe-device cuda: no CUDA device' >&2\nexit 2\n";
  {
    NodeRates rates(Options(), [] { return false; });
    rates.Start(facts_);
    EXPECT_EQ(Settled(rates).pending, "not measured: " + trainer.string() +
                                          " --probe exited with 2: llm-train: --probe-device "
                                          "cuda: no CUDA device");
    EXPECT_EQ(Runs(), 1);
  }
  WriteTrainer(FixedProbe().ToJson().dump(), "60");
  NodeRatesOptions options = Options();
  options.timeout = milliseconds(1000);
  NodeRates rates(options, [] { return false; });
  rates.Start(facts_);
  EXPECT_EQ(Settled(rates).pending,
            "not measured: " + trainer.string() + " --probe was killed or timed out");
  EXPECT_EQ(Runs(), 2);
}

// The controller takes a report of up to kRateProbePendingMaxBytes and refuses a longer one with
// the node's whole description (the node would then run nothing): a trainer's path as long as
// they come is cut from the report, and what it says of the next attempt is kept.
TEST_F(NodeRatesTest, AReportStaysWithinWhatTheControllerTakes) {
  WriteBusyTrainer(100);
  fs::path deep = dir_;
  for (int i = 0; i < 5; ++i) deep /= std::string(200, 'd');
  fs::create_directories(deep);
  fs::copy_file(dir_ / "llm-train", deep / "llm-train");
  NodeRatesOptions options = Options();
  options.llm_train = (deep / "llm-train").string();
  const auto within = [](const std::string& pending) {
    return PrintableTextProblem(pending, estimate::kRateProbePendingMaxBytes).empty();
  };
  {
    options.retry_after = {std::chrono::hours(1), std::chrono::hours(1)};
    NodeRates rates(options, [] { return false; });
    rates.Start(facts_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!rates.Current().pending.ends_with("(attempt 2 of 3)") &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(1));
    }
    const std::string pending = rates.Current().pending;
    EXPECT_TRUE(pending.ends_with("; measuring again in 60 min (attempt 2 of 3)")) << pending;
    EXPECT_TRUE(within(pending)) << pending.size();
    rates.Stop();
  }
  options.retry_after = {milliseconds(10), milliseconds(10)};
  NodeRates rates(options, [] { return false; });
  rates.Start(facts_);
  const std::string pending = Settled(rates).pending;
  EXPECT_TRUE(pending.starts_with("not measured: " + dir_.string())) << pending;
  EXPECT_TRUE(
      pending.ends_with("…; that was attempt 3 of 3, measuring again at the agent's next start"))
      << pending;
  EXPECT_TRUE(within(pending)) << pending.size();
}

}  // namespace
}  // namespace llmctl::agent::node_rates_test
