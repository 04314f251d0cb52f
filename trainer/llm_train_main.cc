// llm-train: runs one trial of an experiment file in this process.
//
//   llm-train --config FILE [--trial NAME] [--set key=value ...] [--events FILE] [--prepare]
//             [--resume CHECKPOINT_DIR] [--nproc N [--master-port P] [--ranks-file FILE]
//             [--nnodes M --node-rank K --master-addr A]]
//   llm-train --config FILE [--trial NAME] [--set key=value ...] --runs RUNS.jsonl
//                                         # several configurations, one after another in this
//                                         # process (trainer/cli/series.h)
//   llm-train --config FILE --list        # the trials, with their expected outcomes
//   llm-train --keys                      # every trial key as Markdown
//   llm-train --version [--json]          # llmctl's, LibTorch's, CUDA's and the NVIDIA driver's
//                                         # versions; --json: one JSON line (the agent reads it)
//   llm-train --probe [--probe-device cpu|cuda] [--probe-output FILE]
//                                         # this machine's rates (trainer/train/rate_probe.h) as
//                                         # JSON, on standard output or written whole to FILE
//
// --nproc starts this host's ranks of a ddp or fsdp trial, torchrun-style; with --nnodes M (the
// trial's nodes) they are node rank K's share of M*N ranks, which meet at node rank 0's host A
// (node rank 0 may take --master-port 0, a free port its ranks file then records for the others).
//
// Exit codes: 0 ok, 1 failed, 2 invalid input (nothing ran), 3 out of memory, 4 diverged, 5
// cancelled, 6 an input file shrank under its mapping (another process truncated it).
// SIGINT/SIGTERM stop the run between micro-batches; SIGUSR1 does too, after writing a checkpoint
// of the last complete step into output_dir (the agent sends it before a lease ends).
#include <CLI/CLI.hpp>
#include <iostream>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/experiment.h"
#include "common/files.h"
#include "common/model_config.h"
#include "common/trainer_exit.h"
#include "common/trial_config.h"
#include "common/trial_keys.h"
#include "trainer/cli/commands.h"
#include "trainer/cli/launcher_args.h"
#include "trainer/cli/trial_args.h"
#include "trainer/train/rate_probe.h"
#include "trainer/train/trained_model.h"
#include "trainer/train/versions.h"

namespace {

namespace llm_train = llmctl::llm_train;

// Every flag of the command line (the usage at the top of this file).
struct Flags {
  llm_train::TrialArgs trial;
  bool print_keys = false;
  bool list_trials = false;
  bool print_version = false;
  bool json = false;
  bool probe = false;
  llmctl::trainer::RateProbeOptions probe_options;
  std::string probe_output;
  // Given only to place --nproc's ranks: a rank that gets them is refused.
  CLI::Option* nnodes_flag = nullptr;
  CLI::Option* node_rank_flag = nullptr;
  CLI::Option* master_addr_flag = nullptr;
};

// --version, --json, --probe and its options, --keys: what prints facts and runs no trial.
void AddInfoFlags(CLI::App& app, Flags& flags) {
  CLI::Option* version_flag =
      app.add_flag("--version", flags.print_version,
                   "print llmctl's and LibTorch's versions, the CUDA LibTorch was built for and, "
                   "with a GPU, the CUDA runtime's and the NVIDIA driver's");
  app.add_flag("--json", flags.json, "with --version: one line of JSON")->needs(version_flag);
  CLI::Option* probe_flag = app.add_flag(
      "--probe", flags.probe,
      "measure this machine's rates (matmuls per dtype, attention, memory, op dispatch, the "
      "host's AdamW step, host<->device copies) in about 12 s on a CPU and print them as JSON");
  app.add_option("--probe-device", flags.probe_options.device,
                 "with --probe: cpu (default) or cuda")
      ->needs(probe_flag);
  app.add_option("--probe-output", flags.probe_output, "with --probe: write the JSON to this file")
      ->needs(probe_flag);
  app.add_flag("--keys", flags.print_keys,
               "print every trial key (type, default, allowed values) as Markdown");
}

// --config and what picks, changes and runs its trial.
void AddTrialFlags(CLI::App& app, Flags& flags) {
  llm_train::TrialArgs& trial = flags.trial;
  app.add_option("--config", trial.config_path, "experiment file (YAML)");
  app.add_option("--trial", trial.trial_name,
                 "which trial of the file to run (default: the only one)");
  app.add_flag(
      "--list", flags.list_trials,
      "print the file's trials, one per line: the name, and a tab and the expected outcome "
      "when the file states one");
  app.add_option("--set", trial.overrides,
                 "override a trial key, e.g. --set train.micro_batch_size=8");
  app.add_option("--events", trial.events_path, "append JSON-lines events to this file");
  app.add_option("--runs", trial.runs_path,
                 "run several configurations one after another in this process, each a line of "
                 "this file: {\"events\": FILE, \"trial\": NAME, \"set\": [\"key=value\", ...]} "
                 "(trial and set optional: --trial's and --set's, then the line's); every line is "
                 "checked before the first runs; one-rank trials only; exits as the first run "
                 "that did not end ok, after running the rest");
  app.add_flag("--prepare", trial.prepare_only, "only tokenize the dataset into the token cache");
  app.add_option("--resume", trial.resume_from,
                 "continue from a checkpoint directory (<output_dir>/checkpoints/step-N)");
}

// --nproc and the flags that place this host's ranks, and --input-name.
void AddLauncherFlags(CLI::App& app, Flags& flags) {
  llm_train::LauncherFlags& launcher = flags.trial.launcher;
  app.add_option("--nproc", launcher.nproc,
                 "strategy ddp or fsdp: start this many ranks of this trial on this machine, "
                 "torchrun-style (the trial's devices); one rank failing stops the others")
      ->check(CLI::PositiveNumber);
  app.add_option("--master-port", launcher.master_port,
                 "with --nproc: the port rank 0 serves the rendezvous on; 0 (node rank 0 only): a "
                 "free port the launcher asks the kernel for and records in --ranks-file (what "
                 "the agent uses)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--ranks-file", launcher.ranks_file,
                 "with --nproc: write this node's ranks' pids, the port and, once one fails, which "
                 "failed first and how, as JSON to this file (atomically; the agent reads it)");
  flags.nnodes_flag =
      app.add_option("--nnodes", launcher.nnodes,
                     "with --nproc: the hosts the trial's ranks span (its nodes); each runs "
                     "--nproc of the nnodes x nproc ranks")
          ->check(CLI::PositiveNumber);
  flags.node_rank_flag =
      app.add_option("--node-rank", launcher.node_rank,
                     "with --nproc and --nnodes: this host's place, 0 up to nnodes-1; its local "
                     "rank l is rank node-rank x nproc + l")
          ->check(CLI::NonNegativeNumber);
  flags.master_addr_flag = app.add_option(
      "--master-addr", launcher.master_addr,
      "with --nproc: node rank 0's host, where rank 0 serves the rendezvous (default 127.0.0.1)");
  app.add_option("--input-name", flags.trial.input_names,
                 "PATH=NAME: call PATH by NAME in messages (the agent names the inputs it copied "
                 "by the paths written in the experiment file); each '\\' and '=' of PATH is "
                 "written '\\\\' and '\\='");
}

// --version, --probe or --keys, when one was given: its exit code.
std::optional<int> PrintInfo(const Flags& flags) {
  if (flags.print_version) {
    // The agent reads the JSON for its node info: the first line of the text names the trainer in
    // reports, and the CUDA versions let the controller refuse a node whose driver is too old.
    const llmctl::TrainerVersions versions = llmctl::trainer::ProbeTrainerVersions();
    std::cout << (flags.json ? versions.ToJson() + "\n" : versions.ToText());
    return 0;
  }
  if (flags.probe) return llm_train::RunProbe(flags.probe_options, flags.probe_output);
  if (flags.print_keys) {
    std::cout << llmctl::TrialKeysMarkdownTable();
    return 0;
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  // A token file or weights shrunk under their mapping end the run naming the file, not with a
  // bare SIGBUS.
  llmctl::ReportShrunkMappedFiles("llm-train", llmctl::trainer_exit::kInputShrank);
  CLI::App app{"llm-train: fine-tunes a LLaMA-family model and reports where the memory went"};
  Flags flags;
  AddInfoFlags(app, flags);
  AddTrialFlags(app, flags);
  AddLauncherFlags(app, flags);
  CLI11_PARSE(app, argc, argv);
  if (std::optional<int> printed = PrintInfo(flags)) return *printed;
  const llm_train::TrialArgs& args = flags.trial;
  if (args.config_path.empty()) return llm_train::Fail("--config is required (see --help)");

  auto experiment = llmctl::LoadExperimentFile(args.config_path);
  if (!experiment.ok()) return llm_train::Fail(experiment.status().message());
  if (flags.list_trials) return llm_train::ListTrials(*experiment);
  if (!args.runs_path.empty()) return llm_train::RunSeries(*experiment, args);
  auto trial = llm_train::PickTrial(*experiment, args.config_path, args.trial_name);
  if (!trial.ok()) return llm_train::Fail(trial.status().message());
  llmctl::TrialConfig config = (*trial)->config;
  if (llmctl::Status status = llm_train::ApplyOverrides(args.overrides, config); !status.ok()) {
    return llm_train::Fail(status.message());
  }
  auto model = llmctl::trainer::ResolveTrialModel(config.settings().model.name);
  if (!model.ok()) return llm_train::Fail(model.status().message());
  // The LLaMA family's shape; BLIP-2's checks are the trial's (llm-train's setup).
  const llmctl::ModelConfig* llama = std::get_if<llmctl::ModelConfig>(&*model);
  if (llmctl::Status status = llmctl::ValidateTrialConfig(config, llama); !status.ok()) {
    return llm_train::Fail(status.message());
  }
  auto names = llm_train::ParseInputNames(args.input_names);
  if (!names.ok()) return llm_train::Fail(names.status().message());
  if (args.prepare_only) return llm_train::Prepare(config, *model, *names);

  if (args.launcher.nproc > 0) return llm_train::LaunchRanks(args.launcher, config, argc, argv);
  if (flags.nnodes_flag->count() > 0 || flags.node_rank_flag->count() > 0 ||
      flags.master_addr_flag->count() > 0) {
    return llm_train::Fail(
        "--nnodes, --node-rank and --master-addr place the ranks that --nproc N starts; pass "
        "--nproc too");
  }
  auto rank_env = llm_train::RankEnvFor(config);
  if (!rank_env.ok()) return llm_train::Fail(rank_env.status().message());
  return llm_train::RunRank(config, args.events_path, args, *rank_env, std::move(*names));
}
