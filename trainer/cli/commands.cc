#include "trainer/cli/commands.h"

#include <atomic>
#include <csignal>
#include <iostream>
#include <nlohmann/json.hpp>
#include <variant>
#include <vector>

#include "common/atomic_file.h"
#include "common/files.h"
#include "common/inputs/trial_inputs.h"
#include "common/model_config.h"
#include "common/rank_files.h"
#include "common/text.h"
#include "common/trainer_exit.h"
#include "trainer/cli/series.h"
#include "trainer/train/batches.h"
#include "trainer/train/caption_batches.h"
#include "trainer/train/trainer.h"

namespace llmctl::llm_train {
namespace {

std::atomic<bool> g_cancel{false};
std::atomic<bool> g_checkpoint_on_cancel{false};

void OnSignal(int) { g_cancel.store(true); }

// The checkpoint flag first: the trainer reads it once it sees `g_cancel`.
void OnCheckpointSignal(int) {
  g_checkpoint_on_cancel.store(true);
  g_cancel.store(true);
}

// Why --prepare stopped: kInvalidInput, or kFailed for what is no fault of the input's
// (IsInputsFault).
int PrepareFailed(const llmctl::Status& status, const std::map<std::string, std::string>& names) {
  return FailWith(status, llmctl::NameInputs(status.message(), names));
}

}  // namespace

// A message may quote another party's bytes (a dataset's line in nlohmann's "last read: '...'",
// a config's value): ForTerminal keeps their controls off the terminal and their lines under ours.
int Fail(const std::string& message) {
  std::cerr << "llm-train: " << llmctl::ForTerminal(message) << std::endl;
  return llmctl::trainer_exit::kInvalidInput;
}

int FailWith(const llmctl::Status& status, const std::string& message) {
  if (llmctl::trainer::IsInputsFault(status)) return Fail(message);
  std::cerr << "llm-train: " << llmctl::ForTerminal(message) << std::endl;
  return llmctl::trainer_exit::kFailed;
}

int RunProbe(const llmctl::trainer::RateProbeOptions& options, const std::string& output) {
  const llmctl::StatusOr<llmctl::estimate::RateProbe> probe = llmctl::trainer::ProbeRates(options);
  if (!probe.ok()) return FailWith(probe.status(), probe.status().message());
  const std::string json = probe->ToJson().dump(2) + "\n";
  if (output.empty()) {
    std::cout << json << std::flush;
    return llmctl::trainer_exit::kOk;
  }
  const llmctl::Status written = llmctl::WriteFileAtomically(
      output, [&](int fd) { return llmctl::WriteAll(fd, json.data(), json.size()); });
  if (!written.ok()) {
    std::cerr << "llm-train: --probe-output " << output << ": " << written.message() << std::endl;
    return llmctl::trainer_exit::kFailed;
  }
  return llmctl::trainer_exit::kOk;
}

int ListTrials(const llmctl::Experiment& experiment) {
  for (const llmctl::Trial& t : experiment.trials) {
    std::cout << t.name;
    if (t.expect) std::cout << '\t' << *t.expect;
    std::cout << '\n';
  }
  return 0;
}

int Prepare(const llmctl::TrialConfig& config, const llmctl::trainer::TrialModelConfig& model,
            const std::map<std::string, std::string>& names) {
  const llmctl::ModelConfig* llama = std::get_if<llmctl::ModelConfig>(&model);
  auto checked = llmctl::TrialInputsChecker().Check(config, llama);
  if (!checked.ok()) return Fail(llmctl::NameInputs(checked.status().message(), names));
  if (const auto* blip2 = std::get_if<llmctl::Blip2Config>(&model)) {
    // The captions' token file; the images are decoded batch by batch in training.
    auto batches = llmctl::trainer::OpenCaptionBatches(config, *blip2, 0, 1);
    if (!batches.ok()) return PrepareFailed(batches.status(), names);
    std::cout << (*batches)->num_examples() << " captioned images prepared" << std::endl;
    return 0;
  }
  auto tokens = llmctl::PrepareTokens(config);
  if (!tokens.ok()) return PrepareFailed(tokens.status(), names);
  std::cout << *tokens << std::endl;
  return 0;
}

int LaunchRanks(const LauncherFlags& flags, const llmctl::TrialConfig& config, int argc,
                char** argv) {
  if (llmctl::Status fits = CheckLauncherFlags(flags, config); !fits.ok()) {
    return Fail(fits.message());
  }
  const llmctl::dist::LaunchSpec spec = LaunchSpecFor(flags, argc, argv);
  // A stderr nobody reads (`llm-train ... 2>&1 | head -1`) loses the lines, not the exit code: the
  // last one below, after Launch, would otherwise end the launcher by SIGPIPE (141) rather than as
  // its ranks did. The ranks start with SIGPIPE's default (Launch).
  std::signal(SIGPIPE, SIG_IGN);
  const llmctl::dist::LaunchResult launched = llmctl::dist::Launch(spec);
  if (launched.status.ok()) return llmctl::trainer_exit::kOk;
  std::cerr << "llm-train: " << launched.status.message() << std::endl;
  // The job ends as its first failed rank did (invalid input, out of memory, diverged, cancelled,
  // an input shrank), else as failed.
  const auto& failure = launched.first_failure;
  if (failure && failure->signal == 0 && failure->exit_code >= llmctl::trainer_exit::kFailed &&
      failure->exit_code <= llmctl::trainer_exit::kInputShrank) {
    return failure->exit_code;
  }
  return llmctl::trainer_exit::kFailed;
}

int RunRank(const llmctl::TrialConfig& config, const std::string& events_path,
            const TrialArgs& args, std::optional<llmctl::dist::RankEnv> rank_env,
            std::map<std::string, std::string> names) {
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGUSR1, OnCheckpointSignal);
  // A peer rank's death closes the sockets c10d writes to. Ignored, the write fails with EPIPE and
  // the collective throws, so this rank ends as a failed trial with its exit code and error event,
  // where SIGPIPE's default kills it without a word (Python, which ignores SIGPIPE, never sees it).
  std::signal(SIGPIPE, SIG_IGN);
  llmctl::trainer::RunOptions options;
  options.events_path = llmctl::RankEventsPath(events_path, rank_env ? rank_env->rank : 0);
  options.rank_env = rank_env;
  options.human = &std::cout;
  options.cancel = &g_cancel;
  options.checkpoint_on_cancel = &g_checkpoint_on_cancel;
  options.resume_from = args.resume_from;
  options.input_names = std::move(names);
  const llmctl::trainer::TrialResult result = llmctl::trainer::RunTrial(config, options);
  if (result.invalid_input) return Fail(result.error);
  if (!result.recorded) {
    std::cerr << "llm-train: " << llmctl::ForTerminal(result.error) << std::endl;
  }
  return llmctl::trainer::ExitCodeFor(result.outcome);
}

// Each run as a process of its own would run it (a run seeds its generator, resets the peaks and
// frees every tensor it made; llm_train_test checks that the figures are the same), so a sweep
// starts LibTorch once (its operator registry: about 1 s of CPU a process).
int RunSeries(const llmctl::Experiment& experiment, const TrialArgs& args) {
  if (!args.events_path.empty() || !args.resume_from.empty() || args.prepare_only ||
      args.launcher.nproc > 0) {
    return Fail(
        "--runs gives each run its own events file and runs one-rank trials from the start: "
        "it does not take --events, --resume, --prepare or --nproc");
  }
  auto names = ParseInputNames(args.input_names);
  if (!names.ok()) return Fail(names.status().message());
  auto runs = ReadSeries(experiment, args);
  if (!runs.ok()) return Fail(runs.status().message());
  int exit_code = llmctl::trainer_exit::kOk;
  for (const SeriesRun& run : *runs) {
    if (g_cancel.load()) return llmctl::trainer_exit::kCancelled;
    const int code = RunRank(run.config, run.events_path, args, std::nullopt, *names);
    if (exit_code == llmctl::trainer_exit::kOk) exit_code = code;
  }
  return exit_code;
}

}  // namespace llmctl::llm_train
