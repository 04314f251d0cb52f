// `llmctl report`: one ReportResponse rendered as a terminal table, CSV, JSON, Markdown or a
// self-contained HTML page with charts (report_charts.h). Pure functions of the response
// (golden-file tested).
//
// The table and Markdown are the labs' table (the one scripts/lab_table.py printed before this
// command replaced it): per trial the expected and the actual outcome, the memory categories at the
// snapshot with the most allocated bytes (MiB = 2^20 bytes, one decimal), the peak, train seconds,
// tokens/s and how much its steps moved, and the predictions beside them. "–" marks what a trial
// does not have (no snapshot, not ended, no tokens).
#ifndef LLMCTL_CONTROLLER_CLI_REPORT_H_
#define LLMCTL_CONTROLLER_CLI_REPORT_H_

#include <string>
#include <string_view>

#include "common/status.h"
#include "llmctl/v1/controller.pb.h"

namespace llmctl::cli {

enum class ReportFormat { kTable, kCsv, kJson, kMarkdown, kHtml };

// "table", "csv", "json", "markdown" (or "md"), "html". InvalidArgument listing them otherwise.
StatusOr<ReportFormat> ParseReportFormat(std::string_view name);

// The whole report in `format`, ending with a newline.
std::string RenderReport(const v1::ReportResponse& report, ReportFormat format);

// True when the trial's outcome is a final one (ok, oom, diverged, failed, cancelled).
bool HasEnded(const v1::TrialReport& trial);

// A trial that did not do what was expected: with `expect:`, an outcome other than it (a trial
// that has not ended counts too); without, failed, invalid (an input refused), diverged or
// cancelled (ok and oom are measurements).
bool IsUnexpected(const v1::TrialReport& trial);

// The trials that IsUnexpected; `submit --wait` exits 1 when there is one.
int CountUnexpectedOutcomes(const v1::ReportResponse& report);

// `text` on one line (OnOneLine: no control character) with &, <, >, " and ' replaced by
// entities, for HTML text and attribute values.
std::string EscapeHtml(std::string_view text);

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_REPORT_H_
