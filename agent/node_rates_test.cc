// The node's rates (agent/node_rates.h), measured by a stand-in llm-train
// (node_rates_test_support.h): once the node is idle, kept across agents of the same node, measured
// again when the node changes, a trial starting while a probe runs, and an agent stopping.
#include "agent/node_rates.h"

#include <gtest/gtest.h>

#include "agent/node_rates_test_support.h"

namespace llmctl::agent::node_rates_test {
namespace {

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

TEST_F(NodeRatesTest, OffMeasuresNothingAndSaysSo) {
  NodeRates rates(Options(/*measure=*/false), [] { return false; });
  rates.Start(facts_);
  EXPECT_EQ(rates.Current().pending, "not measured: LLMCTL_RATE_PROBE=off");
  EXPECT_EQ(rates.Current().probe_json, "");
  EXPECT_EQ(Runs(), 0);
}

}  // namespace
}  // namespace llmctl::agent::node_rates_test
