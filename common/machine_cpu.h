// What the rest of a machine took of its CPUs while this process worked: a CPU trial's tokens/s is
// the machine's as much as the trial's, and a step timed while a compiler or another trial shared
// the cores says little about the trial. Read from /proc/stat (every CPU's busy time, the
// hypervisor's steal included) and getrusage (this process, all its threads), so Linux only.
#ifndef LLMCTL_COMMON_MACHINE_CPU_H_
#define LLMCTL_COMMON_MACHINE_CPU_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

#include "common/status.h"

namespace llmctl {

// /proc/stat's "cpu" line summed over the machine: the ticks its CPUs were busy (user, nice,
// system, irq, softirq and steal; guest time is inside user) and how many CPUs (its cpuN lines)
// that is the sum of.
struct MachineTicks {
  int64_t busy = 0;
  int cpus = 0;
};

// Parses /proc/stat's text; InvalidArgument naming what is missing.
StatusOr<MachineTicks> ParseProcStat(std::string_view text);

// One moment's counters.
struct CpuCounters {
  std::chrono::steady_clock::time_point at;
  MachineTicks machine;
  double own_seconds = 0;  // this process's user + system time, all its threads
};

// Now's counters; nullopt where /proc/stat cannot be read or parsed (not Linux).
std::optional<CpuCounters> ReadCpuCounters();

// The share of the machine's CPU time (all its CPUs over the wall time between the two readings)
// that went to anything but this process: (busy ticks / ticks_per_second - own seconds) / (wall x
// CPUs), within [0, 1] (the ticks' resolution can put a short span's figure just outside);
// nullopt without wall time or CPUs between them.
std::optional<double> OthersCpuShare(const CpuCounters& before, const CpuCounters& after,
                                     double ticks_per_second);

// From this share of the machine's CPU time taken by others, what was timed meanwhile (a trial's
// tokens/s, a probe's rates) is said to be the machine's load's as much as its own. On the 2-core
// CPU here (12-03) an idle machine's steps read 0-4% (a 0.2 s step on 2 CPUs is 40 ticks of
// /proc/stat's 100 a second), and a compiler at nice 19 in another session (its own autogroup, so
// the nice did not hold it back) took 49% while the CPU lab's rows measured 36-77% of their
// predicted tokens/s.
inline constexpr double kBusyMachineShare = 0.10;

// The clock ticks a second /proc/stat counts in (sysconf(_SC_CLK_TCK)).
double ProcStatTicksPerSecond();

}  // namespace llmctl

#endif  // LLMCTL_COMMON_MACHINE_CPU_H_
