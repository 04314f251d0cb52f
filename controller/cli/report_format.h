// How `llmctl report` writes numbers, shared by its formats (report_renderers.h) and its HTML
// charts (report_charts.cc), so every format prints a figure the same way.
#ifndef LLMCTL_CONTROLLER_CLI_REPORT_FORMAT_H_
#define LLMCTL_CONTROLLER_CLI_REPORT_FORMAT_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace llmctl::cli {

// What a trial does not have (no snapshot, not ended, no tokens).
inline constexpr std::string_view kNone = "–";

inline constexpr double kMiB = 1 << 20;

// Python's f"{value:,.Nf}": fixed decimals, thousands separated by commas.
std::string Grouped(double value, int decimals);

// Bytes in MiB (2^20) with one decimal, thousands grouped: "4,196.0".
std::string Mib(int64_t bytes);

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_REPORT_FORMAT_H_
