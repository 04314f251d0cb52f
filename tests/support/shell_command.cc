#include "tests/support/shell_command.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>

namespace llmctl::testing {

CommandResult RunShellCommand(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer;
  size_t got;
  while ((got = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) {
    result.out.append(buffer.data(), got);
  }
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::filesystem::path BuildDir() {
  const char* dir = std::getenv("LLMCTL_BUILD_DIR");
  return std::filesystem::absolute(dir != nullptr ? dir : "build");
}

}  // namespace llmctl::testing
