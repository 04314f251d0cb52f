// The embedded default (../shared/DESIGN.md): with no controller configured, llmctl runs llmctld
// and a local llm-agent itself, in the background, on unix sockets in its data directory D:
//
//   D/controller.sock, D/llmctld.pid, D/logs/llmctld.log       llmctld --data-dir D --listen
//   unix:D/controller.sock D/agent.sock, D/llm-agent.pid, D/logs/llm-agent.log        llm-agent
//   --node local, its data in D/agent D/agent/tls/{ca.crt,agent.crt,agent.key,token} (0600) from
//   RegisterNode("local", ...) the first time
//
// Each is detached and found again by its pid file as daemon_process.h says; a pid file of another
// llmctl's daemon (upgraded or moved while its daemons ran) is refused by name until `llmctl daemon
// stop` ends it. Starts and stops are serialised by a lock file, so two commands at once start one
// pair, and a stop waits for a start under way.
#ifndef LLMCTL_CONTROLLER_CLI_DAEMONS_H_
#define LLMCTL_CONTROLLER_CLI_DAEMONS_H_

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "controller/cli/address.h"
#include "controller/cli/daemon_process.h"
#include "llmctl/v1/controller.pb.h"

namespace llmctl::cli {

// What an embedded daemon gets to end on SIGTERM before it is killed: `llmctl daemon stop`'s, and a
// start's for an llmctld it started and then refused.
inline constexpr std::chrono::seconds kDaemonStopGrace{10};

// The node the embedded controller knows its local llm-agent by: this machine.
inline constexpr char kLocalNode[] = "local";

struct DaemonBinaries {
  std::filesystem::path llmctld;
  std::filesystem::path llm_agent;
  std::filesystem::path llm_train;
};

// LLMCTL_LLMCTLD_BIN, LLMCTL_AGENT_BIN, LLMCTL_TRAIN_BIN when set; otherwise beside `self` (an
// install: every binary in one folder) or in the build tree around it (build/controller/cli/llmctl,
// build/controller/llmctld, build/agent/llm-agent, build/trainer/llm-train). NotFound naming what
// is missing and the override to set.
StatusOr<DaemonBinaries> LocateDaemonBinaries(const std::filesystem::path& self,
                                              const EnvLookup& env);

// The embedded pair in one data directory.
class EmbeddedDaemons {
 public:
  EmbeddedDaemons(std::filesystem::path data_dir, DaemonBinaries binaries);

  std::string controller_target() const;  // "unix:D/controller.sock"
  std::string agent_target() const;       // "unix:D/agent.sock"

  // Starts whatever is not running, waits for the controller to answer, registers the local agent
  // the first time (credentials into D/agent/tls, 0600), waits for an agent it starts to listen,
  // and, after starting either, for the controller to reach the agent (WaitForLocalNode), all
  // within `ready_timeout`. Unavailable naming the daemon's log when it
  // runs but does not answer (llmctld) or listen (llm-agent) in time. When either exits at start,
  // its exit code (common/daemon_exit.h) and what it wrote to its log, which says why:
  // InvalidArgument when it refused its configuration (llmctl exits 2, as the daemon did),
  // FailedPrecondition otherwise (llmctld refused D, another llmctld holds it; llmctl exits 1).
  // FailedPrecondition naming both versions, at its first answer, when it is another llmctl
  // version's (LLMCTL_LLMCTLD_BIN, or one left running by an earlier llmctl: rpc/version_check.h);
  // one this call started is stopped, and the message says so where the refusal said to run
  // `llmctl daemon stop`, which is left to stop one that ran before.
  // FailedPrecondition, before anything starts, when a daemon of D runs another llmctl's binary
  // (llmctl upgraded or moved while its daemons ran), naming both binaries and `llmctl daemon
  // stop`: a second daemon beside it would take its socket, and a second agent would manage the
  // same runs. InvalidArgument, before anything is made or started, when D is too long for its
  // sockets' paths (CheckSocketPathsFit).
  Status EnsureRunning(std::chrono::milliseconds ready_timeout);

  // Ends the agent, then the controller (SIGTERM, up to `grace` each), another llmctl's too
  // (FindDaemon), after a start under way (EnsureRunning) has ended. Lines saying what it did, and,
  // when the agent was running, that the trials already running go on; the lock file's error when
  // it cannot be taken.
  StatusOr<std::vector<std::string>> Stop(std::chrono::milliseconds grace);

  // One line for each running daemon whose binary was rebuilt or replaced since it started (an
  // llmctl upgraded in place while its daemons ran): it still runs the earlier code, which this
  // llmctl's commands would reach; says how to restart it. Notes, not refusals: a rebuild in the
  // tree under a running daemon is routine, and the daemon still serves.
  std::vector<std::string> ReplacedBinaryNotes() const;

  // One line per daemon: running (pid, and the binary when another llmctl's) or stopped, with its
  // socket and log.
  std::vector<std::string> Describe() const;

  // What EnsureRunning starts: llmctld's and llm-agent's command lines, pid files and logs.
  DaemonSpec ControllerSpec() const;
  DaemonSpec AgentSpec() const;

 private:
  // InvalidArgument when a daemon's socket path (D/controller.sock, D/agent.sock) is longer than a
  // unix socket's path may be (sun_path's 108 bytes with the terminating NUL): its length, the
  // limit, and the shorter LLMCTL_HOME to choose.
  Status CheckSocketPathsFit() const;
  // `started`: the controller when this call started it, to learn its exit code should it end;
  // null when it ran already.
  Status WaitForController(pid_t pid, StartedDaemon* started,
                           std::chrono::steady_clock::time_point give_up) const;
  // Waits for the agent EnsureRunning started to make its socket, D/agent.sock; its exit code and
  // log when it ends first.
  Status WaitForAgent(StartedDaemon& started, std::chrono::steady_clock::time_point give_up) const;
  // Once this start started a daemon: waits until the controller has the local node connected (or
  // unusable), at most until `give_up`. Its first health check came before the agent listened, and
  // the next one comes within its backoff (a second): a command right after the start that needs
  // the node (fetch, resume, nodes) found it "not connected". Not reached in time: the command
  // says so.
  void WaitForLocalNode(std::chrono::steady_clock::time_point give_up) const;
  // EnsureRunning's FailedPrecondition for a daemon of `spec` that runs another binary.
  static Status RefuseAnotherInstall(const DaemonSpec& spec);
  Status RegisterLocalAgent() const;

  const std::filesystem::path data_dir_;
  const DaemonBinaries binaries_;
};

// Writes a RegisterNode response where the agent reads it: ca.crt, agent.crt, agent.key and token
// in `tls_dir` (created 0700), each 0600, written whole before being renamed into place.
Status WriteAgentCredentials(const v1::NodeCredentials& credentials,
                             const std::filesystem::path& tls_dir);

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_DAEMONS_H_
