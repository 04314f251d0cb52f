// llm-agent: the node daemon. Serves the Agent API (proto/llmctl/v1/agent.proto) over mutual TLS,
// runs trials in llm-train workers and serves their event files.
//
//   llm-agent --listen unix:/path|host:port --data-dir DIR --node NAME --ca FILE --cert FILE
//             --key FILE --token-file FILE --llm-train PATH [--cancel-grace-ms N]
//             [--enrollment-token-file FILE]   (a cloud node: --cert, --key and --token-file are
//                                               written by the enrollment, agent/enrollment.h)
//   llm-agent --supervise RUN_DIR --grace-ms N -- PROGRAM ARGS...   (started by the agent itself)
//
// Its exit codes are common/daemon_exit.h's, which llmctl reports when it starts llm-agent as the
// embedded agent: 2 for refused flags or files (its credentials, token, llm-train, a --listen
// path that is not a socket), 1 when it could not serve (nor finish a certificate renewal a crash
// interrupted).
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>

#include "agent/certificate_renewal.h"
#include "agent/enrollment.h"
#include "agent/server.h"
#include "agent/supervisor.h"
#include "common/daemon_exit.h"
#include "common/files.h"
#include "common/logging.h"
#include "rpc/tls.h"

namespace {

namespace daemon_exit = llmctl::daemon_exit;

// Logs `message` and returns `code` (daemon_exit's) for main to exit with.
int Fail(const std::string& message, int code) {
  std::cerr << llmctl::LogLinePrefix(llmctl::LogLevel::kError) << "llm-agent: " << message
            << std::endl;
  return code;
}

// Reads the enrollment token and the CA into `options`: the files the enrollment needs, refused
// before anything serves.
llmctl::Status LoadEnrollmentFiles(llmctl::agent::EnrollmentOptions& options,
                                   const std::string& enrollment_token_file,
                                   const std::string& ca_file) {
  ASSIGN_OR_RETURN(options.enrollment_token, llmctl::rpc::ReadTokenFile(enrollment_token_file));
  llmctl::StatusOr<std::string> ca_pem = llmctl::ReadFileToString(ca_file, 1 << 20);
  if (!ca_pem.ok()) return ca_pem.status().WithContext("--ca " + ca_file);
  options.ca_pem = std::move(*ca_pem);
  return llmctl::Status::Ok();
}

// Serves the enrollment until the controller has handed over the node's credentials (then
// `listen` becomes the address it served on, for the Agent service) or a stop signal came (then
// `stopped`). `options` as LoadEnrollmentFiles completed them.
llmctl::Status Enroll(llmctl::agent::EnrollmentOptions options, const sigset_t& stop_signals,
                      std::string& listen, bool& stopped) {
  auto server = llmctl::agent::EnrollmentServer::Start(std::move(options));
  if (!server.ok()) return server.status();
  std::cerr << llmctl::LogLinePrefix(llmctl::LogLevel::kInfo) << "llm-agent: waiting on "
            << (*server)->address() << " for the controller to enroll this node" << std::endl;
  const timespec poll{0, 200'000'000};
  while (!(*server)->done()) {
    if (sigtimedwait(&stop_signals, nullptr, &poll) > 0) {
      stopped = true;
      return llmctl::Status::Ok();
    }
  }
  listen = (*server)->address();
  (*server)->Shutdown();
  return llmctl::Status::Ok();
}

// The agent's command line: its options, and the files its identity and tokens are read from.
struct CommandLine {
  llmctl::agent::AgentOptions options;
  std::string ca_file, cert_file, key_file, token_file, enrollment_token_file;
};

// With an enrollment token and no identity yet, serves the enrollment (Enroll) and sets
// `line.options.listen` to where the Agent service then listens. Returns the exit code when the
// process ends here (files refused, the enrollment failed, a stop signal came); none to go on.
std::optional<int> EnrollWhenAsked(CommandLine& line, const sigset_t& stop_signals) {
  if (line.enrollment_token_file.empty() || llmctl::agent::Enrolled(line.token_file)) {
    return std::nullopt;
  }
  llmctl::agent::AgentOptions& options = line.options;
  llmctl::agent::EnrollmentOptions enrollment{.listen = options.listen,
                                              .node = options.node,
                                              .ca_pem = {},
                                              .enrollment_token = {},
                                              .certificate_file = line.cert_file,
                                              .private_key_file = line.key_file,
                                              .token_file = line.token_file};
  const llmctl::Status loaded =
      LoadEnrollmentFiles(enrollment, line.enrollment_token_file, line.ca_file);
  if (!loaded.ok()) return Fail(loaded.message(), daemon_exit::kConfigRefused);
  bool stopped = false;
  const llmctl::Status enrolled =
      Enroll(std::move(enrollment), stop_signals, options.listen, stopped);
  if (!enrolled.ok()) return Fail(enrolled.message(), daemon_exit::kFailed);
  if (stopped) return daemon_exit::kOk;
  return std::nullopt;
}

// Defines the agent's flags on `app`, writing into `line`.
void DefineFlags(CLI::App& app, CommandLine& line, int64_t& cancel_grace_ms) {
  llmctl::agent::AgentOptions& options = line.options;
  app.add_option("--listen", options.listen, "unix:/path or host:port")->required();
  app.add_option("--data-dir", options.data_dir, "runs and the input cache live here")->required();
  app.add_option("--node", options.node, "node name; the certificate names agent-<node>.llmctl")
      ->required();
  app.add_option("--ca", line.ca_file, "the controller's CA certificate (PEM)")->required();
  app.add_option("--cert", line.cert_file, "this agent's certificate (PEM)")->required();
  app.add_option("--key", line.key_file, "this agent's private key (PEM)")->required();
  app.add_option("--token-file", line.token_file, "the node's token (a 0600 file)")->required();
  app.add_option("--enrollment-token-file", line.enrollment_token_file,
                 "a one-time enrollment token (0600): until --token-file exists, wait for the "
                 "controller to enroll this node and write --cert, --key and --token-file");
  app.add_option("--llm-train", options.llm_train, "the llm-train binary")->required();
  app.add_option("--rate-probe-file", options.adoptable_rate_probe,
                 "a probe of this machine by this llm-train (llmctl's LLMCTL_HOME/probe.json), "
                 "taken as the node's rates instead of measuring them again when none are kept");
  // Bounded by what the supervisor takes (it refuses a longer grace, and adds it to its clock).
  app.add_option("--cancel-grace-ms", cancel_grace_ms,
                 "after SIGTERM, how long a cancelled worker gets before SIGKILL")
      ->check(CLI::Range(int64_t{0}, int64_t{llmctl::agent::kMaxSupervisorGrace.count()}));
}

// SIGINT and SIGTERM, blocked in the calling thread (and so in every thread started after it),
// for sigwait to take.
sigset_t BlockStopSignals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  return stop_signals;
}

// Completes `line.options` from the files it names, which are the command line's to get right:
// the TLS identity (its files in options.identity_files), the node's token, and llm-train.
llmctl::Status LoadFromFiles(CommandLine& line) {
  llmctl::agent::AgentOptions& options = line.options;
  // Checked here: gRPC's file watcher only logs files it cannot use.
  ASSIGN_OR_RETURN(options.identity,
                   llmctl::rpc::LoadTlsIdentity(line.ca_file, line.cert_file, line.key_file));
  ASSIGN_OR_RETURN(options.token, llmctl::rpc::ReadTokenFile(line.token_file));
  // Absolute: the supervisor starts each worker in its run's directory, where a relative path
  // from the command line names nothing.
  std::error_code error;
  options.data_dir = std::filesystem::absolute(options.data_dir, error).string();
  options.llm_train = std::filesystem::absolute(options.llm_train, error).string();
  if (::access(options.llm_train.c_str(), X_OK) != 0) {
    return llmctl::InvalidArgumentError("--llm-train " + options.llm_train +
                                        " is not an executable file");
  }
  return llmctl::Status::Ok();
}

// This program's own path, which the agent starts as each run's supervisor.
llmctl::StatusOr<std::string> OwnPath() {
  char self[PATH_MAX];
  const ssize_t length = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length <= 0) {
    return llmctl::InternalError("cannot find this program's own path in /proc/self/exe");
  }
  return std::string(self, static_cast<size_t>(length));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == llmctl::agent::kSuperviseFlag) {
    auto command = llmctl::agent::ParseSupervisorArgs(std::vector<std::string>(argv, argv + argc));
    if (!command.ok()) return Fail(command.status().message(), daemon_exit::kConfigRefused);
    return llmctl::agent::RunSupervisor(*command);
  }

  CLI::App app{"llm-agent: runs llmctl trials on this node for the controller"};
  CommandLine line;
  int64_t cancel_grace_ms = 10000;
  DefineFlags(app, line, cancel_grace_ms);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return daemon_exit::OfFlagParse(app.exit(error));
  }
  llmctl::agent::AgentOptions& options = line.options;
  options.cancel_grace = std::chrono::milliseconds(cancel_grace_ms);
  options.hub = llmctl::agent::HubOptionsFromEnvironment();
  // LLMCTL_RATE_PROBE=off (which every test sets) leaves the node's rates unmeasured.
  const char* rate_probe = std::getenv("LLMCTL_RATE_PROBE");
  options.measure_rates = rate_probe == nullptr || std::string_view(rate_probe) != "off";

  // Before any thread starts, so that none of them is interrupted.
  const sigset_t stop_signals = BlockStopSignals();
  if (const std::optional<int> ended = EnrollWhenAsked(line, stop_signals)) return *ended;
  options.identity_files = {.ca_file = line.ca_file,
                            .certificate_file = line.cert_file,
                            .private_key_file = line.key_file};
  // A renewal a crash interrupted is finished before the identity is read: renaming or removing
  // its files fails on this machine (a read-only disk), not on the command line.
  if (const llmctl::Status finished =
          llmctl::agent::FinishInterruptedRenewal(options.identity_files);
      !finished.ok()) {
    return Fail(finished.message(), daemon_exit::kFailed);
  }
  if (const llmctl::Status loaded = LoadFromFiles(line); !loaded.ok()) {
    return Fail(loaded.message(), daemon_exit::kConfigRefused);
  }
  llmctl::StatusOr<std::string> self = OwnPath();
  if (!self.ok()) return Fail(self.status().message(), daemon_exit::kFailed);
  options.supervisor_program = std::move(*self);

  auto server = llmctl::agent::AgentServer::Start(options);
  if (!server.ok()) {
    // Its InvalidArgument is its options' (--listen naming something that is not a socket); the
    // rest is this machine's (the data directory, an address it cannot listen on).
    return Fail(server.status().message(),
                server.status().code() == llmctl::StatusCode::kInvalidArgument
                    ? daemon_exit::kConfigRefused
                    : daemon_exit::kFailed);
  }
  std::cerr << llmctl::LogLinePrefix(llmctl::LogLevel::kInfo) << "llm-agent: node " << options.node
            << " listening on " << (*server)->address() << ", data in " << options.data_dir
            << ", models from " << options.hub.endpoint
            << (options.hub.token.empty() ? "" : " (with HF_TOKEN)") << std::endl;
  int signal = 0;
  sigwait(&stop_signals, &signal);
  std::cerr << llmctl::LogLinePrefix(llmctl::LogLevel::kInfo) << "llm-agent: stopping (signal "
            << signal << "); running trials go on" << std::endl;
  (*server)->Shutdown();
  return daemon_exit::kOk;
}
