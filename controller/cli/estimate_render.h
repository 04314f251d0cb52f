// How `llmctl estimate` prints its trials' estimates (internal to controller/cli; estimate.h is the
// public face): a table in MiB with its notes and --explain's terms, or JSON in exact bytes.
#ifndef LLMCTL_CONTROLLER_CLI_ESTIMATE_RENDER_H_
#define LLMCTL_CONTROLLER_CLI_ESTIMATE_RENDER_H_

#include <string>
#include <vector>

#include "common/experiment.h"
#include "controller/cli/estimate.h"
#include "controller/cli/estimate_trial.h"

namespace llmctl::cli {

// Which rates a time is at: a probe's (its description), else the data sheet's.
std::string RatesText(const std::string& rates);

// The estimates of `experiment`'s trials (read from `file`) as a table, with --fit's columns and
// --explain's terms as `options` asks.
std::string RenderEstimateTable(const std::string& file, const Experiment& experiment,
                                const std::vector<TrialEstimate>& estimates,
                                const EstimateOptions& options);

// The same as one JSON document, every figure in bytes.
std::string RenderEstimateJson(const std::string& file, const Experiment& experiment,
                               const std::vector<TrialEstimate>& estimates,
                               const EstimateOptions& options);

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_ESTIMATE_RENDER_H_
