#include "common/machine_cpu.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mman.h>

#include <chrono>
#include <functional>
#include <optional>
#include <set>
#include <thread>

namespace llmctl {
namespace {

using std::chrono::milliseconds;

// The "cpu " line is the sum of the cpuN lines below it (here deliberately not, to show which is
// read).
constexpr char kThreeCpus[] =
    "cpu  9999 9999 9999 9999 9999 9999 9999 9999 0 0\n"
    "cpu0 50 10 15 2500 20 3 3 4 0 0\n"
    "cpu1 50 10 15 2500 20 2 3 3 0 0\n"
    "cpu3 7 0 1 900 0 0 0 2 0 0\n"
    "intr 12345 0 0\n"
    "ctxt 999\n";

TEST(ProcStatTest, SumsTheBusyCountersOfEveryCpu) {
  StatusOr<MachineTicks> ticks = ParseProcStat(kThreeCpus);
  ASSERT_TRUE(ticks.ok()) << ticks.status().message();
  // user + nice + system + irq + softirq + steal; idle and iowait are not busy.
  EXPECT_EQ(ticks->busy, (50 + 10 + 15 + 3 + 3 + 4) + (50 + 10 + 15 + 2 + 3 + 3) + (7 + 1 + 2));
  EXPECT_EQ(ticks->cpus, 3);
}

// A process confined to some CPUs (a container's cpuset, taskset) is slowed only by work on those:
// the others' ticks are not its business. A CPU it may use that /proc/stat does not list
// (offline) counts for nothing.
TEST(ProcStatTest, SumsOnlyTheCpusAProcessMayRunOn) {
  StatusOr<MachineTicks> ticks = ParseProcStat(kThreeCpus, {1, 3});
  ASSERT_TRUE(ticks.ok()) << ticks.status().message();
  EXPECT_EQ(ticks->busy, (50 + 10 + 15 + 2 + 3 + 3) + (7 + 1 + 2));
  EXPECT_EQ(ticks->cpus, 2);
  ticks = ParseProcStat(kThreeCpus, {0, 2});
  ASSERT_TRUE(ticks.ok()) << ticks.status().message();
  EXPECT_EQ(ticks->cpus, 1);
  const StatusOr<MachineTicks> none = ParseProcStat(kThreeCpus, {2, 5});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("none of this process's 2 CPUs is listed"),
            std::string::npos)
      << none.status().message();
}

TEST(ProcStatTest, RefusesWhatIsNoProcStat) {
  for (const char* text :
       {"", "intr 1 2 3\n", "cpu  1 2 3 4 5 6 7 8\n", "cpu  1 2 3 4 5 6 7 8\ncpu0 1 2 3 4 5 6 7\n",
        "cpu0 1 2 x 4 5 6 7 8\n", "cpu0 1 2 -3 4 5 6 7 8\n", "cpu0\n", "cpu0x 1 2 3 4 5 6 7 8\n",
        "cpu99999999999 1 2 3 4 5 6 7 8\n"}) {
    EXPECT_FALSE(ParseProcStat(text).ok()) << text;
  }
}

CpuCounters At(double seconds, int64_t busy, double own) {
  return {.at = std::chrono::steady_clock::time_point(
              std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                  std::chrono::duration<double>(seconds))),
          .machine = {.busy = busy, .cpus = 2},
          .own_seconds = own};
}

TEST(OthersCpuShareTest, IsWhatTheMachineWasBusyWithBeyondThisProcess) {
  // 2 s on 2 CPUs: 4 CPU seconds; busy 300 ticks (3 s) of which 1.2 s were this process'.
  EXPECT_DOUBLE_EQ(*OthersCpuShare(At(1, 1000, 5), At(3, 1300, 6.2), 100), (3 - 1.2) / 4);
  // The ticks' resolution: this process' own time a little above the machine's busy time.
  EXPECT_EQ(*OthersCpuShare(At(1, 1000, 5), At(1.1, 1010, 5.15), 100), 0);
  EXPECT_EQ(*OthersCpuShare(At(1, 1000, 0), At(2, 1500, 0), 100), 1);
  EXPECT_FALSE(OthersCpuShare(At(1, 1000, 5), At(1, 1000, 5), 100).has_value());
  CpuCounters no_cpus = At(2, 1100, 5);
  no_cpus.machine.cpus = 0;
  EXPECT_FALSE(OthersCpuShare(At(1, 1000, 5), no_cpus, 100).has_value());
  // Moved to another number of CPUs between the readings: two sums of different CPUs.
  CpuCounters moved = At(2, 1100, 5);
  moved.machine.cpus = 3;
  EXPECT_FALSE(OthersCpuShare(At(1, 1000, 5), moved, 100).has_value());
}

// This machine's own counters: the share is a share, and a process that spins counts as its own
// time, not others'. Others may run meanwhile: only the bounds are asserted.
TEST(OthersCpuShareTest, ReadsThisMachine) {
  const std::optional<CpuCounters> before = ReadCpuCounters();
  ASSERT_TRUE(before.has_value()) << "Linux's /proc/stat";
  // The CPUs this process may run on, each of them listed (online).
  EXPECT_GT(before->machine.cpus, 0);
  EXPECT_EQ(before->machine.cpus, static_cast<int>(AllowedCpus().size()));
  const auto until = std::chrono::steady_clock::now() + milliseconds(300);
  volatile double spin = 0;
  while (std::chrono::steady_clock::now() < until) spin = spin + 1;
  const std::optional<CpuCounters> after = ReadCpuCounters();
  ASSERT_TRUE(after.has_value());
  EXPECT_GT(after->own_seconds, before->own_seconds);
  EXPECT_GE(after->machine.busy, before->machine.busy);
  const std::optional<double> share = OthersCpuShare(*before, *after, ProcStatTicksPerSecond());
  ASSERT_TRUE(share.has_value());
  EXPECT_GE(*share, 0);
  EXPECT_LE(*share, 1);
}

TEST(OwnKernelShareTest, IsTheSystemPartOfThisProcessCpuTime) {
  CpuCounters before = At(1, 1000, 5);
  before.own_system_seconds = 0.5;
  CpuCounters after = At(3, 1300, 6);
  after.own_system_seconds = 0.75;
  EXPECT_DOUBLE_EQ(*OwnKernelShare(before, after), 0.25);
  // No CPU time between the readings says nothing.
  EXPECT_FALSE(OwnKernelShare(before, before).has_value());
  // The adjusted user/system split can move a little backwards between readings: within [0, 1].
  after.own_system_seconds = 0.4;
  EXPECT_EQ(*OwnKernelShare(before, after), 0);
  after.own_system_seconds = 2;
  EXPECT_EQ(*OwnKernelShare(before, after), 1);
}

// This process's own readings: touching fresh pages is the kernel's work (a page fault each), a
// spin is not. Each span is compared with the other, not with a bound of its own.
TEST(OwnKernelShareTest, ReadsThisProcess) {
  const auto share_of = [](const std::function<void()>& work) {
    const std::optional<CpuCounters> before = ReadCpuCounters();
    const auto until = std::chrono::steady_clock::now() + milliseconds(300);
    while (std::chrono::steady_clock::now() < until) work();
    const std::optional<CpuCounters> after = ReadCpuCounters();
    return before && after ? OwnKernelShare(*before, *after) : std::nullopt;
  };
  volatile double spin = 0;
  const std::optional<double> spinning = share_of([&spin] { spin = spin + 1; });
  const std::optional<double> faulting = share_of([] {
    constexpr size_t kBytes = 16 << 20;
    void* pages = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(pages, MAP_FAILED);
    for (size_t at = 0; at < kBytes; at += 4096) static_cast<volatile char*>(pages)[at] = 1;
    munmap(pages, kBytes);
  });
  ASSERT_TRUE(spinning.has_value());
  ASSERT_TRUE(faulting.has_value());
  EXPECT_GT(*faulting, *spinning);
}

// A thread confined to one CPU (as taskset or a cpuset confines a process) reads that CPU's
// counters alone.
TEST(OthersCpuShareTest, ReadsOnlyTheCpusThisThreadMayRunOn) {
  const std::set<int> allowed = AllowedCpus();
  ASSERT_FALSE(allowed.empty());
  cpu_set_t original;
  ASSERT_EQ(sched_getaffinity(0, sizeof original, &original), 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(*allowed.rbegin(), &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  const std::set<int> confined = AllowedCpus();
  const std::optional<CpuCounters> counters = ReadCpuCounters();
  ASSERT_EQ(sched_setaffinity(0, sizeof original, &original), 0);
  EXPECT_EQ(confined, std::set<int>{*allowed.rbegin()});
  ASSERT_TRUE(counters.has_value());
  EXPECT_EQ(counters->machine.cpus, 1);
  EXPECT_EQ(AllowedCpus(), allowed);
}

}  // namespace
}  // namespace llmctl
