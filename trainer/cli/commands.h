// What llm-train does once its command line is read (trainer/llm_train_main.cc): each ends in the
// process's exit code (common/trainer_exit.h's trainer_exit), having printed why on standard error
// when it is not kOk.
#ifndef LLMCTL_TRAINER_CLI_COMMANDS_H_
#define LLMCTL_TRAINER_CLI_COMMANDS_H_

#include <map>
#include <optional>
#include <string>

#include "common/experiment.h"
#include "common/status.h"
#include "common/trial_config.h"
#include "trainer/cli/launcher_args.h"
#include "trainer/cli/trial_args.h"
#include "trainer/dist/rank_env.h"
#include "trainer/train/rate_probe.h"
#include "trainer/train/trained_model.h"

namespace llmctl::llm_train {

// Prints `message` as llm-train's and returns kInvalidInput.
int Fail(const std::string& message);

// `message` (the status's, or the same with names put in) and the exit for `status`: kInvalidInput
// when the input is at fault, kFailed for what the system refused (IsInputsFault).
int FailWith(const Status& status, const std::string& message);

// `--probe`: the rates as JSON on standard output, or written whole to `output`.
int RunProbe(const trainer::RateProbeOptions& options, const std::string& output);

// `--list`: the file's trials, one a line, each with a tab and its expected outcome when it has
// one.
int ListTrials(const Experiment& experiment);

// --prepare: the token cache (or, for BLIP-2, the captions' token file) and nothing else.
int Prepare(const TrialConfig& config, const trainer::TrialModelConfig& model,
            const std::map<std::string, std::string>& names);

// Runs this command's ranks on this host (its argv without the launcher's flags, each rank told its
// place by the launcher's variables) and ends as the job does; 2 when the flags do not fit
// `config`.
int LaunchRanks(const LauncherFlags& flags, const TrialConfig& config, int argc, char** argv);

// Trains the trial in this process (one rank of it, or all of a one-rank trial) and ends as it
// does. SIGINT and SIGTERM stop it between micro-batches, SIGUSR1 after a checkpoint.
int RunRank(const TrialConfig& config, const std::string& events_path, const TrialArgs& args,
            std::optional<dist::RankEnv> rank_env, std::map<std::string, std::string> names);

// --runs: each configuration of `args.runs_path` in turn in this process (series.h). Runs them
// all, then ends as the first that did not end ok; a signal stops it.
int RunSeries(const Experiment& experiment, const TrialArgs& args);

}  // namespace llmctl::llm_train

#endif  // LLMCTL_TRAINER_CLI_COMMANDS_H_
