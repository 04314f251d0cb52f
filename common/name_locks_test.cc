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
  std::optional<NameLocks::Held> first(locks.Lock("n1"));
  std::promise<void> taken;
  std::future<void> second_taken = taken.get_future();
  std::thread second([&] {
    const NameLocks::Held held = locks.Lock("n2");
    taken.set_value();
  });
  // Names sharing one lock would keep n2 waiting for n1's holder.
  const bool took = second_taken.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  first.reset();  // so that the thread ends either way
  second.join();
  EXPECT_TRUE(took) << "n2 waited for n1's holder";
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

// The moved-from hold releases nothing; the moved-to one releases the name when it goes.
TEST(NameLocksTest, AMovedHoldKeepsTheNameUntilItGoes) {
  NameLocks locks;
  std::optional<NameLocks::Held> moved;
  {
    NameLocks::Held held = locks.Lock("n1");
    moved.emplace(std::move(held));
  }
  std::promise<void> taken;
  std::future<void> other_took = taken.get_future();
  std::thread other([&] {
    const NameLocks::Held mine = locks.Lock("n1");
    taken.set_value();
  });
  // Whatever the scheduling, the other thread cannot take n1 while the moved-to hold lives.
  EXPECT_EQ(other_took.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout)
      << "the moved-from hold released n1";
  moved.reset();
  EXPECT_EQ(other_took.wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "the moved-to hold kept n1 after it went";
  other.join();
}

}  // namespace
}  // namespace llmctl
