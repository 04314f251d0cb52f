// llmctl: the command line of the orchestrator (controller/cli/commands.h).
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "common/files.h"
#include "controller/cli/commands.h"

int main(int argc, char** argv) {
  // llmctl reads other parties' files (model headers, images) with pread and maps only its own
  // token cache, written by renames alone; should one shrink under it all the same, it says so.
  llmctl::ReportShrunkMappedFiles("llmctl", llmctl::cli::kExitFailed);
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
