#include "controller/cli/commands.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "common/atomic_file.h"
#include "common/byte_size.h"
#include "common/experiment.h"
#include "common/files.h"
#include "common/text.h"
#include "controller/cli/artifact_file.h"
#include "controller/cli/calibration.h"
#include "controller/cli/local_rates.h"
#include "controller/cli/client.h"
#include "controller/cli/daemons.h"
#include "controller/cli/estimate.h"
#include "controller/cli/input_tree.h"
#include "controller/cli/inputs.h"
#include "controller/cli/lease_sizing.h"
#include "controller/cli/plan.h"
#include "controller/cli/report.h"
#include "controller/cli/watch_view.h"
#include "controller/openstack/lease_cli.h"
#include "controller/openstack/node_cli.h"
#include "llmctl/v1/controller.grpc.pb.h"
#include "rpc/grpc_status.h"
#include "rpc/tls.h"
#include "rpc/transfer.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

constexpr int kWatchReconnects = 30;
constexpr std::chrono::seconds kDaemonStopGrace{10};
constexpr std::chrono::milliseconds kFirstAgentPoll{100};

// LLMCTL_MIN_TRANSFER_RATE ("2MiB", per second): the slowest link an upload must survive
// (rpc::TransferDeadline); rpc::kDefaultMinTransferBytesPerSecond when unset.
StatusOr<int64_t> MinTransferRate(const EnvLookup& env) {
  const std::optional<std::string> text = env("LLMCTL_MIN_TRANSFER_RATE");
  if (!text || text->empty()) return rpc::kDefaultMinTransferBytesPerSecond;
  StatusOr<uint64_t> rate = ParseByteSize(*text);
  if (!rate.ok() || *rate == 0 ||
      *rate > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return InvalidArgumentError(
        "LLMCTL_MIN_TRANSFER_RATE: expected a rate per second above 0 such as 10MiB, got '" +
        *text + "'");
  }
  return static_cast<int64_t>(*rate);
}

std::string FormatUnixTime(int64_t seconds) {
  const std::time_t time = static_cast<std::time_t>(seconds);
  std::tm tm{};
  localtime_r(&time, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%d %H:%M", &tm);
  return buffer;
}

class Llmctl {
 public:
  explicit Llmctl(CliContext& context) : context_(context) {}

  int Run(const std::vector<std::string>& args);

 private:
  // The controller's stub, starting the embedded daemons when no controller is configured.
  StatusOr<std::unique_ptr<v1::Controller::Stub>> Connect();
  int Fail(const Status& status) {
    context_.err << "llmctl: " << status.message() << "\n";
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
  // OK when a registered node's lease matches the experiment's target, or after --provision made
  // one for `lease_sizing`'s duration; FailedPrecondition saying what to run otherwise.
  Status EnsureTargetNode(v1::Controller::Stub& stub, const Experiment& experiment, bool provision,
                          const std::vector<std::string>& node_flags,
                          const LeaseSizing& lease_sizing);
  int Lease(const std::vector<std::string>& args, std::ostream& out);
  // The runs estimate, plan and submit calibrate their predicted time with (a note on standard
  // error when the store cannot be read).
  StoredCalibrations LoadCalibrations();
  // The rates a CPU trial's time is predicted at (this machine's probe, measured the first time);
  // with `only_embedded`, only when the trials run on this machine's embedded agent.
  LocalRates LoadLocalRates(bool only_embedded);
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
  int Daemon(const std::string& action);

  CliContext& context_;
  std::string target_;  // set by Connect, for messages
  std::string target_source_;
};

StatusOr<std::unique_ptr<v1::Controller::Stub>> Llmctl::Connect() {
  ASSIGN_OR_RETURN(ControllerAddress address, ResolveControllerAddress(context_.env));
  target_ = address.target;
  target_source_ = address.source;
  if (address.embedded) {
    StatusOr<DaemonBinaries> binaries = LocateDaemonBinaries(context_.self, context_.env);
    if (!binaries.ok()) {
      return UnavailableError(
          "no controller is configured (LLMCTL_CONTROLLER or " +
          ConfigFilePath(context_.env).value_or("config.yaml").string() +
          ") and the embedded one cannot start: " + binaries.status().message());
    }
    EmbeddedDaemons daemons(address.data_dir, std::move(*binaries));
    RETURN_IF_ERROR(daemons.EnsureRunning(context_.daemon_ready_timeout));
  }
  // A unix socket's 0600 mode is its credential; llmctld serves TCP only with a token.
  std::string token;
  if (!address.target.starts_with("unix:")) {
    if (address.token_file.empty()) {
      return FailedPreconditionError(
          "the controller at " + address.target + " (from " + address.source +
          ") is on TCP and takes calls only with its API token: set LLMCTL_CONTROLLER_TOKEN_FILE, "
          "or token_file in " +
          ConfigFilePath(context_.env).value_or("config.yaml").string() +
          ", to a copy of the 0600 file that llmctld's token_file names");
    }
    ASSIGN_OR_RETURN(token, rpc::ReadTokenFile(address.token_file.string()));
  }
  return v1::Controller::NewStub(OpenControllerChannel(address.target, token));
}

StatusOr<v1::ExperimentStatus> Llmctl::Follow(v1::Controller::Stub& stub, int64_t id) {
  WatchPrinter printer(context_.out_is_tty);
  std::optional<v1::ExperimentStatus> last;
  for (int reconnects = 0;; ++reconnects) {
    grpc::ClientContext call;
    v1::GetExperimentRequest request;
    request.set_experiment_id(id);
    std::unique_ptr<grpc::ClientReader<v1::ExperimentStatus>> reader = stub.Watch(&call, request);
    v1::ExperimentStatus status;
    while (reader->Read(&status)) {
      context_.out << printer.Update(status) << std::flush;
      last = status;
    }
    const Status finished = rpc::FromGrpcStatus(reader->Finish());
    if (finished.ok()) {
      if (last) return *last;
      return InternalError("the controller ended the watch of experiment " + std::to_string(id) +
                           " without a status");
    }
    if (finished.code() != StatusCode::kUnavailable || reconnects == kWatchReconnects) {
      return finished.WithContext("watching experiment " + std::to_string(id));
    }
    std::this_thread::sleep_for(context_.watch_retry_interval);
  }
}

int Llmctl::Submit(const std::string& file, const std::vector<std::string>& only_trials, bool wait,
                   bool provision, const std::vector<std::string>& node_flags) {
  StatusOr<std::string> text = ReadFileToString(file, kMaxExperimentFileBytes);
  if (!text.ok()) return Fail(InvalidArgumentError(text.status().message()));  // names the file
  // Locally first, with the files on this machine, exactly as llm-train would: nothing is sent
  // when the file is wrong.
  StatusOr<Experiment> checked =
      ParseExperiment(*text, file, {.resolve_local_paths = true, .output_dir_in_run = true});
  if (!checked.ok()) return Fail(checked.status());
  StatusOr<Experiment> as_written =
      ParseExperiment(*text, file, {.resolve_local_paths = false, .output_dir_in_run = true});
  if (!as_written.ok()) return Fail(as_written.status());
  if (!only_trials.empty()) {
    if (const Status kept = KeepOnlyTrials(only_trials, file, *checked); !kept.ok()) {
      return Fail(kept);
    }
    if (const Status kept = KeepOnlyTrials(only_trials, file, *as_written); !kept.ok()) {
      return Fail(kept);
    }
  }
  // Whatever went wrong with a local input (missing, unreadable, malformed) is the caller's to fix:
  // exit 2, like llm-train.
  StatusOr<SubmitInputs> inputs = CollectInputs(*as_written, file);
  if (!inputs.ok()) return Fail(InvalidArgumentError(inputs.status().message()));
  for (const std::string& notice : inputs->notices) context_.err << "note: " << notice << "\n";
  // What each input holds, before anything is stored or sent: a broken dataset or tokenizer fails
  // here in seconds, not on a leased node.
  if (const Status contents = CheckLocalInputs(*checked, file); !contents.ok()) {
    return Fail(InvalidArgumentError(contents.message()));
  }
  StatusOr<int64_t> min_transfer_rate = MinTransferRate(context_.env);
  if (!min_transfer_rate.ok()) return Fail(min_transfer_rate.status());

  // Each trial's predicted memory and time, stored with it so the report can set them beside the
  // measured ones, and what sizes a provisioned lease; a trial predicted to run out of memory that
  // is not meant to is worth a second look, but the prediction may be wrong, so it is a warning,
  // not a refusal.
  const StoredCalibrations calibrations = LoadCalibrations();
  const LocalRates rates = LoadLocalRates(/*only_embedded=*/true);
  EstimateOptions estimate_options;
  estimate_options.calibrate = calibrations.Lookup();
  estimate_options.rates = rates.Lookup();
  StatusOr<std::vector<TrialPrediction>> predictions =
      PredictTrials(*checked, file, estimate_options);
  if (!predictions.ok()) return Fail(predictions.status());
  StatusOr<std::unique_ptr<v1::Controller::Stub>> stub = Connect();
  if (!stub.ok()) return Fail(stub.status());
  if (!checked->target.empty()) {
    const Status placed = EnsureTargetNode(**stub, *checked, provision, node_flags,
                                           SizeLease(*checked, *predictions));
    if (!placed.ok()) return Fail(placed.WithContext(file + ": target"));
  } else if (provision) {
    return Fail(InvalidArgumentError(
        file + ": --provision needs a `target: {site, flavor}` or `{site, node_type}` in it"));
  }
  StatusOr<UploadSummary> uploaded = UploadMissingBlobs(**stub, inputs->blobs, *min_transfer_rate);
  if (!uploaded.ok()) return Fail(uploaded.status());

  v1::SubmitRequest request;
  request.set_filename(file);
  request.set_yaml_text(*text);
  for (const std::string& name : only_trials) request.add_only_trials(name);
  for (auto& [written, tree] : inputs->trees) (*request.mutable_inputs())[written] = tree;
  for (const TrialPrediction& p : *predictions) {
    v1::TrialPrediction& proto = (*request.mutable_predictions())[p.trial];
    proto.set_peak_bytes(static_cast<int64_t>(p.peak_bytes));
    proto.set_activation_bytes(static_cast<int64_t>(p.activation_bytes));
    proto.set_model_state_bytes(static_cast<int64_t>(p.model_state_bytes));
    proto.set_peak_phase(p.peak_phase);
    proto.set_device_memory_bytes(static_cast<int64_t>(p.device_memory_bytes));
    proto.set_verdict(p.verdict);
    proto.set_step_seconds(p.step_seconds);
    proto.set_tokens_per_second(p.tokens_per_second);
    proto.set_trial_seconds(p.trial_seconds);
    proto.set_time_device(p.time_device);
    proto.set_calibration(p.calibration);
    proto.set_work_json(p.work_json);
    const Trial* trial = nullptr;
    for (const Trial& t : checked->trials) {
      if (t.name == p.trial) trial = &t;
    }
    if (p.verdict == "oom" && trial != nullptr && trial->expect != "oom") {
      context_.err << "warning: " << file << ": trial " << p.trial << " is predicted to run out "
                   << "of memory: its peak " << FormatBytes(p.peak_bytes) << " exceeds "
                   << FormatBytes(p.device_memory_bytes) << " (" << p.device_source
                   << "); `llmctl estimate " << file << " --trial " << p.trial
                   << " --fit --explain` shows why and what fits (add `expect: oom` if that is "
                      "the point)\n";
    }
  }
  v1::SubmitResponse response;
  const Status submitted =
      rpc::FromGrpcStatus((*stub)->Submit(UnaryContext().get(), request, &response));
  if (!submitted.ok()) return Fail(submitted);
  context_.out << response.experiment_id() << "\n" << std::flush;
  context_.err << "submitted " << response.name() << " (" << response.trials_size()
               << " trials); inputs: " << inputs->trees.size() << " trees, " << uploaded->blobs
               << " files, " << uploaded->uploaded << " uploaded (" << uploaded->bytes
               << " bytes)\n";
  if (!wait) return kExitOk;
  return FollowAndReport(**stub, response.experiment_id());
}

int Llmctl::FollowAndReport(v1::Controller::Stub& stub, int64_t id) {
  StatusOr<v1::ExperimentStatus> followed = Follow(stub, id);
  if (!followed.ok()) return Fail(followed.status());
  v1::GetExperimentRequest report_request;
  report_request.set_experiment_id(id);
  v1::ReportResponse report;
  const Status reported =
      rpc::FromGrpcStatus(stub.Report(UnaryContext().get(), report_request, &report));
  if (!reported.ok()) return Fail(reported);
  context_.out << "\n" << RenderReport(report, ReportFormat::kTable);
  return CountUnexpectedOutcomes(report) > 0 ? kExitFailed : kExitOk;
}

Status Llmctl::EnsureTargetNode(v1::Controller::Stub& stub, const Experiment& experiment,
                                bool provision, const std::vector<std::string>& node_flags,
                                const LeaseSizing& lease_sizing) {
  for (const auto& [key, value] : experiment.target) {
    if (key != "site" && key != "flavor" && key != "node_type") {
      return InvalidArgumentError("unknown key '" + key +
                                  "' (target takes site, and flavor or node_type)");
    }
  }
  const auto target_value = [&](const char* key) {
    auto found = experiment.target.find(key);
    return found == experiment.target.end() ? std::string() : found->second;
  };
  const std::string site = target_value("site");
  // A KVM site's flavor, or a bare-metal site's node type: a lease reserves either, and a node's
  // lease names whichever it reserved.
  const std::string node_type = target_value("node_type");
  if (target_value("flavor").empty() == node_type.empty()) {
    return InvalidArgumentError(
        "the target needs a flavor (KVM sites) or a node_type (bare-metal sites), one of them");
  }
  const std::string flavor = node_type.empty() ? target_value("flavor") : node_type;
  v1::ListNodesResponse nodes;
  RETURN_IF_ERROR(
      rpc::FromGrpcStatus(stub.ListNodes(UnaryContext().get(), v1::ListNodesRequest(), &nodes)));
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  for (const v1::NodeStatus& node : nodes.nodes()) {
    if (!node.has_lease() || node.lease().flavor() != flavor) continue;
    if (!site.empty() && node.lease().site() != site) continue;
    if (node.lease().ends_unix() <= now) continue;
    context_.err << "target " << flavor << ": node " << node.name() << " (lease "
                 << node.lease().name() << ")\n";
    return Status::Ok();
  }
  const std::string lease = ProvisionLeaseName(experiment.name, flavor);
  std::vector<std::string> create = {"create",
                                     node_type.empty() ? "--flavor" : "--node-type",
                                     flavor,
                                     "--name",
                                     lease,
                                     "--duration",
                                     lease_sizing.duration,
                                     "--wait"};
  if (!site.empty()) create.insert(create.end(), {"--site", site});
  std::vector<std::string> up = {"up", "--lease", lease};
  up.insert(up.end(), node_flags.begin(), node_flags.end());
  if (!site.empty()) up.insert(up.begin(), {"--site", site});
  if (!provision) {
    std::string create_line = "llmctl lease", up_line = "llmctl node";
    for (const std::string& word : create) create_line += " " + word;
    for (const std::string& word : up) up_line += " " + word;
    return FailedPreconditionError(
        "no node of the controller's is on a lease of " + flavor +
        (site.empty() ? "" : " at " + site) +
        ". `llmctl submit --provision` makes one (it spends your allocation), or run: " +
        create_line + " && " + up_line + (node_flags.empty() ? " --agent-image REF" : ""));
  }
  context_.err << "provisioning lease " << lease << " and its node for target " << flavor << ", "
               << lease_sizing.duration << " (" << lease_sizing.explanation << ")\n";
  // Rerunning finds the lease of the earlier run by its name instead of making another.
  std::vector<std::string> show = {"show", lease};
  if (!site.empty()) show.insert(show.end(), {"--site", site});
  std::ostringstream ignored;
  if (Lease(show, ignored) != kExitOk && Lease(create, context_.err) != kExitOk) {
    return FailedPreconditionError("lease " + lease + " could not be made (see above)");
  }
  if (Node(up, context_.err) != kExitOk) {
    return FailedPreconditionError("node " + lease + " could not be brought up (see above)");
  }
  return Status::Ok();
}

StoredCalibrations Llmctl::LoadCalibrations() {
  StoredCalibrations calibrations = StoredCalibrations::Load(context_.env);
  if (!calibrations.note().empty()) context_.err << "note: " << calibrations.note() << "\n";
  return calibrations;
}

LocalRates Llmctl::LoadLocalRates(bool only_embedded) {
  if (only_embedded) {
    StatusOr<ControllerAddress> address = ResolveControllerAddress(context_.env);
    if (!address.ok() || !address->embedded) return LocalRates();
  }
  return LocalRates::LoadOnFirstUse(context_.env, context_.self, context_.err);
}

int Llmctl::Lease(const std::vector<std::string>& args, std::ostream& out) {
  openstack::LeaseCommandContext lease_context;
  lease_context.env = [this](const std::string& name) { return context_.env(name); };
  if (context_.cloud_clock != nullptr) lease_context.clock = context_.cloud_clock;
  return openstack::RunLeaseCommand(args, out, context_.err, lease_context);
}

int Llmctl::Node(const std::vector<std::string>& args, std::ostream& out) {
  openstack::NodeCommandContext node_context;
  node_context.env = [this](const std::string& name) { return context_.env(name); };
  if (context_.cloud_clock != nullptr) node_context.clock = context_.cloud_clock;
  node_context.issue_enrollment =
      [this](const std::string& node) -> StatusOr<openstack::NodeEnrollment> {
    ASSIGN_OR_RETURN(std::unique_ptr<v1::Controller::Stub> stub, Connect());
    // The floating IP comes after the server, so the address follows with UpdateNode, and the
    // node's credentials with EnrollNode once its agent waits there.
    v1::RegisterNodeRequest request;
    request.set_name(node);
    request.set_enroll(true);
    v1::NodeCredentials issued;
    RETURN_IF_ERROR(
        rpc::FromGrpcStatus(stub->RegisterNode(UnaryContext().get(), request, &issued)));
    return openstack::NodeEnrollment{.ca_pem = issued.ca_certificate_pem(),
                                     .enrollment_token = issued.enrollment_token()};
  };
  node_context.node_up = [this, &out](const openstack::NodeUp& up) { return AwaitAgent(up, out); };
  node_context.node_down = [this, &out](const std::string& node) {
    return DeregisterNode(node, out);
  };
  return openstack::RunNodeCommand(args, out, context_.err, node_context);
}

Status Llmctl::DeregisterNode(const std::string& node, std::ostream& out) {
  StatusOr<std::unique_ptr<v1::Controller::Stub>> stub = Connect();
  v1::DeregisterNodeResponse response;
  Status told = stub.status();
  if (stub.ok()) {
    v1::DeregisterNodeRequest request;
    request.set_name(node);
    told = rpc::FromGrpcStatus((*stub)->DeregisterNode(UnaryContext().get(), request, &response));
  }
  if (!told.ok()) {
    const std::string controller =
        target_.empty() ? "the controller"
                        : "the controller at " + target_ + " (from " + target_source_ + ")";
    return Status(told.code(), "cannot tell " + controller + " that node " + node +
                                   " is going: " + told.message());
  }
  if (response.result() == "removed") {
    out << "controller: node " << node << " removed";
    if (response.requeued_size() > 0) {
      out << "; its running trials are queued again:";
      for (const std::string& attempt : response.requeued()) out << " " << attempt;
    }
    out << "\n";
  } else if (response.result() == "already_removed") {
    out << "controller: node " << node << " was already removed at "
        << FormatUnixTime(response.removed_unix()) << "\n";
  } else {
    out << "controller: node " << node << " was not registered there\n";
  }
  return Status::Ok();
}

Status Llmctl::AwaitAgent(const openstack::NodeUp& up, std::ostream& out) {
  const std::string address = up.node.AgentAddress();
  if (address.empty()) {
    return FailedPreconditionError("node " + up.node.name +
                                   " has no agent address yet (no floating IP or agent port)");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<v1::Controller::Stub> stub, Connect());
  v1::UpdateNodeRequest request;
  request.set_name(up.node.name);
  request.set_address(address);
  v1::NodeLease* lease = request.mutable_lease();
  lease->set_name(up.lease.name);
  lease->set_site(up.site);
  lease->set_flavor(up.flavor);
  lease->set_ends_unix(
      std::chrono::duration_cast<std::chrono::seconds>(up.lease.end.time_since_epoch()).count());
  v1::NodeStatus updated;
  const Status told =
      rpc::FromGrpcStatus(stub->UpdateNode(UnaryContext().get(), request, &updated));
  if (told.code() == StatusCode::kNotFound) {
    return FailedPreconditionError(
        "the controller does not know node " + up.node.name +
        " (its server was made for another controller): llmctl node down " + up.node.name +
        ", then node up again");
  }
  RETURN_IF_ERROR(told);
  const auto minutes =
      std::chrono::duration_cast<std::chrono::minutes>(context_.agent_ready_timeout);
  out << "waiting for the agent at " << address << " (up to " << minutes.count()
      << " min: cloud-init installs Docker and the agent first)\n"
      << std::flush;
  const auto deadline = std::chrono::steady_clock::now() + context_.agent_ready_timeout;
  // The first polls come quickly (an agent that is already running answers within a dispatcher
  // round), then double up to agent_poll_interval for a node that is still booting.
  std::chrono::milliseconds poll = std::min(kFirstAgentPoll, context_.agent_poll_interval);
  bool enrolled = false;
  while (true) {
    if (!enrolled) {
      v1::EnrollNodeRequest enroll;
      enroll.set_name(up.node.name);
      v1::EnrollNodeResponse response;
      const Status told =
          rpc::FromGrpcStatus(stub->EnrollNode(UnaryContext().get(), enroll, &response));
      enrolled = told.ok();
      if (told.ok() && !response.already_enrolled()) {
        out << "node " << up.node.name
            << ": enrolled (its certificate and token went over the link)\n"
            << std::flush;
      }
      // Unavailable: no agent waits there yet (the node is still booting); anything else is a
      // refusal that waiting does not change.
      if (!told.ok() && told.code() != StatusCode::kUnavailable &&
          told.code() != StatusCode::kDeadlineExceeded) {
        return told;
      }
    }
    v1::ListNodesResponse nodes;
    RETURN_IF_ERROR(
        rpc::FromGrpcStatus(stub->ListNodes(UnaryContext().get(), v1::ListNodesRequest(), &nodes)));
    for (const v1::NodeStatus& node : nodes.nodes()) {
      // The agent answers, but its node cannot run llm-train: waiting longer does not help.
      if (node.name() == up.node.name && !node.unusable().empty()) {
        return FailedPreconditionError(node.unusable());
      }
      if (node.name() == up.node.name && node.state() == "connected") {
        out << "node " << node.name() << ": the agent answers (" << node.devices_size()
            << " devices)\n";
        return Status::Ok();
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status(
          StatusCode::kDeadlineExceeded,
          "the controller could not reach node " + up.node.name + "'s agent at " + address +
              " within " + std::to_string(minutes.count()) +
              " min; the server is up: look at its console log (openstack console log show " +
              openstack::NamesForNode(up.node.name).server + ") and run `llmctl node up --lease " +
              up.lease.name + "` again to wait once more");
    }
    std::this_thread::sleep_for(poll);
    poll = std::min(poll * 2, context_.agent_poll_interval);
  }
}

int Llmctl::ShowStatus(int64_t id) {
  StatusOr<std::unique_ptr<v1::Controller::Stub>> stub = Connect();
  if (!stub.ok()) return Fail(stub.status());
  if (id == 0) {
    v1::ListExperimentsResponse list;
    const Status listed = rpc::FromGrpcStatus(
        (*stub)->ListExperiments(UnaryContext().get(), v1::ListExperimentsRequest(), &list));
    if (!listed.ok()) return Fail(listed);
    if (list.experiments().empty()) {
      context_.out << "no experiments yet; llmctl submit FILE.yaml starts one\n";
      return kExitOk;
    }
    std::vector<std::vector<std::string>> rows = {
        {"id", "name", "state", "ended", "created", "file"}};
    for (const v1::ExperimentSummary& e : list.experiments()) {
      rows.push_back({std::to_string(e.id()), e.name(), e.state(),
                      std::to_string(e.ended()) + "/" + std::to_string(e.trials()),
                      FormatUnixTime(e.created_unix()), e.filename()});
    }
    context_.out << FormatColumns(rows);
    return kExitOk;
  }
  v1::GetExperimentRequest request;
  request.set_experiment_id(id);
  v1::ExperimentStatus status;
  const Status got =
      rpc::FromGrpcStatus((*stub)->GetExperiment(UnaryContext().get(), request, &status));
  if (!got.ok()) return Fail(got);
  context_.out << "experiment " << status.id() << " " << status.name() << ": " << status.state()
               << "\n";
  for (const std::string& line : WatchLines(status)) context_.out << line << "\n";
  return kExitOk;
}

int Llmctl::Watch(int64_t id) {
  StatusOr<std::unique_ptr<v1::Controller::Stub>> stub = Connect();
  if (!stub.ok()) return Fail(stub.status());
  StatusOr<v1::ExperimentStatus> followed = Follow(**stub, id);
  if (!followed.ok()) return Fail(followed.status());
  return kExitOk;
}

int Llmctl::Cancel(int64_t id, const std::string& trial, bool checkpoint) {
  StatusOr<std::unique_ptr<v1::Controller::Stub>> stub = Connect();
  if (!stub.ok()) return Fail(stub.status());
  v1::CancelRequest request;
  request.set_experiment_id(id);
  request.set_trial(trial);
  request.set_checkpoint(checkpoint);
  v1::CancelResponse response;
  const Status cancelled =
      rpc::FromGrpcStatus((*stub)->Cancel(UnaryContext().get(), request, &response));
  if (!cancelled.ok()) return Fail(cancelled);
  if (response.cancelled().empty()) {
    context_.out << "nothing to cancel: " << (trial.empty() ? "every trial" : trial)
                 << " had already ended\n";
  }
  for (const std::string& name : response.cancelled()) context_.out << "cancelled " << name << "\n";
  if (checkpoint && !response.cancelled().empty()) {
    const std::string ids = std::to_string(id);
    context_.out << "running trials first checkpoint their last complete step: `llmctl status " +
                        ids + "` says where, `llmctl resume " + ids + " TRIAL` continues from it\n";
  }
  return kExitOk;
}

int Llmctl::Resume(int64_t id, const std::string& trial, bool wait) {
  StatusOr<std::unique_ptr<v1::Controller::Stub>> stub = Connect();
  if (!stub.ok()) return Fail(stub.status());
  v1::ResumeRequest request;
  request.set_experiment_id(id);
  request.set_trial(trial);
  v1::ResumeResponse response;
  const Status resumed =
      rpc::FromGrpcStatus((*stub)->Resume(UnaryContext().get(), request, &response));
  // A trial that cannot be resumed is the caller's mistake, like an unknown one: nothing changed.
  if (resumed.code() == StatusCode::kFailedPrecondition) {
    context_.err << "llmctl: cannot resume: " << resumed.message() << "\n";
    return kExitInvalidInput;
  }
  if (!resumed.ok()) return Fail(resumed);
  context_.out << "resuming " << response.trial() << " of experiment " << response.experiment_id()
               << " at step " << response.first_step() + 1 << " from attempt "
               << response.resumes_attempt() << "'s checkpoint " << response.checkpoint()
               << " on node " << response.node()
               << (response.checkpoint_copied()
                       ? " (the controller has a copy: any node that can run it may continue it)"
                       : "")
               << "\n"
               << std::flush;
  if (!wait) return kExitOk;
  return FollowAndReport(**stub, response.experiment_id());
}

int Llmctl::Report(int64_t id, const std::string& format_name, const std::string& output) {
  StatusOr<ReportFormat> format = ParseReportFormat(format_name);
  if (!format.ok()) return Fail(format.status());
  StatusOr<std::unique_ptr<v1::Controller::Stub>> stub = Connect();
  if (!stub.ok()) return Fail(stub.status());
  v1::GetExperimentRequest request;
  request.set_experiment_id(id);
  v1::ReportResponse report;
  const Status got = rpc::FromGrpcStatus((*stub)->Report(UnaryContext().get(), request, &report));
  if (!got.ok()) return Fail(got);
  const std::string text = RenderReport(report, *format);
  if (output.empty()) {
    context_.out << text;
    return kExitOk;
  }
  const Status written =
      WriteFileAtomically(output, [&](int fd) { return WriteAll(fd, text.data(), text.size()); });
  if (!written.ok()) return Fail(written.WithContext("--output " + output));
  context_.err << "wrote " << output << "\n";
  return kExitOk;
}

int Llmctl::Fetch(int64_t id, const std::string& trial, const std::string& to) {
  std::string safe_trial = trial;  // sweep trials are named "base/key=value"
  std::replace(safe_trial.begin(), safe_trial.end(), '/', '_');
  const fs::path destination =
      to.empty() ? fs::path("llmctl-" + std::to_string(id) + "-" + safe_trial) : fs::path(to);
  StatusOr<std::unique_ptr<v1::Controller::Stub>> stub = Connect();
  if (!stub.ok()) return Fail(stub.status());

  // The artifacts' total size is not known up front: no call deadline, an idle limit instead.
  grpc::ClientContext call;
  rpc::IdleCanceller idle(call, kCallDeadline);
  v1::FetchTrialArtifactsRequest request;
  request.set_experiment_id(id);
  request.set_trial(trial);
  std::unique_ptr<grpc::ClientReader<v1::ArtifactChunk>> reader =
      (*stub)->FetchArtifacts(&call, request);
  auto abort = [&](const Status& status) {
    call.TryCancel();
    reader->Finish().ok();
    return Fail(status);
  };
  std::unique_ptr<ArtifactFile> current;
  int files = 0;
  int64_t total = 0;
  v1::ArtifactChunk chunk;
  while (reader->Read(&chunk)) {
    idle.Progress();
    if (current == nullptr) {
      StatusOr<std::unique_ptr<ArtifactFile>> begun = ArtifactFile::Begin(destination, chunk);
      if (!begun.ok()) return abort(begun.status());
      current = std::move(*begun);
    }
    if (Status appended = current->Append(chunk.data()); !appended.ok()) return abort(appended);
    if (!chunk.last()) continue;
    if (Status finished = current->Finish(chunk.sha256()); !finished.ok()) return abort(finished);
    ++files;
    total += current->size();
    current.reset();
  }
  const Status finished = idle.Explain(reader->Finish(), "fetching the artifacts");
  if (!finished.ok()) return Fail(finished);
  if (current != nullptr) {
    return Fail(DataLossError(current->path() + ": the stream ended in the middle of the file"));
  }
  context_.out << "fetched " << files << " files (" << total << " bytes, sha256 checked) into "
               << destination.string() << "\n";
  return kExitOk;
}

int Llmctl::Nodes() {
  StatusOr<std::unique_ptr<v1::Controller::Stub>> stub = Connect();
  if (!stub.ok()) return Fail(stub.status());
  v1::ListNodesResponse nodes;
  const Status listed =
      rpc::FromGrpcStatus((*stub)->ListNodes(UnaryContext().get(), v1::ListNodesRequest(), &nodes));
  if (!listed.ok()) return Fail(listed);
  std::vector<std::vector<std::string>> rows = {
      {"node", "state", "address", "devices", "last seen", "lease ends", "certificate until",
       "running"}};
  for (const v1::NodeStatus& node : nodes.nodes()) {
    std::map<std::string, int> device_counts;  // "cuda NVIDIA H100 PCIe 79.6 GiB" -> count
    for (const v1::Device& device : node.devices()) {
      char memory[32];
      std::snprintf(memory, sizeof memory, " %.1f GiB",
                    static_cast<double>(device.memory_bytes()) / (1LL << 30));
      ++device_counts[device.type() + " " + device.name() + memory];
    }
    std::string devices;
    for (const auto& [description, count] : device_counts) {
      if (!devices.empty()) devices += ", ";
      devices += std::to_string(count) + "x " + description;
    }
    rows.push_back({node.name(), node.state(), node.address(), devices.empty() ? "–" : devices,
                    node.last_seen_unix() > 0 ? FormatUnixTime(node.last_seen_unix()) : "never",
                    node.has_lease() ? FormatUnixTime(node.lease().ends_unix()) : "–",
                    node.certificate_expires_unix() > 0
                        ? FormatUnixTime(node.certificate_expires_unix())
                        : "–",
                    node.running().empty() ? "–" : node.running()});
  }
  context_.out << FormatColumns(rows);
  // Each node's own rates as measured (llm-train --probe), beside its device's data sheet.
  for (const v1::NodeStatus& node : nodes.nodes()) {
    if (node.rate_probe_json().empty()) continue;
    context_.out << node.name() << " rates: " << DescribeNodeRates(node.rate_probe_json()) << "\n";
  }
  for (const v1::NodeStatus& node : nodes.nodes()) {
    if (!node.unusable().empty()) context_.out << "! " << node.unusable() << "\n";
  }
  return kExitOk;
}

int Llmctl::Daemon(const std::string& action) {
  StatusOr<ControllerAddress> address = ResolveControllerAddress(context_.env);
  if (!address.ok()) return Fail(address.status());
  if (!address->embedded) {
    return Fail(InvalidArgumentError(
        "the controller is configured (" + address->target + ", from " + address->source +
        "); `llmctl daemon` manages only the embedded one, used when none is configured"));
  }
  StatusOr<DaemonBinaries> binaries = LocateDaemonBinaries(context_.self, context_.env);
  if (!binaries.ok()) return Fail(binaries.status());
  EmbeddedDaemons daemons(address->data_dir, std::move(*binaries));
  if (action == "start") {
    const Status started = daemons.EnsureRunning(context_.daemon_ready_timeout);
    if (!started.ok()) return Fail(started);
  } else if (action == "stop") {
    for (const std::string& line : daemons.Stop(kDaemonStopGrace)) context_.out << line << "\n";
    return kExitOk;
  }
  for (const std::string& line : daemons.Describe()) context_.out << line << "\n";
  return kExitOk;
}

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

int Llmctl::Run(const std::vector<std::string>& args) {
  CLI::App app(kDescription, "llmctl");
  app.require_subcommand(1);

  std::string file, trial, format = "table", output, to, action, agent_image;
  int64_t id = 0;
  bool wait = false, provision = false, checkpoint = false;

  CLI::App* submit = app.add_subcommand(
      "submit", "Validate an experiment file, upload its local inputs, start it; prints its id");
  submit->add_option("FILE", file, "The experiment file (YAML)")->required();
  std::vector<std::string> submit_trials;
  submit->add_option("--trial", submit_trials,
                     "Only this trial of the file (repeat for more; the whole file is still "
                     "checked)");
  submit->add_flag("--wait", wait,
                   "Follow it live, print the report, exit 1 when a trial's outcome differs "
                   "from its expect:");
  submit->add_flag("--provision", provision,
                   "When no node is on a lease matching the file's target: {site, flavor}, "
                   "create the lease and bring up its node first (spends your allocation)");
  submit->add_option("--agent-image", agent_image,
                     "With --provision: the agent image the new node pulls");

  EstimateOptions estimate_options;
  CLI::App* estimate = app.add_subcommand(
      "estimate",
      "Each trial's memory per rank before it runs, from the experiment file alone: model state, "
      "activations, the step's peak, and whether it fits the trial's device");
  estimate->add_option("FILE", file, "The experiment file (YAML)")->required();
  estimate->add_option("--trial", estimate_options.trial, "Only this trial");
  estimate->add_option("--device-memory", estimate_options.device_memory,
                       "Judge every trial against this device: a size (80GiB) or a GPU "
                       "(h100-94gb, a100-80gb, a100-40gb, v100-32gb, ...); default: each trial's "
                       "device_memory, else its target's GPU");
  estimate->add_flag("--fit", estimate_options.fit,
                     "Also the largest micro-batch that fits each trial's device");
  estimate->add_flag("--explain", estimate_options.explain,
                     "Also every term's formula with its numbers");
  estimate->add_option("--format", estimate_options.format, "table (MiB) or json (exact bytes)")
      ->capture_default_str();

  PlanOptions plan_options;
  CLI::App* plan = app.add_subcommand(
      "plan",
      "Which configuration fits a device and which is fastest: every precision x optimizer x "
      "checkpointing x offload x PEFT x strategy at the largest micro-batch that fits, fastest "
      "first, before anything is reserved");
  plan->add_option("MODEL", plan_options.model, "A preset name or a local model directory")
      ->required();
  plan->add_option("--device", plan_options.device,
                   "A GPU (h100-94gb, h100-80gb, h200-141gb, a100-80gb, a100-40gb, v100-32gb, "
                   "...) or cpu")
      ->required();
  plan->add_option("--device-memory", plan_options.device_memory,
                   "The memory budget per device (for cpu; on a GPU a cap below its memory)");
  plan->add_option("--gpus", plan_options.gpus, "Devices per node (ranks: ddp or fsdp)")
      ->capture_default_str();
  plan->add_option("--nodes", plan_options.nodes, "Nodes")->capture_default_str();
  plan->add_option("--seq", plan_options.seq, "Tokens per sequence (data.max_seq_length)")
      ->required();
  plan->add_option("--global-batch", plan_options.global_batch, "Sequences per optimizer step")
      ->required();
  plan->add_option("--steps", plan_options.steps, "The run's optimizer steps");
  plan->add_option("--tokens", plan_options.tokens, "Or the run's tokens");
  plan->add_option("--budget-hours", plan_options.budget_hours,
                   "Drop configurations predicted to take longer");
  plan->add_option("--su-per-node-hour", plan_options.su_per_node_hour,
                   "Service units a node-hour costs on your allocation: adds an SU column");
  plan->add_option("--precisions", plan_options.precisions, "Precisions to search")
      ->capture_default_str();
  plan->add_option("--optimizers", plan_options.optimizers, "Optimizers to search (sgd too)")
      ->capture_default_str();
  plan->add_option("--peft", plan_options.peft, "PEFT methods to search (none: full fine-tuning)")
      ->capture_default_str();
  plan->add_flag("--no-offload", plan_options.no_offload, "Do not search offload");
  plan->add_option("--set", plan_options.sets,
                   "KEY=VALUE fixed on every configuration (kernels=aten, peft.r=16, ...)");
  plan->add_option("--top", plan_options.top, "Configurations shown and written")
      ->capture_default_str();
  plan->add_option("--write", plan_options.write,
                   "Write the top configurations as an experiment file `llmctl submit` runs");
  plan->add_option("--data", plan_options.data, "With --write: the training data (data.path)");
  plan->add_option("--init", plan_options.init,
                   "With --write: pretrained or random (default: pretrained for a published "
                   "preset)");
  plan->add_option("--format", plan_options.format, "table or json")->capture_default_str();

  CLI::App* status = app.add_subcommand("status", "List experiments, or one experiment's trials");
  status->add_option("ID", id, "An experiment id (default: list them all)")
      ->check(CLI::NonNegativeNumber);

  CLI::App* watch = app.add_subcommand(
      "watch",
      "Follow an experiment live until every trial has ended (a table redrawn in place "
      "on a terminal, appended lines otherwise)");
  watch->add_option("ID", id, "The experiment id (default: the latest)")
      ->check(CLI::NonNegativeNumber);

  CLI::App* cancel =
      app.add_subcommand("cancel", "Cancel an experiment's trials that have not ended");
  cancel->add_option("ID", id, "The experiment id")->required()->check(CLI::PositiveNumber);
  cancel->add_option("--trial", trial, "Only this trial");
  cancel->add_flag("--checkpoint", checkpoint,
                   "Stop now, keep the progress: running trials first checkpoint their last "
                   "complete step (llmctl resume continues from it)");

  CLI::App* resume = app.add_subcommand(
      "resume",
      "Continue a trial that stopped with a checkpoint (cancel --checkpoint, a lease's end) from "
      "it, on the node that holds it; the report then shows the steps of both runs");
  resume->add_option("ID", id, "The experiment id")->required()->check(CLI::PositiveNumber);
  resume->add_option("TRIAL", trial, "The trial's name")->required();
  resume->add_flag("--wait", wait,
                   "Follow the experiment live, print the report, exit 1 when a trial's outcome "
                   "differs from its expect:");

  CLI::App* report = app.add_subcommand("report",
                                        "An experiment's results: outcome, memory per "
                                        "category at the peak snapshot, time, tokens/s");
  report->add_option("ID", id, "The experiment id (default: the latest)")
      ->check(CLI::NonNegativeNumber);
  report
      ->add_option("--format", format, "table, csv, json, markdown or html (one file with charts)")
      ->capture_default_str();
  report->add_option("--output", output, "Write to FILE instead of standard output");

  CLI::App* fetch = app.add_subcommand(
      "fetch", "Copy a trial's artifacts (adapters, checkpoints, logs), checking each sha256");
  fetch->add_option("ID", id, "The experiment id")->required()->check(CLI::PositiveNumber);
  fetch->add_option("TRIAL", trial, "The trial's name")->required();
  fetch->add_option("--to", to, "Destination directory (default: ./llmctl-ID-TRIAL)");

  CLI::App* nodes =
      app.add_subcommand("nodes", "The agents the controller knows and their devices");

  // The lease commands parse their own flags (controller/openstack/lease_cli.h).
  CLI::App* lease = app.add_subcommand(
      "lease", "Chameleon leases: create|list|show|extend|delete (llmctl lease list, ...)");
  lease->prefix_command();
  lease->set_help_flag();

  CLI::App* node = app.add_subcommand(
      "node", "Chameleon GPU nodes on a lease: up|list|show|down (llmctl node up --lease L ...)");
  node->prefix_command();
  node->set_help_flag();

  CLI::App* daemon =
      app.add_subcommand("daemon", "Start, stop or show the embedded llmctld and llm-agent");
  daemon->add_option("ACTION", action, "start, stop or status")
      ->required()
      ->check(CLI::IsMember({"start", "stop", "status"}));

  std::vector<const char*> argv;
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e, context_.out, context_.err);
    return code == static_cast<int>(CLI::ExitCodes::Success) ? kExitOk : kExitInvalidInput;
  }

  if (submit->parsed()) {
    std::vector<std::string> node_flags;
    if (!agent_image.empty()) node_flags = {"--agent-image", agent_image};
    return Submit(file, submit_trials, wait, provision, node_flags);
  }
  if (estimate->parsed()) {
    const StoredCalibrations calibrations = LoadCalibrations();
    const LocalRates rates = LoadLocalRates(/*only_embedded=*/false);
    estimate_options.calibrate = calibrations.Lookup();
    estimate_options.rates = rates.Lookup();
    StatusOr<std::string> text = EstimateExperiment(file, estimate_options);
    if (!text.ok()) return Fail(text.status());
    context_.out << *text << std::flush;
    return kExitOk;
  }
  if (plan->parsed()) {
    const StoredCalibrations calibrations = LoadCalibrations();
    const LocalRates rates = LoadLocalRates(/*only_embedded=*/false);
    plan_options.calibrate = calibrations.Lookup();
    plan_options.rates = rates.Lookup();
    StatusOr<std::string> text = PlanRun(plan_options);
    if (!text.ok()) return Fail(text.status());
    context_.out << *text << std::flush;
    return kExitOk;
  }
  if (status->parsed()) return ShowStatus(id);
  if (watch->parsed()) return Watch(id);
  if (cancel->parsed()) return Cancel(id, trial, checkpoint);
  if (resume->parsed()) return Resume(id, trial, wait);
  if (report->parsed()) return Report(id, format, output);
  if (fetch->parsed()) return Fetch(id, trial, to);
  if (nodes->parsed()) return Nodes();
  if (daemon->parsed()) return Daemon(action);
  if (lease->parsed()) return Lease(lease->remaining(), context_.out);
  if (node->parsed()) return Node(node->remaining(), context_.out);
  return kExitInvalidInput;  // require_subcommand(1) makes this unreachable
}

}  // namespace

std::string ProvisionLeaseName(std::string_view experiment, std::string_view flavor) {
  std::string name = "llmctl-" + std::string(experiment) + "-" + std::string(flavor);
  for (char& c : name) {
    c = std::isalnum(static_cast<unsigned char>(c))
            ? static_cast<char>(std::tolower(static_cast<unsigned char>(c)))
            : '-';
  }
  name.resize(std::min<size_t>(name.size(), 63));
  while (name.back() == '-') name.pop_back();
  return name;
}

int ExitCodeFor(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return kExitOk;
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kAlreadyExists:
    case StatusCode::kOutOfRange:
      return kExitInvalidInput;
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
      return kExitUnreachable;
    default:
      return kExitFailed;
  }
}

int RunLlmctl(const std::vector<std::string>& args, CliContext& context) {
  return Llmctl(context).Run(args);
}

}  // namespace llmctl::cli
