// llm-c10d-check: does PyTorch's distributed engine (c10d) work here, and how fast?
//
//   llm-c10d-check --world-size N --backend gloo|nccl --device cpu|cuda [--port P]
//                  [--numel LIST] [--timeout SECONDS]
//
// Starts N ranks of itself on this machine (torchrun's variables, MASTER_ADDR=127.0.0.1), which
// run every collective and print one JSON line each (rank 0). Under another launcher (torchrun),
// `--as-rank` runs just the rank the environment describes. Exit codes: 0 every result right, 1 a
// wrong result, a failed collective or a dead rank, 2 bad flags or environment, 3 NCCL with fewer
// GPUs than ranks, 4 --device cuda without a CUDA device.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <csignal>
#include <iostream>

#include "trainer/dist/c10d_check.h"
#include "trainer/dist/rank_env.h"
#include "trainer/dist/rank_launcher.h"

namespace {

using llmctl::dist::CheckOptions;

int Fail(int code, const std::string& message) {
  std::cerr << "llm-c10d-check: " << message << std::endl;
  return code;
}

std::string SelfPath() {
  char path[PATH_MAX];
  const ssize_t length = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (length <= 0) return "";
  return std::string(path, static_cast<size_t>(length));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"llm-c10d-check: runs and verifies c10d's collectives across N local ranks"};
  int world_size = 2;
  std::string backend_name = "gloo";
  std::string device_name = "cpu";
  int port = 29500;
  std::vector<int64_t> numels = CheckOptions().numels;
  int timeout_seconds = 60;
  bool as_rank = false;
  app.add_option("--world-size", world_size, "ranks to start on this machine")
      ->check(CLI::Range(1, 1024));
  app.add_option("--backend", backend_name, "gloo or nccl")->check(CLI::IsMember({"gloo", "nccl"}));
  app.add_option("--device", device_name, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--port", port, "MASTER_PORT: rank 0 serves the rendezvous store here")
      ->check(CLI::Range(1, 65535));
  app.add_option("--numel", numels, "flat tensor lengths to run each collective on")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 34));
  app.add_option("--timeout", timeout_seconds, "seconds the ranks wait for each other to join")
      ->check(CLI::Range(1, 3600));
  app.add_flag(
      "--as-rank", as_rank,
      "be one rank, from RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? 0 : llmctl::dist::kCheckExitUsage;
  }

  CheckOptions options;
  options.backend = *llmctl::dist::ParseBackendKind(backend_name);
  options.device = *llmctl::dist::ParseDeviceKind(device_name);
  options.numels = numels;
  options.rendezvous_timeout = std::chrono::seconds(timeout_seconds);

  if (as_rank) {
    llmctl::StatusOr<llmctl::dist::RankEnv> env = llmctl::dist::RankEnvFromEnvironment();
    if (!env.ok()) return Fail(llmctl::dist::kCheckExitUsage, env.status().message());
    return llmctl::dist::RunCheckRank(*env, options, std::cout, std::cerr);
  }

  if (std::optional<llmctl::dist::Refusal> refusal =
          llmctl::dist::RefuseMachine(options, world_size)) {
    return Fail(refusal->exit_code, refusal->message);
  }
  llmctl::dist::LaunchSpec spec;
  spec.argv = {SelfPath(), "--as-rank", "--backend", backend_name,
               "--device", device_name, "--timeout", std::to_string(timeout_seconds)};
  spec.argv.push_back("--numel");
  std::string list;
  for (int64_t numel : numels) list += (list.empty() ? "" : ",") + std::to_string(numel);
  spec.argv.push_back(list);
  spec.nproc_per_node = world_size;
  spec.master_port = static_cast<uint16_t>(port);
  // As llm-train's launcher: a stderr nobody reads loses the lines, not the exit code.
  std::signal(SIGPIPE, SIG_IGN);
  const llmctl::Status launched = llmctl::dist::LaunchRanks(spec);
  if (!launched.ok()) return Fail(llmctl::dist::kCheckExitFailed, launched.message());
  return llmctl::dist::kCheckExitOk;
}
