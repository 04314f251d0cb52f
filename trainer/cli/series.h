// llm-train --runs: a file of runs, one JSON object a line, each a configuration of the experiment
// run in turn in one process (RunSeries in commands.h). Each line is checked as a trial of its own
// would be, and the file refused whole at its first bad line, before anything runs.
#ifndef LLMCTL_TRAINER_CLI_SERIES_H_
#define LLMCTL_TRAINER_CLI_SERIES_H_

#include <string>
#include <vector>

#include "common/experiment.h"
#include "common/status.h"
#include "common/trial_config.h"
#include "trainer/cli/trial_args.h"

namespace llmctl::llm_train {

// One line of a --runs file: where its events go and the trial it runs.
struct SeriesRun {
  std::string events_path;
  TrialConfig config;
};

// A --runs line: {"events": FILE, "trial": NAME, "set": ["key=value", ...]}, its trial's settings
// after --set and then its own, checked as a trial of its own would be. `args` gives the trial
// (its --trial, or the file's only one) and the --set a line adds to.
StatusOr<SeriesRun> ParseSeriesLine(const std::string& line, const Experiment& experiment,
                                    const TrialArgs& args);

// Every line of the --runs file `args.runs_path` (blank lines aside), refused whole at its first
// bad line.
StatusOr<std::vector<SeriesRun>> ReadSeries(const Experiment& experiment, const TrialArgs& args);

}  // namespace llmctl::llm_train

#endif  // LLMCTL_TRAINER_CLI_SERIES_H_
