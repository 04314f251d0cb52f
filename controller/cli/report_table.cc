// `llmctl report`'s lab table for the terminal and as Markdown.
#include <string>
#include <string_view>
#include <vector>

#include "common/text.h"
#include "common/trial_name.h"
#include "controller/cli/report.h"
#include "controller/cli/report_format.h"
#include "controller/cli/report_renderers.h"
#include "controller/cli/report_rows.h"

namespace llmctl::cli {
namespace {

// A text cell of a Markdown table (the controller's words: a trial's name, its outcome) as literal
// text. A table's cells are inline Markdown, so the characters that open inline syntax are
// backslash-escaped: '[', ']', '(', ')' and '!' (a link or an image: `![a](http://x/y.png)` was
// an <img>), '*', '_' and '~' (emphasis, strikethrough), '`' (code), '{' and '}', '|' (it would
// end the cell), '&' (an entity), and '\' itself (so that `m\|x` cannot end the cell at its
// '|'); '<' becomes "&lt;" (raw HTML, an autolink). '#', '+', '-' and '.' are left: they mean
// something only at a line's start, which a cell never is.
std::string MarkdownText(std::string_view text) {
  std::string escaped;
  for (char c : text) {
    if (c == '<') {
      escaped += "&lt;";
      continue;
    }
    if (std::string_view("\\`*_{}[]()!|&~").find(c) != std::string_view::npos) escaped += '\\';
    escaped += c;
  }
  return escaped;
}

// "train: 2 ranks; peak MiB 45.3 (rank 0), 45.4 (rank 1); allocated MiB per phase over the ranks:
// phase0_before_fwd 40.1, phase1_after_fwd 44.0–44.2; tokens/s is the whole job's\n".
std::string DescribeRanks(const v1::TrialReport& trial) {
  std::string out = OnOneLine(trial.name(), kMaxTrialNameBytes) + ": " +
                    std::to_string(trial.ranks_size()) + " ranks; peak MiB ";
  for (int i = 0; i < trial.ranks_size(); ++i) {
    out += (i > 0 ? ", " : "") + Mib(trial.ranks(i).peak_bytes()) + " (rank " +
           std::to_string(trial.ranks(i).rank()) + ")";
  }
  const std::vector<PhaseRange> ranges = PhaseRanges(trial);
  if (!ranges.empty()) {
    out += "; allocated MiB per phase, min\u2013max over the ranks:";
    for (size_t i = 0; i < ranges.size(); ++i) {
      out += std::string(i > 0 ? "," : "") + " " + ranges[i].phase + " " +
             MibRange(ranges[i].min, ranges[i].max);
    }
  }
  return out + "; tokens/s is the whole job's\n";
}

// "long: resumed; steps 1-3 in attempt 1, 4-6 in attempt 3\n" (steps counted from 1, as the
// live view and the checkpoint messages count them): which attempt ran which part of the run.
std::string DescribeResumedRun(const v1::TrialReport& trial) {
  std::string parts;
  for (int i = 0; i < trial.steps_size();) {
    int end = i;
    while (end + 1 < trial.steps_size() &&
           trial.steps(end + 1).attempt() == trial.steps(i).attempt()) {
      ++end;
    }
    if (!parts.empty()) parts += ", ";
    parts += std::to_string(trial.steps(i).step() + 1) + "-" +
             std::to_string(trial.steps(end).step() + 1) + " in attempt " +
             std::to_string(trial.steps(i).attempt());
    i = end + 1;
  }
  return OnOneLine(trial.name(), kMaxTrialNameBytes) + ": resumed; " +
         (parts.empty() ? "no steps" : "steps " + parts) + "\n";
}

}  // namespace

std::string RenderTable(const v1::ReportResponse& report) {
  const LabLayout layout = LabLayoutOf(report);
  std::vector<std::vector<std::string>> rows;
  rows.push_back(LabColumns(layout));
  // Why each trial that ended other than expected did: the table's outcome column cannot hold it,
  // and without it a failed row sent the user to `llmctl status` or the csv to learn why.
  std::string unexpected_errors;
  for (const v1::TrialReport& trial : report.trials()) {
    LabRow row = MakeLabRow(trial, layout);
    if (row.unexpected && !trial.error().empty()) {
      unexpected_errors += OnOneLine(trial.name(), kMaxTrialNameBytes) + ": " +
                           OnOneLine(trial.outcome(), kMaxShownBytes) + ": " +
                           OnOneLine(trial.error(), kMaxShownBytes) + "\n";
    }
    // Without `expect:` a failed, diverged or cancelled trial is unexpected too: its expected
    // column says "–", and there is no outcome to name here.
    if (row.unexpected && !trial.expected().empty()) {
      row.cells[kOutcomeColumn] +=
          " (expected " + OnOneLine(trial.expected(), kMaxShownBytes) + ")";
    }
    rows.push_back(std::move(row.cells));
  }
  std::string out = "experiment " + std::to_string(report.experiment_id()) + ": " +
                    OnOneLine(report.name(), kMaxShownBytes) + "\n" +
                    FormatColumns(rows, kFirstNumericColumn);
  if (layout.predicted) out += std::string(kPredictionNote) + "\n";
  if (layout.timed) out += std::string(kTimeNote) + "\n";
  if (layout.paced) out += std::string(kPaceNote) + "\n";
  out += std::string(kStepVariationNote) + "\n";
  for (const std::string& line : TimeSourceLines(report)) out += line + "\n";
  if (const std::string busy = BusyMachineLine(report); !busy.empty()) out += busy + "\n";
  for (const v1::TrialReport& trial : report.trials()) {
    if (trial.run_attempts_size() > 1) out += DescribeResumedRun(trial);
  }
  for (const v1::TrialReport& trial : report.trials()) {
    if (trial.ranks_size() > 1) out += DescribeRanks(trial);
  }
  for (const v1::TrialReport& trial : report.trials()) {
    if (trial.refused_event_lines() > 0) {
      out += OnOneLine(trial.name(), kMaxTrialNameBytes) + ": " +
             CountOf(trial.refused_event_lines(), "event line", "event lines") +
             " refused (not a JSON object with a string \"type\", not UTF-8, or over " +
             "the cap): stored as refused_line events\n";
    }
  }
  for (const v1::TrialReport& trial : report.trials()) {
    for (const v1::KernelFallback& fallback : trial.kernel_fallbacks()) {
      out += OnOneLine(trial.name(), kMaxTrialNameBytes) + ": kernels: fused ran ATen's " +
             OnOneLine(fallback.op(), kMaxShownBytes) + " instead of its kernel";
      if (trial.ranks_size() > 1) out += " on rank " + std::to_string(fallback.rank());
      out += " from step " + std::to_string(fallback.step()) + " (" +
             OnOneLine(fallback.reason(), kMaxShownBytes) + ")\n";
    }
  }
  const int unexpected = CountUnexpectedOutcomes(report);
  if (unexpected > 0) {
    out += "\n" + CountOf(unexpected, "trial", "trials") +
           " ended other than the experiment file expects.\n" + unexpected_errors;
  }
  return out;
}

std::string RenderMarkdown(const v1::ReportResponse& report) {
  const LabLayout layout = LabLayoutOf(report);
  const std::vector<std::string> columns = LabColumns(layout);
  std::string out;
  out += "| ";
  for (size_t i = 0; i < columns.size(); ++i) {
    out += columns[i] + (i + 1 < columns.size() ? " | " : " |\n");
  }
  out += "|";
  for (size_t i = 0; i < columns.size(); ++i) out += i < kFirstNumericColumn ? "---|" : "---:|";
  out += "\n";
  for (const v1::TrialReport& trial : report.trials()) {
    LabRow row = MakeLabRow(trial, layout);
    // The numeric cells are this file's own figures ("0.0 + 480.1", "61.0 (OOM)"), which hold no
    // Markdown: only the controller's words are escaped.
    for (size_t i = 0; i < kFirstNumericColumn; ++i) row.cells[i] = MarkdownText(row.cells[i]);
    if (row.unexpected) row.cells[kOutcomeColumn] = "**" + row.cells[kOutcomeColumn] + "**";
    if (row.unexpected && !trial.expected().empty()) {
      row.cells[kOutcomeColumn] +=
          " (expected " + MarkdownText(OnOneLine(trial.expected(), kMaxShownBytes)) + ")";
    }
    out += "|";
    for (const std::string& cell : row.cells) out += " " + cell + " |";
    out += "\n";
  }
  return out;
}

}  // namespace llmctl::cli
