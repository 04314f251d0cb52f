// The local probe as estimate and plan use it: read from LLMCTL_HOME's probe.json, refused by name
// when broken, and turning a CPU trial's time into its work over the probe's rates (a fixed probe:
// no test depends on this machine's rates).
#include "controller/cli/local_rates.h"

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
#include "controller/cli/offline_cli_test.h"
#include "controller/cli/plan.h"
#include "controller/store/store.h"
#include "tests/support/shell_command.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

std::string Experiments() { return (llmctl::testing::SourceDir() / "experiments/").string(); }

estimate::RateProbe FixedProbe() {
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
std::string StandInStart(const TrainerVersions& versions = FixedProbe().versions) {
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

TEST_F(LocalRatesTest, ReadsTheCachedProbeWithoutMeasuring) {
  std::ofstream(home_ / "probe.json") << FixedProbe().ToJson().dump(2);
  std::ostringstream err;
  // `self` names no llm-train: a probe run would fail, so the rates are the file's.
  const LocalRates rates = LocalRates::Load(Env(), home_ / "no-such" / "llmctl", err);
  ASSERT_TRUE(rates.probe().has_value()) << err.str();
  EXPECT_EQ(rates.probe()->ToJson(), FixedProbe().ToJson());
  EXPECT_EQ(err.str(), "");
  const estimate::DeviceSpeed cpu = rates.For(estimate::CpuSpeed());
  EXPECT_EQ(cpu.bf16_flops, 1e9);
  EXPECT_NE(cpu.rates.find((home_ / "probe.json").string()), std::string::npos) << cpu.rates;
  // A GPU's time keeps its data sheet: this probe is the CPU's.
  const estimate::DeviceSpeed h100 =
      rates.For(estimate::GpuSpeed(*estimate::GpuNamed("h100-94gb")));
  EXPECT_EQ(h100.rates, "");
}

// LLMCTL_HOME as the embedded daemons take it: a link in its place is refused, not followed to a
// directory elsewhere that the probe would be written into (here by a stand-in llm-train).
TEST_F(LocalRatesTest, ALinkInTheDataDirectorysPlaceIsRefusedAndNothingIsMeasured) {
  const fs::path bin = home_ / "bin";
  fs::create_directories(bin);
  for (const char* name : {"llmctld", "llm-agent", "llm-train"}) {
    std::ofstream(bin / name) << StandInStart() << ": > \"$3\"\n";  // writes --probe-output's file
    fs::permissions(bin / name, fs::perms::owner_all);
  }
  fs::create_directories(home_ / "elsewhere");
  const fs::path link = home_ / "link";
  fs::create_directory_symlink(home_ / "elsewhere", link);
  std::ostringstream err;
  const EnvLookup env = [&link](std::string_view name) -> std::optional<std::string> {
    if (name == "LLMCTL_HOME") return link.string();
    return std::nullopt;
  };
  const LocalRates rates = LocalRates::Load(env, bin / "llmctl", err);
  EXPECT_FALSE(rates.probe().has_value());
  EXPECT_NE(err.str().find("the time is at the data sheets' rates: " + link.string() +
                           ": a symbolic link, not a directory"),
            std::string::npos)
      << err.str();
  EXPECT_FALSE(fs::exists(home_ / "elsewhere" / "probe.json"));
}

// Two llmctls that need this machine's rates at once measure them once: the second waits for the
// first's probe and takes it, rather than measuring beside it (each then measures half a machine,
// which the probe refuses as a busy machine's rates).
TEST_F(LocalRatesTest, TwoAtOnceMeasureOnceAndBothTakeTheProbe) {
  const fs::path bin = home_ / "bin";
  fs::create_directories(bin);
  std::ofstream(home_ / "fixed.json") << FixedProbe().ToJson().dump(2);
  const std::string runs = (home_ / "runs.txt").string();
  for (const char* name : {"llmctld", "llm-agent", "llm-train"}) {
    // The stand-in llm-train waits for a second run (2 s at most) before writing --probe-output's
    // file, so that two measurements would overlap.
    std::ofstream(bin / name) << StandInStart() << "echo run >> '" << runs
                              << "'\ni=0\nwhile [ \"$(wc -l < '" << runs
                              << "')\" -lt 2 ] && [ $i -lt 100 ]; do sleep 0.02; i=$((i+1)); "
                                 "done\ncat '"
                              << (home_ / "fixed.json").string() << "' > \"$3\"\n";
    fs::permissions(bin / name, fs::perms::owner_all);
  }
  std::ostringstream errs[2];
  std::optional<LocalRates> loaded[2];
  {
    std::jthread first([&] { loaded[0] = LocalRates::Load(Env(), bin / "llmctl", errs[0]); });
    std::jthread second([&] { loaded[1] = LocalRates::Load(Env(), bin / "llmctl", errs[1]); });
  }
  std::ifstream measured(runs);
  const std::string measured_text(std::istreambuf_iterator<char>(measured), {});
  EXPECT_EQ(measured_text, "run\n") << errs[0].str() << errs[1].str();
  for (int i : {0, 1}) {
    ASSERT_TRUE(loaded[i]->probe().has_value()) << errs[i].str();
    EXPECT_EQ(loaded[i]->probe()->ToJson(), FixedProbe().ToJson());
  }
}

// The probe's path is LLMCTL_HOME's text, the user's environment's: an escape in it (\e]0;...\a
// retitles the window) reaches the terminal as a space.
TEST_F(LocalRatesTest, TheProbesPathIsShownWithoutItsEscapes) {
  const fs::path bin = home_ / "bin";
  fs::create_directories(bin);
  std::ofstream(home_ / "fixed.json") << FixedProbe().ToJson().dump(2);
  for (const char* name : {"llmctld", "llm-agent", "llm-train"}) {
    std::ofstream(bin / name) << StandInStart() << "cat '" << (home_ / "fixed.json").string()
                              << "' > \"$3\"\n";
    fs::permissions(bin / name, fs::perms::owner_all);
  }
  const std::string home = (home_ / "data\x1b]0;T\a").string();
  const EnvLookup env = [&home](std::string_view name) -> std::optional<std::string> {
    if (name == "LLMCTL_HOME") return home;
    return std::nullopt;
  };
  std::ostringstream err;
  const LocalRates rates = LocalRates::Load(env, bin / "llmctl", err);
  EXPECT_TRUE(rates.probe().has_value()) << err.str();
  EXPECT_NE(err.str().find("measuring this machine's rates once"), std::string::npos) << err.str();
  EXPECT_EQ(err.str().find('\x1b'), std::string::npos) << err.str();
  EXPECT_EQ(err.str().find('\a'), std::string::npos) << err.str();
}

// A probe killed while llm-train wrote probe.json left its temporary (probe.json.tmp.PID.N) for
// good; the next llmctl to measure removes it once it holds probe.json.lock.
TEST_F(LocalRatesTest, AKilledProbesTemporaryIsRemovedByTheNextProbe) {
  const fs::path bin = home_ / "bin";
  fs::create_directories(bin);
  std::ofstream(home_ / "fixed.json") << FixedProbe().ToJson().dump(2);
  for (const char* name : {"llmctld", "llm-agent", "llm-train"}) {
    std::ofstream(bin / name) << StandInStart() << "cat '" << (home_ / "fixed.json").string()
                              << "' > \"$3\"\n";  // writes --probe-output's file
    fs::permissions(bin / name, fs::perms::owner_all);
  }
  const fs::path leftover = home_ / "probe.json.tmp.123.0";
  std::ofstream(leftover) << "{\"version\":";
  std::ostringstream err;
  const LocalRates rates = LocalRates::Load(Env(), bin / "llmctl", err);
  ASSERT_TRUE(rates.probe().has_value()) << err.str();
  EXPECT_FALSE(fs::exists(leftover));
}

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
  {
    StatusOr<std::unique_ptr<store::Store>> store =
        store::Store::Open((home_ / "llmctl.db").string());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
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
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    ASSERT_TRUE(
        (*store)
            ->StartAttempt((*(*store)->ListTrials(*id))[0].id, kLocalNode, store::Time(), {0})
            .ok());
  }
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

// A probe that found the machine busy (llm-train's exit 1: others shared its CPUs) writes nothing;
// the data sheets serve, saying so, and the next llmctl measures again.
TEST_F(LocalRatesTest, AProbeRefusedAsBusyIsMeasuredAgainNextTime) {
  const fs::path bin = home_ / "bin";
  fs::create_directories(bin);
  const fs::path runs = home_ / "runs";
  for (const char* name : {"llmctld", "llm-agent", "llm-train"}) {
    std::ofstream(bin / name) << StandInStart() << "echo run >> '" << runs.string()
                              << "'\nexit 1\n";
    fs::permissions(bin / name, fs::perms::owner_all);
  }
  for (int attempt = 1; attempt <= 2; ++attempt) {
    std::ostringstream err;
    const LocalRates rates = LocalRates::Load(Env(), bin / "llmctl", err);
    EXPECT_FALSE(rates.probe().has_value());
    EXPECT_NE(err.str().find("note: the time is at the data sheets' rates: "), std::string::npos)
        << err.str();
    EXPECT_NE(err.str().find("--probe found this machine busy (exit code 1, said above); it is "
                             "measured again the next time its rates are needed"),
              std::string::npos)
        << err.str();
    EXPECT_FALSE(fs::exists(home_ / "probe.json"));
    std::ifstream counted(runs);
    const std::string text((std::istreambuf_iterator<char>(counted)), {});
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), attempt) << text;
  }
}

// Whether process `pid` has ended: gone, or a zombie its parent has not reaped yet.
bool ProcessEnded(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  const size_t name_end = text.rfind(')');
  return name_end == std::string::npos || text.substr(name_end + 2, 1) == "Z";
}

// The probe dies with the llmctl that runs it: an llmctl killed alone (a `kill`, a supervisor's
// SIGTERM; a terminal's Ctrl-C reaches its whole process group) left it measuring on, outside
// probe.json.lock, beside the next llmctl's probe.
TEST_F(LocalRatesTest, AProbeDoesNotOutliveTheLlmctlThatRunsIt) {
  const fs::path bin = home_ / "bin";
  fs::create_directories(bin);
  const std::string pid_file = (home_ / "probe.pid").string();
  for (const char* name : {"llmctld", "llm-agent", "llm-train"}) {
    // The stand-in llm-train says its pid, then measures for ten minutes.
    std::ofstream(bin / name) << StandInStart() << "echo $$ > '" << pid_file << ".new' && mv '"
                              << pid_file << ".new' '" << pid_file << "'\nexec sleep 600\n";
    fs::permissions(bin / name, fs::perms::owner_all);
  }
  const pid_t llmctl = ::fork();
  ASSERT_GE(llmctl, 0);
  if (llmctl == 0) {
    std::ostringstream err;
    LocalRates::Load(Env(), bin / "llmctl", err);
    ::_exit(0);
  }
  std::string probe_pid;
  for (int i = 0; i < 3000 && probe_pid.empty(); ++i) {
    std::ifstream(pid_file) >> probe_pid;
    if (probe_pid.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(llmctl, SIGKILL);
  ::waitpid(llmctl, nullptr, 0);
  ASSERT_FALSE(probe_pid.empty()) << "the stand-in probe never started";
  const pid_t probe = std::stoi(probe_pid);
  bool ended = ProcessEnded(probe);
  for (int i = 0; i < 500 && !ended; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ended = ProcessEnded(probe);
  }
  if (!ended) ::kill(probe, SIGKILL);  // leaves nothing running after the test
  EXPECT_TRUE(ended) << "the probe outlived its llmctl";
}

// A probe of version 1 timed its matmuls at 512 tokens only: it is measured again, saying why
// (here `self` names no llm-train, so the data sheets serve, said too).
TEST_F(LocalRatesTest, AnOlderProbeVersionIsMeasuredAgain) {
  nlohmann::json old = nlohmann::json::parse(FixedProbe().ToJson().dump());
  old["version"] = 1;
  for (nlohmann::json& row : old["matmul"]) row.erase("tokens");
  std::ofstream(home_ / "probe.json") << old.dump(2);
  std::ostringstream err;
  const LocalRates rates = LocalRates::Load(Env(), home_ / "no-such" / "llmctl", err);
  EXPECT_FALSE(rates.probe().has_value());
  EXPECT_NE(err.str().find("measuring this machine's rates again: " +
                           (home_ / "probe.json").string() + " is a probe of version 1"),
            std::string::npos)
      << err.str();
  EXPECT_NE(err.str().find("data sheets' rates"), std::string::npos) << err.str();
}

// A probe measured with other threads or kernels than llm-train now takes (the user has set
// OMP_NUM_THREADS or ONEDNN_MAX_CPU_ISA since), or by another LibTorch, is measured again, saying
// why; one that matches is taken without measuring. An llm-train that does not answer --version
// leaves the kept probe as it is. llm-train is asked once at most, and not about a probe measured
// again whatever it says.
TEST_F(LocalRatesTest, AProbeOfOtherThreadsKernelsOrLibTorchIsMeasuredAgain) {
  const fs::path bin = home_ / "bin";
  fs::create_directories(bin);
  estimate::RateProbe kept = FixedProbe();
  kept.versions.cpu_threads = 2;
  kept.versions.aten_cpu_capability = "AVX512";
  estimate::RateProbe measured = kept;
  measured.measured_at = "2026-12-04T10:00:00Z";
  std::ofstream(home_ / "measured.json") << measured.ToJson().dump(2);
  const std::string runs = (home_ / "runs.txt").string();
  const std::string asks = (home_ / "asks.txt").string();
  // Loads from a probe.json of `probe`, with a stand-in llm-train whose --version runs
  // `version_answer`: whether it measured (the stand-in's probe then serves), what it said, and how
  // often llm-train was asked its version.
  struct Loaded {
    bool remeasured = false;
    std::string said;
    int asked = 0;
  };
  const auto load = [&](const std::string& version_answer, const nlohmann::json& probe) {
    for (const char* name : {"llmctld", "llm-agent", "llm-train"}) {
      std::ofstream(bin / name) << "#!/bin/sh\n[ \"$1\" = --version ] && { echo ask >> '" << asks
                                << "'; " << version_answer << "; }\necho run >> '" << runs
                                << "'\ncat '" << (home_ / "measured.json").string()
                                << "' > \"$3\"\n";
      fs::permissions(bin / name, fs::perms::owner_all);
    }
    std::ofstream(home_ / "probe.json") << probe.dump(2);
    fs::remove(runs);
    fs::remove(asks);
    std::ostringstream err;
    const LocalRates rates = LocalRates::Load(Env(), bin / "llmctl", err);
    EXPECT_TRUE(rates.probe().has_value()) << err.str();
    std::ifstream asked(asks);
    const std::string asked_text(std::istreambuf_iterator<char>(asked), {});
    return Loaded{fs::exists(runs), err.str(),
                  static_cast<int>(std::count(asked_text.begin(), asked_text.end(), '\n'))};
  };
  // What llm-train says it is now.
  const auto answering = [](const TrainerVersions& now) {
    return "echo '" + now.ToJson() + "'; exit 0";
  };
  const std::string kept_path = (home_ / "probe.json").string();
  TrainerVersions one_thread = kept.versions;
  one_thread.cpu_threads = 1;
  TrainerVersions capped = kept.versions;
  capped.onednn_isa_cap = "AVX2";
  TrainerVersions newer = kept.versions;
  newer.libtorch = "2.16.0";
  const std::pair<TrainerVersions, std::string> changes[] = {
      {one_thread, "measuring this machine's rates again: " + kept_path +
                       " was measured with 2 threads, ATen AVX512, and llm-train now runs with 1 "
                       "thread, ATen AVX512"},
      {capped, "and llm-train now runs with 2 threads, ATen AVX512, oneDNN at most AVX2"},
      {newer,
       " was measured by llm-train 0.4.0 (LibTorch 2.15.0, no CUDA device), and llm-train is now "
       "llm-train 0.4.0 (LibTorch 2.16.0, no CUDA device)"},
  };
  const nlohmann::json kept_json = kept.ToJson();
  for (const auto& [now, why] : changes) {
    const Loaded loaded = load(answering(now), kept_json);
    EXPECT_TRUE(loaded.remeasured) << loaded.said;
    EXPECT_NE(loaded.said.find(why), std::string::npos) << loaded.said;
    EXPECT_EQ(loaded.asked, 1) << loaded.said;
  }

  Loaded loaded = load(answering(kept.versions), kept_json);
  EXPECT_FALSE(loaded.remeasured) << loaded.said;
  EXPECT_EQ(loaded.said, "");
  EXPECT_EQ(loaded.asked, 1);
  loaded = load("exit 3", kept_json);
  EXPECT_FALSE(loaded.remeasured) << loaded.said;
  EXPECT_EQ(loaded.said, "");
  EXPECT_EQ(loaded.asked, 1);
  // A probe measured again whatever llm-train says (an older version) does not ask it.
  nlohmann::json older = kept_json;
  older["version"] = 11;
  loaded = load("exit 3", older);
  EXPECT_TRUE(loaded.remeasured) << loaded.said;
  EXPECT_EQ(loaded.asked, 0);
}

TEST_F(LocalRatesTest, OffKeepsTheDataSheetsWithoutMeasuringOrReading) {
  std::ofstream(home_ / "probe.json") << FixedProbe().ToJson().dump(2);
  const EnvLookup env = [home =
                             home_.string()](std::string_view name) -> std::optional<std::string> {
    if (name == "LLMCTL_HOME") return home;
    if (name == kRateProbeVariable) return "off";
    return std::nullopt;
  };
  std::ostringstream err;
  const LocalRates rates = LocalRates::Load(env, home_ / "no-such" / "llmctl", err);
  EXPECT_FALSE(rates.probe().has_value());
  EXPECT_EQ(err.str(), "");
  EXPECT_EQ(rates.For(estimate::CpuSpeed()).rates, "");
}

// estimate, plan and submit load on first use: a GPU trial's time neither measures nor says
// anything; the first CPU trial loads (here: no llm-train beside `self`, so the data sheets, said).
TEST_F(LocalRatesTest, OnFirstUseOnlyACpuTrialLoadsTheProbe) {
  std::ostringstream err;
  const LocalRates rates = LocalRates::LoadOnFirstUse(Env(), home_ / "no-such" / "llmctl", err);
  const estimate::DeviceSpeed h100 =
      rates.For(estimate::GpuSpeed(*estimate::GpuNamed("h100-94gb")));
  EXPECT_EQ(h100.rates, "");
  EXPECT_EQ(err.str(), "");
  EXPECT_FALSE(rates.probe().has_value());
  EXPECT_EQ(rates.For(estimate::CpuSpeed()).rates, "");
  EXPECT_NE(err.str().find("data sheets' rates"), std::string::npos) << err.str();
  const std::string said = err.str();
  rates.For(estimate::CpuSpeed());
  EXPECT_EQ(err.str(), said) << "loaded once";

  std::ofstream(home_ / "probe.json") << FixedProbe().ToJson().dump(2);
  std::ostringstream quiet;
  const LocalRates cached = LocalRates::LoadOnFirstUse(Env(), home_ / "no-such" / "llmctl", quiet);
  EXPECT_EQ(cached.For(estimate::CpuSpeed()).bf16_flops, 1e9);
  EXPECT_EQ(quiet.str(), "");
}

TEST_F(LocalRatesTest, ABrokenProbeFileIsNamedAndTheSheetsServe) {
  std::ofstream(home_ / "probe.json") << R"({"version": 1e400})";
  EXPECT_EQ(ReadRateProbe(home_ / "probe.json").status().message(),
            (home_ / "probe.json").string() + ": not JSON");
  std::ofstream(home_ / "probe.json") << R"({"version": 1})";
  EXPECT_NE(ReadRateProbe(home_ / "probe.json").status().message().find("probe.json"),
            std::string::npos);
  std::ostringstream err;
  const LocalRates rates = LocalRates::Load(Env(), home_ / "no-such" / "llmctl", err);
  EXPECT_FALSE(rates.probe().has_value());
  EXPECT_NE(err.str().find("probe.json"), std::string::npos) << err.str();
  EXPECT_NE(err.str().find("data sheets' rates"), std::string::npos) << err.str();
}

// The bf16-true row of cpu-lab at the probe's rates: its step is its work over them, with no
// factor from another machine, and the JSON says which rates; without the probe it says nothing
// of rates, as before.
TEST_F(LocalRatesTest, AnEstimateWithTheProbeIsItsWorkOverTheProbesRates) {
  const LocalRates rates = LocalRates::FromProbe(FixedProbe(), "a test");
  EstimateOptions options;
  options.trial = "bf16-true";
  options.format = "json";
  StatusOr<std::string> sheet = EstimateExperiment(Experiments() + "cpu-lab.yaml", options);
  ASSERT_TRUE(sheet.ok()) << sheet.status().message();
  options.rates = rates.Lookup();
  StatusOr<std::string> probed = EstimateExperiment(Experiments() + "cpu-lab.yaml", options);
  ASSERT_TRUE(probed.ok()) << probed.status().message();
  const nlohmann::json without = nlohmann::json::parse(*sheet)["trials"][0]["time"];
  const nlohmann::json with = nlohmann::json::parse(*probed)["trials"][0]["time"];
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

// The embedded controller's store with `probes` stored as its nodes' rates (what the dispatcher
// stores from each agent's NodeInfo).
void StoreNodeRates(const fs::path& home,
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

// A GPU of the table whose NVML name reads back as that GPU.
estimate::Gpu KnownGpu() {
  for (const estimate::Gpu& gpu : estimate::KnownGpus()) {
    const std::optional<estimate::Gpu> named = estimate::GpuOfDeviceName(gpu.model);
    if (named.has_value() && named->name == gpu.name) return gpu;
  }
  ADD_FAILURE() << "no GPU reads back by its model name";
  return estimate::KnownGpus().front();
}

// A node's stored probe serves before this machine's (probe.json) and measures nothing here; the
// estimate's step is its work over the node's rates, and its time names the node. A GPU trial
// takes the probe of a node with that GPU; a GPU the store has no probe of keeps its data sheet.
// (The embedded agent's, node "local", is this machine's own: the next test.)
TEST_F(LocalRatesTest, AStoredNodeProbeServesBeforeThisMachinesAndTheEstimateSaysWhich) {
  estimate::RateProbe node = FixedProbe();
  node.matmul = {{"fp32", 512, 2e10}, {"bf16", 512, 4e9}};
  node.memory_bytes_per_s = 5e9;
  node.launch_seconds = 8e-6;
  node.loss = {{"aten", "bf16", 2e8}};
  estimate::RateProbe gpu = FixedProbe();
  gpu.device = "cuda";
  gpu.loss.clear();  // a CPU's
  gpu.device_name = KnownGpu().model;
  gpu.matmul = {{"fp32", 512, 3e13}, {"bf16", 512, 2e14}};
  gpu.memory_bytes_per_s = 2e12;
  StoreNodeRates(home_, {{"cpu-1", node}, {"gpu-1", gpu}});
  std::ofstream(home_ / "probe.json") << FixedProbe().ToJson().dump(2);

  std::ostringstream err;
  const LocalRates rates = LocalRates::LoadOnFirstUse(Env(), home_ / "no-such" / "llmctl", err);
  const estimate::DeviceSpeed on_gpu = rates.For(estimate::GpuSpeed(KnownGpu()));
  EXPECT_EQ(on_gpu.bf16_flops, 2e14);
  EXPECT_TRUE(on_gpu.rates.starts_with("node gpu-1's probe (stored by the controller): cuda "))
      << on_gpu.rates;
  for (const estimate::Gpu& other : estimate::KnownGpus()) {
    if (other.name != KnownGpu().name) {
      EXPECT_EQ(rates.For(estimate::GpuSpeed(other)).rates, "") << other.name;
    }
  }

  EstimateOptions options;
  options.trial = "bf16-true";
  options.format = "json";
  StatusOr<std::string> sheet = EstimateExperiment(Experiments() + "cpu-lab.yaml", options);
  ASSERT_TRUE(sheet.ok()) << sheet.status().message();
  options.rates = rates.Lookup();
  StatusOr<std::string> probed = EstimateExperiment(Experiments() + "cpu-lab.yaml", options);
  ASSERT_TRUE(probed.ok()) << probed.status().message();
  EXPECT_EQ(err.str(), "") << "nothing measured, nothing to say";
  const nlohmann::json without = nlohmann::json::parse(*sheet)["trials"][0]["time"];
  const nlohmann::json with = nlohmann::json::parse(*probed)["trials"][0]["time"];
  EXPECT_TRUE(with["rates"].get<std::string>().starts_with(
      "node cpu-1's probe (stored by the controller): cpu "))
      << with["rates"];
  const nlohmann::json& work = with["work"];
  EXPECT_EQ(work, without["work"]);
  ASSERT_EQ(work["matmul_class"], "bf16");
  const double expected =
      work["matmul_flops"].get<double>() / 4e9 + work["memory_bytes"].get<double>() / 5e9 +
      work["loss_logits"].get<double>() / 2e8 + work["launches"].get<double>() * 8e-6;
  EXPECT_NEAR(with["step_seconds"].get<double>(), expected, 1e-9 * expected);

  // Off keeps the data sheets, stored probes too.
  const EnvLookup off = [home =
                             home_.string()](std::string_view name) -> std::optional<std::string> {
    if (name == "LLMCTL_HOME") return home;
    if (name == kRateProbeVariable) return "off";
    return std::nullopt;
  };
  const LocalRates sheets = LocalRates::LoadOnFirstUse(off, home_ / "no-such" / "llmctl", err);
  EXPECT_EQ(sheets.For(estimate::GpuSpeed(KnownGpu())).rates, "");
  EXPECT_EQ(sheets.For(estimate::CpuSpeed()).rates, "");
}

// The embedded agent's stored probe (node "local") is its copy of this machine's probe.json: the
// file serves in its place, before another CPU's node as the copy did, and deleting it measures
// again (a probe taken at a bad moment), where the copy would have served on and nothing been
// measured. Where this machine's cannot be had, the copy serves, and the note says so.
TEST_F(LocalRatesTest, TheEmbeddedAgentsCopyDoesNotStandInForThisMachinesProbe) {
  estimate::RateProbe copy = FixedProbe();
  copy.memory_bytes_per_s = 3e9;  // the bad moment's
  estimate::RateProbe far = FixedProbe();
  far.device_name = "Another CPU";
  far.memory_bytes_per_s = 4e9;
  StoreNodeRates(home_, {{"cpu-far", far}, {std::string(kLocalNode), copy}});
  const fs::path bin = home_ / "bin";
  fs::create_directories(bin);
  std::ofstream(home_ / "fixed.json") << FixedProbe().ToJson().dump(2);
  const std::string runs = (home_ / "runs.txt").string();
  for (const char* name : {"llmctld", "llm-agent", "llm-train"}) {
    std::ofstream(bin / name) << StandInStart() << "echo run >> '" << runs << "'\ncat '"
                              << (home_ / "fixed.json").string() << "' > \"$3\"\n";
    fs::permissions(bin / name, fs::perms::owner_all);
  }
  std::ostringstream err;
  const LocalRates rates = LocalRates::LoadOnFirstUse(Env(), bin / "llmctl", err);
  const estimate::DeviceSpeed cpu = rates.For(estimate::CpuSpeed());
  EXPECT_EQ(cpu.memory_bytes_per_s, 1e10);
  EXPECT_TRUE(cpu.rates.starts_with("this machine's probe (" + (home_ / "probe.json").string()))
      << cpu.rates;
  std::ifstream measured(runs);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(measured), {}), "run\n") << err.str();
  EXPECT_NE(err.str().find("measuring this machine's rates once"), std::string::npos) << err.str();

  fs::remove(home_ / "probe.json");
  std::ostringstream unmeasured;
  const LocalRates copied =
      LocalRates::LoadOnFirstUse(Env(), home_ / "no-such" / "llmctl", unmeasured);
  const estimate::DeviceSpeed at_copy = copied.For(estimate::CpuSpeed());
  EXPECT_EQ(at_copy.memory_bytes_per_s, 3e9);
  EXPECT_TRUE(at_copy.rates.starts_with("node local's probe (stored by the controller): cpu "))
      << at_copy.rates;
  EXPECT_NE(unmeasured.str().find(
                "note: the time is at the embedded agent's stored copy of this machine's rates: "),
            std::string::npos)
      << unmeasured.str();
}

// The node a trial is timed on is one that could run it: its probe of the trial's device, and its
// lease matching the experiment's target as the scheduler matches it (site and flavor). A CPU
// trial with a target never runs on this machine's embedded agent (it has no lease), so this
// machine's probe does not serve it.
TEST_F(LocalRatesTest, TheTargetPicksTheNodeWhoseLeaseMatchesIt) {
  estimate::RateProbe tacc = FixedProbe();
  tacc.device = "cuda";
  tacc.loss.clear();  // a CPU's
  tacc.device_name = KnownGpu().model;
  tacc.matmul = {{"fp32", 512, 3e13}, {"bf16", 512, 2e14}};
  estimate::RateProbe uc = tacc;
  uc.matmul = {{"fp32", 512, 3e13}, {"bf16", 512, 1e14}};
  StoreNodeRates(home_, {{"gpu-tacc", tacc}, {"gpu-uc", uc}});
  {
    StatusOr<std::unique_ptr<store::Store>> store =
        store::Store::Open((home_ / "llmctl.db").string());
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->SetNodeLease("gpu-tacc", {"l1", "KVM@TACC", "g1.h100.pci.1", {}}).ok());
    ASSERT_TRUE((*store)->SetNodeLease("gpu-uc", {"l2", "CHI@UC", "gpu_h100", {}}).ok());
  }
  std::ofstream(home_ / "probe.json") << FixedProbe().ToJson().dump(2);
  std::ostringstream err;
  const LocalRates rates = LocalRates::LoadOnFirstUse(Env(), home_ / "no-such" / "llmctl", err);
  const estimate::DeviceSpeed gpu = estimate::GpuSpeed(KnownGpu());

  EXPECT_EQ(rates.For(gpu, {{"site", "CHI@UC"}}).bf16_flops, 1e14);
  EXPECT_TRUE(rates.For(gpu, {{"site", "CHI@UC"}}).rates.starts_with("node gpu-uc's probe"));
  EXPECT_EQ(rates.For(gpu, {{"site", "KVM@TACC"}, {"flavor", "g1.h100.pci.1"}}).bf16_flops, 2e14);
  // node_type is not a label: it narrows nothing, as in placement.
  EXPECT_EQ(rates.For(gpu, {{"node_type", "gpu_h100"}}).bf16_flops, 2e14);
  EXPECT_EQ(rates.For(gpu).bf16_flops, 2e14) << "no target: the first node by name";
  EXPECT_EQ(rates.For(gpu, {{"site", "CHI@TACC"}}).rates, "") << "no such node: the data sheet";

  // This machine's probe serves an untargeted CPU trial, not a targeted one.
  EXPECT_EQ(rates.For(estimate::CpuSpeed()).fp32_flops, 5e10);
  EXPECT_EQ(rates.For(estimate::CpuSpeed(), {{"site", "CHI@UC"}}).rates, "");
  EXPECT_EQ(err.str(), "");
}

// A configured controller's nodes come through ListNodes: another process's bytes. A probe that
// does not parse is named and skipped; connected nodes come before the others.
TEST(NodeProbesOfTest, ParsesEachNodesProbeWithItsLeaseConnectedFirst) {
  v1::ListNodesResponse nodes;
  const auto add = [&nodes](const std::string& name, const std::string& state,
                            const std::string& probe_json) {
    v1::NodeStatus* node = nodes.add_nodes();
    node->set_name(name);
    node->set_state(state);
    node->set_rate_probe_json(probe_json);
    return node;
  };
  estimate::RateProbe probe = FixedProbe();
  add("a-away", "unreachable", probe.ToJson().dump());
  v1::NodeStatus* leased = add("b-here", "connected", probe.ToJson().dump());
  leased->mutable_lease()->set_site("CHI@UC");
  leased->mutable_lease()->set_flavor("gpu_h100");
  add("c-broken", "connected", "{\"device\": 7}");
  add("d-torn", "connected", "{ torn");
  add("e-none", "connected", "");

  std::ostringstream err;
  const std::vector<NodeProbe> parsed = NodeProbesOf(nodes, err);
  ASSERT_EQ(parsed.size(), 2u);
  EXPECT_EQ(parsed[0].node, "b-here");
  EXPECT_EQ(parsed[0].labels,
            (std::map<std::string, std::string>{{"site", "CHI@UC"}, {"flavor", "gpu_h100"}}));
  EXPECT_EQ(parsed[1].node, "a-away");
  EXPECT_TRUE(parsed[1].labels.empty());
  EXPECT_NE(err.str().find("note: node c-broken's rates are not used: "), std::string::npos)
      << err.str();
  EXPECT_NE(err.str().find("note: node d-torn's rates are not used: not JSON"), std::string::npos)
      << err.str();
  EXPECT_EQ(err.str().find("e-none"), std::string::npos) << "no probe is nothing to say";
}

// A controller's node names and probes are another party's: a note about them stays one line
// without their controls, and a probe whose versions would print them is not used.
TEST(NodeProbesOfTest, NotesShowAHostileNodeWithoutItsControls) {
  v1::ListNodesResponse nodes;
  v1::NodeStatus* torn = nodes.add_nodes();
  torn->set_name("n\x1b]0;T\x07\nFORGED\u202e");
  torn->set_state("connected");
  torn->set_rate_probe_json("{ torn");
  nlohmann::ordered_json forged = FixedProbe().ToJson();
  forged["identity"]["versions"]["libtorch"] = "2.15.0\x1b]0;T\x07\x1b[2J\r\nFORGED LINE";
  v1::NodeStatus* lying = nodes.add_nodes();
  lying->set_name("lying");
  lying->set_state("connected");
  lying->set_rate_probe_json(forged.dump());

  std::ostringstream err;
  EXPECT_TRUE(NodeProbesOf(nodes, err).empty());
  EXPECT_NE(err.str().find("note: node n ]0;T  FORGED 's rates are not used: not JSON"),
            std::string::npos)
      << err.str();
  EXPECT_NE(err.str().find("note: node lying's rates are not used: "), std::string::npos)
      << err.str();
  EXPECT_EQ(err.str().find('\x1b'), std::string::npos) << err.str();
  EXPECT_EQ(err.str().find("\nFORGED"), std::string::npos) << err.str();
  EXPECT_EQ(err.str().find("\u202e"), std::string::npos) << err.str();
}

// --rates' probe serves its device's trials before a node's or this machine's, and nothing is
// measured or read for them; a trial on another device takes what it would have without it.
TEST_F(LocalRatesTest, APreferredProbeServesItsDeviceFirstWithoutMeasuring) {
  std::ofstream(home_ / "probe.json") << "{ torn";
  std::ostringstream err;
  LocalRates rates = LocalRates::LoadOnFirstUse(Env(), home_ / "no-such" / "llmctl", err);
  estimate::RateProbe preferred = FixedProbe();
  preferred.device_name = "another CPU than this one";
  preferred.matmul = {{"fp32", 512, 7e10}};
  rates.Prefer(preferred, "their-node.json");
  EXPECT_FALSE(rates.preferred_used());
  EXPECT_EQ(rates.For(estimate::GpuSpeed(KnownGpu())).rates, "");
  EXPECT_FALSE(rates.preferred_used());
  const estimate::DeviceSpeed cpu = rates.For(estimate::CpuSpeed());
  EXPECT_EQ(cpu.fp32_flops, 7e10);
  EXPECT_EQ(cpu.rates, "the probe in their-node.json (--rates): " + preferred.Summary());
  EXPECT_TRUE(rates.preferred_used());
  EXPECT_EQ(err.str(), "") << "the broken probe.json was neither read nor measured again";
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
}  // namespace llmctl::cli
