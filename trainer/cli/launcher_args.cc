#include "trainer/cli/launcher_args.h"

#include <cstdint>
#include <string>

namespace llmctl::llm_train {

llmctl::Status CheckLauncherFlags(const LauncherFlags& flags, const llmctl::TrialConfig& config) {
  const int64_t nodes = config.settings().parallel.nodes;
  const int64_t devices = config.settings().device.count;
  const std::string strategy(llmctl::Name(config.settings().parallel.strategy));
  if (flags.nnodes != nodes) {
    return llmctl::InvalidArgumentError(
        "the trial has nodes: " + std::to_string(nodes) + " but --nnodes is " +
        std::to_string(flags.nnodes) + "; pass --nnodes " + std::to_string(nodes) +
        (nodes > 1 ? " --node-rank K --master-addr HOST --master-port P on each of its "
                     "hosts (HOST and P: node rank 0's)"
                   : ""));
  }
  if (flags.node_rank >= flags.nnodes) {
    return llmctl::InvalidArgumentError("--node-rank " + std::to_string(flags.node_rank) +
                                        " must be below --nnodes " + std::to_string(flags.nnodes));
  }
  if (flags.master_port == 0 && flags.node_rank > 0) {
    return llmctl::InvalidArgumentError(
        "--master-port 0 (a free port picked on this host) is for node rank 0 only: "
        "--node-rank " +
        std::to_string(flags.node_rank) +
        " needs the port node rank 0's launcher chose (master_port in its --ranks-file)");
  }
  if (llmctl::DataParallelRanks(config) < 2 || devices != flags.nproc) {
    return llmctl::InvalidArgumentError(
        "--nproc " + std::to_string(flags.nproc) +
        " starts the ranks of a data-parallel trial: it needs strategy: ddp or fsdp and "
        "devices: " +
        std::to_string(flags.nproc) + " (the trial has strategy: " + strategy +
        ", devices: " + std::to_string(devices) + ", nodes: " + std::to_string(nodes) + ")");
  }
  return llmctl::Status::Ok();
}

llmctl::dist::LaunchSpec LaunchSpecFor(const LauncherFlags& flags, int argc, char** argv) {
  llmctl::dist::LaunchSpec spec;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    bool launcher_flag = false;
    for (const std::string flag :
         {"--nproc", "--master-port", "--ranks-file", "--nnodes", "--node-rank", "--master-addr"}) {
      if (arg == flag) {
        launcher_flag = true;
        ++i;  // its value
      } else if (arg.starts_with(flag + "=")) {
        launcher_flag = true;
      }
    }
    if (!launcher_flag) spec.argv.push_back(arg);
  }
  spec.nproc_per_node = flags.nproc;
  spec.nnodes = flags.nnodes;
  spec.node_rank = flags.node_rank;
  spec.master_addr = flags.master_addr;
  spec.master_port = static_cast<uint16_t>(flags.master_port);
  spec.status_file = flags.ranks_file;
  return spec;
}

llmctl::StatusOr<std::optional<llmctl::dist::RankEnv>> RankEnvFor(
    const llmctl::TrialConfig& config) {
  if (llmctl::DataParallelRanks(config) <= 1) return std::optional<llmctl::dist::RankEnv>();
  auto env = llmctl::dist::RankEnvFromEnvironment();
  if (env.ok()) return std::optional<llmctl::dist::RankEnv>(*env);
  const std::string strategy(llmctl::Name(config.settings().parallel.strategy));
  const int64_t devices = config.settings().device.count;
  const int64_t nodes = config.settings().parallel.nodes;
  const std::string start =
      nodes > 1 ? "nodes: " + std::to_string(nodes) +
                      " spreads them over that many hosts: start each host's share with "
                      "--nproc " +
                      std::to_string(devices) + " --nnodes " + std::to_string(nodes) +
                      " --node-rank K --master-addr HOST --master-port P (HOST and P: node "
                      "rank 0's; node rank 0 may pass --master-port 0)"
                : "start them with --nproc " + std::to_string(devices);
  return llmctl::InvalidArgumentError(
      "strategy: " + strategy + " with devices: " + std::to_string(devices) +
      " runs one rank per device; " + start + " (or torchrun): " + env.status().message());
}

}  // namespace llmctl::llm_train
