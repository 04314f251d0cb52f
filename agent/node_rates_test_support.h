// The fixture of the node rates tests (node_rates_test.cc, node_rates_adopt_test.cc,
// node_rates_failures_test.cc, node_rates_measure_again_test.cc): a stand-in llm-train whose
// --probe prints a fixed probe (or fails as told) and counts its runs, the agent's data directory,
// and waits on what NodeRates reports.
#ifndef LLMCTL_AGENT_NODE_RATES_TEST_SUPPORT_H_
#define LLMCTL_AGENT_NODE_RATES_TEST_SUPPORT_H_

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "agent/node_rates.h"
#include "common/cpu_model.h"
#include "common/estimate/rate_probe.h"
#include "common/files.h"
#include "common/text.h"

namespace llmctl::agent::node_rates_test {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

// llm-train's last line when its rates disagree (trainer/train/rate_probe.cc, CheckMeasuredProbe).
inline constexpr char kBusy[] =
    "the rates measured disagree with each other, as when other work holds this machine's cores "
    "while the probe runs (load average 3.5 now): ... Nothing is written; measure again when the "
    "machine is idle";

inline estimate::RateProbe FixedProbe() {
  estimate::RateProbe probe;
  probe.measured_at = "2026-11-29T01:00:00Z";
  probe.device = "cpu";
  probe.device_name = "Test CPU";
  probe.threads = 2;
  probe.versions.llmctl = "0.4.0";
  probe.versions.libtorch = "2.15.0";
  probe.matmul = {{"fp32", 512, 5e10}};
  probe.memory_bytes_per_s = 1e10;
  return probe;
}

class NodeRatesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("llmctl-node-rates-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    WriteTrainer(FixedProbe().ToJson().dump());
    facts_.devices = {DeviceInfo{"cpu", 0, "Test CPU", 1 << 30}};
    facts_.trainer_version = "llm-train 0.4.0 (LibTorch 2.15.0)";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A stand-in llm-train: --probe appends a line to runs.txt and prints `output` after `delay`.
  void WriteTrainer(const std::string& output, const std::string& delay = "0") {
    std::ofstream(dir_ / "probe.out") << output;
    const fs::path trainer = dir_ / "llm-train";
    std::ofstream(trainer) << "#!/bin/sh\n[ \"$1\" = --probe ] || exit 3\necho \"$@\" >> '"
                           << (dir_ / "runs.txt").string() << "'\nsleep " << delay << "\ncat '"
                           << (dir_ / "probe.out").string() << "'\n";
    fs::permissions(trainer, fs::perms::owner_all);
  }

  NodeRatesOptions Options(bool measure = true, std::string adoptable_probe = "") const {
    return {.data_dir = (dir_ / "data").string(),
            .llm_train = (dir_ / "llm-train").string(),
            .measure = measure,
            .adoptable_probe = std::move(adoptable_probe),
            .idle_check = milliseconds(10),
            .timeout = std::chrono::seconds(20),
            .retry_after = {milliseconds(10), milliseconds(10)}};
  }

  // A stand-in llm-train whose first `busy_runs` probes find the machine busy (exit 1 with
  // llm-train's line, as CheckMeasuredProbe fails) and whose later ones print the fixed probe.
  void WriteBusyTrainer(int busy_runs) {
    std::ofstream(dir_ / "probe.out") << FixedProbe().ToJson().dump();
    std::ofstream(dir_ / "busy.txt") << "llm-train: " << kBusy << "\n";
    const std::string runs = (dir_ / "runs.txt").string();
    const fs::path trainer = dir_ / "llm-train";
    std::ofstream(trainer) << "#!/bin/sh\necho \"$@\" >> '" << runs << "'\nif [ $(wc -l < '" << runs
                           << "') -le " << busy_runs << " ]; then\n  cat '"
                           << (dir_ / "busy.txt").string() << "' >&2\n  exit 1\nfi\ncat '"
                           << (dir_ / "probe.out").string() << "'\n";
    fs::permissions(trainer, fs::perms::owner_all);
  }

  // What the report says after a probe that found the machine busy.
  std::string NotMeasuredBusy() const {
    return "not measured: " + (dir_ / "llm-train").string() +
           " --probe exited with 1: llm-train: " + kBusy;
  }

  int Runs() const {
    StatusOr<std::string> runs = ReadFileToString((dir_ / "runs.txt").string(), 1 << 16);
    return runs.ok() ? static_cast<int>(std::count(runs->begin(), runs->end(), '\n')) : 0;
  }

  // Whether `pending` says that a probe is measured or waited for.
  static bool SaysUnderway(const std::string& pending) {
    return pending == "measuring" || pending.starts_with("waiting") ||
           pending.find("; measuring again in ") != std::string::npos ||
           pending.find("; measuring again once ") != std::string::npos;
  }

  // The report once no probe is underway (at most 20 s). Its `underway` and what its note says
  // agree whenever it is read: `llmctl nodes --measure --wait` stops on the one and prints the
  // other.
  static NodeRates::Report Settled(const NodeRates& rates) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    NodeRates::Report report = rates.Current();
    while (report.underway && std::chrono::steady_clock::now() < deadline) {
      EXPECT_TRUE(SaysUnderway(report.pending) || report.pending.empty()) << report.pending;
      std::this_thread::sleep_for(milliseconds(5));
      report = rates.Current();
    }
    EXPECT_FALSE(report.underway) << report.pending;
    EXPECT_FALSE(SaysUnderway(report.pending)) << report.pending;
    return report;
  }

  // Whether the report comes to say `pending` within 20 s.
  static bool Says(const NodeRates& rates, const std::string& pending) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (rates.Current().pending != pending && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(1));
    }
    return rates.Current().pending == pending;
  }

  // A current probe of this machine by this llm-train, as llmctl keeps it in probe.json, written
  // where the agent may take it (NodeRatesOptions::adoptable_probe); the facts then say this
  // llm-train measured it. Returns the file's path.
  fs::path WriteThisMachinesProbe(const estimate::RateProbe& probe) {
    const fs::path path = dir_ / "probe.json";
    std::ofstream(path) << probe.ToJson().dump();
    facts_.trainer_version = probe.versions.Summary();
    facts_.trainer_cpu_kernels = probe.versions.CpuKernelsOrUnrecorded();
    return path;
  }

  // The probe `rates` reports, as RateProbe::ToJson writes it; null for none.
  static nlohmann::ordered_json Reported(const NodeRates& rates) {
    const std::string json = rates.Current().probe_json;
    if (json.empty()) return nullptr;
    return estimate::RateProbe::FromJson(nlohmann::json::parse(json))->ToJson();
  }

  // What the next start of an agent reports once this machine's probe at `path` is gone: the
  // probe it kept.
  nlohmann::ordered_json KeptForTheNextStart(const fs::path& path) {
    fs::remove(path);
    NodeRates rates(Options(true, path.string()), [] { return false; });
    rates.Start(facts_);
    return Reported(rates);
  }

  fs::path dir_;
  NodeFacts facts_;
};

}  // namespace llmctl::agent::node_rates_test

#endif  // LLMCTL_AGENT_NODE_RATES_TEST_SUPPORT_H_
