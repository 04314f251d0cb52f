// A node's measured rates described for a person (`llmctl nodes`, `nodes --measure`): each rate
// beside its device's data sheet.
#ifndef LLMCTL_CONTROLLER_CLI_RATES_TEXT_H_
#define LLMCTL_CONTROLLER_CLI_RATES_TEXT_H_

#include <string>
#include <string_view>
#include <vector>

namespace llmctl::cli {

// A node's stored probe (NodeStatus's rate_probe_json) beside its device's data sheet, for
// `llmctl nodes`: first the probe ("cpu AMD EPYC 7763 (2 threads, LibTorch 2.15.0),
// 2026-11-29T01:20:00Z"), then one line for each kind of rate ("matmuls fp32 51 GFLOP/s (sheet
// 192), bf16 ...", "memory 12 GB/s (sheet 20), launch 4.0 us (sheet 6)", on a CPU its element-wise,
// loss, optimizer and reference steps' rates and its pace); the parser's message alone when it does
// not parse. Lines as the probe's text has them: OnOneLine each before printing.
std::vector<std::string> DescribeNodeRates(const std::string& probe_json);

// "LABEL PROBE\n" then each rate line of DescribeNodeRates indented by two spaces, every line
// through OnOneLine (a node's probe is its agent's word).
std::string NodeRatesText(std::string_view label, const std::string& probe_json);

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_RATES_TEXT_H_
