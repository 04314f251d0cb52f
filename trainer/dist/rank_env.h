// Where this process sits in a distributed job, read from the variables torchrun sets.
//
// No LibTorch: a launcher (llm-c10d-check, later llm-train's) writes these variables and a rank
// reads them; both sides use the names below.
#ifndef LLMCTL_TRAINER_DIST_RANK_ENV_H_
#define LLMCTL_TRAINER_DIST_RANK_ENV_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace llmctl::dist {

struct RankEnv {
  int rank = 0;        // RANK: 0 .. world_size-1, across all nodes
  int local_rank = 0;  // LOCAL_RANK: this rank's index on its node (its GPU)
  int world_size = 1;  // WORLD_SIZE
  // LOCAL_WORLD_SIZE, the ranks on this node; torchrun sets it, other launchers may not.
  std::optional<int> local_world_size;
  std::string master_addr;   // MASTER_ADDR: the host of rank 0, which serves the rendezvous store
  uint16_t master_port = 0;  // MASTER_PORT
};

// A variable's value, or nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;

// Reads RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (all required) and LOCAL_WORLD_SIZE
// (optional) through `lookup`. InvalidArgument naming the variable and its value when one is
// missing, not a whole number, or out of range (RANK below WORLD_SIZE, LOCAL_RANK below
// LOCAL_WORLD_SIZE, MASTER_PORT in 1..65535).
StatusOr<RankEnv> ParseRankEnv(const EnvLookup& lookup);

// ParseRankEnv over this process's environment.
StatusOr<RankEnv> RankEnvFromEnvironment();

// The variables above as NAME=VALUE entries, for a launcher to add to a rank's environment.
std::vector<std::string> RankEnvVariables(const RankEnv& env);

// Set by llm-train's launcher for rank 0 when it chose MASTER_PORT itself (--master-port 0): the
// number of an inherited descriptor already listening on MASTER_PORT, which rank 0 serves the
// rendezvous store on instead of binding the port again. The port is never free in between, so two
// jobs on one host cannot both take it.
inline constexpr char kMasterListenFdVariable[] = "LLMCTL_MASTER_LISTEN_FD";

// Binds and listens on `port` for every address of this host (IPv6 with IPv4-mapped addresses, or
// IPv4 only), close-on-exec; port 0 asks the kernel for a free one (see ListeningPort).
// FailedPrecondition naming MASTER_PORT when the port is in use.
StatusOr<int> ListenOnMasterPort(uint16_t port);

// The port a listening socket is bound to; 0 when it cannot be read.
uint16_t ListeningPort(int fd);

}  // namespace llmctl::dist

#endif  // LLMCTL_TRAINER_DIST_RANK_ENV_H_
