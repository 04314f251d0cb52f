// The node's rates (agent/node_rates.h) with a stand-in llm-train whose --probe prints a fixed
// probe and counts its runs: measured once the node is idle, kept across agents of the same node,
// measured again when the node changes, a probe that found the machine busy measured again a few
// times, and a broken probe reported as not measured.
#include "agent/node_rates.h"

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

#include "common/cpu_model.h"
#include "common/estimate/rate_probe.h"
#include "common/files.h"
#include "common/text.h"

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

// llm-train's last line when its rates disagree (trainer/train/rate_probe.cc, CheckMeasuredProbe).
constexpr char kBusy[] =
    "the rates measured disagree with each other, as when other work holds this machine's cores "
    "while the probe runs (load average 3.5 now): ... Nothing is written; measure again when the "
    "machine is idle";

estimate::RateProbe FixedProbe() {
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

TEST_F(NodeRatesTest, MeasuredOnceIdleThenKeptUntilTheNodeChanges) {
  std::atomic<bool> trial_running = true;
  {
    NodeRates rates(Options(), [&] { return trial_running.load(); });
    EXPECT_EQ(rates.Current().probe_json, "");
    rates.Start(facts_);
    // Not while a trial runs.
    EXPECT_TRUE(Says(rates, "waiting for the running trial to end"));
    std::this_thread::sleep_for(milliseconds(50));
    EXPECT_EQ(Runs(), 0);
    trial_running = false;
    const NodeRates::Report report = Settled(rates);
    EXPECT_EQ(report.pending, "");
    ASSERT_EQ(Runs(), 1);
    const StatusOr<estimate::RateProbe> probe =
        estimate::RateProbe::FromJson(nlohmann::json::parse(report.probe_json));
    ASSERT_TRUE(probe.ok()) << probe.status().ToString();
    EXPECT_EQ(probe->ToJson(), FixedProbe().ToJson());
  }
  StatusOr<std::string> runs = ReadFileToString((dir_ / "runs.txt").string(), 1 << 16);
  EXPECT_EQ(*runs, "--probe --probe-device cpu\n");

  // The next agent on the same node reports the kept probe at once, measuring nothing.
  {
    NodeRates rates(Options(), [] { return false; });
    rates.Start(facts_);
    EXPECT_EQ(rates.Current().pending, "");
    EXPECT_EQ(
        estimate::RateProbe::FromJson(nlohmann::json::parse(rates.Current().probe_json))->ToJson(),
        FixedProbe().ToJson());
    EXPECT_EQ(Runs(), 1);
  }
  // A new llm-train (another LibTorch), then the same one computing otherwise (one thread, as the
  // busy line's advice has the agent started), then a GPU: each measures again, the GPU on cuda.
  facts_.trainer_version = "llm-train 0.4.0 (LibTorch 2.16.0)";
  {
    NodeRates rates(Options(), [] { return false; });
    rates.Start(facts_);
    EXPECT_EQ(Settled(rates).pending, "");
    EXPECT_EQ(Runs(), 2);
  }
  facts_.trainer_cpu_kernels = "1 thread, ATen AVX2";
  {
    NodeRates rates(Options(), [] { return false; });
    rates.Start(facts_);
    EXPECT_EQ(Settled(rates).pending, "");
    EXPECT_EQ(Runs(), 3);
  }
  facts_.devices = {DeviceInfo{"cuda", 0, "NVIDIA H200", int64_t{141} << 30}};
  {
    NodeRates rates(Options(), [] { return false; });
    rates.Start(facts_);
    EXPECT_EQ(Settled(rates).pending, "");
  }
  runs = ReadFileToString((dir_ / "runs.txt").string(), 1 << 16);
  EXPECT_TRUE(runs->ends_with("--probe --probe-device cuda\n")) << *runs;
}

// On a GPU node the probe counts CUDA's devices in NVML's order, as a trial's worker does, whatever
// order the agent's own environment names.
TEST_F(NodeRatesTest, GpuProbeCountsDevicesInNvmlsOrder) {
  const fs::path order = dir_ / "order.txt";
  const fs::path trainer = dir_ / "llm-train";
  std::ofstream(trainer) << "#!/bin/sh\necho \"$CUDA_DEVICE_ORDER\" > '" << order.string()
                         << "'\ncat '" << (dir_ / "probe.out").string() << "'\n";
  fs::permissions(trainer, fs::perms::owner_all);
  facts_.devices = {DeviceInfo{"cuda", 0, "NVIDIA H200", int64_t{141} << 30}};
  ::setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST", 1);
  {
    NodeRates rates(Options(), [] { return false; });
    rates.Start(facts_);
    EXPECT_EQ(Settled(rates).pending, "");
  }
  ::unsetenv("CUDA_DEVICE_ORDER");
  StatusOr<std::string> seen = ReadFileToString(order.string(), 1 << 10);
  ASSERT_TRUE(seen.ok()) << seen.status().ToString();
  EXPECT_EQ(*seen, "PCI_BUS_ID\n");
}

// An agent killed while it wrote rates.json left its temporary (rates.json.tmp.PID.N) for good; the
// next agent removes it when it starts, whether it measures or takes the kept probe.
TEST_F(NodeRatesTest, AKilledWritesTemporaryIsRemovedAtTheNextStart) {
  const fs::path leftover = dir_ / "data" / "rates.json.tmp.123.0";
  std::ofstream(leftover) << "{\"fingerprint\":";
  {
    NodeRates rates(Options(), [] { return false; });
    rates.Start(facts_);
    EXPECT_EQ(Settled(rates).pending, "");
    EXPECT_EQ(Runs(), 1);
  }
  EXPECT_FALSE(fs::exists(leftover));

  std::ofstream(leftover) << "{\"fingerprint\":";
  NodeRates rates(Options(), [] { return false; });
  rates.Start(facts_);
  EXPECT_EQ(rates.Current().pending, "") << "the kept probe serves";
  EXPECT_EQ(Runs(), 1);
  EXPECT_FALSE(fs::exists(leftover));
}

// llmctl's probe of this machine by this llm-train (the embedded agent's --rate-probe-file) is
// taken as the node's, measuring nothing, and kept; one of another CPU, another llm-train or an
// older version, or any on a node with a GPU, is not: the node measures.
TEST_F(NodeRatesTest, ThisMachinesProbeByThisTrainerIsTakenInsteadOfMeasuring) {
  estimate::RateProbe local = FixedProbe();
  local.device_name = CpuModelName();
  const fs::path local_path = dir_ / "probe.json";
  std::ofstream(local_path) << local.ToJson().dump();
  facts_.trainer_version = local.versions.Summary();
  facts_.trainer_cpu_kernels = local.versions.CpuKernelsOrUnrecorded();
  {
    NodeRates rates(Options(true, local_path.string()), [] { return false; });
    rates.Start(facts_);
    const NodeRates::Report report = rates.Current();
    EXPECT_EQ(report.pending, "");
    ASSERT_FALSE(report.probe_json.empty());
    EXPECT_EQ(estimate::RateProbe::FromJson(nlohmann::json::parse(report.probe_json))->ToJson(),
              local.ToJson());
    EXPECT_EQ(Runs(), 0);
  }
  {  // kept: the next start reports it without reading the file again
    fs::remove(local_path);
    NodeRates rates(Options(true, local_path.string()), [] { return false; });
    rates.Start(facts_);
    EXPECT_FALSE(rates.Current().probe_json.empty());
    EXPECT_EQ(Runs(), 0);
  }
  // Measures instead of taking `text`, and says why on stderr when `why` is not empty (a GPU node
  // does not look at a CPU's probe: nothing to say).
  auto measures_instead = [&](const std::string& text, const NodeFacts& facts,
                              const std::string& why) {
    fs::remove_all(dir_ / "data");
    fs::create_directories(dir_ / "data");
    std::ofstream(local_path) << text;
    const int before = Runs();
    testing::internal::CaptureStderr();
    NodeRates rates(Options(true, local_path.string()), [] { return false; });
    rates.Start(facts);
    EXPECT_EQ(Settled(rates).pending, "");
    const std::string said = testing::internal::GetCapturedStderr();
    if (why.empty()) {
      EXPECT_EQ(said.find("not taking"), std::string::npos) << said;
    } else {
      EXPECT_NE(said.find("not taking " + local_path.string() + " as the node's rates: " + why),
                std::string::npos)
          << said;
    }
    return Runs() == before + 1;
  };
  estimate::RateProbe other_cpu = local;
  other_cpu.device_name = "Another CPU";
  EXPECT_TRUE(measures_instead(other_cpu.ToJson().dump(), facts_, "measured on another device"));
  estimate::RateProbe other_trainer = local;
  other_trainer.versions.libtorch = "2.16.0";
  EXPECT_TRUE(
      measures_instead(other_trainer.ToJson().dump(), facts_, "measured on another device"));
  // The same llm-train started with other threads or kernels (OMP_NUM_THREADS, ONEDNN_MAX_CPU_ISA):
  // its rates are not the probe's.
  local.versions.cpu_threads = 2;
  local.versions.aten_cpu_capability = "AVX512";
  NodeFacts one_thread = facts_;
  one_thread.trainer_cpu_kernels = "1 thread, ATen AVX512";
  EXPECT_TRUE(measures_instead(local.ToJson().dump(), one_thread,
                               "measured with 2 threads, ATen AVX512, where this node's llm-train "
                               "runs with 1 thread, ATen AVX512"));
  NodeFacts same = facts_;
  same.trainer_cpu_kernels = "2 threads, ATen AVX512";
  EXPECT_FALSE(measures_instead(local.ToJson().dump(), same, ""));
  // A probe of an llm-train that did not say, taken by one that does.
  estimate::RateProbe unsaid = local;
  unsaid.versions.cpu_threads = 0;
  EXPECT_TRUE(measures_instead(unsaid.ToJson().dump(), same,
                               "measured with threads and kernels not recorded, where this node's "
                               "llm-train runs with 2 threads, ATen AVX512"));
  estimate::RateProbe older = local;
  older.version = 1;
  EXPECT_TRUE(measures_instead(older.ToJson().dump(), facts_, "version 1, this llm-train"));
  NodeFacts with_gpu = facts_;
  with_gpu.devices.push_back(DeviceInfo{"cuda", 0, "NVIDIA H200", int64_t{141} << 30});
  EXPECT_TRUE(measures_instead(local.ToJson().dump(), with_gpu, ""));
  // A hostile or broken file: refused by the field it names, and measured instead.
  estimate::RateProbe with_attention = local;
  with_attention.sdpa = {{"bf16", 5e10, 128}};
  nlohmann::json broken = nlohmann::json::parse(with_attention.ToJson().dump());
  broken["sdpa"][0]["tokens"] = 99999999999999;
  EXPECT_TRUE(measures_instead(broken.dump(), facts_, "rate probe: 'sdpa[0].tokens'"));
  EXPECT_TRUE(measures_instead("{not json", facts_, "not JSON"));
}

// llmctl measures probe.json again when a user deletes it (a probe taken at a bad moment): the
// agent's next start takes the new one over the copy it kept, keeps it, and measures nothing; the
// same file as the kept copy is reported as kept, without a word.
TEST_F(NodeRatesTest, ThisMachinesProbeMeasuredAgainReplacesTheKeptCopyAtTheNextStart) {
  estimate::RateProbe first = FixedProbe();
  first.device_name = CpuModelName();
  const fs::path local_path = WriteThisMachinesProbe(first);
  {
    NodeRates rates(Options(true, local_path.string()), [] { return false; });
    rates.Start(facts_);
    EXPECT_EQ(Reported(rates), first.ToJson());
  }
  {  // the same file again: kept, nothing said
    testing::internal::CaptureStderr();
    NodeRates rates(Options(true, local_path.string()), [] { return false; });
    rates.Start(facts_);
    EXPECT_EQ(Reported(rates), first.ToJson());
    EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  }
  estimate::RateProbe again = first;
  again.measured_at = "2026-11-29T02:00:00Z";
  again.memory_bytes_per_s = 2e10;
  std::ofstream(local_path) << again.ToJson().dump();
  {
    testing::internal::CaptureStderr();
    NodeRates rates(Options(true, local_path.string()), [] { return false; });
    rates.Start(facts_);
    EXPECT_EQ(rates.Current().pending, "");
    EXPECT_EQ(Reported(rates), again.ToJson());
    const std::string said = testing::internal::GetCapturedStderr();
    EXPECT_NE(said.find("the node's rates are " + local_path.string() +
                        "'s, measured on this machine by this llm-train after the ones this "
                        "agent kept"),
              std::string::npos)
        << said;
  }
  EXPECT_EQ(KeptForTheNextStart(local_path), again.ToJson());  // in place of the first
  EXPECT_EQ(Runs(), 0);
}

// While the agent runs, a probe.json llmctl measured again is taken at the next health check
// (TakeChangedLocalProbe), and kept for the next start; an unchanged file changes nothing, and
// one this agent would not take at a start (another CPU's) is not taken now either.
TEST_F(NodeRatesTest, ThisMachinesProbeMeasuredAgainIsTakenWhileTheAgentRuns) {
  estimate::RateProbe first = FixedProbe();
  first.device_name = CpuModelName();
  const fs::path local_path = WriteThisMachinesProbe(first);
  // Rewrites the file with `probe`, its modification time moved on by `seconds`.
  const auto rewrite = [&local_path](const estimate::RateProbe& probe, int seconds) {
    const fs::file_time_type before = fs::last_write_time(local_path);
    std::ofstream(local_path) << probe.ToJson().dump();
    fs::last_write_time(local_path, before + std::chrono::seconds(seconds));
  };
  NodeRates rates(Options(true, local_path.string()), [] { return false; });
  rates.TakeChangedLocalProbe();  // before Start: nothing
  EXPECT_EQ(rates.Current().probe_json, "");
  rates.Start(facts_);
  EXPECT_EQ(Reported(rates), first.ToJson());
  rates.TakeChangedLocalProbe();
  EXPECT_EQ(Reported(rates), first.ToJson());

  estimate::RateProbe other_cpu = first;
  other_cpu.device_name = "Another CPU";
  other_cpu.measured_at = "2026-11-29T02:00:00Z";
  rewrite(other_cpu, 1);
  rates.TakeChangedLocalProbe();
  EXPECT_EQ(Reported(rates), first.ToJson());

  estimate::RateProbe again = first;
  again.measured_at = "2026-11-29T03:00:00Z";
  again.memory_bytes_per_s = 2e10;
  rewrite(again, 2);
  testing::internal::CaptureStderr();
  rates.TakeChangedLocalProbe();
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_EQ(Reported(rates), again.ToJson());
  EXPECT_EQ(rates.Current().pending, "");
  EXPECT_NE(said.find("the node's rates are now " + local_path.string() + "'s"), std::string::npos)
      << said;
  EXPECT_EQ(KeptForTheNextStart(local_path), again.ToJson());
  EXPECT_EQ(Runs(), 0);
}

// A kept probe of an older version (1: matmuls at 512 tokens only) reads, but this llm-train
// measures more: the node measures again, on the same fingerprint.
TEST_F(NodeRatesTest, AKeptProbeOfAnOlderVersionIsMeasuredAgain) {
  {
    NodeRates rates(Options(), [] { return false; });
    rates.Start(facts_);
    EXPECT_EQ(Settled(rates).pending, "");
    ASSERT_EQ(Runs(), 1);
  }
  const std::string kept_path = (dir_ / "data" / "rates.json").string();
  nlohmann::json kept = nlohmann::json::parse(*ReadFileToString(kept_path, 1 << 20));
  kept["probe"]["version"] = 1;
  for (nlohmann::json& row : kept["probe"]["matmul"]) row.erase("tokens");
  ASSERT_TRUE(estimate::RateProbe::FromJson(kept["probe"]).ok());
  std::ofstream(kept_path) << kept.dump();
  {
    NodeRates rates(Options(), [] { return false; });
    rates.Start(facts_);
    EXPECT_EQ(Settled(rates).pending, "");
    EXPECT_EQ(Runs(), 2);
  }
}

TEST_F(NodeRatesTest, ATrialStartingWaitsForTheProbeAndAProbeForTheStartingTrial) {
  WriteTrainer(FixedProbe().ToJson().dump(), "0.3");
  NodeRates rates(Options(), [] { return false; });
  {
    // A trial starting before the probe: the probe waits for its guard.
    const NodeRates::StartingTrial starting(rates, {});
    rates.Start(facts_);
    EXPECT_TRUE(Says(rates, "waiting for the running trial to end"));
    std::this_thread::sleep_for(milliseconds(50));
    EXPECT_EQ(Runs(), 0);
  }
  // The probe runs; a trial starting now waits for it to end.
  ASSERT_TRUE(Says(rates, "measuring"));
  const NodeRates::StartingTrial starting(rates, {});
  EXPECT_TRUE(starting.free());
  EXPECT_EQ(rates.Current().pending, "");
  EXPECT_EQ(Runs(), 1);
}

TEST_F(NodeRatesTest, ATrialStartingWaitsForTheProbeOnlyUntilItsCallersDeadline) {
  WriteTrainer(FixedProbe().ToJson().dump(), "3");
  NodeRates rates(Options(), [] { return false; });
  rates.Start(facts_);
  ASSERT_TRUE(Says(rates, "measuring"));
  {
    // The controller stops waiting long before the probe ends: the trial does not start.
    const auto asked = std::chrono::steady_clock::now();
    const NodeRates::StartingTrial starting(rates, asked + milliseconds(100));
    EXPECT_FALSE(starting.free());
    EXPECT_LT(std::chrono::steady_clock::now() - asked, std::chrono::seconds(2));
    EXPECT_EQ(rates.Current().pending, "measuring");
  }
  // Once it has ended, the same deadline is no obstacle.
  const NodeRates::StartingTrial starting(
      rates, std::chrono::steady_clock::now() + std::chrono::seconds(30));
  EXPECT_TRUE(starting.free());
  EXPECT_EQ(rates.Current().pending, "");
}

// The agent stopping (SIGTERM) while a probe runs: the probe's process group is killed and the
// agent goes within about a second, instead of waiting out the probe (up to its 3-minute timeout;
// an agent was still up 8 s after "stopping" and had to be killed).
TEST_F(NodeRatesTest, StoppingKillsAProbeInProgressAtOnce) {
  const fs::path pid_file = dir_ / "helper.pid";
  {
    // A probe that would take a minute in a helper process of its own (as a probe's workers),
    // whose pid it writes.
    std::ofstream(dir_ / "probe.out") << FixedProbe().ToJson().dump();
    std::ofstream(dir_ / "llm-train") << "#!/bin/sh\nsleep 60 &\necho $! > '" << pid_file.string()
                                      << "'\nwait\ncat '" << (dir_ / "probe.out").string() << "'\n";
  }
  std::optional<NodeRates> rates;
  rates.emplace(Options(), [] { return false; });
  rates->Start(facts_);
  ASSERT_TRUE(Says(*rates, "measuring"));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  StatusOr<std::string> pid_text = NotFoundError("");
  while (!(pid_text = ReadFileToString(pid_file.string(), 64)).ok() || !pid_text->ends_with("\n")) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the probe did not start";
    std::this_thread::sleep_for(milliseconds(5));
  }
  const pid_t helper = std::stoi(*pid_text);

  const auto stopping = std::chrono::steady_clock::now();
  rates->Stop();
  EXPECT_TRUE(Says(*rates, "not measured: " + (dir_ / "llm-train").string() + " was stopped"))
      << rates->Current().pending;
  rates.reset();  // joins the probe's thread
  EXPECT_LT(std::chrono::steady_clock::now() - stopping, std::chrono::seconds(2));
  // The helper went with it (its group killed): gone, or a zombie until init reaps it.
  const auto helper_runs = [helper] {
    StatusOr<std::string> stat =
        ReadFileToString("/proc/" + std::to_string(helper) + "/stat", 4096);
    const size_t paren = stat.ok() ? stat->rfind(')') : std::string::npos;
    return paren != std::string::npos && paren + 2 < stat->size() && (*stat)[paren + 2] != 'Z';
  };
  const auto gone_by = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (helper_runs() && std::chrono::steady_clock::now() < gone_by) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_FALSE(helper_runs()) << "the probe's helper outlived it";
  EXPECT_FALSE(fs::exists(dir_ / "data" / "rates.json"));
}

TEST_F(NodeRatesTest, ABrokenProbeIsNotMeasuredAndNotKept) {
  WriteTrainer(R"({"version": 1, "matmul": []})");
  {
    NodeRates rates(Options(), [] { return false; });
    rates.Start(facts_);
    const NodeRates::Report report = Settled(rates);
    EXPECT_EQ(report.probe_json, "");
    EXPECT_TRUE(report.pending.starts_with("not measured: llm-train --probe: ")) << report.pending;
  }
  EXPECT_FALSE(fs::exists(dir_ / "data" / "rates.json"));
  EXPECT_EQ(Runs(), 1);  // this llm-train would write the same again: not measured again

  WriteTrainer("not json");
  NodeRates rates(Options(), [] { return false; });
  rates.Start(facts_);
  EXPECT_EQ(Settled(rates).pending, "not measured: llm-train --probe wrote no JSON");
  EXPECT_EQ(Runs(), 2);
}

// llm-train says why its probe failed on stderr, last: the report carries that line, on one line.
TEST_F(NodeRatesTest, AFailedProbesReportCarriesItsReason) {
  const fs::path trainer = dir_ / "llm-train";
  std::ofstream(trainer) << "#!/bin/sh\necho 'measuring' >&2\nprintf 'llm-train: the rates "
                            "measured disagree\\033[1m with each other\\n\\n' >&2\nexit 1\n";
  fs::permissions(trainer, fs::perms::owner_all);
  NodeRates rates(Options(), [] { return false; });
  rates.Start(facts_);
  EXPECT_EQ(Settled(rates).pending,
            "not measured: " + trainer.string() +
                " --probe exited with 1: llm-train: the rates measured disagree [1m with each "
                "other; that was attempt 3 of 3, measuring again at the agent's next start");
}

// A probe taken while other work held the machine (llm-train exits 1) is measured again after a
// wait, instead of leaving the node without rates until the agent's next start.
TEST_F(NodeRatesTest, ABusyMachinesProbeIsMeasuredAgain) {
  WriteBusyTrainer(1);
  {
    NodeRates rates(Options(), [] { return false; });
    rates.Start(facts_);
    const NodeRates::Report report = Settled(rates);
    EXPECT_EQ(report.pending, "");
    EXPECT_FALSE(report.probe_json.empty());
    EXPECT_EQ(Runs(), 2);
  }
  EXPECT_TRUE(fs::exists(dir_ / "data" / "rates.json"));
}

// A machine busy at every attempt: measured as often as NodeRatesOptions::retry_after allows, then
// reported as measured again at the agent's next start.
TEST_F(NodeRatesTest, ABusyMachineIsMeasuredAsManyTimesAsItsAttemptsThenAtTheNextStart) {
  WriteBusyTrainer(100);
  NodeRates rates(Options(), [] { return false; });
  rates.Start(facts_);
  EXPECT_EQ(
      Settled(rates).pending,
      NotMeasuredBusy() + "; that was attempt 3 of 3, measuring again at the agent's next start");
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(Runs(), 3);
  EXPECT_FALSE(fs::exists(dir_ / "data" / "rates.json"));
}

// While it waits to measure again the report says why, when and which attempt, trials start, and
// the agent stopping ends the wait: the agent does not wait out the hour, and measures no more.
TEST_F(NodeRatesTest, StoppingEndsTheWaitToMeasureAgain) {
  WriteBusyTrainer(100);
  NodeRatesOptions options = Options();
  options.retry_after = {std::chrono::hours(1), std::chrono::hours(1)};
  std::optional<NodeRates> rates;
  rates.emplace(options, [] { return false; });
  rates->Start(facts_);
  EXPECT_TRUE(Says(*rates, NotMeasuredBusy() + "; measuring again in 60 min (attempt 2 of 3)"))
      << rates->Current().pending;
  {
    const NodeRates::StartingTrial starting(
        *rates, std::chrono::steady_clock::now() + std::chrono::seconds(20));
    EXPECT_TRUE(starting.free());
  }
  rates->Stop();
  rates.reset();  // joins the probe's thread
  EXPECT_EQ(Runs(), 1);
}

// The attempt after the wait, as the first, waits for the running trial to end.
TEST_F(NodeRatesTest, AProbeIsMeasuredAgainOnlyOnceTheNodeIsIdle) {
  WriteBusyTrainer(1);
  // A trial starts once the first probe has failed, and runs until the test ends it.
  std::atomic<bool> trial_ended = false;
  NodeRates rates(Options(), [&] { return Runs() >= 1 && !trial_ended.load(); });
  rates.Start(facts_);
  EXPECT_TRUE(Says(
      rates, NotMeasuredBusy() + "; measuring again once the running trial ends (attempt 2 of 3)"))
      << rates.Current().pending;
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(Runs(), 1);
  trial_ended = true;
  EXPECT_EQ(Settled(rates).pending, "");
  EXPECT_EQ(Runs(), 2);
}

// Failures that waiting does not change are reported once: an llm-train that cannot run, one that
// refuses its input (exit 2, such as no CUDA device for --probe-device cuda), and a probe killed at
// its timeout (a hung probe holds trials off for the whole timeout at each attempt).
TEST_F(NodeRatesTest, AFailureWaitingCannotChangeIsNotMeasuredAgain) {
  {
    NodeRatesOptions options = Options();
    options.llm_train = (dir_ / "missing-llm-train").string();
    NodeRates rates(options, [] { return false; });
    rates.Start(facts_);
    EXPECT_EQ(Settled(rates).pending,
              "not measured: cannot run " + options.llm_train + ": No such file or directory");
  }
  const fs::path trainer = dir_ / "llm-train";
  const std::string runs = (dir_ / "runs.txt").string();
  std::ofstream(trainer)
      << "#!/bin/sh\necho \"$@\" >> '" << runs
      << "'\necho 'llm-train: --probe-device cuda: no CUDA device' >&2\nexit 2\n";
  {
    NodeRates rates(Options(), [] { return false; });
    rates.Start(facts_);
    EXPECT_EQ(Settled(rates).pending, "not measured: " + trainer.string() +
                                          " --probe exited with 2: llm-train: --probe-device "
                                          "cuda: no CUDA device");
    EXPECT_EQ(Runs(), 1);
  }
  WriteTrainer(FixedProbe().ToJson().dump(), "60");
  NodeRatesOptions options = Options();
  options.timeout = milliseconds(1000);
  NodeRates rates(options, [] { return false; });
  rates.Start(facts_);
  EXPECT_EQ(Settled(rates).pending,
            "not measured: " + trainer.string() + " --probe was killed or timed out");
  EXPECT_EQ(Runs(), 2);
}

// The controller takes a report of up to kRateProbePendingMaxBytes and refuses a longer one with
// the node's whole description (the node would then run nothing): a trainer's path as long as
// they come is cut from the report, and what it says of the next attempt is kept.
TEST_F(NodeRatesTest, AReportStaysWithinWhatTheControllerTakes) {
  WriteBusyTrainer(100);
  fs::path deep = dir_;
  for (int i = 0; i < 5; ++i) deep /= std::string(200, 'd');
  fs::create_directories(deep);
  fs::copy_file(dir_ / "llm-train", deep / "llm-train");
  NodeRatesOptions options = Options();
  options.llm_train = (deep / "llm-train").string();
  const auto within = [](const std::string& pending) {
    return PrintableTextProblem(pending, estimate::kRateProbePendingMaxBytes).empty();
  };
  {
    options.retry_after = {std::chrono::hours(1), std::chrono::hours(1)};
    NodeRates rates(options, [] { return false; });
    rates.Start(facts_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!rates.Current().pending.ends_with("(attempt 2 of 3)") &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(1));
    }
    const std::string pending = rates.Current().pending;
    EXPECT_TRUE(pending.ends_with("; measuring again in 60 min (attempt 2 of 3)")) << pending;
    EXPECT_TRUE(within(pending)) << pending.size();
    rates.Stop();
  }
  options.retry_after = {milliseconds(10), milliseconds(10)};
  NodeRates rates(options, [] { return false; });
  rates.Start(facts_);
  const std::string pending = Settled(rates).pending;
  EXPECT_TRUE(pending.starts_with("not measured: " + dir_.string())) << pending;
  EXPECT_TRUE(
      pending.ends_with("…; that was attempt 3 of 3, measuring again at the agent's next start"))
      << pending;
  EXPECT_TRUE(within(pending)) << pending.size();
}

// `llmctl nodes --measure NODE`: a node measured once measures again when asked, once idle, the
// rates before serving meanwhile; the new ones are reported and kept for the next start. An ask
// while the probe is waited for or measured is that probe's.
TEST_F(NodeRatesTest, AskedToMeasureAgainTheNodeDoesOnceIdleAndTheRatesBeforeServeMeanwhile) {
  std::atomic<bool> trial_running = false;
  NodeRates rates(Options(), [&] { return trial_running.load(); });
  rates.Start(facts_);
  ASSERT_EQ(Settled(rates).pending, "");
  ASSERT_EQ(Runs(), 1);
  estimate::RateProbe faster = FixedProbe();
  faster.memory_bytes_per_s = 2e10;
  WriteTrainer(faster.ToJson().dump());

  trial_running = true;
  StatusOr<std::string> asked = rates.MeasureAgain();
  ASSERT_TRUE(asked.ok()) << asked.status().ToString();
  EXPECT_EQ(*asked, "waiting for the running trial to end");
  StatusOr<std::string> asked_again = rates.MeasureAgain();
  ASSERT_TRUE(asked_again.ok());
  EXPECT_EQ(*asked_again, "waiting for the running trial to end");
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(Runs(), 1) << "not while a trial runs";
  EXPECT_EQ(Reported(rates), FixedProbe().ToJson()) << "the rates before serve meanwhile";
  trial_running = false;
  EXPECT_EQ(Settled(rates).pending, "");
  EXPECT_EQ(Runs(), 2) << "two asks, one probe";
  EXPECT_EQ(Reported(rates), faster.ToJson());

  // Idle: measured at once.
  WriteTrainer(FixedProbe().ToJson().dump(), "0.3");
  asked = rates.MeasureAgain();
  ASSERT_TRUE(asked.ok());
  EXPECT_EQ(*asked, "measuring");
  EXPECT_EQ(Reported(rates), faster.ToJson());
  EXPECT_EQ(Settled(rates).pending, "");
  EXPECT_EQ(Runs(), 3);
  EXPECT_EQ(Reported(rates), FixedProbe().ToJson());
  rates.Stop();

  NodeRates next(Options(), [] { return false; });
  next.Start(facts_);
  EXPECT_EQ(next.Current().pending, "") << "kept, not measured again";
  EXPECT_EQ(Reported(next), FixedProbe().ToJson());
  EXPECT_EQ(Runs(), 3);
}

// A probe asked for again that fails leaves the rates before reported and kept, and says so: a
// broken one at once, a busy machine's after its attempts.
TEST_F(NodeRatesTest, AProbeAskedForAgainThatFailsLeavesTheRatesBefore) {
  {
    NodeRates rates(Options(), [] { return false; });
    rates.Start(facts_);
    ASSERT_EQ(Settled(rates).pending, "");
    WriteTrainer("not a probe");
    ASSERT_TRUE(rates.MeasureAgain().ok());
    const NodeRates::Report report = Settled(rates);
    EXPECT_EQ(report.pending, "not measured again: llm-train --probe wrote no JSON");
    EXPECT_EQ(Reported(rates), FixedProbe().ToJson());

    WriteBusyTrainer(100);
    ASSERT_TRUE(rates.MeasureAgain().ok());
    EXPECT_EQ(Settled(rates).pending,
              "not measured again: " + (dir_ / "llm-train").string() +
                  " --probe exited with 1: llm-train: " + kBusy +
                  "; that was attempt 3 of 3; the rates measured before serve on");
    EXPECT_EQ(Reported(rates), FixedProbe().ToJson());
  }
  NodeRates next(Options(), [] { return false; });
  next.Start(facts_);
  EXPECT_EQ(next.Current().pending, "");
  EXPECT_EQ(Reported(next), FixedProbe().ToJson());
}

// An ask while a busy machine's probe waits to be retried measures it once the node is idle,
// rather than after the wait.
TEST_F(NodeRatesTest, AnAskCutsTheWaitBeforeABusyMachinesNextAttempt) {
  WriteBusyTrainer(1);
  NodeRatesOptions options = Options();
  options.retry_after = {std::chrono::hours(1), std::chrono::hours(1)};
  NodeRates rates(options, [] { return false; });
  rates.Start(facts_);
  ASSERT_TRUE(Says(rates, NotMeasuredBusy() + "; measuring again in 60 min (attempt 2 of 3)"))
      << rates.Current().pending;
  const StatusOr<std::string> asked = rates.MeasureAgain();
  ASSERT_TRUE(asked.ok());
  EXPECT_TRUE(asked->starts_with(NotMeasuredBusy() + "; measuring again ")) << *asked;
  EXPECT_EQ(Settled(rates).pending, "");
  EXPECT_EQ(Runs(), 2);
  EXPECT_EQ(Reported(rates), FixedProbe().ToJson());
}

// Nothing is measured where nothing may be: before the node is described, with the probe off, and
// on the embedded agent, whose rates are llmctl's probe.json (llmctl measures that again).
TEST_F(NodeRatesTest, AnAskIsRefusedWhereTheAgentMeasuresNothing) {
  {
    NodeRates rates(Options(), [] { return false; });
    EXPECT_EQ(rates.MeasureAgain().status().code(), StatusCode::kUnavailable);
  }
  {
    NodeRates rates(Options(/*measure=*/false), [] { return false; });
    rates.Start(facts_);
    const Status refused = rates.MeasureAgain().status();
    EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(refused.message().find("LLMCTL_RATE_PROBE=off"), std::string::npos);
  }
  {
    estimate::RateProbe this_machines = FixedProbe();
    this_machines.device_name = CpuModelName();
    const fs::path probe = WriteThisMachinesProbe(this_machines);
    NodeRates rates(Options(true, probe.string()), [] { return false; });
    rates.Start(facts_);
    ASSERT_EQ(Reported(rates), this_machines.ToJson()) << "taken, not measured";
    const Status refused = rates.MeasureAgain().status();
    EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(refused.message().find("llmctl nodes --measure local"), std::string::npos)
        << refused.message();
  }
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(Runs(), 0);
}

TEST_F(NodeRatesTest, OffMeasuresNothingAndSaysSo) {
  NodeRates rates(Options(/*measure=*/false), [] { return false; });
  rates.Start(facts_);
  EXPECT_EQ(rates.Current().pending, "not measured: LLMCTL_RATE_PROBE=off");
  EXPECT_EQ(rates.Current().probe_json, "");
  EXPECT_EQ(Runs(), 0);
}

}  // namespace
}  // namespace llmctl::agent
