#include "controller/cli/watch_view.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "common/printf.h"
#include "controller/cli/report_format.h"

namespace llmctl::cli {
namespace {

v1::ExperimentStatus TwoTrials(int64_t step) {
  v1::ExperimentStatus status;
  status.set_id(3);
  status.set_name("cpu-lab");
  status.set_state("running");
  v1::TrialStatus* running = status.add_trials();
  running->set_name("baseline");
  running->set_state("running");
  running->set_node("local");
  running->set_step(step);
  running->set_total_steps(6);
  running->set_tokens_per_second(1460.4);
  running->set_allocated_bytes(132 << 20);
  running->set_peak_bytes(212 << 20);
  v1::TrialStatus* queued = status.add_trials();
  queued->set_name("reduced-batch");
  queued->set_state("queued");
  return status;
}

TEST(ProgressBarTest, FillsInProportion) {
  EXPECT_EQ(ProgressBar(3, 6, 10), "[#####-----]");
  EXPECT_EQ(ProgressBar(6, 6, 4), "[####]");
  EXPECT_EQ(ProgressBar(9, 6, 4), "[####]");
  EXPECT_EQ(ProgressBar(5, 0, 4), "[----]");  // total unknown
  // Step counts a node may report: step x width would overflow int64_t.
  EXPECT_EQ(ProgressBar(int64_t{500'000'000'000'000'000}, int64_t{500'000'000'000'000'000}, 4),
            "[####]");
  EXPECT_EQ(ProgressBar(int64_t{250'000'000'000'000'000}, int64_t{500'000'000'000'000'000}, 4),
            "[##--]");
}

TEST(WatchLinesTest, OneAlignedLinePerTrial) {
  const std::vector<std::string> lines = WatchLines(TwoTrials(3));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0],
            "baseline       running    [##########----------] 3/6          1460 tok/s  mem "
            "132.0 MiB (peak 212.0 MiB)  on local");
  EXPECT_EQ(lines[1].find("reduced-batch  queued     [--------------------] 0/?"), 0u) << lines[1];
}

// The status is the controller's: its words reach the terminal without control characters, and
// a name longer than any trial's (200 bytes) is printed, not padded to on every other line.
TEST(WatchLinesTest, AHostileStatusIsShownSafely) {
  v1::ExperimentStatus status = TwoTrials(3);
  status.mutable_trials(0)->set_name("base\x1b[31mline");
  status.mutable_trials(0)->set_state("ok\r\x1b[Kfake");
  status.mutable_trials(1)->set_name(std::string(1 << 20, 'x'));
  const std::vector<std::string> lines = WatchLines(status);
  ASSERT_GE(lines.size(), 2u);
  for (const std::string& line : lines) {
    EXPECT_EQ(line.find_first_of("\x1b\r"), std::string::npos);
  }
  EXPECT_EQ(lines[0].find("base [31mline"), 0u) << lines[0];
  EXPECT_LT(lines[0].size(), 1000u) << "the first line padded to the long name";
}

// A tokens/s the controller sends (a hostile step line's) too long for a fixed buffer is printed
// whole, not cut to a number many times smaller.
TEST(WatchLinesTest, AHugeTokensPerSecondIsPrintedWhole) {
  v1::ExperimentStatus status = TwoTrials(3);
  status.mutable_trials(0)->set_tokens_per_second(1e40);
  const std::vector<std::string> lines = WatchLines(status);
  ASSERT_GE(lines.size(), 1u);
  const std::string digits = Printf("%.0f", 1e40);
  ASSERT_EQ(digits.size(), 41u);
  EXPECT_NE(lines[0].find(" " + digits + " tok/s"), std::string::npos) << lines[0];
}

// The controller's words are cut, each to a few hundred bytes, and lose their bidirectional
// controls: a trainer's 60,000-byte error made a line of 60,290 bytes every second.
TEST(WatchLinesTest, LongWordsAreCutAndBidiControlsSpacedOut) {
  v1::ExperimentStatus status = TwoTrials(3);
  status.set_name(std::string(5000, 'n'));
  status.mutable_trials(0)->set_error(std::string(60000, 'e'));
  status.mutable_trials(0)->set_node(std::string(5000, 'o'));
  status.mutable_trials(1)->set_name(
      "evil\xe2\x80\xae"
      "gpj.exe");
  status.mutable_trials(1)->set_notice(std::string(5000, 'w'));
  const std::vector<std::string> lines = WatchLines(status);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_LT(lines[0].size(), 1000u);
  EXPECT_NE(lines[0].find(std::string(100, 'e').append("\u2026")), std::string::npos) << lines[0];
  EXPECT_EQ(lines[1].find("evil gpj.exe"), 0u) << lines[1];
  EXPECT_LT(lines[2].size(), 400u);
  WatchPrinter printer(/*tty=*/true);
  const std::string drawn = printer.Update(status, WatchPrinter::Clock::time_point());
  EXPECT_LT(drawn.size(), 3000u);
  EXPECT_EQ(drawn.find("\xe2\x80\xae"), std::string::npos);
}

TEST(WatchLinesTest, AMultiRankTrialShowsItsHighestPeakAndEachRanks) {
  v1::ExperimentStatus status;
  v1::TrialStatus* trial = status.add_trials();
  trial->set_name("ddp");
  trial->set_state("running");
  trial->set_allocated_bytes(int64_t{100} << 20);
  trial->set_peak_bytes(int64_t{130} << 20);
  for (const auto& [rank, peak] : {std::pair{0, 120}, std::pair{1, 130}}) {
    v1::RankMemory* memory = trial->add_ranks();
    memory->set_rank(rank);
    memory->set_peak_bytes(int64_t{peak} << 20);
  }
  const std::vector<std::string> lines = WatchLines(status);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("mem 100.0 MiB (peak 130.0 MiB, max of 2 ranks: 120.0 MiB 130.0 MiB)"),
            std::string::npos)
      << lines[0];
}

v1::DeviceSample Gpu(const std::string& device, double percent, double used_gib) {
  v1::DeviceSample sample;
  sample.set_device(device);
  sample.set_utilization_percent(percent);
  sample.set_memory_used_bytes(static_cast<int64_t>(used_gib * (1 << 30)));
  sample.set_memory_total_bytes(int64_t{80} << 30);
  sample.set_power_watts(312.4);
  sample.set_temperature_celsius(64);
  return sample;
}

TEST(MeterTest, FillsInProportionUnderItsText) {
  EXPECT_EQ(Meter("GPU", 0.45, "45%", 20), "GPU[|||||||||        45%]");
  EXPECT_EQ(Meter("GPU", 0, "0%", 10), "GPU[        0%]");
  EXPECT_EQ(Meter("GPU", 1, "100%", 10), "GPU[||||||100%]");
  EXPECT_EQ(Meter("CPU", 1.8, "180%", 10), "CPU[||||||180%]");  // full from 100% on
  EXPECT_EQ(Meter("X", -1, "", 4), "X[    ]");
  EXPECT_EQ(Meter("X", 0.5, "too long", 4), "X[long]");  // the text's end stays
}

TEST(DeviceLineTest, GpuAndCpuAsNvtopDrawsThem) {
  EXPECT_EQ(DeviceLine(Gpu("cuda:0", 45, 61.2), "cuda:0", 6),
            "cuda:0 GPU[|||||||||        45%] MEM[|||||||||||||||||61.2/80.0 GiB] 312 W 64\u00b0C");
  v1::DeviceSample cpu;
  cpu.set_device("cpu");
  cpu.set_utilization_percent(180);
  cpu.set_memory_used_bytes(int64_t{13} << 30 >> 3);  // 1.625 GiB
  cpu.set_memory_total_bytes(int64_t{24} << 30);
  EXPECT_EQ(DeviceLine(cpu, "cpu", 6),
            "cpu    CPU[||||||||||||||||180%] RSS[||                1.6/24.0 GiB]");
  cpu.clear_utilization_percent();  // a CPU's first reading
  EXPECT_EQ(DeviceLine(cpu, "cpu", 3).find("cpu CPU[                   ?] RSS["), 0u);
}

TEST(WatchLinesTest, ARunningTrialsDevicesFollowItsLineAligned) {
  v1::ExperimentStatus status = TwoTrials(3);
  *status.mutable_trials(0)->add_devices() = Gpu("cuda:0", 45, 61.2);
  *status.mutable_trials(0)->add_devices() = Gpu("cuda:10", 100, 80);
  status.mutable_trials(0)->set_notice("node n's lease ends soon");
  const std::vector<std::string> lines = WatchLines(status);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0].find("baseline "), 0u);
  EXPECT_EQ(lines[1], "    ! node n's lease ends soon");
  EXPECT_EQ(lines[2].find("    cuda:0  GPU[|||||||||        45%] MEM["), 0u) << lines[2];
  EXPECT_EQ(
      lines[3].find("    cuda:10 GPU[||||||||||||||||100%] MEM[|||||||||||||||||80.0/80.0 GiB]"),
      0u)
      << lines[3];
  EXPECT_EQ(lines[4].find("reduced-batch "), 0u);
}

// A multi-node trial's devices: each node's cuda:0, named by its node rank.
TEST(WatchLinesTest, SeveralNodesDevicesAreNamedByTheirNodeRank) {
  v1::ExperimentStatus status = TwoTrials(3);
  *status.mutable_trials(0)->add_devices() = Gpu("cuda:0", 45, 61.2);
  v1::DeviceSample other = Gpu("cuda:0", 100, 80);
  other.set_node_rank(1);
  *status.mutable_trials(0)->add_devices() = other;
  const std::vector<std::string> lines = WatchLines(status);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[1].find("    node 0 cuda:0 GPU[|||||||||        45%]"), 0u) << lines[1];
  EXPECT_EQ(lines[2].find("    node 1 cuda:0 GPU[||||||||||||||||100%]"), 0u) << lines[2];
}

constexpr auto kInterval = WatchPrinter::kProgressInterval;

size_t CountLines(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

TEST(WatchPrinterTest, PlainOutputStartsWithAHeaderThatCountsTheQueuedTrials) {
  WatchPrinter printer(/*tty=*/false);
  const std::string first = printer.Update(TwoTrials(1), WatchPrinter::Clock::time_point());
  ASSERT_EQ(CountLines(first), 2u) << first;
  EXPECT_EQ(first.rfind("experiment 3 cpu-lab: 2 trials, 1 queued\nbaseline ", 0), 0u) << first;
  EXPECT_EQ(first.find("reduced-batch"), std::string::npos);  // queued: counted in the header
  EXPECT_EQ(first.find('\x1b'), std::string::npos);
}

TEST(WatchPrinterTest, PlainOutputLeavesOutTheDevicesThatChangeEverySecond) {
  WatchPrinter printer(/*tty=*/false);
  WatchPrinter::Clock::time_point now;
  v1::ExperimentStatus status = TwoTrials(1);
  *status.mutable_trials(0)->add_devices() = Gpu("cuda:0", 45, 61.2);
  const std::string first = printer.Update(status, now);
  EXPECT_NE(first.find("baseline"), std::string::npos);
  EXPECT_EQ(first.find("cuda:0"), std::string::npos);
  *status.mutable_trials(0)->mutable_devices(0) = Gpu("cuda:0", 90, 70);
  EXPECT_EQ(printer.Update(status, now += kInterval), "");
}

TEST(WatchPrinterTest, PlainOutputWritesATrialsLineWhenItsStateChanges) {
  WatchPrinter printer(/*tty=*/false);
  WatchPrinter::Clock::time_point now;
  printer.Update(TwoTrials(1), now);
  v1::ExperimentStatus status = TwoTrials(6);
  status.mutable_trials(0)->set_state("ok");
  status.mutable_trials(1)->set_state("running");
  const std::string changed = printer.Update(status, now += std::chrono::seconds(1));
  const std::vector<std::string> lines = WatchLines(status);
  EXPECT_EQ(changed, lines[0] + "\n" + lines[1] + "\n");
  EXPECT_EQ(printer.Update(status, now += kInterval), "");  // nothing moved
}

TEST(WatchPrinterTest, PlainOutputWritesANewNoticeOnceForTheTrialsThatGotIt) {
  WatchPrinter printer(/*tty=*/false);
  WatchPrinter::Clock::time_point now;
  v1::ExperimentStatus status = TwoTrials(1);
  status.mutable_trials(0)->set_state("queued");
  status.mutable_trials(0)->set_notice("no connected node has 1 cpu device");
  status.mutable_trials(1)->set_notice("no connected node has 1 cpu device");
  EXPECT_EQ(printer.Update(status, now),
            "experiment 3 cpu-lab: 2 trials, 2 queued\n"
            "    ! baseline and reduced-batch: no connected node has 1 cpu device\n");
  EXPECT_EQ(printer.Update(status, now += kInterval), "");
  status.mutable_trials(1)->set_notice("node n's lease ends soon");
  EXPECT_EQ(printer.Update(status, now += kInterval),
            "    ! reduced-batch: node n's lease ends soon\n");
  // A notice can carry an agent's words (an upload's refusal): its control characters never reach
  // the terminal, in plain output or in the live view.
  status.mutable_trials(1)->set_notice("upload refused\x1b[2J\x1b]0;owned\x07\nnext line");
  EXPECT_EQ(printer.Update(status, now += kInterval),
            "    ! reduced-batch: upload refused [2J ]0;owned  next line\n");
  for (const std::string& line : WatchLines(status)) {
    EXPECT_EQ(line.find_first_of("\x1b\x07\n"), std::string::npos) << line;
  }
}

// The seconds after the first status at which plain output writes a progress line, for one trial
// whose step moves every second from `start_step` for `seconds`.
std::vector<int> ProgressLineTimes(WatchPrinter& printer, int start_step, int seconds) {
  std::vector<int> times;
  for (int second = 1; second <= seconds; ++second) {
    const std::string out =
        printer.Update(TwoTrials(start_step + second),
                       WatchPrinter::Clock::time_point(std::chrono::seconds(second)));
    if (out.find(" s: 0 of 2 trials ended; running: baseline ") != std::string::npos) {
      times.push_back(second);
    } else {
      EXPECT_EQ(out, "") << "second " << second;
    }
  }
  return times;
}

TEST(WatchPrinterTest, PlainOutputWritesProgressLinesFurtherApartWhileNoStateChanges) {
  WatchPrinter printer(/*tty=*/false);
  printer.Update(TwoTrials(0), WatchPrinter::Clock::time_point());
  EXPECT_EQ(ProgressLineTimes(printer, 0, 700), std::vector<int>({10, 30, 70, 150, 310, 610}));
}

TEST(WatchPrinterTest, PlainOutputsProgressLineSaysHowFarTheRunningTrialsGot) {
  WatchPrinter printer(/*tty=*/false);
  printer.Update(TwoTrials(0), WatchPrinter::Clock::time_point());
  EXPECT_EQ(printer.Update(TwoTrials(3), WatchPrinter::Clock::time_point(kInterval)),
            std::to_string(kInterval.count()) +
                " s: 0 of 2 trials ended; running: baseline 3/6 at 1460 tok/s\n");
}

TEST(WatchPrinterTest, PlainOutputWritesNoProgressLineWhileNoStepMoves) {
  WatchPrinter printer(/*tty=*/false);
  printer.Update(TwoTrials(1), WatchPrinter::Clock::time_point());
  EXPECT_EQ(printer.Update(TwoTrials(1), WatchPrinter::Clock::time_point(10 * kInterval)), "");
}

TEST(WatchPrinterTest, AStateLineLeavesTheProgressIntervalAsItIs) {
  WatchPrinter printer(/*tty=*/false);
  printer.Update(TwoTrials(0), WatchPrinter::Clock::time_point());
  ASSERT_EQ(ProgressLineTimes(printer, 0, 40), std::vector<int>({10, 30}));
  v1::ExperimentStatus status = TwoTrials(40);
  status.mutable_trials(1)->set_state("running");
  EXPECT_NE(printer.Update(status, WatchPrinter::Clock::time_point(std::chrono::seconds(41))), "");
  // The next progress line comes 40 s after the state line, not 10.
  for (int second = 42; second <= 81; ++second) {
    status.mutable_trials(0)->set_step(second);
    const std::string out =
        printer.Update(status, WatchPrinter::Clock::time_point(std::chrono::seconds(second)));
    EXPECT_EQ(out.empty(), second < 81) << second << ": " << out;
  }
}

// `make demo | cat`'s watch output: experiments/cpu-lab.yaml's 14 trials run one at a time, their
// lengths in a Zen 3's proportions (the bf16 rows the longest; 18 minutes in all) times `slowdown`,
// a status a second (the devices' samples).
std::string CpuLabOutput(int slowdown) {
  const std::vector<std::pair<std::string, int>> trials = {{"baseline", 5},
                                                           {"reduced-batch", 8},
                                                           {"grad-accumulation", 20},
                                                           {"bf16-true", 60},
                                                           {"bf16-mixed", 60},
                                                           {"larger-model", 60},
                                                           {"even-larger", 5},
                                                           {"smallest-batch", 5},
                                                           {"sgd", 30},
                                                           {"adam-8bit", 240},
                                                           {"activation-checkpointing", 240},
                                                           {"cpu-offload", 30},
                                                           {"lora", 60},
                                                           {"qlora", 240}};
  v1::ExperimentStatus status;
  status.set_id(1);
  status.set_name("cpu-lab");
  for (const auto& [name, seconds] : trials) {
    v1::TrialStatus* trial = status.add_trials();
    trial->set_name(name);
    trial->set_state("queued");
    trial->set_notice("no connected node has 1 cpu device");
  }
  WatchPrinter printer(/*tty=*/false);
  WatchPrinter::Clock::time_point now;
  std::string out = printer.Update(status, now);
  for (v1::TrialStatus& trial : *status.mutable_trials()) trial.clear_notice();
  constexpr int kSteps = 6;
  for (size_t i = 0; i < trials.size(); ++i) {
    v1::TrialStatus& trial = *status.mutable_trials(static_cast<int>(i));
    trial.set_state("running");
    trial.set_total_steps(kSteps);
    const int seconds = trials[i].second * slowdown;
    for (int second = 0; second < seconds; ++second) {
      trial.set_step(second * kSteps / seconds);
      trial.clear_devices();
      *trial.add_devices() = Gpu("cpu", 90 + second % 10, 1);
      out += printer.Update(status, now += std::chrono::seconds(1));
    }
    trial.set_step(kSteps);
    trial.clear_devices();
    trial.set_state("ok");
    out += printer.Update(status, now);
  }
  return out;
}

// The header, the agent's missing-node notice, each trial's start and end, and a few progress
// lines: with the report and submit's lines after it (25), `make demo`'s output stays under 80
// lines in 18 minutes and in 53 (a make demo took about that on 2 cores shared with builds).
TEST(WatchPrinterTest, PlainOutputOfTheCpuLabFitsInAScreen) {
  for (int slowdown : {1, 3}) {
    SCOPED_TRACE("slowdown " + std::to_string(slowdown));
    const std::string out = CpuLabOutput(slowdown);
    EXPECT_LE(CountLines(out), 80u - 25) << out;
    EXPECT_EQ(out.find("CPU["), std::string::npos) << out;  // no device bars
    EXPECT_NE(out.find("qlora                     ok"), std::string::npos) << out;
  }
}

TEST(WatchPrinterTest, TerminalOutputRedrawsInPlace) {
  WatchPrinter printer(/*tty=*/true);
  WatchPrinter::Clock::time_point now;
  const std::string first = printer.Update(TwoTrials(1), now);
  EXPECT_EQ(first.find("\x1b[3F"), std::string::npos);           // nothing to go back over yet
  const std::string second = printer.Update(TwoTrials(2), now);  // every status, however soon
  // Auto-wrap off, so that each line takes one row, then back over the header and two trials.
  EXPECT_EQ(second.rfind("\x1b[?7l\x1b[3F", 0), 0u);
  EXPECT_TRUE(second.ends_with("\x1b[?7h")) << "auto-wrap is on again after the table";
  EXPECT_NE(second.find("experiment 3 cpu-lab: running"), std::string::npos);
}

}  // namespace
}  // namespace llmctl::cli
