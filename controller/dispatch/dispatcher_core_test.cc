// The helpers every part of the dispatcher uses: the doubling backoff and how an attempt is named.
#include "controller/dispatch/dispatcher_core.h"

#include <gtest/gtest.h>

#include <vector>

namespace llmctl::controller::dispatch {
namespace {

using std::chrono::milliseconds;

TEST(NextBackoffTest, StartsAtTheInitialThenDoublesUpToTheMaximum) {
  const milliseconds initial(1000), max(4000);
  milliseconds backoff(0);
  std::vector<int64_t> seen;
  for (int i = 0; i < 5; ++i) {
    backoff = NextBackoff(backoff, initial, max);
    seen.push_back(backoff.count());
  }
  EXPECT_EQ(seen, (std::vector<int64_t>{1000, 2000, 4000, 4000, 4000}));
  // The first is `initial` even above `max`: callers that want it capped pass min(initial, max).
  EXPECT_EQ(NextBackoff(milliseconds(0), milliseconds(500), milliseconds(300)), milliseconds(500));
  EXPECT_EQ(NextBackoff(milliseconds(500), milliseconds(500), milliseconds(300)),
            milliseconds(300));
}

TEST(AttemptNameTest, NamesTheTrialAndAttempt) {
  EXPECT_EQ(AttemptName(12, 3), "trial 12 attempt 3");
  store::RunningAttempt attempt;
  attempt.trial_id = 4;
  attempt.attempt = 1;
  EXPECT_EQ(AttemptName(attempt), "trial 4 attempt 1");
}

}  // namespace
}  // namespace llmctl::controller::dispatch
