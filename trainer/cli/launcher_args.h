// What llm-train's launcher flags (--nproc and those that place this host's ranks) mean for a
// trial, and where a rank of a data-parallel trial sits: apart from the command line that reads
// them (trainer/llm_train_main.cc), so that their rules are tested without starting a process.
//
// No LibTorch.
#ifndef LLMCTL_TRAINER_CLI_LAUNCHER_ARGS_H_
#define LLMCTL_TRAINER_CLI_LAUNCHER_ARGS_H_

#include <optional>
#include <string>

#include "common/status.h"
#include "common/trial_config.h"
#include "trainer/dist/rank_env.h"
#include "trainer/dist/rank_launcher.h"

namespace llmctl::llm_train {

// The flags that make this process the launcher of this host's ranks rather than a rank.
struct LauncherFlags {
  int nproc = 0;  // 0: not the launcher
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string ranks_file;
};

// InvalidArgument when the launcher's flags do not fit `config`: its nodes, the node rank among
// them, the port only node rank 0 may pick, and a data-parallel trial of --nproc devices.
Status CheckLauncherFlags(const LauncherFlags& flags, const TrialConfig& config);

// What the launcher starts: this command's argv without the launcher's flags, placed by them.
dist::LaunchSpec LaunchSpecFor(const LauncherFlags& flags, int argc, char** argv);

// A rank of a data-parallel trial: its place, from what the launcher (or torchrun) put in its
// environment; nullopt for a trial of one rank.
StatusOr<std::optional<dist::RankEnv>> RankEnvFor(const TrialConfig& config);

}  // namespace llmctl::llm_train

#endif  // LLMCTL_TRAINER_CLI_LAUNCHER_ARGS_H_
