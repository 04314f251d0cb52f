#include "controller/openstack/polling.h"

#include <gtest/gtest.h>

namespace llmctl::openstack {
namespace {

using std::chrono::hours;
using std::chrono::milliseconds;
using std::chrono::seconds;

// A clock whose wall clock steps by `step` during the first sleep, as chrony steps a node's wrong
// clock, while its time since boot moves only by what was slept.
class SteppingClock : public CloudClock {
 public:
  explicit SteppingClock(std::chrono::system_clock::duration step) : step_(step) {}
  TimePoint Now() const override { return now_; }
  milliseconds SinceBoot() const override { return since_boot_; }
  void SleepFor(milliseconds duration) override {
    now_ += duration + (sleeps_ == 0 ? step_ : std::chrono::system_clock::duration(0));
    since_boot_ += duration;
    ++sleeps_;
  }
  int sleeps() const { return sleeps_; }

 private:
  std::chrono::system_clock::duration step_;
  TimePoint now_ = TimePoint(hours(24 * 365 * 60));
  milliseconds since_boot_{0};
  int sleeps_ = 0;
};

// Ready at the `ready_at`th probe (never when 0).
std::function<StatusOr<std::optional<int>>()> ReadyAt(int ready_at, int& probes) {
  return [ready_at, &probes]() -> StatusOr<std::optional<int>> {
    ++probes;
    if (probes == ready_at) return 7;
    return std::nullopt;
  };
}

// The wall clock stepping an hour forward during the first sleep would end a 60 s wait after one
// poll; the resource that becomes ready at the fourth poll is still waited for.
TEST(PollUntilTest, AWallClockStepForwardDoesNotCutTheWaitShort) {
  SteppingClock clock(hours(1));
  int probes = 0;
  StatusOr<int> ready = PollUntil<int>(clock, seconds(5), seconds(60), "x", ReadyAt(4, probes));
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  EXPECT_EQ(*ready, 7);
  EXPECT_EQ(probes, 4);
}

// The wall clock stepping an hour back would stretch a 60 s wait by that hour; it still ends after
// 60 s of polls 5 s apart.
TEST(PollUntilTest, AWallClockStepBackDoesNotStretchTheWait) {
  SteppingClock clock(-hours(1));
  int probes = 0;
  StatusOr<int> never =
      PollUntil<int>(clock, seconds(5), seconds(60), "x is still not ready", ReadyAt(0, probes));
  ASSERT_EQ(never.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(never.status().message(), "x is still not ready after 60 s");
  EXPECT_EQ(clock.sleeps(), 12);
  EXPECT_EQ(probes, 13);
}

}  // namespace
}  // namespace llmctl::openstack
