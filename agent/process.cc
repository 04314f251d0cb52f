#include "agent/process.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace llmctl::agent {

std::optional<uint64_t> ProcessStartTime(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!in || !std::getline(in, stat)) return std::nullopt;
  // "pid (comm) state ...": comm may hold spaces and parentheses, so fields count from the last
  // ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(stat.substr(close + 1));
  std::string state;
  fields >> state;
  if (state == "Z" || state == "X") return std::nullopt;
  std::string skip;
  for (int field = 4; field < 22; ++field) fields >> skip;  // fields 4..21
  uint64_t start_time = 0;
  if (!(fields >> start_time)) return std::nullopt;
  return start_time;
}

bool IsSameProcessAlive(pid_t pid, uint64_t start_time) {
  const std::optional<uint64_t> actual = ProcessStartTime(pid);
  return actual.has_value() && *actual == start_time;
}

UniqueFd OpenExitWatch(pid_t pid, uint64_t start_time) {
  // Through syscall(): Debian 12's <sys/pidfd.h> declares pidfd_open without C linkage. Every
  // pidfd is close-on-exec.
  UniqueFd watch(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  // Checked after opening: the descriptor then names the process that was alive at the check, not
  // a later one the kernel gave the same pid.
  if (!watch.valid() || !IsSameProcessAlive(pid, start_time)) return UniqueFd();
  return watch;
}

}  // namespace llmctl::agent
