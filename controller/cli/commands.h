// The `llmctl` command line: submit, estimate, status, watch, cancel, resume, report, fetch, nodes,
// daemon, lease and node (controller/openstack/lease_cli.h and node_cli.h, same exit codes).
//
// Exit codes (stable; scripts rely on them):
//   0  success
//   1  a trial ended other than its `expect:` says, or without one failed, was refused as
//      invalid, diverged or was cancelled (submit --wait, resume --wait); or an operation failed
//   2  invalid input: a bad flag, experiment file, input file (data, tokenizer, model, adapter),
//      format, id or trial name (nothing was stored or sent); for resume also a trial that cannot
//      be resumed (still running, ended ok, no checkpoint, its node removed), saying why
//   3  the controller is unreachable (or the embedded one could not be started); for lease and node
//      commands also the cloud, when it did not answer (`node down` still deletes the node's cloud
//      resources when only the controller is unreachable, and says to run it again)
#ifndef LLMCTL_CONTROLLER_CLI_COMMANDS_H_
#define LLMCTL_CONTROLLER_CLI_COMMANDS_H_

#include <chrono>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "common/status.h"
#include "controller/cli/address.h"
#include "controller/openstack/cloud_clock.h"

namespace llmctl::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitInvalidInput = 2;
inline constexpr int kExitUnreachable = 3;

// The exit code for a failed operation's status: 2 for the caller's mistakes (InvalidArgument,
// NotFound, AlreadyExists, OutOfRange), 3 for Unavailable and DeadlineExceeded, 1 otherwise.
int ExitCodeFor(const Status& status);

// What a command reads and writes besides its arguments, so tests run commands in-process.
struct CliContext {
  EnvLookup env;
  std::ostream& out;
  std::ostream& err;
  bool out_is_tty = false;
  std::filesystem::path self;  // this executable, to find llmctld and llm-agent beside it
  // How long the embedded controller may take to answer after it is started.
  std::chrono::milliseconds daemon_ready_timeout{30000};
  // Between reconnects of a watch whose controller went away.
  std::chrono::milliseconds watch_retry_interval{1000};
  // How often `nodes --measure NODE --wait` asks the controller how the node's probe goes, and
  // how long it waits on a node that shows no probe underway and no new rates (its agent restarted
  // and forgot the ask, or the controller has not reached it since its own restart).
  std::chrono::milliseconds rates_poll_interval{1000};
  std::chrono::milliseconds rates_unchanged_timeout{30000};
  // The cloud commands' clock (lease --wait, node up's polling); null: the system's.
  openstack::CloudClock* cloud_clock = nullptr;
  // How long `node up` waits for the controller to reach the node's agent (cloud-init installs
  // Docker and the agent image first), and how often it asks.
  std::chrono::milliseconds agent_ready_timeout = std::chrono::minutes(30);
  std::chrono::milliseconds agent_poll_interval = std::chrono::seconds(5);
};

// The lease (and node) `submit --provision` makes for an experiment named `experiment` with
// target flavor `flavor`: "llmctl-<experiment>-<flavor>" in lower case, other characters as '-',
// at most 63 characters (a DNS label, as the node's certificate name needs).
std::string ProvisionLeaseName(std::string_view experiment, std::string_view flavor);

// Runs one command line (args[0] is the program name) and returns its exit code: kExitFailed
// when the command succeeded but its output could not be written.
int RunLlmctl(const std::vector<std::string>& args, CliContext& context);

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_COMMANDS_H_
