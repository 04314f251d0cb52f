#include "tests/support/shell_command.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace llmctl::testing {
namespace {

namespace fs = std::filesystem;

// $`name` as an absolute path, else `otherwise` as one.
fs::path AbsoluteFromEnvironment(const char* name, const char* otherwise) {
  const char* value = std::getenv(name);
  return fs::absolute(value != nullptr && *value != '\0' ? value : otherwise);
}

}  // namespace

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

std::string SubmittedExperimentId(const std::string& out) {
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.find_first_not_of("0123456789") == std::string::npos) return line;
  }
  return "";
}

fs::path BuildDir() { return AbsoluteFromEnvironment("LLMCTL_BUILD_DIR", "build"); }

fs::path SourceDir() { return AbsoluteFromEnvironment("LLMCTL_SOURCE_DIR", "."); }

}  // namespace llmctl::testing
