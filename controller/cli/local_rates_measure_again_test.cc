// `llmctl nodes --measure local` with the embedded controller (controller/cli/local_rates.h,
// MeasureLocalProbeAgain): this llmctl measures this machine's probe.json again itself.
#include <gtest/gtest.h>

#include "controller/cli/local_rates.h"
#include "controller/cli/local_rates_test_support.h"

namespace llmctl::cli::local_rates_test {
namespace {

// `llmctl nodes --measure local` with the embedded controller: this llmctl measures probe.json
// again, though one is there, and starts no daemon; a probe that finds the machine busy leaves
// the file as it was; a trial running on node local, and LLMCTL_RATE_PROBE=off, measure nothing.
TEST_F(LocalRatesTest, NodesMeasureLocalMeasuresThisMachinesProbeAgain) {
  const fs::path bin = home_ / "bin";
  fs::create_directories(bin);
  estimate::RateProbe faster = FixedProbe();
  faster.memory_bytes_per_s = 2e10;
  std::ofstream(home_ / "faster.json") << faster.ToJson().dump(2);
  const fs::path runs = home_ / "runs";
  // The daemons' stand-ins are llm-train's too: a daemon started would count as a run.
  const auto stand_ins = [&](const std::string& then) {
    for (const char* name : {"llmctld", "llm-agent", "llm-train"}) {
      std::ofstream(bin / name) << StandInStart() << "echo run >> '" << runs.string() << "'\n"
                                << then;
      fs::permissions(bin / name, fs::perms::owner_all);
    }
  };
  const auto run_count = [&] {
    std::ifstream counted(runs);
    const std::string text((std::istreambuf_iterator<char>(counted)), {});
    return std::count(text.begin(), text.end(), '\n');
  };
  const fs::path path = home_ / "probe.json";
  std::ofstream(path) << FixedProbe().ToJson().dump(2);
  std::map<std::string, std::string> variables = {{"LLMCTL_HOME", home_.string()}};
  std::ostringstream out, err;
  const auto measure = [&] {
    out.str("");
    err.str("");
    CliContext context = testing::TestCliContext(
        [&variables](std::string_view name) -> std::optional<std::string> {
          if (auto value = variables.find(std::string(name)); value != variables.end()) {
            return value->second;
          }
          return std::nullopt;
        },
        out, err, bin);
    return RunLlmctl({"llmctl", "nodes", "--measure", "local"}, context);
  };

  stand_ins("cat '" + (home_ / "faster.json").string() + "' > \"$3\"\n");
  ASSERT_EQ(measure(), kExitOk) << err.str();
  EXPECT_EQ(err.str(),
            "measuring this machine's rates again (llm-train --probe, about 12 s) into " +
                path.string() + "\n");
  EXPECT_TRUE(out.str().starts_with("this machine's rates, measured again: cpu ")) << out.str();
  EXPECT_NE(out.str().find("memory 20 GB/s"), std::string::npos) << out.str();
  EXPECT_EQ(run_count(), 1) << "one probe, no daemon";
  ASSERT_TRUE(ReadRateProbe(path).ok());
  EXPECT_EQ(ReadRateProbe(path)->memory_bytes_per_s, 2e10);

  stand_ins("exit 1\n");
  EXPECT_EQ(measure(), kExitFailed);
  EXPECT_NE(err.str().find(" --probe found this machine busy (exit code 1, said above); " +
                           path.string() + " is as it was: measure again when the machine is idle"),
            std::string::npos)
      << err.str();
  EXPECT_EQ(run_count(), 2);
  EXPECT_EQ(ReadRateProbe(path)->memory_bytes_per_s, 2e10);

  // Never beside a trial on this machine, as an agent never measures beside one.
  stand_ins("cat '" + (home_ / "faster.json").string() + "' > \"$3\"\n");
  ASSERT_EQ(StartATrialOnThisMachine(home_), 1);
  EXPECT_EQ(measure(), kExitFailed);
  EXPECT_EQ(err.str(),
            "llmctl: a trial of experiment 1 runs on this machine now: a probe beside it would "
            "slow it and read the CPUs it leaves as the machine's speed; measure again once it "
            "has ended (llmctl status 1)\n");
  EXPECT_EQ(run_count(), 2);

  variables["LLMCTL_RATE_PROBE"] = "off";
  EXPECT_EQ(measure(), kExitFailed);
  EXPECT_EQ(err.str(), "llmctl: LLMCTL_RATE_PROBE=off: this machine's rates are not measured\n");
  EXPECT_EQ(run_count(), 2);
}

}  // namespace
}  // namespace llmctl::cli::local_rates_test
