#include "common/name_locks.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <optional>
#include <thread>

namespace llmctl {
namespace {

TEST(NameLocksTest, AnotherNameIsTakenWhileOneIsHeld) {
  NameLocks locks;
  const NameLocks::Held first = locks.Lock("n1");
  // Would wait for ever if names shared one lock.
  auto second =
      std::async(std::launch::async, [&] { const NameLocks::Held held = locks.Lock("n2"); });
  second.get();
}

TEST(NameLocksTest, TheSameNameWaitsForItsHolder) {
  NameLocks locks;
  std::atomic<int> order{0};
  std::atomic<int> holder_done{0};
  std::atomic<int> waiter_got{0};
  std::optional<NameLocks::Held> held(locks.Lock("n1"));
  std::promise<void> waiting;
  std::thread waiter([&] {
    waiting.set_value();
    const NameLocks::Held mine = locks.Lock("n1");
    waiter_got = ++order;
  });
  waiting.get_future().wait();
  // Time for a lock that did not wait to be taken; whatever the scheduling, a waiting one is
  // taken only after the holder lets it go.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  holder_done = ++order;
  held.reset();
  waiter.join();
  EXPECT_EQ(holder_done.load(), 1);
  EXPECT_EQ(waiter_got.load(), 2);
}

TEST(NameLocksTest, AMovedHoldReleasesOnce) {
  NameLocks locks;
  {
    NameLocks::Held held = locks.Lock("n1");
    NameLocks::Held moved = std::move(held);
  }
  const NameLocks::Held again = locks.Lock("n1");
}

}  // namespace
}  // namespace llmctl
