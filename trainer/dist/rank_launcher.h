// Starts one node's ranks of a job the way torchrun does (--nnodes M --node-rank K --nproc-per-node
// N): one process per local rank, each told its place through RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, and the node's ranks stopped as soon as one of
// them fails (its peers would otherwise block in a collective until the timeout). A rank on another
// node that fails closes its sockets under this node's ranks, which then fail too.
//
// Not agent/'s process code: that starts one supervised llm-train with its output in log files and
// links gRPC; this starts N peers that share the terminal, and builds where only LibTorch does.
#ifndef LLMCTL_TRAINER_DIST_RANK_LAUNCHER_H_
#define LLMCTL_TRAINER_DIST_RANK_LAUNCHER_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace llmctl::dist {

struct LaunchSpec {
  std::vector<std::string> argv;  // every rank runs this; argv[0] is a path
  int nproc_per_node = 1;         // this node's ranks, N (LOCAL_WORLD_SIZE)
  int nnodes = 1;                 // M: the job has M*N ranks (WORLD_SIZE)
  int node_rank = 0;              // K, 0 <= K < M: local rank l is global rank K*N + l
  // Node rank 0's host, where global rank 0 serves the rendezvous store (on every address of it).
  std::string master_addr = "127.0.0.1";
  // 0, on node rank 0 only: the launcher asks the kernel for a free port and hands rank 0 the
  // listening socket (kMasterListenFdVariable), so two jobs on one host never collide and no port
  // is guessed; the other nodes are then told the port the status file records.
  uint16_t master_port = 29500;
  // When set, the node's record, written atomically: once every local rank has started
  // {"world_size":M*N,"master_port":P,"nnodes":M,"node_rank":K,"nproc_per_node":N,"pids":[...]}
  // (pids in local rank order), and again with "first_failure" once a rank has failed
  // ({"rank":R,"exit_code":C} or {"rank":R,"signal":S}, R its global rank), before the others are
  // stopped. It outlives the launcher, so whoever classifies the job's end (the agent, after a
  // restart too) knows which rank failed first and how, and node rank 0's agent learns the port.
  std::string status_file;
  // After a rank fails, how long the others have to end on SIGTERM before they get SIGKILL.
  std::chrono::milliseconds stop_grace{std::chrono::seconds(3)};
};

// How the first rank to fail ended.
struct RankFailure {
  int rank = -1;      // global
  int exit_code = 0;  // when signal is 0
  int signal = 0;     // non-zero: killed by this signal
};

struct LaunchResult {
  Status status;
  std::optional<RankFailure> first_failure;  // set when a rank failed
};

// Runs spec.nproc_per_node processes of spec.argv (this process's environment plus the rank's
// variables; stdin and stdout shared, stderr a pipe whose bytes this process passes on to its own
// stderr as they come) and waits for all of them. OK when every rank exits 0. Otherwise the first
// rank to fail (a non-zero exit, a signal, or a program that cannot be executed) is named by its
// global rank in the error ("rank R of W exited with code C: <its last stderr line>; the other
// ranks were stopped", the line on one line and cut to 400 bytes, left out when the rank wrote
// none or was killed by a signal), the others are stopped,
// and every rank has been reaped when this returns. InvalidArgument, nothing started, for a spec
// out of range (node_rank outside 0..nnodes-1, or port 0 on a node rank above 0). Ranks die with
// this process too (PR_SET_PDEATHSIG), so none outlives a killed launcher. SIGTERM, SIGINT and
// SIGUSR1 sent to the launcher while it waits are passed on to every rank (a rank gets a signal
// sent to the whole process group twice; llm-train's handlers only set flags). SIGPIPE is ignored
// while it waits: a stderr nobody reads any more (`... 2>&1 | head -1`) loses the ranks' text, not
// the run; each rank starts with SIGPIPE at its default.
//
// "First" is the first failure seen; when the launcher finds several ranks ended in the same look,
// a rank's own failure (killed by a signal, out of memory, diverged, invalid input: exit codes 2,
// 3, 4 or a signal) comes before a plain failure or a stop (1, 5), which is what the peers of a
// dead rank end with when its sockets close under them.
LaunchResult Launch(const LaunchSpec& spec);

// Launch's status.
Status LaunchRanks(const LaunchSpec& spec);

}  // namespace llmctl::dist

#endif  // LLMCTL_TRAINER_DIST_RANK_LAUNCHER_H_
