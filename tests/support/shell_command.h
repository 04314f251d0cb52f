// Runs a command line through /bin/sh, as a user at a terminal would, and keeps what it printed:
// how the integration tests drive the built llmctl binary.
#ifndef LLMCTL_TESTS_SUPPORT_SHELL_COMMAND_H_
#define LLMCTL_TESTS_SUPPORT_SHELL_COMMAND_H_

#include <filesystem>
#include <string>

namespace llmctl::testing {

struct CommandResult {
  int exit_code = -1;  // -1 when the command could not start or ended by a signal
  std::string out;     // stdout and stderr, interleaved as written
};

CommandResult RunShellCommand(const std::string& command);

// The experiment's id `llmctl submit` printed alone on its line of standard output: the first line
// of `out` that is a whole number, since notes on standard error may come before it (such as the
// one on measuring this machine's rates, which holds a quote, where no LLMCTL_RATE_PROBE=off
// says otherwise); "" when there is none.
std::string SubmittedExperimentId(const std::string& out);

// Where the built binaries are, as an absolute path: $LLMCTL_BUILD_DIR, which ctest sets and a test
// binary run on its own sets to the build tree it lies in (tests/support/gtest_main.cc); build/
// without it.
std::filesystem::path BuildDir();

// The source tree, as an absolute path: $LLMCTL_SOURCE_DIR, which ctest sets and a test binary run
// on its own sets to the tree its build was configured from; the working directory without it.
// Tests name the tree's files through it, so that a run from another directory finds them.
std::filesystem::path SourceDir();

}  // namespace llmctl::testing

#endif  // LLMCTL_TESTS_SUPPORT_SHELL_COMMAND_H_
