// The `llmctl` command line's commands (commands.h runs them): one Llmctl per command line, its
// methods in command_line.cc (the flags and the dispatch), submit_command.cc,
// experiment_commands.cc (status, watch, cancel, resume, report, fetch) and commands.cc (the
// connection, nodes, leases and the embedded daemons).
#ifndef LLMCTL_CONTROLLER_CLI_LLMCTL_H_
#define LLMCTL_CONTROLLER_CLI_LLMCTL_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "common/experiment.h"
#include "common/status.h"
#include "common/text.h"
#include "controller/cli/calibration.h"
#include "controller/cli/commands.h"
#include "controller/cli/estimate.h"
#include "controller/cli/inputs.h"
#include "controller/cli/lease_sizing.h"
#include "controller/cli/local_rates.h"
#include "controller/cli/plan.h"
#include "controller/openstack/node_cli.h"
#include "llmctl/v1/controller.grpc.pb.h"

namespace llmctl::cli {

// What the command line says (command_line.cc).
struct ParsedCommandLine;

// An experiment file as `llmctl submit` reads it: its text, checked with the paths on this
// machine resolved, and as written (what is sent).
struct SubmitFile {
  std::string name;
  std::string text;
  Experiment checked;
  Experiment as_written;
};

// "2026-11-29 04:14 CET": local time with its zone's abbreviation (as `date` prints it); every
// time llmctl's own tables and messages show goes through it.
std::string FormatUnixTime(int64_t seconds);

// How long estimate, plan and submit wait for a configured controller's nodes' rates and measured
// runs: an estimate works without them, at the data sheets' rates and built-in calibration.
inline constexpr std::chrono::seconds kMeasuredReadDeadline{5};

class Llmctl {
 public:
  explicit Llmctl(CliContext& context) : context_(context) {}

  int Run(const std::vector<std::string>& args);

 private:
  // The command the parsed command line names, run.
  int Dispatch(const ParsedCommandLine& line);
  // `rates_file`: --rates, a probe to predict its device's trials at ("" for none).
  int Estimate(const std::string& file, EstimateOptions options, const std::string& rates_file);
  int Plan(PlanOptions options, const std::string& rates_file);
  // The controller's stub, starting the embedded daemons when no controller is configured.
  StatusOr<std::unique_ptr<v1::Controller::Stub>> Connect();
  int Fail(const Status& status) {
    // The message may hold the controller's words: no escape of theirs reaches the terminal.
    context_.err << "llmctl: " << ForTerminal(status.message()) << "\n";
    if (status.code() == StatusCode::kUnavailable && !target_.empty()) {
      context_.err << "llmctl: is the controller at " << target_ << " (from " << target_source_
                   << ") running?\n";
    }
    return ExitCodeFor(status);
  }
  // Prints each status of experiment `id` until every trial has ended, reconnecting when the
  // controller goes away for a while. The last status.
  StatusOr<v1::ExperimentStatus> Follow(v1::Controller::Stub& stub, int64_t id);
  // Follow, then the report's table; the exit code `submit --wait` and `resume --wait` end with.
  int FollowAndReport(v1::Controller::Stub& stub, int64_t id);

  // `only_trials`: --trial, each of which the file must have (none: every trial).
  int Submit(const std::string& file, const std::vector<std::string>& only_trials, bool wait,
             bool provision, const std::vector<std::string>& node_flags);
  // The file's inputs collected (its notices printed) and their contents checked; InvalidArgument
  // for whatever is wrong with one.
  StatusOr<SubmitInputs> PrepareInputs(const SubmitFile& submitted);
  // Each trial's predicted memory and time, calibrated with the stored runs.
  StatusOr<std::vector<TrialPrediction>> Predict(const SubmitFile& submitted);
  // A warning for each trial predicted to run out of memory, or tight (within its allocator's
  // slack of the limit), that does not `expect: oom`.
  void WarnPredictedOom(const SubmitFile& submitted,
                        const std::vector<TrialPrediction>& predictions);
  // OK when a registered node's lease matches the experiment's target, or after --provision made
  // one for `lease_sizing`'s duration; FailedPrecondition saying what to run otherwise.
  Status EnsureTargetNode(v1::Controller::Stub& stub, const Experiment& experiment, bool provision,
                          const std::vector<std::string>& node_flags,
                          const LeaseSizing& lease_sizing);
  // EnsureTargetNode's --provision: makes lease `lease` at `site` with `llmctl lease` `create`
  // (unless a lease of that name is there, then waits for it to be ACTIVE), then brings its node
  // up with `llmctl node` `up`.
  Status Provision(const std::string& lease, const std::string& site,
                   const std::vector<std::string>& create, const std::vector<std::string>& up);
  int Lease(const std::vector<std::string>& args, std::ostream& out);
  // The runs estimate, plan and submit calibrate their predicted time with: the embedded
  // controller's store, read in place (nothing is started), or a configured controller's
  // (TimedRuns). A note on standard error when they cannot be read.
  StoredCalibrations LoadCalibrations();
  // The rates estimate, plan and submit predict a trial's time at (local_rates.h): the embedded
  // controller's nodes' and this machine's probe (measured the first time a CPU trial needs it),
  // or a configured controller's nodes' (ListNodes). A note on standard error when a configured
  // controller cannot be asked.
  LocalRates LoadRates();
  // LoadRates for estimate and plan, preferring the probe in `rates_file` (--rates) when one is
  // named: InvalidArgument naming the file when it cannot be read or is not a probe.
  StatusOr<LocalRates> LoadRatesPreferring(const std::string& rates_file);
  // The controller llmctl is configured for (LLMCTL_CONTROLLER or the config file); none for the
  // embedded one, or an address that does not resolve (whose use says why).
  std::optional<ControllerAddress> ConfiguredController();
  // Calls `read` on a configured controller within kMeasuredReadDeadline; once a call could not
  // reach it, the next is not tried (the first's status).
  Status ReadFromController(
      const std::function<grpc::Status(v1::Controller::Stub&, grpc::ClientContext&)>& read);
  // Says on standard error that --rates' probe served no trial, naming its device.
  void NoteUnusedRates(const LocalRates& rates, const std::string& rates_file);
  int Node(const std::vector<std::string>& args, std::ostream& out);
  // Tells the controller where `node up`'s agent is and on which lease, then waits until the
  // controller reaches it.
  Status AwaitAgent(const openstack::NodeUp& up, std::ostream& out);
  // `node down`'s part on the controller: DeregisterNode, its result printed to `out`. The error
  // names the controller.
  Status DeregisterNode(const std::string& node, std::ostream& out);
  int ShowStatus(int64_t id);
  int Watch(int64_t id);
  int Cancel(int64_t id, const std::string& trial, bool checkpoint);
  int Resume(int64_t id, const std::string& trial, bool wait);
  int Report(int64_t id, const std::string& format_name, const std::string& output);
  int Fetch(int64_t id, const std::string& trial, const std::string& to);
  int Nodes();
  // `nodes --measure NODE`: the node's agent measures its rates again (MeasureNodeRates); for
  // node `local` of the embedded controller, this llmctl measures probe.json again, which the
  // embedded agent then takes. `wait`: until the node's new rates are stored, or its probe failed.
  int MeasureNode(const std::string& node, bool wait);
  // `nodes --measure NODE --wait` once the agent was asked: follows ListNodes until the node
  // shows no probe underway and rates or a note other than `before`'s, printing what its agent
  // says meanwhile; the new rates, or FailedPrecondition with the agent's note on why none came.
  Status AwaitNodeRates(v1::Controller::Stub& stub, const v1::NodeStatus& before, std::string note);
  int Daemon(const std::string& action);

  CliContext& context_;
  std::string target_;  // set by Connect, for messages
  std::string target_source_;
  std::optional<Status> controller_unreachable_;  // ReadFromController's first failed reach
};

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_LLMCTL_H_
