// llmctld's exit codes: a rule two processes share. llmctld exits with them
// (controller/llmctld_main.cc); llmctl, which starts it as the embedded controller, reports the one
// it exits with at start as its own failure (controller/cli/daemons.cc): a refused configuration
// is the user's input there too (llmctl exits 2), any other failure this machine's to fix (1). A
// new code changes both at compile time.
#ifndef LLMCTL_COMMON_DAEMON_EXIT_H_
#define LLMCTL_COMMON_DAEMON_EXIT_H_

namespace llmctl::daemon_exit {

inline constexpr int kOk = 0;  // stopped by SIGTERM or SIGINT, or --help
// It could not start: its data directory, store, certificates, socket or lock (what its stderr
// says).
inline constexpr int kFailed = 1;
// Its flags, config file or environment were refused, naming what (a config file by its path and
// line): nothing was started or written.
inline constexpr int kConfigRefused = 2;

}  // namespace llmctl::daemon_exit

#endif  // LLMCTL_COMMON_DAEMON_EXIT_H_
