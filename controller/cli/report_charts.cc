#include "controller/cli/report_charts.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>

#include "common/byte_size.h"
#include "common/printf.h"
#include "common/snapshot_event.h"
#include "controller/cli/report.h"
#include "controller/cli/report_format.h"
#include "controller/cli/report_rows.h"
#include "controller/cli/watch_view.h"

namespace llmctl::cli {
namespace {

struct Category {
  std::string_view name;
  std::string_view color;
};
// The last two only for reports with data-parallel trials (ShownCategories).
constexpr std::array<Category, 6> kCategories = {
    Category{"params", "#4e79a7"},         Category{"grads", "#f28e2b"},
    Category{"optim (device)", "#59a14f"}, Category{"acts", "#b07aa1"},
    Category{"comm", "#9c755f"},           Category{"gathered params", "#edc948"}};
constexpr size_t kOneDeviceCategories = 4;

std::array<int64_t, 6> Stack(const v1::MemorySnapshot& snap) {
  return {snap.params_bytes(),       snap.grads_bytes(),
          snap.optim_device_bytes(), std::max<int64_t>(snap.other_bytes(), 0),
          snap.comm_bytes(),         snap.gathered_bytes()};
}

// How many of kCategories the report's phase charts draw: the data-parallel ones only when a
// trial has such buffers.
size_t ShownCategories(const v1::ReportResponse& report) {
  for (const v1::TrialReport& trial : report.trials()) {
    for (const v1::MemorySnapshot& snap : trial.per_phase()) {
      if (snap.comm_bytes() != 0 || snap.gathered_bytes() != 0) return kCategories.size();
    }
  }
  return kOneDeviceCategories;
}

// "phase2_after_bwd" -> "2"; other phases (e.g. "oom") as they are.
std::string PhaseLabel(const std::string& phase) {
  if (phase.size() > 5 && phase.starts_with("phase") && phase[5] >= '0' && phase[5] <= '9') {
    return phase.substr(5, 1);
  }
  return phase;
}

// Legend entries: a colour swatch and its name.
std::string Legend(const std::vector<Category>& entries) {
  std::string out = "<p class=\"legend\">";
  for (const Category& entry : entries) {
    out += "<span><i style=\"background:" + std::string(entry.color) + "\"></i>" +
           EscapeHtml(entry.name) + "</span>";
  }
  return out + "</p>\n";
}

// Horizontal bars, one per trial; `value` of each trial and its label text.
template <typename Value, typename Label>
std::string BarChart(const v1::ReportResponse& report, Value value, Label label,
                     std::string_view color) {
  constexpr double kRow = 22, kNameWidth = 200, kBarWidth = 360;
  double top = 0;
  for (const v1::TrialReport& trial : report.trials()) top = std::max(top, value(trial));
  if (top <= 0) top = 1;
  std::string out = "<svg width=\"" + Printf("%.0f", kNameWidth + kBarWidth + 90) + "\" height=\"" +
                    Printf("%.0f", kRow * report.trials_size() + 4) + "\" role=\"img\">\n";
  double y = 2;
  for (const v1::TrialReport& trial : report.trials()) {
    const double w = kBarWidth * std::max(0.0, value(trial)) / top;
    out += "<text x=\"" + Printf("%.0f", kNameWidth - 6) + "\" y=\"" + Printf("%.0f", y + 15) +
           "\" text-anchor=\"end\">" + EscapeHtml(trial.name()) + "</text>\n";
    out += "<rect x=\"" + Printf("%.0f", kNameWidth) + "\" y=\"" + Printf("%.0f", y + 3) +
           "\" width=\"" + Printf("%.1f", w) + "\" height=\"16\" fill=\"" + std::string(color) +
           "\"/>\n";
    out += "<text x=\"" + Printf("%.1f", kNameWidth + w + 6) + "\" y=\"" + Printf("%.0f", y + 15) +
           "\">" + EscapeHtml(label(trial)) + "</text>\n";
    y += kRow;
  }
  return out + "</svg>\n";
}

// ---- Memory over time.

constexpr std::string_view kAllocatedColor = "#4e79a7";
constexpr std::string_view kReservedColor = "#f28e2b";
constexpr std::string_view kDeviceUsedColor = "#59a14f";
constexpr std::string_view kLimitColor = "#e15759";
constexpr std::string_view kRuleColor = "#e4e4e4";

// An axis from 0 to `top` in steps of 1, 2, 2.5 or 5 times a power of ten of `unit`, about
// `ticks` of them.
struct Axis {
  double unit = 1;  // what one label counts: bytes of a MiB, seconds of a minute, ...
  std::string_view unit_name;
  double step = 1;  // in units
  double max = 1;   // in units: the last tick, at or above the data
  int decimals = 0;
  std::string Label(double units) const {
    return Printf(("%." + std::to_string(decimals) + "f").c_str(), units) + " " +
           std::string(unit_name);
  }
};

Axis NiceAxis(double top, double unit, std::string_view unit_name, int ticks) {
  Axis axis{.unit = unit, .unit_name = unit_name};
  const double span = std::max(top / unit, 1e-9);
  const double rough = span / ticks;
  const double magnitude = std::pow(10.0, std::floor(std::log10(rough)));
  for (double factor : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    axis.step = factor * magnitude;
    if (axis.step >= rough) break;
  }
  axis.max = std::ceil(span / axis.step - 1e-9) * axis.step;
  // As many decimals as the step has: 0.25 -> 2, 0.5 -> 1, 25 -> 0.
  while (axis.decimals < 3) {
    const double scaled = axis.step * std::pow(10.0, axis.decimals);
    if (std::abs(scaled - std::round(scaled)) < 1e-6) break;
    ++axis.decimals;
  }
  return axis;
}

// Bytes in the largest binary unit that keeps the top at least 1 (MiB for 216 MiB, GiB for 80 GiB).
Axis BytesAxis(int64_t top) {
  constexpr std::array<std::string_view, 5> kUnits = {"B", "KiB", "MiB", "GiB", "TiB"};
  size_t index = 0;
  double unit = 1;
  while (index + 1 < kUnits.size() && static_cast<double>(top) >= unit * 1024) {
    unit *= 1024;
    ++index;
  }
  // A little headroom, so that a limit at the top is not drawn on the frame.
  return NiceAxis(1.04 * static_cast<double>(std::max<int64_t>(top, 1)), unit, kUnits[index], 4);
}

// Seconds up to three minutes, then minutes up to three hours, then hours.
Axis TimeAxis(double seconds) {
  if (seconds >= 3 * 3600) return NiceAxis(seconds, 3600, "h", 5);
  if (seconds >= 180) return NiceAxis(seconds, 60, "min", 5);
  return NiceAxis(std::max(seconds, 1e-3), 1, "s", 5);
}

// "x,y" with one decimal: an SVG coordinate pair.
std::string Coordinates(double x, double y) { return Printf("%.1f", x) + "," + Printf("%.1f", y); }

// Appended to an SVG points list.
void AppendPoint(std::string& points, double x, double y) {
  if (!points.empty()) points += ' ';
  points += Coordinates(x, y);
}

// The timeline's plot area: its size in px and where a time and a byte count fall in it.
struct TimelinePlot {
  static constexpr double kWidth = 420, kHeight = 196;
  static constexpr double kLeft = 64, kRight = 22, kTop = 20, kBottom = 32;
  static constexpr double kPlotWidth = kWidth - kLeft - kRight,
                          kPlotHeight = kHeight - kTop - kBottom;

  Axis x_axis;  // seconds
  Axis y_axis;  // bytes

  double X(double seconds) const {
    return kLeft + kPlotWidth * seconds / (x_axis.max * x_axis.unit);
  }
  double Y(int64_t bytes) const {
    return kTop + kPlotHeight -
           kPlotHeight * static_cast<double>(bytes) / (y_axis.max * y_axis.unit);
  }
};

// Grid and tick labels.
std::string TimelineGrid(const TimelinePlot& plot) {
  using P = TimelinePlot;
  const Axis& y_axis = plot.y_axis;
  const Axis& x_axis = plot.x_axis;
  std::string out;
  for (double tick = 0; tick <= y_axis.max + y_axis.step / 2; tick += y_axis.step) {
    const double y = plot.Y(static_cast<int64_t>(std::llround(tick * y_axis.unit)));
    out += "<line x1=\"" + Printf("%.0f", P::kLeft) + "\" x2=\"" +
           Printf("%.0f", P::kLeft + P::kPlotWidth) + "\" y1=\"" + Printf("%.1f", y) + "\" y2=\"" +
           Printf("%.1f", y) + "\" stroke=\"" + std::string(kRuleColor) + "\"/>\n";
    out += "<text x=\"" + Printf("%.0f", P::kLeft - 5) + "\" y=\"" + Printf("%.1f", y + 4) +
           "\" text-anchor=\"end\">" + y_axis.Label(tick) + "</text>\n";
  }
  for (double tick = 0; tick <= x_axis.max + x_axis.step / 2; tick += x_axis.step) {
    const double x = plot.X(tick * x_axis.unit);
    out += "<text x=\"" + Printf("%.1f", x) + "\" y=\"" +
           Printf("%.0f", P::kHeight - P::kBottom + 15) + "\" text-anchor=\"middle\">" +
           x_axis.Label(tick) + "</text>\n";
  }
  return out;
}

// Phase boundaries: a rule at each snapshot, its phase's number above the plot where there is
// room for it.
std::string TimelinePhaseRules(const TimelinePlot& plot, const MemoryTimeline& timeline) {
  using P = TimelinePlot;
  constexpr double kLabelSpacing = 9;  // px between phase labels, so that they never overlap
  std::string out;
  double last_label_x = -kLabelSpacing;
  for (const MemoryTimeline::Snapshot& snap : timeline.snapshots) {
    if (snap.phase == snapshot_event::kAtOom) continue;
    const double x = plot.X(snap.seconds);
    out += "<line x1=\"" + Printf("%.1f", x) + "\" x2=\"" + Printf("%.1f", x) + "\" y1=\"" +
           Printf("%.0f", P::kTop) + "\" y2=\"" + Printf("%.0f", P::kTop + P::kPlotHeight) +
           "\" stroke=\"" + std::string(kRuleColor) + "\"/>\n";
    if (x - last_label_x >= kLabelSpacing) {
      out += "<text x=\"" + Printf("%.1f", x) + "\" y=\"" + Printf("%.0f", P::kTop - 5) +
             "\" text-anchor=\"middle\" class=\"phase\">" + EscapeHtml(PhaseLabel(snap.phase)) +
             "</text>\n";
      last_label_x = x;
    }
  }
  return out;
}

// Attempts: the device limit over each, and where each after the first began.
std::string TimelineAttempts(const TimelinePlot& plot, const MemoryTimeline& timeline) {
  using P = TimelinePlot;
  std::string out;
  for (size_t i = 0; i < timeline.attempts.size(); ++i) {
    const MemoryTimeline::Attempt& attempt = timeline.attempts[i];
    const double x1 = plot.X(attempt.start_seconds);
    const double x2 = plot.X(std::max(attempt.end_seconds, attempt.start_seconds));
    if (i > 0) {
      out += "<line x1=\"" + Printf("%.1f", x1) + "\" x2=\"" + Printf("%.1f", x1) + "\" y1=\"" +
             Printf("%.0f", P::kTop) + "\" y2=\"" + Printf("%.0f", P::kTop + P::kPlotHeight) +
             "\" stroke=\"#888\" stroke-dasharray=\"2 3\"/>\n";
      out += "<text x=\"" + Printf("%.1f", x1 + 3) + "\" y=\"" + Printf("%.0f", P::kTop + 11) +
             "\" class=\"attempt\">attempt " + std::to_string(attempt.attempt) + "</text>\n";
    }
    if (attempt.limit_bytes > 0) {
      const double y = plot.Y(attempt.limit_bytes);
      out += "<line x1=\"" + Printf("%.1f", x1) + "\" x2=\"" + Printf("%.1f", x2) + "\" y1=\"" +
             Printf("%.1f", y) + "\" y2=\"" + Printf("%.1f", y) + "\" stroke=\"" +
             std::string(kLimitColor) + "\" stroke-dasharray=\"6 3\" class=\"limit\"><title>" +
             "device limit " + Mib(attempt.limit_bytes) + " MiB</title></line>\n";
      // Below the line at its start, where memory has yet to rise and an OOM cannot be; once
      // for a run whose attempts share the limit.
      if (i == 0 || timeline.attempts[i - 1].limit_bytes != attempt.limit_bytes) {
        out += "<text x=\"" + Printf("%.1f", x1 + 4) + "\" y=\"" + Printf("%.1f", y + 13) +
               "\" fill=\"" + std::string(kLimitColor) + "\">limit " +
               FormatBytes(static_cast<uint64_t>(attempt.limit_bytes)) + "</text>\n";
      }
    }
  }
  return out;
}

// Device samples, then reserved under allocated (on a CPU they are the same line).
std::string TimelineLines(const TimelinePlot& plot, const MemoryTimeline& timeline) {
  std::string out;
  for (const auto& [device, samples] : timeline.device_used) {
    std::string points;
    for (const MemoryTimeline::Sample& sample : samples) {
      AppendPoint(points, plot.X(sample.seconds), plot.Y(sample.used_bytes));
    }
    out += "<polyline class=\"device\" fill=\"none\" stroke=\"" + std::string(kDeviceUsedColor) +
           "\" stroke-width=\"1.5\" points=\"" + points + "\"><title>" + EscapeHtml(device) +
           " memory in use (any process)</title></polyline>\n";
  }
  // One line per attempt and series: a resumed run's attempts are not joined by a line.
  for (const auto& [series, color, dash] :
       {std::tuple<std::string_view, std::string_view, std::string_view>{"reserved", kReservedColor,
                                                                         "4 2"},
        {"allocated", kAllocatedColor, ""}}) {
    for (const MemoryTimeline::Attempt& attempt : timeline.attempts) {
      std::string points;
      for (const MemoryTimeline::Snapshot& snap : timeline.snapshots) {
        if (snap.attempt != attempt.attempt) continue;
        const int64_t bytes = series == "reserved" ? snap.reserved_bytes : snap.allocated_bytes;
        AppendPoint(points, plot.X(snap.seconds), plot.Y(bytes));
      }
      if (points.empty()) continue;
      out += "<polyline class=\"" + std::string(series) + "\" fill=\"none\" stroke=\"" +
             std::string(color) + "\" stroke-width=\"1.5\"" +
             (dash.empty() ? std::string() : " stroke-dasharray=\"" + std::string(dash) + "\"") +
             " points=\"" + points + "\"/>\n";
    }
  }
  return out;
}

// The out-of-memory snapshot at (x, y): a cross with its `title`, and a label below it, towards
// the middle of the plot.
std::string OomMark(double x, double y, const std::string& title) {
  std::string cross = "M";  // two strokes
  cross += Coordinates(x - 5, y - 5) + " L" + Coordinates(x + 5, y + 5);
  cross += " M" + Coordinates(x - 5, y + 5) + " L" + Coordinates(x + 5, y - 5);
  std::string out = "<path class=\"oom\" d=\"" + cross + "\" stroke=\"" + std::string(kLimitColor) +
                    "\" stroke-width=\"2.5\">" + title + "</path>\n";
  const bool right_half = x > TimelinePlot::kLeft + TimelinePlot::kPlotWidth / 2;
  out += "<text x=\"" + Printf("%.1f", right_half ? x - 4 : x + 4) + "\" y=\"" +
         Printf("%.1f", y + 19) + "\" text-anchor=\"" + (right_half ? "end" : "start") +
         "\" fill=\"" + std::string(kLimitColor) + "\" class=\"head\">out of memory</text>\n";
  return out;
}

// Each snapshot as a point to hover, the out-of-memory one as a cross.
std::string TimelinePoints(const TimelinePlot& plot, const MemoryTimeline& timeline) {
  std::string out;
  for (const MemoryTimeline::Snapshot& snap : timeline.snapshots) {
    const double x = plot.X(snap.seconds), y = plot.Y(snap.allocated_bytes);
    const std::string title =
        "<title>" + EscapeHtml(snap.phase) + ", step " + std::to_string(snap.step) +
        ", micro-batch " + std::to_string(snap.micro_batch) + ", " + Printf("%.3f", snap.seconds) +
        " s: allocated " + Mib(snap.allocated_bytes) + " MiB, reserved " +
        Mib(snap.reserved_bytes) + " MiB</title>";
    if (snap.phase == snapshot_event::kAtOom) {
      out += OomMark(x, y, title);
      continue;
    }
    out += "<circle cx=\"" + Printf("%.1f", x) + "\" cy=\"" + Printf("%.1f", y) +
           "\" r=\"2\" fill=\"" + std::string(kAllocatedColor) + "\">" + title + "</circle>\n";
  }
  return out;
}

// The plot's left and bottom edges.
std::string TimelineFrame() {
  using P = TimelinePlot;
  std::string out = "<line x1=\"" + Printf("%.0f", P::kLeft) + "\" x2=\"" +
                    Printf("%.0f", P::kLeft) + "\" y1=\"" + Printf("%.0f", P::kTop) + "\" y2=\"" +
                    Printf("%.0f", P::kTop + P::kPlotHeight) + "\" stroke=\"#888\"/>\n";
  out += "<line x1=\"" + Printf("%.0f", P::kLeft) + "\" x2=\"" +
         Printf("%.0f", P::kLeft + P::kPlotWidth) + "\" y1=\"" +
         Printf("%.0f", P::kTop + P::kPlotHeight) + "\" y2=\"" +
         Printf("%.0f", P::kTop + P::kPlotHeight) + "\" stroke=\"#888\"/>\n";
  return out;
}

// Under the plot, a line for each device it leaves out for want of a zero (unplaced_used), each
// after a line break; none where it leaves none out.
std::string UnplacedNotes(const MemoryTimeline& timeline) {
  std::string out;
  for (const auto& [device, used_bytes] : timeline.unplaced_used) {
    out += "\n<p class=\"unplaced\" style=\"max-width:" + Printf("%.0f", TimelinePlot::kWidth) +
           "px;font-size:12px;margin:0.2em 0\">" + EscapeHtml(device) + ": up to " +
           Mib(used_bytes) +
           " MiB in use, not drawn: the attempt&#8217;s events do not say when the ranks met (an "
           "older llm-train&#8217;s do not), so its clock cannot be set against rank 0&#8217;s "
           "start</p>";
  }
  return out;
}

std::string MemoryTimelineChart(const std::string& name, const MemoryTimeline& timeline) {
  std::string out = "<figure><figcaption>" + EscapeHtml(name) + "</figcaption>\n";
  out += "<svg width=\"" + Printf("%.0f", TimelinePlot::kWidth) + "\" height=\"" +
         Printf("%.0f", TimelinePlot::kHeight) + "\" role=\"img\" class=\"timeline\">\n";
  if (timeline.snapshots.empty() && timeline.device_used.empty()) {
    return out + "<text x=\"8\" y=\"40\">no snapshots</text>\n</svg>" + UnplacedNotes(timeline) +
           "</figure>\n";
  }
  const TimelinePlot plot{.x_axis = TimeAxis(timeline.end_seconds),
                          .y_axis = BytesAxis(timeline.top_bytes)};
  out += TimelineGrid(plot);
  out += TimelinePhaseRules(plot, timeline);
  out += TimelineAttempts(plot, timeline);
  out += TimelineLines(plot, timeline);
  out += TimelinePoints(plot, timeline);
  out += TimelineFrame();
  return out + "</svg>" + UnplacedNotes(timeline) + "</figure>\n";
}

// When rank 0's trainer started, read on node rank `node_rank`'s clock, which its device samples
// are dated by; 0 when it is not known.
int64_t NodeStartedUnixMs(const v1::AttemptMemory& attempt, int32_t node_rank) {
  if (node_rank == 0) return attempt.started_unix_ms();
  const auto start = attempt.node_started_unix_ms().find(node_rank);
  return start == attempt.node_started_unix_ms().end() ? 0 : start->second;
}

}  // namespace

std::string PhaseCharts(const v1::ReportResponse& report) {
  const size_t shown = ShownCategories(report);
  int64_t top = 1;
  for (const v1::TrialReport& trial : report.trials()) {
    for (const v1::MemorySnapshot& snap : trial.per_phase()) {
      const std::array<int64_t, 6> stack = Stack(snap);
      int64_t sum = 0;
      for (int64_t bytes : stack) sum += bytes;
      top = std::max(top, sum);
    }
  }
  constexpr double kHeight = 160, kBar = 28, kGap = 14, kLeft = 8, kBottom = 18, kTop = 14;
  std::string out = Legend({kCategories.begin(), kCategories.begin() + shown}) +
                    "<p>Full height: " + Mib(top) + " MiB.</p>\n<div class=\"grid\">\n";
  for (const v1::TrialReport& trial : report.trials()) {
    const double width = kLeft + std::max(2, trial.per_phase_size()) * (kBar + kGap) + kGap;
    out += "<figure><figcaption>" + EscapeHtml(trial.name()) + "</figcaption>\n";
    out += "<svg width=\"" + Printf("%.0f", width) + "\" height=\"" +
           Printf("%.0f", kTop + kHeight + kBottom) + "\" role=\"img\">\n";
    if (trial.per_phase().empty()) {
      out += "<text x=\"8\" y=\"40\">no snapshots</text>\n";
    }
    double x = kLeft + kGap;
    for (const v1::MemorySnapshot& snap : trial.per_phase()) {
      const std::array<int64_t, 6> stack = Stack(snap);
      double y = kTop + kHeight;
      for (size_t i = 0; i < shown; ++i) {
        const double h = kHeight * static_cast<double>(stack[i]) / static_cast<double>(top);
        y -= h;
        out += "<rect x=\"" + Printf("%.1f", x) + "\" y=\"" + Printf("%.1f", y) + "\" width=\"" +
               Printf("%.0f", kBar) + "\" height=\"" + Printf("%.1f", h) + "\" fill=\"" +
               std::string(kCategories[i].color) + "\"><title>" + EscapeHtml(snap.phase()) + " " +
               EscapeHtml(kCategories[i].name) + ": " + Mib(stack[i]) + " MiB</title></rect>\n";
      }
      out += "<text x=\"" + Printf("%.1f", x + kBar / 2) + "\" y=\"" +
             Printf("%.0f", kTop + kHeight + 13) + "\" text-anchor=\"middle\">" +
             EscapeHtml(PhaseLabel(snap.phase())) + "<title>" + EscapeHtml(snap.phase()) +
             ", step " + std::to_string(snap.step()) + ", allocated " +
             Mib(snap.allocated_bytes()) + " MiB, optim (host) " + Mib(snap.optim_host_bytes()) +
             " MiB</title></text>\n";
      x += kBar + kGap;
    }
    out += "</svg></figure>\n";
  }
  return out + "</div>\n";
}

std::string TrainTimeChart(const v1::ReportResponse& report) {
  return BarChart(
      report, [](const v1::TrialReport& t) { return HasEnded(t) ? t.train_seconds() : 0; },
      [](const v1::TrialReport& t) {
        return HasEnded(t) ? Printf("%.1f s", t.train_seconds()) : std::string(kNone);
      },
      "#4e79a7");
}

// The table's tokens/s (SteadyTokensPerSecond), so the page shows one figure for each trial.
std::string TokensPerSecondChart(const v1::ReportResponse& report) {
  return BarChart(
      report,
      [](const v1::TrialReport& t) {
        return MeasuredRate(t, SteadyTokensPerSecond(t)).value_or(0);
      },
      [](const v1::TrialReport& t) {
        const std::optional<double> tokens_per_second = MeasuredRate(t, SteadyTokensPerSecond(t));
        return tokens_per_second ? Grouped(*tokens_per_second, 0) : std::string(kNone);
      },
      "#f28e2b");
}

std::string OutcomeChart(const v1::ReportResponse& report) {
  constexpr double kRow = 22, kNameWidth = 200, kPill = 110;
  std::string out = "<svg width=\"" + Printf("%.0f", kNameWidth + 2 * kPill + 40) + "\" height=\"" +
                    Printf("%.0f", kRow * (report.trials_size() + 1) + 4) + "\" role=\"img\">\n";
  out += "<text x=\"" + Printf("%.0f", kNameWidth + kPill / 2) +
         "\" y=\"15\" text-anchor=\"middle\" class=\"head\">expected</text>\n";
  out += "<text x=\"" + Printf("%.0f", kNameWidth + kPill * 1.5 + 10) +
         "\" y=\"15\" text-anchor=\"middle\" class=\"head\">observed</text>\n";
  double y = kRow + 2;
  for (const v1::TrialReport& trial : report.trials()) {
    const bool stated = !trial.expected().empty();
    const std::string observed_color =
        !stated ? "#bab0ac" : (IsUnexpected(trial) ? "#e15759" : "#59a14f");
    const std::string expected = stated ? trial.expected() : std::string(kNone);
    out += "<text x=\"" + Printf("%.0f", kNameWidth - 6) + "\" y=\"" + Printf("%.0f", y + 15) +
           "\" text-anchor=\"end\">" + EscapeHtml(trial.name()) + "</text>\n";
    out += "<rect x=\"" + Printf("%.0f", kNameWidth) + "\" y=\"" + Printf("%.0f", y + 2) +
           "\" width=\"" + Printf("%.0f", kPill) + "\" height=\"18\" rx=\"9\" fill=\"#e8e8e8\"/>\n";
    out += "<text x=\"" + Printf("%.0f", kNameWidth + kPill / 2) + "\" y=\"" +
           Printf("%.0f", y + 15) + "\" text-anchor=\"middle\">" + EscapeHtml(expected) +
           "</text>\n";
    out += "<rect x=\"" + Printf("%.0f", kNameWidth + kPill + 10) + "\" y=\"" +
           Printf("%.0f", y + 2) + "\" width=\"" + Printf("%.0f", kPill) +
           "\" height=\"18\" rx=\"9\" fill=\"" + observed_color + "\"/>\n";
    out += "<text x=\"" + Printf("%.0f", kNameWidth + kPill * 1.5 + 10) + "\" y=\"" +
           Printf("%.0f", y + 15) + "\" text-anchor=\"middle\" fill=\"#fff\">" +
           EscapeHtml(trial.outcome()) + "</text>\n";
    y += kRow;
  }
  return out + "</svg>\n";
}

MemoryTimeline LayOutMemoryTimeline(const v1::TrialReport& trial) {
  MemoryTimeline timeline;
  double offset = 0;
  for (const v1::AttemptMemory& attempt : trial.memory_timeline()) {
    MemoryTimeline::Attempt& span = timeline.attempts.emplace_back();
    span.attempt = attempt.attempt();
    span.start_seconds = offset;
    span.limit_bytes = attempt.device_limit_bytes();
    double end = attempt.ended_elapsed_ms() / 1000.0;  // seconds since its trainer started
    for (const v1::MemorySnapshot& snap : attempt.snapshots()) {
      const double seconds = snap.elapsed_ms() / 1000.0;
      end = std::max(end, seconds);
      timeline.snapshots.push_back({.attempt = attempt.attempt(),
                                    .seconds = offset + seconds,
                                    .allocated_bytes = snap.allocated_bytes(),
                                    .reserved_bytes = snap.reserved_bytes(),
                                    .phase = snap.phase(),
                                    .step = snap.step(),
                                    .micro_batch = snap.micro_batch()});
      timeline.top_bytes =
          std::max({timeline.top_bytes, snap.allocated_bytes(), snap.reserved_bytes()});
    }
    const bool several_nodes =
        std::any_of(attempt.device_samples().begin(), attempt.device_samples().end(),
                    [](const v1::DeviceMemorySample& sample) { return sample.node_rank() > 0; });
    for (const v1::DeviceMemorySample& sample : attempt.device_samples()) {
      // A CPU node's sample is the trial's resident memory: LibTorch's code, the host's share of
      // the run and everything the device budget leaves out, two to three times the budget in
      // the CPU lab. It is no device's memory, and it would squeeze the chart into its bottom.
      if (sample.device() == "cpu") continue;
      const int64_t node_started_unix_ms = NodeStartedUnixMs(attempt, sample.node_rank());
      if (node_started_unix_ms <= 0) {
        // Its zero is unknown, not its memory. Drawn from another zero the line would be off by
        // what is not known and look exact: from its own trainer's start, early by its later
        // launch (3.6 s in a two-node demo on one host); from rank 0's on node rank 0's clock,
        // off by the two clocks' difference.
        if (sample.node_rank() > 0) {
          const std::string device = DeviceName(sample.device(), sample.node_rank(), several_nodes);
          int64_t& most = timeline.unplaced_used[device];
          most = std::max(most, sample.memory_used_bytes());
        }
        continue;
      }
      const double seconds = static_cast<double>(sample.unix_ms() - node_started_unix_ms) / 1000.0;
      if (seconds < 0) continue;
      end = std::max(end, seconds);
      timeline.device_used[DeviceName(sample.device(), sample.node_rank(), several_nodes)]
          .push_back({.seconds = offset + seconds, .used_bytes = sample.memory_used_bytes()});
      timeline.top_bytes = std::max(timeline.top_bytes, sample.memory_used_bytes());
    }
    timeline.top_bytes = std::max(timeline.top_bytes, span.limit_bytes);
    span.end_seconds = offset + end;
    offset = span.end_seconds;
  }
  timeline.end_seconds = offset;
  return timeline;
}

std::string MemoryTimelineCharts(const v1::ReportResponse& report) {
  std::vector<MemoryTimeline> timelines;
  bool any_samples = false;
  for (const v1::TrialReport& trial : report.trials()) {
    timelines.push_back(LayOutMemoryTimeline(trial));
    any_samples = any_samples || !timelines.back().device_used.empty();
  }
  std::vector<Category> legend = {
      {"allocated", kAllocatedColor},
      {"reserved (dashed; on a CPU it equals allocated)", kReservedColor}};
  if (any_samples) {
    legend.push_back({"GPU memory in use (the nodes' samples)", kDeviceUsedColor});
  }
  legend.push_back({"device limit (dashed), out of memory (×)", kLimitColor});
  std::string out = Legend(legend) + "<div class=\"grid\">\n";
  for (int i = 0; i < report.trials_size(); ++i) {
    out += MemoryTimelineChart(report.trials(i).name(), timelines[static_cast<size_t>(i)]);
  }
  return out + "</div>\n";
}

}  // namespace llmctl::cli
