// `llmctl estimate FILE [--trial NAME] [--format table|json]`: each trial's model-state memory per
// rank (common/estimate), before anything runs and without a controller. Activations are not
// predicted yet, so there is no fits / out-of-memory verdict: the output says so.
#ifndef LLMCTL_CONTROLLER_CLI_ESTIMATE_H_
#define LLMCTL_CONTROLLER_CLI_ESTIMATE_H_

#include <string>

#include "common/status.h"

namespace llmctl::cli {

// The estimate of experiment file `file` (read and validated as `llmctl submit` reads it, local
// paths resolved beside it), of every trial or only `trial`, as `format` "table" (MiB) or "json"
// (exact bytes). A trial whose model is a hub reference (hf:...) is listed as not estimated: only
// an agent downloads its config.json. InvalidArgument (exit 2) for an unreadable or invalid file
// ("FILE:LINE:COLUMN: problem"), an unknown trial or format, and a local model whose config.json
// cannot be read.
StatusOr<std::string> EstimateExperiment(const std::string& file, const std::string& trial,
                                         const std::string& format);

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_ESTIMATE_H_
