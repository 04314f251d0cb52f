#include "controller/cli/watch_view.h"

#include <gtest/gtest.h>

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
}

TEST(WatchLinesTest, OneAlignedLinePerTrial) {
  const std::vector<std::string> lines = WatchLines(TwoTrials(3));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0],
            "baseline       running    [##########----------] 3/6          1460 tok/s  mem "
            "132.0 MiB (peak 212.0 MiB)  on local");
  EXPECT_EQ(lines[1].find("reduced-batch  queued     [--------------------] 0/?"), 0u) << lines[1];
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

TEST(WatchPrinterTest, PlainOutputLeavesOutTheDevicesThatChangeEverySecond) {
  WatchPrinter printer(/*tty=*/false);
  v1::ExperimentStatus status = TwoTrials(1);
  *status.mutable_trials(0)->add_devices() = Gpu("cuda:0", 45, 61.2);
  const std::string first = printer.Update(status);
  EXPECT_NE(first.find("baseline"), std::string::npos);
  EXPECT_EQ(first.find("cuda:0"), std::string::npos);
  *status.mutable_trials(0)->mutable_devices(0) = Gpu("cuda:0", 90, 70);
  EXPECT_EQ(printer.Update(status), "");
  // A notice is part of the trial's lines.
  status.mutable_trials(1)->set_notice("no connected node has 1 cuda device(s)");
  EXPECT_EQ(printer.Update(status), std::string(WatchLines(status)[2]) +
                                        "\n    ! no connected node has 1 cuda device(s)\n");
}

TEST(WatchPrinterTest, PlainOutputAppendsOnlyChangedLines) {
  WatchPrinter printer(/*tty=*/false);
  const std::string first = printer.Update(TwoTrials(1));
  EXPECT_NE(first.find("baseline"), std::string::npos);
  EXPECT_NE(first.find("reduced-batch"), std::string::npos);
  EXPECT_EQ(printer.Update(TwoTrials(1)), "");
  const std::string second = printer.Update(TwoTrials(2));
  EXPECT_NE(second.find("baseline"), std::string::npos);
  EXPECT_EQ(second.find("reduced-batch"), std::string::npos);
  EXPECT_EQ(second.find('\x1b'), std::string::npos);
}

TEST(WatchPrinterTest, TerminalOutputRedrawsInPlace) {
  WatchPrinter printer(/*tty=*/true);
  const std::string first = printer.Update(TwoTrials(1));
  EXPECT_EQ(first.find("\x1b[3F"), std::string::npos);  // nothing to go back over yet
  const std::string second = printer.Update(TwoTrials(2));
  EXPECT_EQ(second.rfind("\x1b[3F", 0), 0u);  // back over the header and two trials
  EXPECT_NE(second.find("experiment 3 cpu-lab: running"), std::string::npos);
}

}  // namespace
}  // namespace llmctl::cli
