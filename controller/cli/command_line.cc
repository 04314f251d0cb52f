// The `llmctl` command line: its commands and flags (CLI11), and which Llmctl method each runs.
#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "controller/cli/llmctl.h"

namespace llmctl::cli {
namespace {

constexpr char kDescription[] =
    "llmctl: run fine-tuning memory/speed experiments and report what each technique costs.\n\n"
    "The controller is LLMCTL_CONTROLLER (unix:/path or host:port), else `controller:` in\n"
    "${XDG_CONFIG_HOME:-~/.config}/llmctl/config.yaml, else an embedded one that llmctl starts\n"
    "in the background (llmctld and a local llm-agent, data in $LLMCTL_HOME or\n"
    "${XDG_DATA_HOME:-~/.local/share}/llmctl; `llmctl daemon stop` ends them). A controller on\n"
    "TCP needs its API token: the 0600 file named by LLMCTL_CONTROLLER_TOKEN_FILE, else by\n"
    "`token_file:` in config.yaml.\n"
    "An upload may take the call deadline plus its size at LLMCTL_MIN_TRANSFER_RATE (per\n"
    "second, default 10MiB).\n\n"
    "Exit codes: 0 ok; 1 a trial ended other than its `expect:` (without one: failed, diverged or\n"
    "cancelled) under submit or resume --wait, or an operation failed; 2 invalid input (flags,\n"
    "experiment file, its input files, id, trial, a trial resume cannot continue); 3 controller\n"
    "unreachable.";

}  // namespace

// What the command line says: the command given (the one whose App parsed) and its flags.
struct ParsedCommandLine {
  std::string file, trial, format = "table", output, to, action, agent_image, rates_file, measure;
  int64_t id = 0;
  bool wait = false, provision = false, checkpoint = false;
  std::vector<std::string> submit_trials;
  EstimateOptions estimate_options;
  PlanOptions plan_options;
  CLI::App* submit = nullptr;
  CLI::App* estimate = nullptr;
  CLI::App* plan = nullptr;
  CLI::App* status = nullptr;
  CLI::App* watch = nullptr;
  CLI::App* cancel = nullptr;
  CLI::App* resume = nullptr;
  CLI::App* report = nullptr;
  CLI::App* fetch = nullptr;
  CLI::App* nodes = nullptr;
  CLI::App* lease = nullptr;
  CLI::App* node = nullptr;
  CLI::App* daemon = nullptr;
};

namespace {

void AddSubmitCommand(CLI::App& app, ParsedCommandLine& line) {
  line.submit = app.add_subcommand(
      "submit", "Validate an experiment file, upload its local inputs, start it; prints its id");
  line.submit->add_option("FILE", line.file, "The experiment file (YAML)")->required();
  line.submit->add_option("--trial", line.submit_trials,
                          "Only this trial of the file (repeat for more; the whole file is still "
                          "checked)");
  line.submit->add_flag("--wait", line.wait,
                        "Follow it live, print the report, exit 1 when a trial's outcome differs "
                        "from its expect:");
  line.submit->add_flag("--provision", line.provision,
                        "When no node is on a lease matching the file's target: {site, flavor}, "
                        "create the lease and bring up its node first (spends your allocation)");
  line.submit->add_option("--agent-image", line.agent_image,
                          "With --provision: the agent image the new node pulls");
}

// estimate's and plan's --rates.
constexpr char kRatesHelp[] =
    "A probe's JSON (llm-train --probe --probe-output FILE, run on the node you plan for): the "
    "time of the trials on its device at its rates, before a node's or this machine's";

void AddEstimateCommand(CLI::App& app, ParsedCommandLine& line) {
  line.estimate = app.add_subcommand(
      "estimate",
      "Each trial's memory per rank before it runs, from the experiment file alone: model state, "
      "activations, the step's peak, and whether it fits the trial's device");
  line.estimate->add_option("FILE", line.file, "The experiment file (YAML)")->required();
  line.estimate->add_option("--trial", line.estimate_options.trial, "Only this trial");
  line.estimate->add_option(
      "--device-memory", line.estimate_options.device_memory,
      "Judge every trial against this device: a size (80GiB) or a GPU "
      "(h100-94gb, a100-80gb, a100-40gb, v100-32gb, ...); default: each trial's "
      "device_memory, else its target's GPU");
  line.estimate->add_flag("--fit", line.estimate_options.fit,
                          "Also the largest micro-batch that fits each trial's device");
  line.estimate->add_flag("--explain", line.estimate_options.explain,
                          "Also every term's formula with its numbers");
  line.estimate
      ->add_option("--format", line.estimate_options.format, "table (MiB) or json (exact bytes)")
      ->capture_default_str();
  line.estimate->add_option("--rates", line.rates_file, kRatesHelp);
}

void AddPlanCommand(CLI::App& app, ParsedCommandLine& line) {
  line.plan = app.add_subcommand(
      "plan",
      "Which configuration fits a device and which is fastest: every precision x optimizer x "
      "checkpointing x offload x PEFT x strategy at the largest micro-batch that fits, fastest "
      "first, before anything is reserved");
  line.plan
      ->add_option("MODEL", line.plan_options.model,
                   "A preset name, a local model directory, or a BLIP-2 model by its hub name "
                   "(hf:Salesforce/blip2-opt-2.7b); another hf: model's config.json must be in "
                   "a local directory")
      ->required();
  line.plan
      ->add_option("--device", line.plan_options.device,
                   "A GPU (h100-94gb, h100-80gb, h200-141gb, a100-80gb, a100-40gb, v100-32gb, "
                   "...) or cpu")
      ->required();
  line.plan->add_option("--device-memory", line.plan_options.device_memory,
                        "The memory budget per device (for cpu; on a GPU a cap below its memory)");
  line.plan->add_option("--gpus", line.plan_options.gpus, "Devices per node (ranks: ddp or fsdp)")
      ->capture_default_str();
  line.plan->add_option("--nodes", line.plan_options.nodes, "Nodes")->capture_default_str();
  line.plan->add_option("--seq", line.plan_options.seq, "Tokens per sequence (data.max_seq_length)")
      ->required();
  line.plan
      ->add_option("--global-batch", line.plan_options.global_batch, "Sequences per optimizer step")
      ->required();
  line.plan->add_option("--steps", line.plan_options.steps, "The run's optimizer steps");
  line.plan->add_option("--tokens", line.plan_options.tokens, "Or the run's tokens");
  line.plan->add_option("--budget-hours", line.plan_options.budget_hours,
                        "Drop configurations predicted to take longer");
  line.plan->add_option("--su-per-node-hour", line.plan_options.su_per_node_hour,
                        "Service units a node-hour costs on your allocation: adds an SU column");
  line.plan->add_option("--precisions", line.plan_options.precisions, "Precisions to search")
      ->capture_default_str();
  line.plan
      ->add_option("--optimizers", line.plan_options.optimizers, "Optimizers to search (sgd too)")
      ->capture_default_str();
  line.plan
      ->add_option("--peft", line.plan_options.peft,
                   "PEFT methods to search (none: full fine-tuning)")
      ->capture_default_str();
  line.plan->add_flag("--no-offload", line.plan_options.no_offload, "Do not search offload");
  line.plan->add_option("--set", line.plan_options.sets,
                        "KEY=VALUE fixed on every configuration (kernels=aten, peft.r=16, ...)");
  line.plan->add_option("--top", line.plan_options.top, "Configurations shown and written")
      ->capture_default_str();
  line.plan->add_option("--write", line.plan_options.write,
                        "Write the top configurations as an experiment file `llmctl submit` runs");
  line.plan->add_option("--data", line.plan_options.data,
                        "With --write: the training data (data.path)");
  line.plan->add_option("--tokenizer", line.plan_options.tokenizer,
                        "With --write: a tokenizer.json or its directory (tokenizer), where "
                        "MODEL's directory has none");
  line.plan->add_option("--init", line.plan_options.init,
                        "With --write: pretrained or random (default: pretrained for a published "
                        "preset)");
  line.plan->add_option("--format", line.plan_options.format, "table or json")
      ->capture_default_str();
  line.plan->add_option("--rates", line.rates_file, kRatesHelp);
}

// An experiment id of at least `lowest`: CLI11's NonNegativeNumber and PositiveNumber are ranges
// of doubles, which let "1.5" through to a failed conversion and refused "x" as "not in range
// 0.000000 to" a 309-digit number.
CLI::Validator ExperimentId(int64_t lowest) {
  return CLI::Validator(
      [lowest](const std::string& input) {
        int64_t id = 0;
        const char* end = input.data() + input.size();
        const auto [parsed_end, error] = std::from_chars(input.data(), end, id);
        if (error == std::errc() && parsed_end == end && id >= lowest) return std::string();
        return std::string("'")
            .append(input)
            .append("' is not an experiment id (a whole number from ")
            .append(std::to_string(lowest))
            .append(")");
      },
      lowest == 0 ? "NONNEGATIVE" : "POSITIVE");
}

// status, watch, cancel, resume, report and fetch: one experiment's.
void AddExperimentCommands(CLI::App& app, ParsedCommandLine& line) {
  line.status = app.add_subcommand("status", "List experiments, or one experiment's trials");
  line.status->add_option("ID", line.id, "An experiment id (default: list them all)")
      ->check(ExperimentId(0));

  line.watch = app.add_subcommand(
      "watch",
      "Follow an experiment live until every trial has ended (a table redrawn in place "
      "on a terminal, appended lines otherwise)");
  line.watch->add_option("ID", line.id, "The experiment id (default: the latest)")
      ->check(ExperimentId(0));

  line.cancel = app.add_subcommand("cancel", "Cancel an experiment's trials that have not ended");
  line.cancel->add_option("ID", line.id, "The experiment id")->required()->check(ExperimentId(1));
  line.cancel->add_option("--trial", line.trial, "Only this trial");
  line.cancel->add_flag("--checkpoint", line.checkpoint,
                        "Stop now, keep the progress: running trials first checkpoint their last "
                        "complete step (llmctl resume continues from it)");

  line.resume = app.add_subcommand(
      "resume",
      "Continue a trial that stopped with a checkpoint (cancel --checkpoint, a lease's end) from "
      "it, on the node that holds it; the report then shows the steps of both runs");
  line.resume->add_option("ID", line.id, "The experiment id")->required()->check(ExperimentId(1));
  line.resume->add_option("TRIAL", line.trial, "The trial's name")->required();
  line.resume->add_flag(
      "--wait", line.wait,
      "Follow the experiment live, print the report, exit 1 when a trial's outcome "
      "differs from its expect:");

  line.report = app.add_subcommand("report",
                                   "An experiment's results: outcome, memory per "
                                   "category at the peak snapshot, time, tokens/s");
  line.report->add_option("ID", line.id, "The experiment id (default: the latest)")
      ->check(ExperimentId(0));
  line.report
      ->add_option("--format", line.format,
                   "table, csv, json, markdown or html (one file with charts)")
      ->capture_default_str();
  line.report->add_option("--output", line.output, "Write to FILE instead of standard output");

  line.fetch = app.add_subcommand(
      "fetch", "Copy a trial's artifacts (adapters, checkpoints, logs), checking each sha256");
  line.fetch->add_option("ID", line.id, "The experiment id")->required()->check(ExperimentId(1));
  line.fetch->add_option("TRIAL", line.trial, "The trial's name")->required();
  line.fetch->add_option("--to", line.to, "Destination directory (default: ./llmctl-ID-TRIAL)");
}

// nodes, lease, node and daemon: the controller's nodes, the cloud's, and the embedded daemons.
void AddNodeCommands(CLI::App& app, ParsedCommandLine& line) {
  line.nodes = app.add_subcommand("nodes", "The agents the controller knows and their devices");
  CLI::Option* measure =
      line.nodes->add_option("--measure", line.measure,
                             "Measure NODE's rates again (llm-train --probe, once no trial runs "
                             "there); `local`, with the embedded controller: this machine's");
  line.nodes
      ->add_flag("--wait", line.wait,
                 "With --measure: wait until the rates are measured and print them; exit 1 when "
                 "the node could not measure them (the rates before serve on)")
      ->needs(measure);

  // The lease commands parse their own flags (controller/openstack/lease_cli.h).
  line.lease = app.add_subcommand(
      "lease", "Chameleon leases: create|list|show|extend|delete (llmctl lease list, ...)");
  line.lease->prefix_command();
  line.lease->set_help_flag();

  line.node = app.add_subcommand(
      "node", "Chameleon GPU nodes on a lease: up|list|show|down (llmctl node up --lease L ...)");
  line.node->prefix_command();
  line.node->set_help_flag();

  line.daemon =
      app.add_subcommand("daemon", "Start, stop or show the embedded llmctld and llm-agent");
  line.daemon->add_option("ACTION", line.action, "start, stop or status")
      ->required()
      ->check(CLI::IsMember({"start", "stop", "status"}));
}

// For a command line CLI11 refused: a line telling how to pass a value that starts with '-' (a
// trial named '-lead' in `llmctl fetch 1 -lead`), which CLI11 takes for a flag it does not know
// and then misses the value's positional; "" when no such argument took a name's place. Only a
// positional that takes text counts: an id is never negative.
std::string DashValueHint(const CLI::App& app) {
  for (const CLI::App* command : app.get_subcommands()) {
    const std::vector<const CLI::Option*> unfilled =
        command->get_options([](const CLI::Option* option) {
          return option->get_positional() && option->count() == 0 &&
                 option->get_type_name() == "TEXT";
        });
    if (unfilled.empty()) continue;
    for (const std::string& argument : command->remaining()) {
      if (argument.size() < 2 || argument.front() != '-' || argument == "--") continue;
      return std::string("if '")
          .append(argument)
          .append("' is the ")
          .append(unfilled.front()->get_name())
          .append(", not a flag, put -- before it (-- ")
          .append(argument)
          .append("): what follows -- is never read as a flag");
    }
  }
  return "";
}

}  // namespace

int Llmctl::Run(const std::vector<std::string>& args) {
  CLI::App app(kDescription, "llmctl");
  app.require_subcommand(1);
  // CLI11's refusal quotes the arguments it refused as they came: an escape sequence among them
  // would clear or retitle the terminal.
  app.failure_message([](const CLI::App* command, const CLI::Error& error) {
    const std::string message = CLI::FailureMessage::simple(command, error);
    const size_t refusal_size = std::strlen(error.what());
    return ForTerminal(message.substr(0, refusal_size)).append(message.substr(refusal_size));
  });
  ParsedCommandLine line;
  AddSubmitCommand(app, line);
  AddEstimateCommand(app, line);
  AddPlanCommand(app, line);
  AddExperimentCommands(app, line);
  AddNodeCommands(app, line);

  std::vector<const char*> argv;
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e, context_.out, context_.err);
    if (const std::string hint = DashValueHint(app); !hint.empty()) {
      context_.err << "llmctl: " << ForTerminal(hint) << "\n";
    }
    return code == static_cast<int>(CLI::ExitCodes::Success) ? kExitOk : kExitInvalidInput;
  }
  return Dispatch(line);
}

int Llmctl::Dispatch(const ParsedCommandLine& line) {
  if (line.submit->parsed()) {
    std::vector<std::string> node_flags;
    if (!line.agent_image.empty()) node_flags = {"--agent-image", line.agent_image};
    return Submit(line.file, line.submit_trials, line.wait, line.provision, node_flags);
  }
  if (line.estimate->parsed()) return Estimate(line.file, line.estimate_options, line.rates_file);
  if (line.plan->parsed()) return Plan(line.plan_options, line.rates_file);
  if (line.status->parsed()) return ShowStatus(line.id);
  if (line.watch->parsed()) return Watch(line.id);
  if (line.cancel->parsed()) return Cancel(line.id, line.trial, line.checkpoint);
  if (line.resume->parsed()) return Resume(line.id, line.trial, line.wait);
  if (line.report->parsed()) return Report(line.id, line.format, line.output);
  if (line.fetch->parsed()) return Fetch(line.id, line.trial, line.to);
  if (line.nodes->parsed()) {
    return line.measure.empty() ? Nodes() : MeasureNode(line.measure, line.wait);
  }
  if (line.daemon->parsed()) return Daemon(line.action);
  if (line.lease->parsed()) return Lease(line.lease->remaining(), context_.out);
  if (line.node->parsed()) return Node(line.node->remaining(), context_.out);
  return kExitInvalidInput;  // require_subcommand(1) makes this unreachable
}

int Llmctl::Estimate(const std::string& file, EstimateOptions options,
                     const std::string& rates_file) {
  StatusOr<LocalRates> rates = LoadRatesPreferring(rates_file);
  if (!rates.ok()) return Fail(rates.status());
  const StoredCalibrations calibrations = LoadCalibrations();
  options.calibrate = calibrations.Lookup();
  options.rates = rates->Lookup();
  options.rates_gpu = rates->preferred_gpu();
  StatusOr<std::string> text = EstimateExperiment(file, options);
  if (!text.ok()) return Fail(text.status());
  context_.out << *text << std::flush;
  NoteUnusedRates(*rates, rates_file);
  return kExitOk;
}

int Llmctl::Plan(PlanOptions options, const std::string& rates_file) {
  StatusOr<LocalRates> rates = LoadRatesPreferring(rates_file);
  if (!rates.ok()) return Fail(rates.status());
  const StoredCalibrations calibrations = LoadCalibrations();
  options.calibrate = calibrations.Lookup();
  options.rates = rates->Lookup();
  StatusOr<std::string> text = PlanRun(options);
  if (!text.ok()) return Fail(text.status());
  context_.out << *text << std::flush;
  NoteUnusedRates(*rates, rates_file);
  return kExitOk;
}

}  // namespace llmctl::cli
