// A follower of the controller's changes that paces itself takes a burst of changes at once: over
// any stretch it wakes at most once per interval, however many changes come (Watch's streams, which
// rebuild the whole experiment from the store on each wake).
#include "controller/change_notifier.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace llmctl::controller {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

TEST(ChangeNotifierTest, APacedFollowerWakesAtMostOncePerInterval) {
  ChangeNotifier changes;
  std::atomic<bool> done = false;
  int notified = 0;
  std::thread notifier([&] {
    const auto until = steady_clock::now() + milliseconds(300);
    while (steady_clock::now() < until) {
      changes.Notify();
      ++notified;
      std::this_thread::sleep_for(milliseconds(1));
    }
    done = true;
  });
  constexpr milliseconds kInterval{50};
  const auto start = steady_clock::now();
  uint64_t seen = changes.version();
  int wakes = 0;
  while (!done) {
    const auto woke = steady_clock::now();
    seen = changes.WaitForChangeNotBefore(seen, milliseconds(500), woke + kInterval);
    ++wakes;
    EXPECT_GE(steady_clock::now(), woke + kInterval);  // never before its time
  }
  notifier.join();
  const auto elapsed = steady_clock::now() - start;
  // Each wake takes at least an interval, so no more of them than the stretch holds, whatever the
  // machine's speed; the changes came many times faster.
  EXPECT_LE(wakes, elapsed / kInterval + 1);
  EXPECT_GT(notified, wakes);
  EXPECT_EQ(seen, changes.version());
}

TEST(ChangeNotifierTest, WaitingReturnsTheNewVersionOrTheSameAfterItsBound) {
  ChangeNotifier changes;
  const uint64_t start = changes.version();
  EXPECT_EQ(changes.WaitForChange(start, milliseconds(1)), start);  // nothing changed
  changes.Notify();
  EXPECT_EQ(changes.WaitForChange(start, milliseconds(500)), start + 1);
  EXPECT_EQ(changes.WaitForChangeNotBefore(start, milliseconds(500), steady_clock::now()),
            start + 1);
}

}  // namespace
}  // namespace llmctl::controller
