// The estimate at a probe's rates (controller/cli/local_rates.h): a CPU trial's time is its work
// over the probe's rates, each matmul shape at the probe's rate for it, a probe taken at a bad
// moment says how to measure again, and plan says which rates it used.
#include <gtest/gtest.h>

#include "controller/cli/local_rates.h"
#include "controller/cli/local_rates_test_support.h"

namespace llmctl::cli::local_rates_test {
namespace {

// The bf16-true row of cpu-lab at the probe's rates: its step is its work over them, with no
// factor from another machine, and the JSON says which rates; without the probe it says nothing
// of rates, as before.
TEST_F(LocalRatesTest, AnEstimateWithTheProbeIsItsWorkOverTheProbesRates) {
  const auto [without, with] = Bf16TrueTimes(LocalRates::FromProbe(FixedProbe(), "a test"));
  ASSERT_FALSE(with.is_null());
  EXPECT_FALSE(without.contains("rates"));
  EXPECT_NE(with["rates"].get<std::string>().find("this machine's probe (a test)"),
            std::string::npos);
  EXPECT_EQ(with["work"], without["work"]);
  const nlohmann::json& work = with["work"];
  ASSERT_EQ(work["matmul_class"], "bf16");
  // Its loss: ATen's (cpu-lab's `kernels: aten`) over bf16 logits, at the probe's rate for it.
  ASSERT_EQ(work["loss_kernels"], "aten");
  ASSERT_EQ(work["loss_class"], "bf16");
  ASSERT_GT(work["loss_logits"].get<double>(), 0);
  const double expected =
      work["matmul_flops"].get<double>() / 1e9 + work["memory_bytes"].get<double>() / 1e10 +
      work["loss_logits"].get<double>() / 5e8 + work["launches"].get<double>() * 4e-6;
  EXPECT_EQ(with["factor"], 1);
  EXPECT_NEAR(with["step_seconds"].get<double>(), expected, 1e-9 * expected);
  // The data sheets' bf16 is twice their fp32; this CPU's is a fiftieth of its fp32.
  EXPECT_GT(with["step_seconds"].get<double>(), 10 * without["step_seconds"].get<double>());
}

// A probe whose bf16 matmuls speed up with the weight's width (1 GFLOP/s at 256 wide, 4 at 4,096,
// at any rows) and whose bf16 attention runs at 2 GFLOP/s: the bf16-true row's step takes each of
// its matmul shapes at the rate of its sqrt(in x out), linear in log(width), and its attention at
// the attention rate; the shapes' FLOPs with attention's are the whole work's.
TEST_F(LocalRatesTest, AnEstimateTakesEachMatmulShapeAtTheProbesRateForIt) {
  estimate::RateProbe probe = FixedProbe();
  probe.matmul = {{"fp32", 512, 5e10},
                  {"bf16", 256, 1e9, 32},
                  {"bf16", 256, 1e9, 2048},
                  {"bf16", 4096, 4e9, 32},
                  {"bf16", 4096, 4e9, 2048}};
  probe.sdpa = {{"bf16", 2e9}};
  EstimateOptions options;
  options.trial = "bf16-true";
  options.format = "json";
  const LocalRates rates = LocalRates::FromProbe(probe, "a test");
  options.rates = rates.Lookup();
  StatusOr<std::string> probed = EstimateExperiment(Experiments() + "cpu-lab.yaml", options);
  ASSERT_TRUE(probed.ok()) << probed.status().message();
  const nlohmann::json time = nlohmann::json::parse(*probed)["trials"][0]["time"];
  const nlohmann::json& work = time["work"];
  ASSERT_EQ(work["matmul_class"], "bf16");
  ASSERT_FALSE(work["matmul_shapes"].empty());
  double matmuls = 0, flops = work["attention_flops"].get<double>();
  for (const nlohmann::json& shape : work["matmul_shapes"]) {
    const double width = std::sqrt(shape["in"].get<double>() * shape["out"].get<double>());
    const double rate = 1e9 + 3e9 * std::log(width / 256) / std::log(4096.0 / 256);
    matmuls += shape["flops"].get<double>() / rate;
    flops += shape["flops"].get<double>();
  }
  EXPECT_NEAR(flops, work["matmul_flops"].get<double>(), 1e-9 * flops);
  const double expected = matmuls + work["attention_flops"].get<double>() / 2e9 +
                          work["memory_bytes"].get<double>() / 1e10 +
                          work["loss_logits"].get<double>() / 5e8 +
                          work["launches"].get<double>() * 4e-6;
  EXPECT_NEAR(time["step_seconds"].get<double>(), expected, 1e-9 * expected);
}

// A probe that warns of the moment it was measured at (its speed moving, others busy, the kernel's
// share) says how to measure its node again wherever its rates are named: this machine's (node
// local), and a stored node's by its name. A steady one says nothing more.
TEST_F(LocalRatesTest, AProbeTakenAtABadMomentSaysHowToMeasureItsNodeAgain) {
  estimate::RateProbe moved = FixedProbe();
  moved.speed_spread = 0.23;
  std::ofstream(home_ / "probe.json") << moved.ToJson().dump(2);
  std::ostringstream err;
  const LocalRates rates = LocalRates::Load(Env(), home_ / "no-such" / "llmctl", err);
  EXPECT_TRUE(rates.For(estimate::CpuSpeed())
                  .rates.ends_with(", its speed moving 23% while measured; `llmctl nodes "
                                   "--measure local` measures again"))
      << rates.For(estimate::CpuSpeed()).rates;

  estimate::RateProbe busy = FixedProbe();
  busy.others_cpu_share = 0.3;
  StoreNodeRates(home_, {{"cpu-1", busy}});
  const LocalRates stored = LocalRates::Load(Env(), home_ / "no-such" / "llmctl", err);
  EXPECT_TRUE(stored.For(estimate::CpuSpeed())
                  .rates.ends_with("meanwhile; `llmctl nodes --measure cpu-1` measures again"))
      << stored.For(estimate::CpuSpeed()).rates;

  const LocalRates steady = LocalRates::FromProbe(FixedProbe(), "a test");
  EXPECT_EQ(steady.For(estimate::CpuSpeed()).rates.find("--measure"), std::string::npos);
}

TEST_F(LocalRatesTest, PlanSaysWhichRatesItUsed) {
  const LocalRates rates = LocalRates::FromProbe(FixedProbe(), "a test");
  PlanOptions options;
  options.model = Experiments() + "models/cpu-lab-small";
  options.device = "cpu";
  options.device_memory = "216MiB";
  options.seq = 128;
  options.global_batch = 8;
  options.steps = 6;
  options.format = "json";
  StatusOr<std::string> sheet = PlanRun(options);
  ASSERT_TRUE(sheet.ok()) << sheet.status().message();
  EXPECT_FALSE(nlohmann::json::parse(*sheet).contains("rates"));
  options.rates = rates.Lookup();
  StatusOr<std::string> probed = PlanRun(options);
  ASSERT_TRUE(probed.ok()) << probed.status().message();
  EXPECT_NE(nlohmann::json::parse(*probed)["rates"].get<std::string>().find("a test"),
            std::string::npos);
}

}  // namespace
}  // namespace llmctl::cli::local_rates_test
