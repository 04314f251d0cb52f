// llm-agent: the node daemon. Serves the Agent API (proto/llmctl/v1/agent.proto) over mutual TLS,
// runs trials in llm-train workers and serves their event files.
//
//   llm-agent --listen unix:/path|host:port --data-dir DIR --node NAME --ca FILE --cert FILE
//             --key FILE --token-file FILE --llm-train PATH [--cancel-grace-ms N]
//   llm-agent --supervise RUN_DIR --grace-ms N -- PROGRAM ARGS...   (started by the agent itself)
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <iostream>

#include "agent/server.h"
#include "agent/supervisor.h"
#include "rpc/tls.h"

namespace {

int Fail(const std::string& message) {
  std::cerr << "llm-agent: " << message << std::endl;
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == llmctl::agent::kSuperviseFlag) {
    auto command = llmctl::agent::ParseSupervisorArgs(std::vector<std::string>(argv, argv + argc));
    if (!command.ok()) return Fail(command.status().message());
    return llmctl::agent::RunSupervisor(*command);
  }

  CLI::App app{"llm-agent: runs llmctl trials on this node for the controller"};
  llmctl::agent::AgentOptions options;
  std::string ca_file, cert_file, key_file, token_file;
  int64_t cancel_grace_ms = 10000;
  app.add_option("--listen", options.listen, "unix:/path or host:port")->required();
  app.add_option("--data-dir", options.data_dir, "runs and the input cache live here")->required();
  app.add_option("--node", options.node, "node name; the certificate names agent-<node>.llmctl")
      ->required();
  app.add_option("--ca", ca_file, "the controller's CA certificate (PEM)")->required();
  app.add_option("--cert", cert_file, "this agent's certificate (PEM)")->required();
  app.add_option("--key", key_file, "this agent's private key (PEM)")->required();
  app.add_option("--token-file", token_file, "the node's token (a 0600 file)")->required();
  app.add_option("--llm-train", options.llm_train, "the llm-train binary")->required();
  app.add_option("--cancel-grace-ms", cancel_grace_ms,
                 "after SIGTERM, how long a cancelled worker gets before SIGKILL")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  options.cancel_grace = std::chrono::milliseconds(cancel_grace_ms);
  options.hub = llmctl::agent::HubOptionsFromEnvironment();

  auto identity = llmctl::rpc::LoadTlsIdentity(ca_file, cert_file, key_file);
  if (!identity.ok()) return Fail(identity.status().message());
  options.identity = std::move(*identity);
  auto token = llmctl::rpc::ReadTokenFile(token_file);
  if (!token.ok()) return Fail(token.status().message());
  options.token = std::move(*token);
  if (::access(options.llm_train.c_str(), X_OK) != 0) {
    return Fail("--llm-train " + options.llm_train + " is not an executable file");
  }
  char self[PATH_MAX];
  const ssize_t length = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length <= 0) return Fail("cannot find this program's own path in /proc/self/exe");
  options.supervisor_program.assign(self, static_cast<size_t>(length));

  // SIGINT/SIGTERM are taken by sigwait below; blocked before any thread starts, so that every
  // thread inherits the mask and none of them is interrupted.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto server = llmctl::agent::AgentServer::Start(options);
  if (!server.ok()) return Fail(server.status().message());
  std::cerr << "llm-agent: node " << options.node << " listening on " << (*server)->address()
            << ", data in " << options.data_dir << ", models from " << options.hub.endpoint
            << (options.hub.token.empty() ? "" : " (with HF_TOKEN)") << std::endl;
  int signal = 0;
  sigwait(&stop_signals, &signal);
  std::cerr << "llm-agent: stopping (signal " << signal << "); running trials go on" << std::endl;
  (*server)->Shutdown();
  return 0;
}
