#include "controller/cli/report.h"

#include <algorithm>

#include "common/text.h"
#include "common/trial_outcome.h"
#include "controller/cli/report_renderers.h"

namespace llmctl::cli {

StatusOr<ReportFormat> ParseReportFormat(std::string_view name) {
  if (name == "table") return ReportFormat::kTable;
  if (name == "csv") return ReportFormat::kCsv;
  if (name == "json") return ReportFormat::kJson;
  if (name == "markdown" || name == "md") return ReportFormat::kMarkdown;
  if (name == "html") return ReportFormat::kHtml;
  return InvalidArgumentError("--format: unknown format '" + std::string(name) +
                              "' (one of table, csv, json, markdown, html)");
}

// An oom without `expect:` is a measurement (the labs run trials to see whether they fit), not a
// failure: it counts only when the file says `expect: ok`.
bool IsUnexpected(const v1::TrialReport& trial) {
  if (!trial.expected().empty()) return trial.outcome() != trial.expected();
  const std::string& outcome = trial.outcome();
  return outcome == trial_outcome::kFailed || outcome == trial_outcome::kInvalid ||
         outcome == trial_outcome::kDiverged || outcome == trial_outcome::kCancelled;
}

bool HasEnded(const v1::TrialReport& trial) {
  const std::string& outcome = trial.outcome();
  return outcome == trial_outcome::kOk || outcome == trial_outcome::kOom ||
         outcome == trial_outcome::kDiverged || outcome == trial_outcome::kFailed ||
         outcome == trial_outcome::kCancelled;
}

int CountUnexpectedOutcomes(const v1::ReportResponse& report) {
  return static_cast<int>(
      std::count_if(report.trials().begin(), report.trials().end(), IsUnexpected));
}

std::string EscapeHtml(std::string_view raw) {
  // Every text a report escapes is one line's (a name, a phase, an error in a <p>, where HTML runs
  // lines together anyway), and `report --format html` without --output goes to the terminal:
  // another process's escape sequence or C1 control would act there.
  const std::string text = OnOneLine(raw);
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string RenderReport(const v1::ReportResponse& report, ReportFormat format) {
  switch (format) {
    case ReportFormat::kTable:
      return RenderTable(report);
    case ReportFormat::kCsv:
      return RenderCsv(report);
    case ReportFormat::kJson:
      return RenderJson(report);
    case ReportFormat::kMarkdown:
      return RenderMarkdown(report);
    case ReportFormat::kHtml:
      return RenderHtml(report);
  }
  return {};
}

}  // namespace llmctl::cli
