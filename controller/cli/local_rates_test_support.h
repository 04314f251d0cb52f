// The fixture of the local rates tests (local_rates_test.cc, local_rates_measure_again_test.cc,
// local_rates_estimate_test.cc, node_probes_test.cc): LLMCTL_HOME in a temporary directory, a fixed
// probe, a stand-in llm-train's first lines, and the embedded store with nodes' probes in it.
#ifndef LLMCTL_CONTROLLER_CLI_LOCAL_RATES_TEST_SUPPORT_H_
#define LLMCTL_CONTROLLER_CLI_LOCAL_RATES_TEST_SUPPORT_H_

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "common/cpu_model.h"
#include "common/estimate/gpus.h"
#include "controller/cli/commands.h"
#include "controller/cli/daemons.h"
#include "controller/cli/estimate.h"
#include "controller/cli/local_rates.h"
#include "controller/cli/offline_cli_test.h"
#include "controller/cli/plan.h"
#include "controller/store/store.h"
#include "tests/support/shell_command.h"

namespace llmctl::cli::local_rates_test {

namespace fs = std::filesystem;

inline std::string Experiments() {
  return (llmctl::testing::SourceDir() / "experiments/").string();
}

inline estimate::RateProbe FixedProbe() {
  estimate::RateProbe p;
  p.measured_at = "2026-11-29T01:00:00Z";
  p.seconds = 9.5;
  p.device = "cpu";
  p.device_name = CpuModelName();
  p.threads = 2;
  p.versions.llmctl = "0.4.0";
  p.versions.libtorch = "2.15.0";
  p.matmul = {{"fp32", 512, 5e10}, {"bf16", 512, 1e9}};
  p.memory_bytes_per_s = 1e10;
  p.launch_seconds = 4e-6;
  p.host_adamw_values_per_s = 3e8;
  p.loss = {{"aten", "bf16", 5e8}};
  return p;
}

// A stand-in llm-train's first lines: `--version --json` says it is FixedProbe's llm-train, so
// that a probe.json it wrote is taken as its own.
inline std::string StandInStart(const TrainerVersions& versions = FixedProbe().versions) {
  return "#!/bin/sh\n[ \"$1\" = --version ] && { echo '" + versions.ToJson() + "'; exit 0; }\n";
}

class LocalRatesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    home_ = fs::temp_directory_path() / ("llmctl-local-rates-" + std::to_string(::getpid()));
    fs::remove_all(home_);
    fs::create_directories(home_);
  }
  void TearDown() override { fs::remove_all(home_); }

  EnvLookup Env() const {
    return [home = home_.string()](std::string_view name) -> std::optional<std::string> {
      if (name == "LLMCTL_HOME") return home;
      return std::nullopt;
    };
  }

  fs::path home_;
};

// The embedded controller's store with `probes` stored as its nodes' rates (what the dispatcher
// stores from each agent's NodeInfo).
inline void StoreNodeRates(const fs::path& home,
                           const std::map<std::string, estimate::RateProbe>& probes) {
  StatusOr<std::unique_ptr<store::Store>> store = store::Store::Open((home / "llmctl.db").string());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  for (const auto& [node, probe] : probes) {
    ASSERT_TRUE((*store)
                    ->UpsertNode({.name = node,
                                  .address = "unix:/tmp/agent.sock",
                                  .devices_json = "[]",
                                  .last_seen = store::Time(),
                                  .state = "connected",
                                  .lease = std::nullopt})
                    .ok());
    ASSERT_TRUE((*store)->PutNodeRates(node, probe.ToJson().dump(), store::Time()).ok());
  }
}

// The embedded store with a trial of a new experiment running on this machine (node local); the
// experiment's id, 0 when it could not be made.
inline int64_t StartATrialOnThisMachine(const fs::path& home) {
  StatusOr<std::unique_ptr<store::Store>> store = store::Store::Open((home / "llmctl.db").string());
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  if (!store.ok()) return 0;
  store::NewExperiment experiment;
  experiment.name = "e";
  experiment.filename = "e.yaml";
  experiment.yaml_text = "model: m\n";
  store::NewTrial trial;
  trial.name = "a";
  trial.config_json = R"({"model":"m"})";
  trial.device_type = "cpu";
  experiment.trials.push_back(trial);
  const StatusOr<int64_t> id = (*store)->CreateExperiment(experiment, store::Time());
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  if (!id.ok()) return 0;
  const auto started =
      (*store)->StartAttempt((*(*store)->ListTrials(*id))[0].id, kLocalNode, store::Time(), {0});
  EXPECT_TRUE(started.ok()) << started.status().ToString();
  return started.ok() ? *id : 0;
}

// cpu-lab.yaml's bf16-true row's time as `llmctl estimate --format json` gives it, at the data
// sheets' rates and at `rates`' (in that order); nulls when either estimate failed.
inline std::pair<nlohmann::json, nlohmann::json> Bf16TrueTimes(const LocalRates& rates) {
  EstimateOptions options;
  options.trial = "bf16-true";
  options.format = "json";
  const StatusOr<std::string> sheet = EstimateExperiment(Experiments() + "cpu-lab.yaml", options);
  options.rates = rates.Lookup();
  const StatusOr<std::string> probed = EstimateExperiment(Experiments() + "cpu-lab.yaml", options);
  EXPECT_TRUE(sheet.ok()) << sheet.status().message();
  EXPECT_TRUE(probed.ok()) << probed.status().message();
  if (!sheet.ok() || !probed.ok()) return {};
  return {nlohmann::json::parse(*sheet)["trials"][0]["time"],
          nlohmann::json::parse(*probed)["trials"][0]["time"]};
}

// A GPU of the table whose NVML name reads back as that GPU.
inline estimate::Gpu KnownGpu() {
  for (const estimate::Gpu& gpu : estimate::KnownGpus()) {
    const std::optional<estimate::Gpu> named = estimate::GpuOfDeviceName(gpu.model);
    if (named.has_value() && named->name == gpu.name) return gpu;
  }
  ADD_FAILURE() << "no GPU reads back by its model name";
  return estimate::KnownGpus().front();
}

}  // namespace llmctl::cli::local_rates_test

#endif  // LLMCTL_CONTROLLER_CLI_LOCAL_RATES_TEST_SUPPORT_H_
