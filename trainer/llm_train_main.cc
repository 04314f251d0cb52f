// llm-train: runs one trial of an experiment file in this process.
//
//   llm-train --config FILE [--trial NAME] [--set key=value ...] [--events FILE] [--prepare]
//             [--resume CHECKPOINT_DIR] [--nproc N [--master-port P] [--ranks-file FILE]
//             [--nnodes M --node-rank K --master-addr A]]
//   llm-train --config FILE [--trial NAME] [--set key=value ...] --runs RUNS.jsonl
//                                         # several configurations, one after another in this
//                                         # process (RunSeries below)
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
#include <csignal>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/atomic_file.h"
#include "common/experiment.h"
#include "common/files.h"
#include "common/foreign_json.h"
#include "common/inputs/trial_inputs.h"
#include "common/model_config.h"
#include "common/rank_files.h"
#include "common/text.h"
#include "common/trial_config.h"
#include "common/trial_keys.h"
#include "trainer/dist/rank_env.h"
#include "trainer/dist/rank_launcher.h"
#include "trainer/train/batches.h"
#include "trainer/train/caption_batches.h"
#include "trainer/train/rate_probe.h"
#include "trainer/train/trained_model.h"
#include "trainer/train/trainer.h"
#include "trainer/train/versions.h"

namespace {

std::atomic<bool> g_cancel{false};
std::atomic<bool> g_checkpoint_on_cancel{false};

void OnSignal(int) { g_cancel.store(true); }

// The checkpoint flag first: the trainer reads it once it sees `g_cancel`.
void OnCheckpointSignal(int) {
  g_checkpoint_on_cancel.store(true);
  g_cancel.store(true);
}

// A message may quote another party's bytes (a dataset's line in nlohmann's "last read: '...'",
// a config's value): ForTerminal keeps their controls off the terminal and their lines under ours.
int Fail(const std::string& message) {
  std::cerr << "llm-train: " << llmctl::ForTerminal(message) << std::endl;
  return llmctl::trainer_exit::kInvalidInput;
}

// `message` (the status's, or the same with names put in) and the exit for `status`: kInvalidInput
// when the input is at fault, kFailed for what the system refused (IsInputsFault).
int FailWith(const llmctl::Status& status, const std::string& message) {
  if (llmctl::trainer::IsInputsFault(status)) return Fail(message);
  std::cerr << "llm-train: " << llmctl::ForTerminal(message) << std::endl;
  return llmctl::trainer_exit::kFailed;
}

// The flags that make this process the launcher of this host's ranks rather than a rank.
struct LauncherFlags {
  int nproc = 0;  // 0: not the launcher
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string ranks_file;
};

// InvalidArgument when the launcher's flags do not fit `config`: its nodes, the node rank among
// them, the port only node rank 0 may pick, and a data-parallel trial of --nproc devices.
llmctl::Status CheckLauncherFlags(const LauncherFlags& flags, const llmctl::TrialConfig& config) {
  const int64_t nodes = config.settings().parallel.nodes;
  const int64_t devices = config.settings().device.count;
  const std::string strategy(llmctl::Name(config.settings().parallel.strategy));
  if (flags.nnodes != nodes) {
    return llmctl::InvalidArgumentError(
        "the trial has nodes: " + std::to_string(nodes) + " but --nnodes is " +
        std::to_string(flags.nnodes) + "; pass --nnodes " + std::to_string(nodes) +
        (nodes > 1 ? " --node-rank K --master-addr HOST --master-port P on each of its "
                     "hosts (HOST and P: node rank 0's)"
                   : ""));
  }
  if (flags.node_rank >= flags.nnodes) {
    return llmctl::InvalidArgumentError("--node-rank " + std::to_string(flags.node_rank) +
                                        " must be below --nnodes " + std::to_string(flags.nnodes));
  }
  if (flags.master_port == 0 && flags.node_rank > 0) {
    return llmctl::InvalidArgumentError(
        "--master-port 0 (a free port picked on this host) is for node rank 0 only: "
        "--node-rank " +
        std::to_string(flags.node_rank) +
        " needs the port node rank 0's launcher chose (master_port in its --ranks-file)");
  }
  if (llmctl::DataParallelRanks(config) < 2 || devices != flags.nproc) {
    return llmctl::InvalidArgumentError(
        "--nproc " + std::to_string(flags.nproc) +
        " starts the ranks of a data-parallel trial: it needs strategy: ddp or fsdp and "
        "devices: " +
        std::to_string(flags.nproc) + " (the trial has strategy: " + strategy +
        ", devices: " + std::to_string(devices) + ", nodes: " + std::to_string(nodes) + ")");
  }
  return llmctl::Status::Ok();
}

// What the launcher starts: this command's argv without the launcher's flags, placed by them.
llmctl::dist::LaunchSpec LaunchSpecFor(const LauncherFlags& flags, int argc, char** argv) {
  llmctl::dist::LaunchSpec spec;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    bool launcher_flag = false;
    for (const std::string flag :
         {"--nproc", "--master-port", "--ranks-file", "--nnodes", "--node-rank", "--master-addr"}) {
      if (arg == flag) {
        launcher_flag = true;
        ++i;  // its value
      } else if (arg.starts_with(flag + "=")) {
        launcher_flag = true;
      }
    }
    if (!launcher_flag) spec.argv.push_back(arg);
  }
  spec.nproc_per_node = flags.nproc;
  spec.nnodes = flags.nnodes;
  spec.node_rank = flags.node_rank;
  spec.master_addr = flags.master_addr;
  spec.master_port = static_cast<uint16_t>(flags.master_port);
  spec.status_file = flags.ranks_file;
  return spec;
}

// Runs this command's ranks on this host (its argv without the launcher's flags, each rank told its
// place by the launcher's variables) and ends as the job does; 2 when the flags do not fit
// `config`.
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

// `--probe`: the rates as JSON on standard output, or written whole to `output`.
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

// Every flag of the command line (the usage at the top of this file).
struct Flags {
  std::string config_path;
  std::string trial_name;
  std::vector<std::string> overrides;
  std::string events_path;
  std::string runs_path;
  bool prepare_only = false;
  std::string resume_from;
  bool print_keys = false;
  bool list_trials = false;
  bool print_version = false;
  bool json = false;
  bool probe = false;
  llmctl::trainer::RateProbeOptions probe_options;
  std::string probe_output;
  LauncherFlags launcher;
  std::vector<std::string> input_names;
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
  app.add_option("--config", flags.config_path, "experiment file (YAML)");
  app.add_option("--trial", flags.trial_name,
                 "which trial of the file to run (default: the only one)");
  app.add_flag(
      "--list", flags.list_trials,
      "print the file's trials, one per line: the name, and a tab and the expected outcome "
      "when the file states one");
  app.add_option("--set", flags.overrides,
                 "override a trial key, e.g. --set train.micro_batch_size=8");
  app.add_option("--events", flags.events_path, "append JSON-lines events to this file");
  app.add_option("--runs", flags.runs_path,
                 "run several configurations one after another in this process, each a line of "
                 "this file: {\"events\": FILE, \"trial\": NAME, \"set\": [\"key=value\", ...]} "
                 "(trial and set optional: --trial's and --set's, then the line's); every line is "
                 "checked before the first runs; one-rank trials only; exits as the first run "
                 "that did not end ok, after running the rest");
  app.add_flag("--prepare", flags.prepare_only, "only tokenize the dataset into the token cache");
  app.add_option("--resume", flags.resume_from,
                 "continue from a checkpoint directory (<output_dir>/checkpoints/step-N)");
}

// --nproc and the flags that place this host's ranks, and --input-name.
void AddLauncherFlags(CLI::App& app, Flags& flags) {
  LauncherFlags& launcher = flags.launcher;
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
  app.add_option("--input-name", flags.input_names,
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
  if (flags.probe) return RunProbe(flags.probe_options, flags.probe_output);
  if (flags.print_keys) {
    std::cout << llmctl::TrialKeysMarkdownTable();
    return 0;
  }
  return std::nullopt;
}

int ListTrials(const llmctl::Experiment& experiment) {
  for (const llmctl::Trial& t : experiment.trials) {
    std::cout << t.name;
    if (t.expect) std::cout << '\t' << *t.expect;
    std::cout << '\n';
  }
  return 0;
}

// The trial --trial names, or the file's only one.
llmctl::StatusOr<const llmctl::Trial*> PickTrial(const llmctl::Experiment& experiment,
                                                 const std::string& config_path,
                                                 const std::string& trial_name) {
  if (trial_name.empty()) {
    if (experiment.trials.size() != 1) {
      std::string names;
      for (const auto& t : experiment.trials) names += (names.empty() ? "" : ", ") + t.name;
      return llmctl::InvalidArgumentError(config_path + " has " +
                                          std::to_string(experiment.trials.size()) +
                                          " trials; choose one with --trial (" + names + ")");
    }
    return &experiment.trials.front();
  }
  for (const auto& t : experiment.trials) {
    if (t.name == trial_name) return &t;
  }
  return llmctl::InvalidArgumentError(config_path + ": no trial named '" + trial_name + "'");
}

// The trial's settings after --set, with node: paths and the labs' spellings resolved.
llmctl::Status ApplyOverrides(const std::vector<std::string>& overrides,
                              llmctl::TrialConfig& config) {
  // An assignment is quoted at most this long, as llmctl plan's --set is.
  constexpr size_t kMaxQuotedSetBytes = 200;
  for (const std::string& assignment : overrides) {
    const std::string quoted = llmctl::OnOneLine(assignment, kMaxQuotedSetBytes);
    const size_t eq = assignment.find('=');
    if (eq == std::string::npos) {
      return llmctl::InvalidArgumentError("--set expects key=value, got '" + quoted + "'");
    }
    llmctl::Status status = config.SetFromText(assignment.substr(0, eq), assignment.substr(eq + 1));
    if (!status.ok())
      return llmctl::InvalidArgumentError("--set " + quoted + ": " + status.message());
  }
  llmctl::LocalizeNodePaths(config);
  llmctl::ApplyLabSpellings(config);
  return llmctl::Status::Ok();
}

llmctl::StatusOr<std::map<std::string, std::string>> ParseInputNames(
    const std::vector<std::string>& input_names) {
  std::map<std::string, std::string> names;
  for (const std::string& entry : input_names) {
    auto named = llmctl::ParseInputNameArgument(entry);
    if (!named) {
      return llmctl::InvalidArgumentError(
          std::string("--input-name expects PATH=NAME (neither empty; each '\\' and '=' of PATH "
                      "written '\\\\' and '\\='), got '")
              .append(entry)
              .append("'"));
    }
    names[named->first] = named->second;
  }
  return names;
}

// Why --prepare stopped: kInvalidInput, or kFailed for what is no fault of the input's
// (IsInputsFault).
int PrepareFailed(const llmctl::Status& status, const std::map<std::string, std::string>& names) {
  return FailWith(status, llmctl::NameInputs(status.message(), names));
}

// --prepare: the token cache (or, for BLIP-2, the captions' token file) and nothing else.
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

// A rank of a data-parallel trial: its place, from what the launcher (or torchrun) put in its
// environment; nullopt for a trial of one rank.
llmctl::StatusOr<std::optional<llmctl::dist::RankEnv>> RankEnvFor(
    const llmctl::TrialConfig& config) {
  if (llmctl::DataParallelRanks(config) <= 1) return std::optional<llmctl::dist::RankEnv>();
  auto env = llmctl::dist::RankEnvFromEnvironment();
  if (env.ok()) return std::optional<llmctl::dist::RankEnv>(*env);
  const std::string strategy(llmctl::Name(config.settings().parallel.strategy));
  const int64_t devices = config.settings().device.count;
  const int64_t nodes = config.settings().parallel.nodes;
  const std::string start =
      nodes > 1 ? "nodes: " + std::to_string(nodes) +
                      " spreads them over that many hosts: start each host's share with "
                      "--nproc " +
                      std::to_string(devices) + " --nnodes " + std::to_string(nodes) +
                      " --node-rank K --master-addr HOST --master-port P (HOST and P: node "
                      "rank 0's; node rank 0 may pass --master-port 0)"
                : "start them with --nproc " + std::to_string(devices);
  return llmctl::InvalidArgumentError(
      "strategy: " + strategy + " with devices: " + std::to_string(devices) +
      " runs one rank per device; " + start + " (or torchrun): " + env.status().message());
}

// Trains the trial in this process (one rank of it, or all of a one-rank trial) and ends as it
// does.
int RunRank(const llmctl::TrialConfig& config, const std::string& events_path, const Flags& flags,
            std::optional<llmctl::dist::RankEnv> rank_env,
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
  options.resume_from = flags.resume_from;
  options.input_names = std::move(names);
  const llmctl::trainer::TrialResult result = llmctl::trainer::RunTrial(config, options);
  if (result.invalid_input) return Fail(result.error);
  if (!result.recorded) {
    std::cerr << "llm-train: " << llmctl::ForTerminal(result.error) << std::endl;
  }
  return llmctl::trainer::ExitCodeFor(result.outcome);
}

// One line of a --runs file: where its events go and the trial it runs.
struct SeriesRun {
  std::string events_path;
  llmctl::TrialConfig config;
};

// A --runs line: {"events": FILE, "trial": NAME, "set": ["key=value", ...]}, its trial's settings
// after --set and then its own, checked as a trial of its own would be.
llmctl::StatusOr<SeriesRun> ParseSeriesLine(const std::string& line,
                                            const llmctl::Experiment& experiment,
                                            const Flags& flags) {
  const nlohmann::json run = llmctl::ParseForeignJson(line);
  if (!run.is_object()) {
    return llmctl::InvalidArgumentError(
        "expected a JSON object {\"events\": FILE, \"trial\": NAME, \"set\": [\"key=value\", "
        "...]}");
  }
  for (const auto& [key, value] : run.items()) {
    if (key != "events" && key != "trial" && key != "set") {
      return llmctl::InvalidArgumentError("unknown key \"" + key + "\" (events, trial, set)");
    }
  }
  if (!run.contains("events") || !run["events"].is_string() || run["events"] == "") {
    return llmctl::InvalidArgumentError("\"events\" must name the run's events file");
  }
  std::string trial_name = flags.trial_name;
  if (run.contains("trial")) {
    if (!run["trial"].is_string()) return llmctl::InvalidArgumentError("\"trial\" is not a name");
    trial_name = run["trial"].get<std::string>();
  }
  std::vector<std::string> overrides = flags.overrides;
  if (run.contains("set")) {
    if (!run["set"].is_array()) {
      return llmctl::InvalidArgumentError("\"set\" must be a list of \"key=value\" strings");
    }
    for (const nlohmann::json& assignment : run["set"]) {
      if (!assignment.is_string()) {
        return llmctl::InvalidArgumentError("\"set\" must be a list of \"key=value\" strings");
      }
      overrides.push_back(assignment.get<std::string>());
    }
  }
  ASSIGN_OR_RETURN(const llmctl::Trial* trial,
                   PickTrial(experiment, flags.config_path, trial_name));
  SeriesRun series_run{run["events"].get<std::string>(), trial->config};
  RETURN_IF_ERROR(ApplyOverrides(overrides, series_run.config));
  ASSIGN_OR_RETURN(const llmctl::trainer::TrialModelConfig model,
                   llmctl::trainer::ResolveTrialModel(series_run.config.settings().model.name));
  RETURN_IF_ERROR(
      llmctl::ValidateTrialConfig(series_run.config, std::get_if<llmctl::ModelConfig>(&model)));
  if (llmctl::DataParallelRanks(series_run.config) > 1) {
    return llmctl::InvalidArgumentError(
        "a data-parallel trial's ranks each need a process: run it on its own with --nproc");
  }
  return series_run;
}

// Every line of the --runs file (blank lines aside), refused whole at its first bad line.
llmctl::StatusOr<std::vector<SeriesRun>> ReadSeries(const llmctl::Experiment& experiment,
                                                    const Flags& flags) {
  std::ifstream in(flags.runs_path);
  if (!in) return llmctl::InvalidArgumentError("--runs " + flags.runs_path + ": cannot read it");
  std::vector<SeriesRun> runs;
  int line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto run = ParseSeriesLine(line, experiment, flags);
    if (!run.ok()) {
      return llmctl::InvalidArgumentError("--runs " + flags.runs_path + ":" +
                                          std::to_string(line_number) + ": " +
                                          run.status().message());
    }
    runs.push_back(std::move(*run));
  }
  if (runs.empty()) return llmctl::InvalidArgumentError("--runs " + flags.runs_path + ": no runs");
  return runs;
}

// --runs: each configuration in turn in this process, as a process of its own would run it (a run
// seeds its generator, resets the peaks and frees every tensor it made; llm_train_test checks that
// the figures are the same), so a sweep starts LibTorch once (its operator registry: about 1 s of
// CPU a process). Runs them all, then ends as the first that did not end ok; a signal stops it.
int RunSeries(const llmctl::Experiment& experiment, const Flags& flags) {
  if (!flags.events_path.empty() || !flags.resume_from.empty() || flags.prepare_only ||
      flags.launcher.nproc > 0) {
    return Fail(
        "--runs gives each run its own events file and runs one-rank trials from the start: "
        "it does not take --events, --resume, --prepare or --nproc");
  }
  auto names = ParseInputNames(flags.input_names);
  if (!names.ok()) return Fail(names.status().message());
  auto runs = ReadSeries(experiment, flags);
  if (!runs.ok()) return Fail(runs.status().message());
  int exit_code = llmctl::trainer_exit::kOk;
  for (const SeriesRun& run : *runs) {
    if (g_cancel.load()) return llmctl::trainer_exit::kCancelled;
    const int code = RunRank(run.config, run.events_path, flags, std::nullopt, *names);
    if (exit_code == llmctl::trainer_exit::kOk) exit_code = code;
  }
  return exit_code;
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
  if (flags.config_path.empty()) return Fail("--config is required (see --help)");

  auto experiment = llmctl::LoadExperimentFile(flags.config_path);
  if (!experiment.ok()) return Fail(experiment.status().message());
  if (flags.list_trials) return ListTrials(*experiment);
  if (!flags.runs_path.empty()) return RunSeries(*experiment, flags);
  auto trial = PickTrial(*experiment, flags.config_path, flags.trial_name);
  if (!trial.ok()) return Fail(trial.status().message());
  llmctl::TrialConfig config = (*trial)->config;
  if (llmctl::Status status = ApplyOverrides(flags.overrides, config); !status.ok()) {
    return Fail(status.message());
  }
  auto model = llmctl::trainer::ResolveTrialModel(config.settings().model.name);
  if (!model.ok()) return Fail(model.status().message());
  // The LLaMA family's shape; BLIP-2's checks are the trial's (llm-train's setup).
  const llmctl::ModelConfig* llama = std::get_if<llmctl::ModelConfig>(&*model);
  if (llmctl::Status status = llmctl::ValidateTrialConfig(config, llama); !status.ok()) {
    return Fail(status.message());
  }
  auto names = ParseInputNames(flags.input_names);
  if (!names.ok()) return Fail(names.status().message());
  if (flags.prepare_only) return Prepare(config, *model, *names);

  if (flags.launcher.nproc > 0) return LaunchRanks(flags.launcher, config, argc, argv);
  if (flags.nnodes_flag->count() > 0 || flags.node_rank_flag->count() > 0 ||
      flags.master_addr_flag->count() > 0) {
    return Fail(
        "--nnodes, --node-rank and --master-addr place the ranks that --nproc N starts; pass "
        "--nproc too");
  }
  auto rank_env = RankEnvFor(config);
  if (!rank_env.ok()) return Fail(rank_env.status().message());
  return RunRank(config, flags.events_path, flags, *rank_env, std::move(*names));
}
