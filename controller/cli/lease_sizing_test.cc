#include "controller/cli/lease_sizing.h"

#include <gtest/gtest.h>

namespace llmctl::cli {
namespace {

Experiment TwoTrials() {
  Experiment experiment;
  for (const char* name : {"a", "b"}) {
    Trial& trial = experiment.trials.emplace_back();
    trial.name = std::string(name);
  }
  return experiment;
}

TEST(LeaseSizingTest, BootPlusThePredictedTimesWithTheMarginRoundedUp) {
  // 30 + 42 = 72 min predicted: x 1.25 = 90, + 20 boot = 110, rounded up to 110 (1h50m).
  const LeaseSizing sizing = SizeLease(TwoTrials(), {{.trial = "a", .trial_seconds = 30 * 60},
                                                     {.trial = "b", .trial_seconds = 42 * 60}});
  EXPECT_EQ(sizing.duration, "1h50m");
  EXPECT_EQ(sizing.explanation,
            "sized from the prediction: 2 trials, 72.0 min predicted, + 25% + 20 min for the "
            "node to boot, in steps of 10 min");
  // 1 min predicted: 21.25 min, rounded up to 30.
  EXPECT_EQ(SizeLease(TwoTrials(),
                      {{.trial = "a", .trial_seconds = 30}, {.trial = "b", .trial_seconds = 30}})
                .duration,
            "30m");
}

TEST(LeaseSizingTest, ATrialWithoutAPredictedTimeFallsBackToTheLabsLease) {
  const LeaseSizing sizing = SizeLease(TwoTrials(), {{.trial = "a", .trial_seconds = 600}});
  EXPECT_EQ(sizing.duration, "2h50m");
  EXPECT_EQ(sizing.explanation,
            "the labs' 2h50m: 1 trial has no predicted time (b; `llmctl estimate` says why)");
}

}  // namespace
}  // namespace llmctl::cli
