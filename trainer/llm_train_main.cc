// llm-train: runs one trial of an experiment file in this process.
//
//   llm-train --config FILE [--trial NAME] [--set key=value ...] [--events FILE] [--prepare]
//             [--resume CHECKPOINT_DIR] [--nproc N [--master-port P] [--ranks-file FILE]]
//   llm-train --config FILE --list        # the trials, with their expected outcomes
//   llm-train --keys                      # every trial key as Markdown
//   llm-train --version [--json]          # llmctl's, LibTorch's, CUDA's and the NVIDIA driver's
//                                         # versions; --json: one JSON line (the agent reads it)
//
// Exit codes: 0 ok, 1 failed, 2 invalid input (nothing ran), 3 out of memory, 4 diverged, 5
// cancelled. SIGINT/SIGTERM stop the run between micro-batches; SIGUSR1 does too, after writing a
// checkpoint of the last complete step into output_dir (the agent sends it before a lease ends).
#include <CLI/CLI.hpp>
#include <csignal>
#include <iostream>
#include <map>

#include "common/experiment.h"
#include "common/model_config.h"
#include "common/text.h"
#include "common/trial_config.h"
#include "common/trial_keys.h"
#include "trainer/dist/launcher.h"
#include "trainer/dist/rank_env.h"
#include "trainer/inputs/trial_inputs.h"
#include "trainer/train/batches.h"
#include "trainer/train/ddp.h"
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

int Fail(const std::string& message) {
  std::cerr << "llm-train: " << message << std::endl;
  return llmctl::trainer::kExitInvalidInput;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"llm-train: fine-tunes a LLaMA-family model and reports where the memory went"};
  std::string config_path;
  std::string trial_name;
  std::vector<std::string> overrides;
  std::string events_path;
  bool prepare_only = false;
  std::string resume_from;
  bool print_keys = false;
  bool list_trials = false;
  bool print_version = false;
  bool json = false;
  CLI::Option* version_flag =
      app.add_flag("--version", print_version,
                   "print llmctl's and LibTorch's versions, the CUDA LibTorch was built for and, "
                   "with a GPU, the CUDA runtime's and the NVIDIA driver's");
  app.add_flag("--json", json, "with --version: one line of JSON")->needs(version_flag);
  app.add_flag("--keys", print_keys,
               "print every trial key (type, default, allowed values) as Markdown");
  app.add_option("--config", config_path, "experiment file (YAML)");
  app.add_option("--trial", trial_name, "which trial of the file to run (default: the only one)");
  app.add_flag(
      "--list", list_trials,
      "print the file's trials, one per line: the name, and a tab and the expected outcome "
      "when the file states one");
  app.add_option("--set", overrides, "override a trial key, e.g. --set train.micro_batch_size=8");
  app.add_option("--events", events_path, "append JSON-lines events to this file");
  app.add_flag("--prepare", prepare_only, "only tokenize the dataset into the token cache");
  app.add_option("--resume", resume_from,
                 "continue from a checkpoint directory (<output_dir>/checkpoints/step-N)");
  int nproc = 0;
  app.add_option(
         "--nproc", nproc,
         "strategy ddp or fsdp: start this many ranks of this trial on this machine, "
         "torchrun-style (the trial's devices); one rank failing stops the others")
      ->check(CLI::PositiveNumber);
  int master_port = 29500;
  app.add_option("--master-port", master_port,
                 "with --nproc: the port rank 0 serves the rendezvous on; 0: a free port the "
                 "launcher asks the kernel for (what the agent uses)")
      ->check(CLI::Range(0, 65535));
  std::string ranks_file;
  app.add_option("--ranks-file", ranks_file,
                 "with --nproc: write the ranks' pids and, once one fails, which failed first and "
                 "how, as JSON to this file (atomically; the agent reads it)");
  std::vector<std::string> input_names;
  app.add_option("--input-name", input_names,
                 "PATH=NAME: call PATH by NAME in messages (the agent names the inputs it copied "
                 "by the paths written in the experiment file)");
  CLI11_PARSE(app, argc, argv);
  if (print_version) {
    // The agent reads the JSON for its node info: the first line of the text names the trainer in
    // reports, and the CUDA versions let the controller refuse a node whose driver is too old.
    const llmctl::TrainerVersions versions = llmctl::trainer::ProbeTrainerVersions();
    std::cout << (json ? versions.ToJson() + "\n" : versions.ToText());
    return 0;
  }
  if (print_keys) {
    std::cout << llmctl::TrialKeysMarkdownTable();
    return 0;
  }
  if (config_path.empty()) return Fail("--config is required (see --help)");

  auto experiment = llmctl::LoadExperimentFile(config_path);
  if (!experiment.ok()) return Fail(experiment.status().message());
  if (list_trials) {
    for (const llmctl::Trial& t : experiment->trials) {
      std::cout << t.name;
      if (t.expect) std::cout << '\t' << *t.expect;
      std::cout << '\n';
    }
    return 0;
  }
  const llmctl::Trial* trial = nullptr;
  if (trial_name.empty()) {
    if (experiment->trials.size() != 1) {
      std::string names;
      for (const auto& t : experiment->trials) names += (names.empty() ? "" : ", ") + t.name;
      return Fail(config_path + " has " + std::to_string(experiment->trials.size()) +
                  " trials; choose one with --trial (" + names + ")");
    }
    trial = &experiment->trials.front();
  } else {
    for (const auto& t : experiment->trials) {
      if (t.name == trial_name) trial = &t;
    }
    if (trial == nullptr) return Fail(config_path + ": no trial named '" + trial_name + "'");
  }
  llmctl::TrialConfig config = trial->config;
  for (const std::string& assignment : overrides) {
    const size_t eq = assignment.find('=');
    if (eq == std::string::npos) return Fail("--set expects key=value, got '" + assignment + "'");
    llmctl::Status status = config.SetFromText(assignment.substr(0, eq), assignment.substr(eq + 1));
    if (!status.ok()) return Fail("--set " + assignment + ": " + status.message());
  }
  llmctl::LocalizeNodePaths(config);
  llmctl::ApplyLabSpellings(config);
  auto model = llmctl::ResolveModel(config.GetString("model"));
  if (!model.ok()) return Fail(model.status().message());
  if (llmctl::Status status = llmctl::ValidateTrialConfig(config, &*model); !status.ok()) {
    return Fail(status.message());
  }
  std::map<std::string, std::string> names;
  for (const std::string& entry : input_names) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) {
      return Fail("--input-name expects PATH=NAME, got '" + entry + "'");
    }
    names[entry.substr(0, eq)] = entry.substr(eq + 1);
  }

  if (prepare_only) {
    auto checked = llmctl::TrialInputsChecker().Check(config, &*model);
    if (!checked.ok()) return Fail(llmctl::NameInputs(checked.status().message(), names));
    auto tokens = llmctl::trainer::PrepareTokens(config);
    if (!tokens.ok()) return Fail(llmctl::NameInputs(tokens.status().message(), names));
    std::cout << *tokens << std::endl;
    return 0;
  }

  // The controller places a multi-node trial's nodes together (controller/scheduler), but nothing
  // starts ranks across hosts yet: refused here rather than run as one node's ranks.
  if (config.GetInt("nodes") > 1) {
    return Fail("nodes: " + std::to_string(config.GetInt("nodes")) +
                " spreads the trial's ranks over several hosts, which llm-train cannot start yet; "
                "run it with nodes: 1 (devices: N ranks on this host)");
  }
  const std::string strategy = config.GetString("strategy");
  const bool ranked = (strategy == "ddp" || strategy == "fsdp") && config.GetInt("devices") > 1;
  if (nproc > 0) {
    if (!ranked || config.GetInt("devices") != nproc) {
      return Fail(
          "--nproc " + std::to_string(nproc) +
          " starts the ranks of a data-parallel trial: it needs strategy: ddp or fsdp and "
          "devices: " +
          std::to_string(nproc) + " (the trial has strategy: " + config.GetString("strategy") +
          ", devices: " + std::to_string(config.GetInt("devices")) + ")");
    }
    // Each rank is this command without --nproc, told its place by the launcher's variables.
    llmctl::dist::LaunchSpec spec;
    for (int i = 0; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--nproc" || arg == "--master-port" || arg == "--ranks-file") {
        ++i;
        continue;
      }
      if (arg.starts_with("--nproc=") || arg.starts_with("--master-port=") ||
          arg.starts_with("--ranks-file=")) {
        continue;
      }
      spec.argv.push_back(arg);
    }
    spec.world_size = nproc;
    spec.master_port = static_cast<uint16_t>(master_port);
    spec.status_file = ranks_file;
    const llmctl::dist::LaunchResult launched = llmctl::dist::Launch(spec);
    if (!launched.status.ok()) {
      std::cerr << "llm-train: " << launched.status.message() << std::endl;
      // The job ends as its first failed rank did (invalid input, out of memory, diverged,
      // cancelled), else as failed.
      const auto& failure = launched.first_failure;
      if (failure && failure->signal == 0 && failure->exit_code >= llmctl::trainer::kExitFailed &&
          failure->exit_code <= llmctl::trainer::kExitCancelled) {
        return failure->exit_code;
      }
      return llmctl::trainer::kExitFailed;
    }
    return llmctl::trainer::kExitOk;
  }
  std::optional<llmctl::dist::RankEnv> rank_env;
  if (ranked) {
    auto env = llmctl::dist::RankEnvFromEnvironment();
    if (!env.ok()) {
      return Fail("strategy: " + strategy +
                  " with devices: " + std::to_string(config.GetInt("devices")) +
                  " runs one rank per device: start them with --nproc " +
                  std::to_string(config.GetInt("devices")) +
                  " (or torchrun): " + env.status().message());
    }
    rank_env = *env;
  }

  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGUSR1, OnCheckpointSignal);
  llmctl::trainer::RunOptions options;
  options.events_path = llmctl::trainer::RankEventsPath(events_path, rank_env ? rank_env->rank : 0);
  options.rank_env = rank_env;
  options.human = &std::cout;
  options.cancel = &g_cancel;
  options.checkpoint_on_cancel = &g_checkpoint_on_cancel;
  options.resume_from = resume_from;
  options.input_names = std::move(names);
  const llmctl::trainer::TrialResult result = llmctl::trainer::RunTrial(config, options);
  if (result.invalid_input) {
    std::cerr << "llm-train: " << result.error << std::endl;
    return llmctl::trainer::kExitInvalidInput;
  }
  return llmctl::trainer::ExitCodeFor(result.outcome);
}
