#include "common/machine_cpu.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace llmctl {
namespace {

using std::chrono::milliseconds;

constexpr char kTwoCpus[] =
    "cpu  100 20 30 5000 40 5 6 7 0 0\n"
    "cpu0 50 10 15 2500 20 3 3 4 0 0\n"
    "cpu1 50 10 15 2500 20 2 3 3 0 0\n"
    "intr 12345 0 0\n"
    "ctxt 999\n"
    "cpus_allowed 3\n";

TEST(ProcStatTest, SumsTheBusyCountersAndCountsTheCpus) {
  StatusOr<MachineTicks> ticks = ParseProcStat(kTwoCpus);
  ASSERT_TRUE(ticks.ok()) << ticks.status().message();
  // user + nice + system + irq + softirq + steal; idle and iowait are not busy.
  EXPECT_EQ(ticks->busy, 100 + 20 + 30 + 5 + 6 + 7);
  EXPECT_EQ(ticks->cpus, 2);
}

TEST(ProcStatTest, RefusesWhatIsNoProcStat) {
  for (const char* text : {"", "intr 1 2 3\ncpu0 1 2 3 4 5 6 7 8\n", "cpu  1 2 3 4 5 6 7\ncpu0 1\n",
                           "cpu  1 2 x 4 5 6 7 8\ncpu0 1\n", "cpu  1 2 -3 4 5 6 7 8\ncpu0 1\n",
                           "cpu  1 2 3 4 5 6 7 8\n"}) {
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
}

// This machine's own counters: the share is a share, and a process that spins counts as its own
// time, not others'. Others may run meanwhile: only the bounds are asserted.
TEST(OthersCpuShareTest, ReadsThisMachine) {
  const std::optional<CpuCounters> before = ReadCpuCounters();
  ASSERT_TRUE(before.has_value()) << "Linux's /proc/stat";
  EXPECT_GT(before->machine.cpus, 0);
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

}  // namespace
}  // namespace llmctl
