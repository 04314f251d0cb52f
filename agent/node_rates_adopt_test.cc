// The node's rates (agent/node_rates.h) taken from llmctl's probe of this machine (the embedded
// agent's NodeRatesOptions::adoptable_probe) instead of measured: at a start, over a kept copy, and
// while the agent runs.
#include <gtest/gtest.h>

#include "agent/node_rates.h"
#include "agent/node_rates_test_support.h"

namespace llmctl::agent::node_rates_test {
namespace {

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

}  // namespace
}  // namespace llmctl::agent::node_rates_test
