// `llmctl report --format html`: one self-contained page, the lab table then the charts.
#include <algorithm>
#include <string>
#include <vector>

#include "controller/cli/report.h"
#include "controller/cli/report_charts.h"
#include "controller/cli/report_format.h"
#include "controller/cli/report_renderers.h"
#include "controller/cli/report_rows.h"

namespace llmctl::cli {
namespace {

// The multi-rank trials' memory per rank and each phase's range over the ranks; "" when no
// trial has ranks.
std::string RanksHtml(const v1::ReportResponse& report) {
  std::string out;
  for (const v1::TrialReport& trial : report.trials()) {
    if (trial.ranks_size() == 0) continue;
    const std::vector<PhaseRange> ranges = PhaseRanges(trial);
    out += "<h3>" + EscapeHtml(trial.name()) + ": " + std::to_string(trial.ranks_size()) +
           " ranks</h3>\n<table>\n<tr><th>rank</th><th>peak MiB</th>";
    for (const PhaseRange& range : ranges) out += "<th>" + EscapeHtml(range.phase) + " MiB</th>";
    out += "</tr>\n";
    for (const v1::RankMemory& rank : trial.ranks()) {
      out += "<tr><td>" + std::to_string(rank.rank()) + "</td><td class=\"n\">" +
             Mib(rank.peak_bytes()) + "</td>";
      for (const PhaseRange& range : ranges) {
        std::string cell(kNone);
        for (const v1::PhaseBytes& phase : rank.per_phase()) {
          if (phase.phase() == range.phase) cell = Mib(phase.allocated_bytes());
        }
        out += "<td class=\"n\">" + EscapeHtml(cell) + "</td>";
      }
      out += "</tr>\n";
    }
    out += "<tr><td>min&#8211;max</td><td class=\"n\">" +
           EscapeHtml(MibRange(std::min_element(trial.ranks().begin(), trial.ranks().end(),
                                                [](const auto& a, const auto& b) {
                                                  return a.peak_bytes() < b.peak_bytes();
                                                })
                                   ->peak_bytes(),
                               MaxRankPeak(trial))) +
           "</td>";
    for (const PhaseRange& range : ranges) {
      out += "<td class=\"n\">" + EscapeHtml(MibRange(range.min, range.max)) + "</td>";
    }
    out += "</tr>\n</table>\n";
  }
  if (out.empty()) return out;
  return "<h2>Memory per rank</h2>\n<p>Each rank of a data-parallel trial writes its own events: "
         "its peak and, per phase, its snapshot with the most allocated bytes. The trials table "
         "shows the highest rank's peak; tokens/s is the whole job's.</p>\n" +
         out;
}

}  // namespace

std::string RenderHtml(const v1::ReportResponse& report) {
  const std::string title = "llmctl report: " + report.name() + " (experiment " +
                            std::to_string(report.experiment_id()) + ")";
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
      EscapeHtml(title) +
      "</title>\n<style>\n"
      "body{font-family:system-ui,sans-serif;margin:2em;color:#222}\n"
      "table{border-collapse:collapse;font-size:14px}\n"
      "th,td{border:1px solid #ccc;padding:3px 8px}td.n{text-align:right}\n"
      "tr.unexpected td{background:#fde2e2}\n"
      "svg{font-size:12px;font-family:inherit}svg .head{font-weight:bold}\n"
      ".grid{display:flex;flex-wrap:wrap;gap:1em}figure{margin:0}\n"
      "figcaption{font-weight:bold;font-size:13px}\n"
      ".legend span{margin-right:1.2em}"
      ".legend i{display:inline-block;width:12px;height:12px;margin-right:4px}\n"
      "</style>\n</head>\n<body>\n<h1>" +
      EscapeHtml(title) + "</h1>\n";

  const LabLayout layout = LabLayoutOf(report);
  out += "<h2>Trials</h2>\n<table>\n<tr>";
  for (const std::string& column : LabColumns(layout)) {
    out += "<th>" + EscapeHtml(column) + "</th>";
  }
  out += "</tr>\n";
  for (const v1::TrialReport& trial : report.trials()) {
    LabRow row = MakeLabRow(trial, layout);
    if (row.unexpected && !trial.expected().empty()) {
      row.cells[kOutcomeColumn] += " (expected " + trial.expected() + ")";
    }
    out += row.unexpected ? "<tr class=\"unexpected\">" : "<tr>";
    for (size_t i = 0; i < row.cells.size(); ++i) {
      out += (i >= kFirstNumericColumn ? "<td class=\"n\">" : "<td>") + EscapeHtml(row.cells[i]) +
             "</td>";
    }
    out += "</tr>\n";
  }
  out +=
      "</table>\n<p>MiB = 2<sup>20</sup> bytes. Memory columns are the snapshot with the most "
      "allocated bytes (for an out-of-memory trial, the moment the allocation failed).</p>\n";
  if (layout.predicted) out += "<p>" + EscapeHtml(std::string(kPredictionNote)) + ".</p>\n";
  if (layout.timed) out += "<p>" + EscapeHtml(std::string(kTimeNote)) + ".</p>\n";
  if (layout.paced) out += "<p>" + EscapeHtml(std::string(kPaceNote)) + ".</p>\n";
  out += "<p>" + EscapeHtml(std::string(kStepVariationNote)) + ".</p>\n";
  for (const std::string& line : TimeSourceLines(report)) {
    out += "<p>" + EscapeHtml(line) + ".</p>\n";
  }
  if (const std::string busy = BusyMachineLine(report); !busy.empty()) {
    out += "<p>" + EscapeHtml(busy) + ".</p>\n";
  }

  out += RanksHtml(report);
  out +=
      "<h2>Memory per phase</h2>\n<p>The snapshot with the most allocated bytes of each phase "
      "(0 before forward, 1 after forward, 2 after backward, 3 after the optimizer step), on one "
      "scale for every trial.</p>\n" +
      PhaseCharts(report);
  out +=
      "<h2>Memory over time</h2>\n<p>Allocated and reserved bytes at each of the trainer's "
      "snapshots, each marked with the phase it closes (0&#8211;3 as above), against seconds "
      "since the trainer started; each trial on its own scales. A resumed trial's attempts follow "
      "each other on one axis, each from its own start, without the time between them.</p>\n" +
      MemoryTimelineCharts(report);
  out += "<h2>Train time</h2>\n" + TrainTimeChart(report);
  out += "<h2>Tokens per second</h2>\n" + TokensPerSecondChart(report);
  out += "<h2>Expected and observed outcomes</h2>\n" + OutcomeChart(report);
  for (const v1::TrialReport& trial : report.trials()) {
    if (trial.error().empty()) continue;
    out += "<p><b>" + EscapeHtml(trial.name()) + "</b>: " + EscapeHtml(trial.error()) + "</p>\n";
  }
  return out + "</body>\n</html>\n";
}

}  // namespace llmctl::cli
