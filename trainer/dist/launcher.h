// Starts the ranks of a single-node job the way torchrun does: one process per rank, each told its
// place through RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, and
// the whole job stopped as soon as one rank fails (its peers would otherwise block in a collective
// until the timeout).
//
// Not agent/'s process code: that starts one supervised llm-train with its output in log files and
// links gRPC; this starts N peers that share the terminal, and builds where only LibTorch does.
#ifndef LLMCTL_TRAINER_DIST_LAUNCHER_H_
#define LLMCTL_TRAINER_DIST_LAUNCHER_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace llmctl::dist {

struct LaunchSpec {
  std::vector<std::string> argv;  // every rank runs this; argv[0] is a path
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 29500;
  // After a rank fails, how long the others have to end on SIGTERM before they get SIGKILL.
  std::chrono::milliseconds stop_grace{std::chrono::seconds(3)};
};

// Runs spec.world_size processes of spec.argv (this process's environment plus the rank's
// variables; stdin, stdout and stderr shared) and waits for all of them. OK when every rank exits
// 0. Otherwise the first rank to fail (a non-zero exit, a signal, or a program that cannot be
// executed) is named in the error, the others are stopped, and every rank has been reaped when this
// returns. Ranks die with this process too (PR_SET_PDEATHSIG), so none outlives a killed launcher.
Status LaunchRanks(const LaunchSpec& spec);

}  // namespace llmctl::dist

#endif  // LLMCTL_TRAINER_DIST_LAUNCHER_H_
