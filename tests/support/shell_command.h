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

// Where the built binaries are, as an absolute path: $LLMCTL_BUILD_DIR, else build/ (ctest runs the
// tests in the source directory).
std::filesystem::path BuildDir();

}  // namespace llmctl::testing

#endif  // LLMCTL_TESTS_SUPPORT_SHELL_COMMAND_H_
