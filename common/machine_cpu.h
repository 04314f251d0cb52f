// What the rest of a machine took of the CPUs this process may run on while it worked: a CPU
// trial's tokens/s is the machine's as much as the trial's, and a step timed while a compiler or
// another trial shared the cores says little about the trial. Read from /proc/stat (each CPU's busy
// time, the hypervisor's steal included), the process's CPU affinity (sched_getaffinity: a
// container's or a job's cpuset; others' work on the CPUs outside it does not slow this process)
// and getrusage (this process, all its threads), so Linux only.
#ifndef LLMCTL_COMMON_MACHINE_CPU_H_
#define LLMCTL_COMMON_MACHINE_CPU_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string_view>

#include "common/status.h"

namespace llmctl {

// /proc/stat's cpuN lines summed over some CPUs: the ticks they were busy (user, nice, system, irq,
// softirq and steal; guest time is inside user) and how many CPUs that is the sum of.
struct MachineTicks {
  int64_t busy = 0;
  int cpus = 0;
};

// Parses /proc/stat's text, summing the lines of the CPUs in `only` (every CPU's when it is empty;
// a CPU of `only` that /proc/stat does not list, an offline one, counts for nothing);
// InvalidArgument naming what is missing or malformed, or when no CPU of `only` is listed.
StatusOr<MachineTicks> ParseProcStat(std::string_view text, const std::set<int>& only = {});

// The CPUs this process may run on (its main thread's affinity); empty when that cannot be read.
std::set<int> AllowedCpus();

// One moment's counters.
struct CpuCounters {
  std::chrono::steady_clock::time_point at;
  MachineTicks machine;
  double own_seconds = 0;         // this process's user + system time, all its threads
  double own_system_seconds = 0;  // the system part of it: the kernel's work for the process
};

// Now's counters, over AllowedCpus() (every CPU's when the affinity cannot be read); nullopt
// where /proc/stat cannot be read or parsed (not Linux).
std::optional<CpuCounters> ReadCpuCounters();

// The share of the CPU time of this process's CPUs (over the wall time between the two readings)
// that went to anything but this process: (their busy ticks / ticks_per_second - own seconds) /
// (wall x CPUs), within [0, 1] (the ticks' resolution can put a short span's figure just
// outside); nullopt without wall time or CPUs between them, or when the two readings summed
// different numbers of CPUs.
std::optional<double> OthersCpuShare(const CpuCounters& before, const CpuCounters& after,
                                     double ticks_per_second);

// The share of this process's CPU time between the two readings that the kernel spent on its behalf
// (page faults, mappings, system calls): its system time over its user + system time, in [0, 1];
// nullopt without CPU time between them.
std::optional<double> OwnKernelShare(const CpuCounters& before, const CpuCounters& after);

// From this share of its CPUs' time taken by others, what was timed meanwhile (a trial's
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
