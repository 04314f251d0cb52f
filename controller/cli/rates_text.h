// A node's measured rates described for a person (`llmctl nodes`, `nodes --measure`): each rate
// beside its device's data sheet.
#ifndef LLMCTL_CONTROLLER_CLI_RATES_TEXT_H_
#define LLMCTL_CONTROLLER_CLI_RATES_TEXT_H_

#include <string>

namespace llmctl::cli {

// A node's stored probe (NodeStatus's rate_probe_json) beside its device's data sheet, for
// `llmctl nodes`: "cpu AMD EPYC 7763 (2 threads, ...), 2026-11-29T01:20:00Z: fp32 51 GFLOP/s
// (sheet 192), bf16 1.0 (384), memory 12 GB/s (20), launch 4.0 us (10)"; the parser's message
// when it does not parse.
std::string DescribeNodeRates(const std::string& probe_json);

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_RATES_TEXT_H_
