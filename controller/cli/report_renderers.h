// The formats of `llmctl report`, a file each (internal to controller/cli's report; RenderReport
// picks one): report_table.cc (the terminal table and Markdown), report_csv.cc, report_json.cc and
// report_html.cc (with report_charts.h's charts).
#ifndef LLMCTL_CONTROLLER_CLI_REPORT_RENDERERS_H_
#define LLMCTL_CONTROLLER_CLI_REPORT_RENDERERS_H_

#include <string>

#include "llmctl/v1/controller.pb.h"

namespace llmctl::cli {

// The lab table, then what it cannot show: the prediction notes, resumed runs, ranks, refused
// event lines, kernel fallbacks and the count of unexpected outcomes.
std::string RenderTable(const v1::ReportResponse& report);
std::string RenderMarkdown(const v1::ReportResponse& report);
std::string RenderCsv(const v1::ReportResponse& report);
std::string RenderJson(const v1::ReportResponse& report);
std::string RenderHtml(const v1::ReportResponse& report);

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_REPORT_RENDERERS_H_
