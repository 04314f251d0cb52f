// Test support: `llmctl` run in-process for the commands that need no controller (estimate,
// plan), with an environment of the test's (empty unless it sets one, but for HOME), in a fresh
// directory per test, its output captured.
#ifndef LLMCTL_CONTROLLER_CLI_OFFLINE_CLI_TEST_H_
#define LLMCTL_CONTROLLER_CLI_OFFLINE_CLI_TEST_H_

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/estimate/gpus.h"
#include "common/estimate/rate_probe.h"
#include "controller/cli/commands.h"

namespace llmctl::cli::testing {

// A CliContext for in-process tests: `env` as the environment, with `dir` as HOME where `env`
// gives none, no terminal, `dir` as the executable's directory, and short waits, so a controller
// that does not answer fails fast. Without HOME llmctl takes the password database's home, where
// a machine that has run llmctl keeps a probe.json every estimate would use and a config.yaml
// whose `controller:` outranks the embedded daemons.
inline CliContext TestCliContext(EnvLookup env, std::ostream& out, std::ostream& err,
                                 const std::filesystem::path& dir) {
  return CliContext{
      .env = [env = std::move(env),
              home = dir.string()](std::string_view name) -> std::optional<std::string> {
        std::optional<std::string> value = env(name);
        if (!value.has_value() && name == "HOME") return home;
        return value;
      },
      .out = out,
      .err = err,
      .out_is_tty = false,
      .self = dir / "llmctl",
      .daemon_ready_timeout = std::chrono::milliseconds(100),
      .watch_retry_interval = std::chrono::milliseconds(1),
      .rates_poll_interval = std::chrono::milliseconds(1),
      .rates_unchanged_timeout = std::chrono::milliseconds(200),
  };
}

// The pid of a process that has ended (forked, exited and reaped), as the name of a temporary
// holds when its writer was killed mid-write.
inline pid_t PidOfAnEndedProcess() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  return child;
}

// A probe of the H200 as llm-train --probe --probe-device cuda writes it, every rate `speed` times
// the first's and each launch 1/`speed` of its time.
inline estimate::RateProbe H200Probe(double speed) {
  estimate::RateProbe probe;
  probe.measured_at = "2026-11-30T06:00:00Z";
  probe.seconds = 20;
  probe.rounds = 5;
  probe.device = "cuda";
  for (const estimate::Gpu& gpu : estimate::KnownGpus()) {
    if (gpu.name == "h200-141gb") probe.device_name = gpu.model;
  }
  probe.threads = 16;
  probe.versions.llmctl = "0.4.0";
  probe.versions.libtorch = "2.11.0";
  for (const int64_t size : {1024, 4096}) {
    probe.matmul.push_back({"fp32", size, speed * 4e13, 2048});
    probe.matmul.push_back({"bf16", size, speed * 6e14, 2048});
  }
  probe.sdpa = {{"fp32", speed * 2e13, 2048}, {"bf16", speed * 3e14, 2048}};
  probe.memory_bytes_per_s = speed * 4e12;
  probe.launch_seconds = 6e-6 / speed;
  probe.host_adamw_values_per_s = speed * 5e8;
  probe.host_to_device_bytes_per_s = speed * 5e10;
  probe.device_to_host_bytes_per_s = speed * 5e10;
  return probe;
}

class OfflineCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("llmctl-offline-cli-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Runs `llmctl COMMAND ARGS...`; the exit code, with out_ and err_ holding the output. No
  // controller is configured: these commands never connect.
  int RunOffline(const std::string& command, std::vector<std::string> args) {
    args.insert(args.begin(), {"llmctl", command});
    out_.str("");
    err_.str("");
    CliContext context = TestCliContext(
        [env = env_](std::string_view name) -> std::optional<std::string> {
          if (auto value = env.find(std::string(name)); value != env.end()) return value->second;
          return std::nullopt;
        },
        out_, err_, dir_);
    return RunLlmctl(args, context);
  }

  std::filesystem::path dir_;
  // The environment, empty unless a test sets it (HOME the test's directory: TestCliContext).
  std::map<std::string, std::string> env_;
  std::ostringstream out_;
  std::ostringstream err_;
};

}  // namespace llmctl::cli::testing

#endif  // LLMCTL_CONTROLLER_CLI_OFFLINE_CLI_TEST_H_
