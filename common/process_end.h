// How a process ended, as llmctl's messages say it: one wording of a signal for llmctl's report of
// a daemon that died at start (controller/cli/daemons.cc), llm-train's of a rank
// (trainer/dist/rank_launcher.cc) and the agent's of a worker (agent/outcome.cc).
#ifndef LLMCTL_COMMON_PROCESS_END_H_
#define LLMCTL_COMMON_PROCESS_END_H_

#include <string.h>

#include <string>

namespace llmctl {

// A signal by its name and glibc's description of it, "SIGKILL (Killed)"; "signal 77" for a number
// glibc does not name. Both are glibc's own text in every locale, where strsignal's is the
// locale's: a message read on another machine, or matched by a test, says the same everywhere.
inline std::string SignalName(int signal) {
  const char* abbreviation = ::sigabbrev_np(signal);
  const char* description = ::sigdescr_np(signal);
  std::string name = abbreviation != nullptr ? std::string("SIG").append(abbreviation)
                                             : "signal " + std::to_string(signal);
  if (description != nullptr) name.append(" (").append(description).append(")");
  return name;
}

}  // namespace llmctl

#endif  // LLMCTL_COMMON_PROCESS_END_H_
