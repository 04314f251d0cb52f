// The report's memory over time (report_charts.h's LayOutMemoryTimeline and its HTML figures):
// attempts laid end to end, each node's samples on its own clock, and the points the chart draws.
#include "controller/cli/report_charts.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "controller/cli/report.h"
#include "controller/cli/report_format.h"
#include "controller/cli/report_test_support.h"

namespace llmctl::cli {
namespace {

using report_test_support::FixedReport;
using report_test_support::kMiB;

// The attempts of a run follow each other on one axis, each from its trainer's start; device
// samples are placed by their wall clock against that start, those from before it left out.
TEST(MemoryTimelineTest, LaysOutAttemptsEndToEndAndSamplesByTheirClock) {
  const v1::ReportResponse report = FixedReport();
  const MemoryTimeline ok = LayOutMemoryTimeline(report.trials(0));
  ASSERT_EQ(ok.attempts.size(), 1u);
  EXPECT_EQ(ok.attempts[0].limit_bytes, 80 * 1024 * kMiB);
  ASSERT_EQ(ok.snapshots.size(), 6u);
  const v1::AttemptMemory& stored = report.trials(0).memory_timeline(0);
  for (size_t i = 0; i < ok.snapshots.size(); ++i) {
    const v1::MemorySnapshot& snap = stored.snapshots(static_cast<int>(i));
    EXPECT_DOUBLE_EQ(ok.snapshots[i].seconds, snap.elapsed_ms() / 1000);
    EXPECT_EQ(ok.snapshots[i].allocated_bytes, snap.allocated_bytes());
    EXPECT_EQ(ok.snapshots[i].reserved_bytes, snap.reserved_bytes());
    EXPECT_EQ(ok.snapshots[i].phase, snap.phase());
  }
  ASSERT_EQ(ok.device_used.at("cuda:0").size(), 4u);  // the one from before the start left out
  EXPECT_DOUBLE_EQ(ok.device_used.at("cuda:0")[1].seconds, 1.0);
  EXPECT_EQ(ok.device_used.at("cuda:0")[3].used_bytes, 31 * 1024 * kMiB);
  EXPECT_DOUBLE_EQ(ok.end_seconds, 3.0);  // the last sample outlasts the last snapshot
  EXPECT_EQ(ok.top_bytes, 80 * 1024 * kMiB);
  // A CPU node's samples (the trial's resident memory) are no device's memory.
  v1::TrialReport on_cpu = report.trials(0);
  for (v1::DeviceMemorySample& sample :
       *on_cpu.mutable_memory_timeline(0)->mutable_device_samples()) {
    sample.set_device("cpu");
  }
  EXPECT_TRUE(LayOutMemoryTimeline(on_cpu).device_used.empty());
  EXPECT_DOUBLE_EQ(LayOutMemoryTimeline(on_cpu).end_seconds, 2.6);

  // Resumed an hour later: the second attempt starts where the first one's trainer ended (after
  // its last snapshot), and ends at its own last snapshot, as it has no end.
  const MemoryTimeline resumed = LayOutMemoryTimeline(report.trials(2));
  ASSERT_EQ(resumed.attempts.size(), 2u);
  EXPECT_DOUBLE_EQ(resumed.attempts[0].end_seconds, 0.06);
  EXPECT_DOUBLE_EQ(resumed.attempts[1].start_seconds, 0.06);
  ASSERT_EQ(resumed.snapshots.size(), 4u);
  EXPECT_EQ(resumed.snapshots[2].attempt, 2);
  EXPECT_DOUBLE_EQ(resumed.snapshots[2].seconds, 0.06 + 0.015);
  EXPECT_DOUBLE_EQ(resumed.end_seconds, 0.1);
}

// A two-node attempt's nodes date their samples by their own clocks: node rank 1's, 30 s ahead of
// node rank 0's, are placed against rank 0's trainer's start read on that same clock (the store's
// node_started_unix_ms), not against node rank 0's reading of it; a node whose zero is
// unknown has nothing to place its samples against.
TEST(MemoryTimelineTest, EachNodesSamplesArePlacedAgainstRankZerosStartOnItsOwnClock) {
  v1::TrialReport trial;
  constexpr int64_t kNodeZeroStart = 1'700'000'000'000;
  // Rank 0's start, read on node rank 1's clock, 30 s ahead.
  constexpr int64_t kZeroOnNodeOne = kNodeZeroStart + 30'000;
  v1::AttemptMemory* attempt = report_test_support::AddAttemptMemory(
      &trial, 1, kNodeZeroStart, 80 * 1024 * kMiB, {{2'500, "phase3_after_opt_step", 0, 3 * kMiB}},
      {{1'000, 10 * 1024 * kMiB}});
  (*attempt->mutable_node_started_unix_ms())[1] = kZeroOnNodeOne;
  const auto add_sample = [&](int32_t node_rank, int64_t unix_ms, int64_t used) {
    v1::DeviceMemorySample* sample = attempt->add_device_samples();
    sample->set_device("cuda:0");
    sample->set_node_rank(node_rank);
    sample->set_unix_ms(unix_ms);
    sample->set_memory_used_bytes(used);
  };
  add_sample(1, kZeroOnNodeOne + 1'000, 11 * 1024 * kMiB);
  add_sample(1, kZeroOnNodeOne + 2'000, 12 * 1024 * kMiB);
  add_sample(2, kNodeZeroStart + 1'500, 13 * 1024 * kMiB);  // node rank 2 has no start

  const MemoryTimeline timeline = LayOutMemoryTimeline(trial);
  EXPECT_EQ(timeline.device_used.size(), 2u);
  ASSERT_EQ(timeline.device_used.at("node 0 cuda:0").size(), 1u);
  EXPECT_DOUBLE_EQ(timeline.device_used.at("node 0 cuda:0")[0].seconds, 1.0);
  const std::vector<MemoryTimeline::Sample>& node_one = timeline.device_used.at("node 1 cuda:0");
  ASSERT_EQ(node_one.size(), 2u);
  EXPECT_DOUBLE_EQ(node_one[0].seconds, 1.0);
  EXPECT_DOUBLE_EQ(node_one[1].seconds, 2.0);
  EXPECT_DOUBLE_EQ(timeline.end_seconds, 2.5);  // the snapshot's, not a misplaced sample's
  EXPECT_EQ(timeline.unplaced_used,
            (std::map<std::string, int64_t>{{"node 2 cuda:0", 13 * 1024 * kMiB}}));
  // The JSON gives them too, for whoever places the samples themselves.
  v1::ReportResponse report;
  *report.add_trials() = trial;
  const nlohmann::json json = nlohmann::json::parse(RenderReport(report, ReportFormat::kJson));
  EXPECT_EQ(json["trials"][0]["memory_timeline"][0]["node_started_unix_ms"],
            nlohmann::json({{"1", kZeroOnNodeOne}}));
}

// One figure of the "Memory over time" section, by its trial's name.
std::string TimelineFigure(const std::string& html, const std::string& trial) {
  const size_t section = html.find("<h2>Memory over time</h2>");
  const size_t begin = html.find("<figcaption>" + trial + "</figcaption>", section);
  if (section == std::string::npos || begin == std::string::npos) return "";
  return html.substr(begin, html.find("</figure>", begin) - begin);
}

// The (x, y) pairs of every `<polyline class="CLASS" ... points="...">` in `svg`, one list each.
std::vector<std::vector<std::pair<double, double>>> Polylines(const std::string& svg,
                                                              const std::string& css_class) {
  std::vector<std::vector<std::pair<double, double>>> lines;
  const std::regex polyline("<polyline class=\"" + css_class + "\"[^>]* points=\"([^\"]*)\"");
  for (std::sregex_iterator it(svg.begin(), svg.end(), polyline), end; it != end; ++it) {
    std::vector<std::pair<double, double>>& line = lines.emplace_back();
    std::istringstream points((*it)[1].str());
    for (std::string pair; points >> pair;) {
      const size_t comma = pair.find(',');
      line.emplace_back(std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1)));
    }
  }
  return lines;
}

// An attempt stored before start events said when the ranks met has no zero for its other nodes
// (the store gives them no node_started_unix_ms, as report_queries_test checks): node rank 0's line
// is drawn and node rank 1's is not, as from any other zero it would be off by what is not known,
// but the figure lists node rank 1's device with the most memory it had in use, which needs no
// time, and says why it is not drawn.
TEST(MemoryTimelineTest, AnOldAttemptsOtherNodesAreListedWithTheirMemoryNotDrawn) {
  v1::ReportResponse report;
  v1::TrialReport* trial = report.add_trials();
  trial->set_name("two-nodes");
  trial->set_outcome("ok");
  constexpr int64_t kNodeZeroStart = 1'700'000'000'000;
  v1::AttemptMemory* attempt = report_test_support::AddAttemptMemory(
      trial, 1, kNodeZeroStart, 80 * 1024 * kMiB, {{2'500, "phase3_after_opt_step", 0, 3 * kMiB}},
      {{1'000, 10 * 1024 * kMiB}});
  for (const auto& [unix_ms, used] :
       {std::pair<int64_t, int64_t>{kNodeZeroStart + 5'000, 11}, {kNodeZeroStart + 6'000, 12}}) {
    v1::DeviceMemorySample* sample = attempt->add_device_samples();
    sample->set_device("cuda:0");
    sample->set_node_rank(1);
    sample->set_unix_ms(unix_ms);
    sample->set_memory_used_bytes(used * 1024 * kMiB);
  }

  const MemoryTimeline timeline = LayOutMemoryTimeline(*trial);
  ASSERT_EQ(timeline.device_used.size(), 1u);
  EXPECT_EQ(timeline.device_used.begin()->first, "node 0 cuda:0");
  EXPECT_EQ(timeline.unplaced_used,
            (std::map<std::string, int64_t>{{"node 1 cuda:0", 12 * 1024 * kMiB}}));
  EXPECT_DOUBLE_EQ(timeline.end_seconds, 2.5);
  const std::string figure =
      TimelineFigure(RenderReport(report, ReportFormat::kHtml), trial->name());
  EXPECT_EQ(Polylines(figure, "device").size(), 1u) << figure;
  EXPECT_NE(figure.find("node 1 cuda:0: up to 12,288.0 MiB in use, not drawn: the attempt&#8217;s "
                        "events do not say when the ranks met"),
            std::string::npos)
      << figure;
}

// The chart draws the snapshots themselves: one point per snapshot, x an affine function of its
// seconds and y of its bytes (to the SVG's 0.1 px), one line per attempt.
TEST(MemoryTimelineTest, ChartPointsAreTheSnapshots) {
  const v1::ReportResponse report = FixedReport();
  const std::string html = RenderReport(report, ReportFormat::kHtml);
  for (int t : {0, 1, 2}) {
    const v1::TrialReport& trial = report.trials(t);
    const std::string figure = TimelineFigure(html, trial.name());
    ASSERT_FALSE(figure.empty()) << trial.name();
    const auto lines = Polylines(figure, "allocated");
    ASSERT_EQ(static_cast<int>(lines.size()), trial.memory_timeline_size()) << trial.name();
    std::vector<std::pair<double, double>> points;      // drawn
    std::vector<std::pair<double, int64_t>> snapshots;  // stored: joined seconds, bytes
    double offset = 0;
    for (int a = 0; a < trial.memory_timeline_size(); ++a) {
      const v1::AttemptMemory& attempt = trial.memory_timeline(a);
      ASSERT_EQ(static_cast<int>(lines[a].size()), attempt.snapshots_size()) << trial.name();
      points.insert(points.end(), lines[a].begin(), lines[a].end());
      for (const v1::MemorySnapshot& snap : attempt.snapshots()) {
        snapshots.emplace_back(offset + snap.elapsed_ms() / 1000, snap.allocated_bytes());
      }
      offset +=
          std::max(attempt.ended_elapsed_ms(), attempt.snapshots().rbegin()->elapsed_ms()) / 1000;
    }
    // The scales from the first and the highest point, checked on every point.
    const size_t high = static_cast<size_t>(
        std::max_element(snapshots.begin(), snapshots.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; }) -
        snapshots.begin());
    const double x_per_second =
        (points[high].first - points[0].first) / (snapshots[high].first - snapshots[0].first);
    const double y_per_byte = (points[high].second - points[0].second) /
                              static_cast<double>(snapshots[high].second - snapshots[0].second);
    EXPECT_GT(x_per_second, 0);
    EXPECT_LT(y_per_byte, 0);  // up the page
    for (size_t i = 0; i < points.size(); ++i) {
      EXPECT_NEAR(points[i].first,
                  points[0].first + x_per_second * (snapshots[i].first - snapshots[0].first), 0.1)
          << trial.name() << " point " << i;
      EXPECT_NEAR(points[i].second,
                  points[0].second +
                      y_per_byte * static_cast<double>(snapshots[i].second - snapshots[0].second),
                  0.1)
          << trial.name() << " point " << i;
    }
  }
  const std::string ok = TimelineFigure(html, "reduced-batch");
  EXPECT_EQ(Polylines(ok, "device").at(0).size(), 4u);
  EXPECT_NE(ok.find("limit 80.00 GiB"), std::string::npos);
  EXPECT_NE(ok.find("<title>phase1_after_fwd, step 1, micro-batch 0, 2.600 s: allocated 29,696.0 "
                    "MiB, reserved 29,704.0 MiB</title>"),
            std::string::npos);
  const std::string oom = TimelineFigure(html, "baseline");
  EXPECT_NE(oom.find("class=\"oom\""), std::string::npos);
  EXPECT_NE(oom.find("out of memory"), std::string::npos);
  EXPECT_EQ(TimelineFigure(html, "reduced-batch").find("class=\"oom\""), std::string::npos);
  EXPECT_NE(TimelineFigure(html, "cpu-offload").find("attempt 2"), std::string::npos);

  // Attempts with one limit: a line over each, its label once.
  v1::ReportResponse same_limit = FixedReport();
  for (v1::AttemptMemory& attempt : *same_limit.mutable_trials(2)->mutable_memory_timeline()) {
    attempt.set_device_limit_bytes(100 * kMiB);
  }
  const std::string resumed =
      TimelineFigure(RenderReport(same_limit, ReportFormat::kHtml), "cpu-offload");
  size_t lines = 0;
  for (size_t at = resumed.find("class=\"limit\""); at != std::string::npos;
       at = resumed.find("class=\"limit\"", at + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 2u);
  EXPECT_EQ(resumed.find(">limit 100.00 MiB<"), resumed.rfind(">limit 100.00 MiB<"));
  EXPECT_NE(resumed.find(">limit 100.00 MiB<"), std::string::npos);
}

}  // namespace
}  // namespace llmctl::cli
