// The daemons' exit codes: a rule three processes share. llmctld (controller/llmctld_main.cc) and
// llm-agent (agent/main.cc) exit with them; llmctl, which starts both as the embedded pair, reports
// the one either exits with at start as its own failure (controller/cli/daemons.cc): a refused
// configuration is the user's input there too (llmctl exits 2), any other failure this machine's to
// fix (1). A new code changes all three at compile time.
#ifndef LLMCTL_COMMON_DAEMON_EXIT_H_
#define LLMCTL_COMMON_DAEMON_EXIT_H_

namespace llmctl::daemon_exit {

inline constexpr int kOk = 0;  // stopped by SIGTERM or SIGINT, or --help
// It could not start: its data directory, store, certificates, socket or lock (what its stderr
// says).
inline constexpr int kFailed = 1;
// Its flags, config file, credential files or environment were refused, naming what (a config
// file by its path and line): nothing was started or written.
inline constexpr int kConfigRefused = 2;

// A daemon's exit for its flags, given what CLI11's App::exit printed and returned: its own codes
// (105, 109, ...) would tell llmctl nothing, so any but --help's 0 is a refused configuration.
inline constexpr int OfFlagParse(int cli11_exit_code) {
  return cli11_exit_code == 0 ? kOk : kConfigRefused;
}

}  // namespace llmctl::daemon_exit

#endif  // LLMCTL_COMMON_DAEMON_EXIT_H_
