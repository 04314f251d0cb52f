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
