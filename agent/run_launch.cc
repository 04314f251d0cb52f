#include "agent/run_launch.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iostream>
#include <optional>
#include <string_view>

#include "agent/run_files.h"
#include "agent/socket_interface.h"
#include "agent/supervisor.h"
#include "common/logging.h"
#include "common/rank_files.h"
#include "common/run_command.h"
#include "common/text.h"

extern char** environ;

namespace llmctl::agent {
namespace {

// For a process that names GPUs by NVML's indices, which count in PCI bus order: CUDA's own default
// order puts the fastest device first, so on a node of mixed GPUs CUDA's index 1 would name another
// card than NVML's.
constexpr std::string_view kNvmlDeviceOrder = "CUDA_DEVICE_ORDER=PCI_BUS_ID";

// The agent's environment less the variables a launch sets itself, each named as "NAME=".
std::vector<std::string> AgentEnvironmentWithout(std::initializer_list<std::string_view> set_here) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (std::none_of(set_here.begin(), set_here.end(),
                     [&](std::string_view name) { return entry.starts_with(name); })) {
      env.emplace_back(entry);
    }
  }
  return env;
}

}  // namespace

std::vector<std::string> WorkerArgv(const WorkerLaunch& launch) {
  const std::string& dir = launch.run_dir;
  const TrialFile& trial_file = launch.trial_file;
  std::vector<std::string> argv = {launch.llm_train, "--config", dir + "/" + kTrialFile, "--events",
                                   dir + "/" + kEventsFile};
  for (const auto& [path, written] : trial_file.input_names) {
    argv.insert(argv.end(), {"--input-name", InputNameArgument(path, written)});
  }
  if (!launch.resume_checkpoint.empty()) {
    argv.insert(argv.end(), {"--resume", launch.resume_checkpoint});
  }
  const NodeGroup& group = launch.group;
  if (group.nodes > 1) {
    // This node's ranks are global ranks node_rank x ranks on. Node rank 0's launcher binds a free
    // port as below (RunState.master_port reports it) and its rank 0 listens on all of the host's
    // addresses, its local peers coming over loopback; the others meet it at its address and port.
    const bool first_node = group.node_rank == 0;
    argv.insert(argv.end(),
                {"--nproc", std::to_string(trial_file.ranks), "--nnodes",
                 std::to_string(group.nodes), "--node-rank", std::to_string(group.node_rank),
                 "--master-addr", first_node ? "127.0.0.1" : group.master_addr, "--master-port",
                 std::to_string(first_node ? 0 : group.master_port), "--ranks-file",
                 dir + "/" + kRanksFile});
  } else if (trial_file.ranks > 1) {
    // llm-train's launcher starts the ranks under this one worker (its process group, so the
    // supervisor's signals and its final SIGKILL reach them all); port 0: it takes a free port
    // from the kernel and hands rank 0 the listening socket, so trials on one node never collide.
    argv.insert(argv.end(), {"--nproc", std::to_string(trial_file.ranks), "--master-port", "0",
                             "--ranks-file", dir + "/" + kRanksFile});
  }
  return argv;
}

std::vector<std::string> WorkerEnvironment(const WorkerLaunch& launch, const std::string& run) {
  std::vector<std::string> env =
      AgentEnvironmentWithout({"CUDA_VISIBLE_DEVICES=", "CUDA_DEVICE_ORDER=", "LLMCTL_CACHE_DIR="});
  // llm-train's token cache lives in the agent's cache, next to the inputs it was made from.
  env.push_back("LLMCTL_CACHE_DIR=" + launch.cache_dir);
  // A multi-node trial's ranks talk over the interface that reaches node rank 0
  // (socket_interface.h), unless the agent's own environment names one.
  const NodeGroup& group = launch.group;
  if (group.nodes > 1 && !group.master_addr.empty()) {
    std::optional<StatusOr<std::string>> interface;  // resolved once, when a variable needs it
    for (const char* variable : {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"}) {
      if (std::getenv(variable) != nullptr) continue;
      if (!interface.has_value()) interface = InterfaceReaching(group.master_addr);
      if (interface->ok()) {
        env.push_back(std::string(variable) + "=" + **interface);
      } else {
        std::cerr << LogLinePrefix(LogLevel::kWarning) << "llm-agent: " << run << ": " << variable
                  << " left to the backend: " << interface->status().message() << std::endl;
      }
    }
  }
  if (launch.trial_file.device == "cuda") {
    std::string devices;
    for (int index : launch.device_indices) {
      devices += (devices.empty() ? "" : ",") + std::to_string(index);
    }
    env.push_back("CUDA_VISIBLE_DEVICES=" + devices);
    // The indices are NVML's: those of the cards the controller placed the trial on and the agent
    // samples.
    env.emplace_back(kNvmlDeviceOrder);
  }
  return env;
}

std::vector<std::string> ProbeEnvironment(const std::string& device) {
  std::vector<std::string> env = AgentEnvironmentWithout({"CUDA_DEVICE_ORDER="});
  // The probe measures CUDA's device 0 and names it by NVML's device 0.
  if (device == "cuda") env.emplace_back(kNvmlDeviceOrder);
  return env;
}

StatusOr<pid_t> SpawnSupervisor(const std::vector<std::string>& argv,
                                const std::vector<std::string>& env, const std::string& log) {
  std::vector<char*> argv_c;
  for (const std::string& a : argv) argv_c.push_back(const_cast<char*>(a.c_str()));
  argv_c.push_back(nullptr);
  std::vector<char*> env_c;
  for (const std::string& e : env) env_c.push_back(const_cast<char*>(e.c_str()));
  env_c.push_back(nullptr);

  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  // A new session: the supervisor leaves the agent's process group and terminal, so neither a
  // signal to the agent's group nor the agent's exit reaches it.
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSID);
  StartWithDefaultSignals(attributes);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int spawned =
      ::posix_spawn(&pid, argv_c[0], &actions, &attributes, argv_c.data(), env_c.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (spawned != 0) {
    return UnavailableError("cannot start the supervisor " + argv[0] + ": " +
                            std::strerror(spawned));
  }
  return pid;
}

}  // namespace llmctl::agent
