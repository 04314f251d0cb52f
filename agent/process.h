// Processes the agent did not necessarily start: identity by pid plus start time, so that a pid
// the kernel reused for something else is never mistaken for our worker.
#ifndef LLMCTL_AGENT_PROCESS_H_
#define LLMCTL_AGENT_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>

#include "common/unique_fd.h"

namespace llmctl::agent {

// The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), or nullopt when
// there is no such process or it has exited (a zombie counts as exited).
std::optional<uint64_t> ProcessStartTime(pid_t pid);

// True while `pid` runs and started at `start_time`.
bool IsSameProcessAlive(pid_t pid, uint64_t start_time);

// A descriptor that poll() reports readable once the process `pid` (started at `start_time`) has
// exited: a pidfd, so it works for processes this one did not start. Invalid when the process is
// already gone or the kernel has no pidfd_open (before Linux 5.3, or a seccomp filter refuses it):
// callers keep a periodic check for that case.
UniqueFd OpenExitWatch(pid_t pid, uint64_t start_time);

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_PROCESS_H_
