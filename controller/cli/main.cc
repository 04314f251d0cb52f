// llmctl: the command line of the orchestrator (controller/cli/commands.h).
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "controller/cli/commands.h"

int main(int argc, char** argv) {
  std::error_code error;
  llmctl::cli::CliContext context{
      .env = llmctl::cli::ProcessEnvironment(),
      .out = std::cout,
      .err = std::cerr,
      .out_is_tty = ::isatty(STDOUT_FILENO) == 1,
      .self = std::filesystem::read_symlink("/proc/self/exe", error),
  };
  return llmctl::cli::RunLlmctl(std::vector<std::string>(argv, argv + argc), context);
}
