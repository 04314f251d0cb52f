// llmctld: the controller daemon. See controller/daemon.h and controller/config.h; its exit codes,
// which llmctl reports when it starts llmctld as the embedded controller: common/daemon_exit.h.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "common/daemon_exit.h"
#include "common/logging.h"
#include "controller/config.h"
#include "controller/daemon.h"

namespace {

std::optional<std::string> Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::nullopt : std::optional<std::string>(value);
}

}  // namespace

int main(int argc, char** argv) {
  llmctl::ConfigureLogging();
  using namespace llmctl::controller;
  namespace daemon_exit = llmctl::daemon_exit;
  CLI::App app("llmctld: the llmctl controller (experiments, agents, reports)");
  ControllerOverrides overrides;
  app.add_option("--data-dir", overrides.data_dir,
                 "Data directory (default ~/.local/share/llmctl)");
  app.add_option("--listen", overrides.listen,
                 "unix:/path/controller.sock (default: in the data directory) or 127.0.0.1:PORT");
  app.add_option("--config", overrides.config_file, "YAML config file");
  app.add_option("--token-file", overrides.token_file,
                 "0600 file holding the API token that calls on a TCP listen address must carry "
                 "(required there; LLMCTL_CONTROLLER_TOKEN_FILE)");
  app.add_flag("--allow-remote-listen", overrides.allow_remote_listen,
               "Allow a listen address other than loopback (the token travels without TLS)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return daemon_exit::OfFlagParse(app.exit(error));
  }
  overrides.env_controller = Env("LLMCTL_CONTROLLER");
  overrides.env_token_file = Env("LLMCTL_CONTROLLER_TOKEN_FILE");
  overrides.env_home = Env("HOME");
  overrides.env_xdg_data_home = Env("XDG_DATA_HOME");

  auto config = ResolveControllerConfig(overrides);
  if (!config.ok()) {
    std::cerr << llmctl::LogLinePrefix(llmctl::LogLevel::kError)
              << "llmctld: " << config.status().message() << std::endl;
    return daemon_exit::kConfigRefused;
  }
  // Blocked before any thread starts, so that only the waiter below receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  SystemClock clock;
  auto daemon = Daemon::Start(*config, clock);
  if (!daemon.ok()) {
    std::cerr << llmctl::LogLinePrefix(llmctl::LogLevel::kError)
              << "llmctld: " << daemon.status().ToString() << std::endl;
    return daemon_exit::kFailed;
  }
  std::thread waiter([&] {
    int received = 0;
    sigwait(&signals, &received);
    // The log says why llmctld ended, as llm-agent's does: a stop, not a crash.
    spdlog::info("llmctld: stopping (signal {})", received);
    (*daemon)->Shutdown();
  });
  (*daemon)->Wait();
  waiter.join();
  return daemon_exit::kOk;
}
