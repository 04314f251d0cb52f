// This machine's probe as estimate and plan use it (controller/cli/local_rates.h): measured once
// into LLMCTL_HOME's probe.json and read from it after, measured again when its version, threads,
// kernels or LibTorch differ or when it found the machine busy, refused by name when broken, and
// never outliving the llmctl that runs it (a fixed probe: no test depends on this machine's
// rates).
#include "controller/cli/local_rates.h"

#include <gtest/gtest.h>

#include "controller/cli/local_rates_test_support.h"

namespace llmctl::cli::local_rates_test {
namespace {

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

// A first use that finds no probe while the embedded store has a trial running on this machine
// measures nothing, as an agent never measures beside a trial (the probe would read what the trial
// leaves of the CPUs as the machine's speed, and keep it): the data sheets serve, saying why, and
// the next use once the trial has ended measures.
TEST_F(LocalRatesTest, NoProbeIsTakenBesideATrialRunningOnThisMachine) {
  const fs::path bin = home_ / "bin";
  fs::create_directories(bin);
  const fs::path runs = home_ / "runs";
  for (const char* name : {"llmctld", "llm-agent", "llm-train"}) {
    std::ofstream(bin / name) << StandInStart() << "echo run >> '" << runs.string() << "'\ncat '"
                              << (home_ / "measured.json").string() << "' > \"$3\"\n";
    fs::permissions(bin / name, fs::perms::owner_all);
  }
  std::ofstream(home_ / "measured.json") << FixedProbe().ToJson().dump(2);
  ASSERT_EQ(StartATrialOnThisMachine(home_), 1);
  std::ostringstream err;
  const LocalRates beside = LocalRates::Load(Env(), bin / "llmctl", err);
  EXPECT_FALSE(beside.probe().has_value());
  EXPECT_EQ(err.str(),
            "note: the time is at the data sheets' rates: this machine's are not measured: a "
            "trial of experiment 1 runs on this machine now: a probe beside it would slow it and "
            "read the CPUs it leaves as the machine's speed; `llmctl nodes --measure local` "
            "measures them once it has ended\n");
  EXPECT_FALSE(fs::exists(home_ / "probe.json"));
  EXPECT_FALSE(fs::exists(runs)) << "nothing measured";

  fs::remove(home_ / "llmctl.db");
  err.str("");
  const LocalRates after = LocalRates::Load(Env(), bin / "llmctl", err);
  EXPECT_TRUE(after.probe().has_value()) << err.str();
  EXPECT_TRUE(fs::exists(home_ / "probe.json"));
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

}  // namespace
}  // namespace llmctl::cli::local_rates_test
