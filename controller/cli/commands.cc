// The Llmctl methods for the connection to the controller, the rates and calibrations the
// estimate takes, the controller's nodes and the embedded daemons; the exit codes.
#include "controller/cli/commands.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "common/text.h"
#include "controller/cli/client.h"
#include "controller/cli/daemons.h"
#include "controller/cli/interrupt_note.h"
#include "controller/cli/llmctl.h"
#include "controller/cli/rates_text.h"
#include "rpc/grpc_status.h"
#include "rpc/tls.h"

namespace llmctl::cli {
namespace {

// "the controller at HOST:PORT (from LLMCTL_CONTROLLER)", for messages.
std::string ControllerName(const ControllerAddress& address) {
  return "the controller at " + address.target + " (from " + address.source + ")";
}

}  // namespace

std::string FormatUnixTime(int64_t seconds) {
  const std::time_t time = static_cast<std::time_t>(seconds);
  std::tm tm{};
  localtime_r(&time, &tm);
  // The zone's abbreviation, as `date` prints it: the daemons' logs are in UTC and a colleague's
  // table may be in another zone, so a time without its zone cannot be compared with them.
  char buffer[64];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%d %H:%M %Z", &tm);
  return buffer;
}

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
    for (const std::string& note : daemons.ReplacedBinaryNotes()) {
      context_.err << "note: " << note << "\n";
    }
  }
  // A unix socket's 0600 mode is its credential; llmctld serves TCP only with a token.
  std::string token;
  if (!address.target.starts_with("unix:")) {
    if (address.token_file.empty()) {
      // The configuration's gap, as a bad address is: invalid input (exit 2), nothing sent.
      return InvalidArgumentError(
          "the controller at " + address.target + " (from " + address.source +
          ") is on TCP and takes calls only with its API token: set LLMCTL_CONTROLLER_TOKEN_FILE, "
          "or token_file in " +
          ConfigFilePath(context_.env).value_or("config.yaml").string() +
          ", to a copy of the 0600 file that llmctld's token_file names");
    }
    StatusOr<std::string> read = rpc::ReadTokenFile(address.token_file.string());
    // A token file others may read is the user's to fix (its chmod named), as a missing or empty
    // one is: invalid input (exit 2), nothing sent.
    if (read.status().code() == StatusCode::kPermissionDenied) {
      return InvalidArgumentError(read.status().message());
    }
    ASSIGN_OR_RETURN(token, std::move(read));
  }
  return v1::Controller::NewStub(OpenControllerChannel(address.target, token));
}

std::optional<ControllerAddress> Llmctl::ConfiguredController() {
  StatusOr<ControllerAddress> address = ResolveControllerAddress(context_.env);
  if (!address.ok() || address->embedded) return std::nullopt;
  return *std::move(address);
}

Status Llmctl::ReadFromController(
    const std::function<grpc::Status(v1::Controller::Stub&, grpc::ClientContext&)>& read) {
  if (controller_unreachable_.has_value()) return *controller_unreachable_;
  StatusOr<std::unique_ptr<v1::Controller::Stub>> stub = Connect();
  if (!stub.ok()) return stub.status();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kMeasuredReadDeadline);
  const Status read_status = rpc::FromGrpcStatus(read(**stub, context));
  if (read_status.code() == StatusCode::kUnavailable ||
      read_status.code() == StatusCode::kDeadlineExceeded) {
    controller_unreachable_ = read_status;
  }
  return read_status;
}

StoredCalibrations Llmctl::LoadCalibrations() {
  const std::optional<ControllerAddress> configured = ConfiguredController();
  if (!configured.has_value()) {
    StoredCalibrations calibrations = StoredCalibrations::Load(context_.env);
    // The note may quote LLMCTL_HOME, the user's environment's text: an escape in it would act on
    // the terminal.
    if (!calibrations.note().empty()) {
      context_.err << "note: " << ForTerminal(calibrations.note()) << "\n";
    }
    return calibrations;
  }
  const std::string where = ControllerName(*configured);
  v1::TimedRunsResponse response;
  const Status read =
      ReadFromController([&response](v1::Controller::Stub& stub, grpc::ClientContext& context) {
        return stub.TimedRuns(&context, v1::TimedRunsRequest(), &response);
      });
  if (read.code() == StatusCode::kUnimplemented) {
    // A controller from before TimedRuns: its runs stay there.
    context_.err << "note: " << where
                 << " does not send its measured runs (it predates TimedRuns; upgrade llmctld): "
                    "the time is at the built-in calibration\n";
    return StoredCalibrations::FromRuns({}, where);
  }
  if (!read.ok()) {
    // The controller's words.
    context_.err << "note: measured runs not read from " << where << ": "
                 << OnOneLine(read.message()) << "\n";
    return StoredCalibrations::FromRuns({}, where);
  }
  std::vector<store::TimedRun> runs;
  for (const v1::TimedRun& run : response.runs()) {
    runs.push_back({.prediction_json = run.prediction_json(),
                    .seconds_per_token = run.seconds_per_token(),
                    .steps = run.steps(),
                    .pace_seconds = run.pace_seconds()});
  }
  return StoredCalibrations::FromRuns(runs, where);
}

LocalRates Llmctl::LoadRates() {
  const std::optional<ControllerAddress> configured = ConfiguredController();
  if (!configured.has_value()) {
    return LocalRates::LoadOnFirstUse(context_.env, context_.self, context_.err);
  }
  // A configured controller's trials run on its nodes, never on this machine: their probes or
  // the data sheets.
  v1::ListNodesResponse nodes;
  const Status read =
      ReadFromController([&nodes](v1::Controller::Stub& stub, grpc::ClientContext& context) {
        return stub.ListNodes(&context, v1::ListNodesRequest(), &nodes);
      });
  if (!read.ok()) {
    context_.err << "note: the nodes' rates not read from " << ControllerName(*configured) << ": "
                 << OnOneLine(read.message()) << "; the time is at the data sheets' rates\n";
    return LocalRates::FromNodeProbes({});
  }
  return LocalRates::FromNodeProbes(NodeProbesOf(nodes, context_.err));
}

StatusOr<LocalRates> Llmctl::LoadRatesPreferring(const std::string& rates_file) {
  LocalRates rates = LoadRates();
  if (rates_file.empty()) return rates;
  StatusOr<estimate::RateProbe> probe = ReadRateProbe(rates_file);
  if (!probe.ok()) return InvalidArgumentError("--rates: " + probe.status().message());
  rates.Prefer(*std::move(probe), rates_file);
  return rates;
}

void Llmctl::NoteUnusedRates(const LocalRates& rates, const std::string& rates_file) {
  if (rates_file.empty() || rates.preferred_used()) return;
  context_.err << "note: --rates " << rates_file << " served no trial: it is a probe of "
               << rates.preferred_summary()
               << ", and no trial here runs on that device (a GPU's probe serves the trials on "
                  "that GPU, --device-memory's included; a CPU's, the CPU trials)\n";
}

int Llmctl::Nodes() {
  StatusOr<std::unique_ptr<v1::Controller::Stub>> stub = Connect();
  if (!stub.ok()) return Fail(stub.status());
  v1::ListNodesResponse nodes;
  const Status listed =
      rpc::FromGrpcStatus((*stub)->ListNodes(UnaryContext().get(), v1::ListNodesRequest(), &nodes));
  if (!listed.ok()) return Fail(listed);
  std::vector<std::vector<std::string>> rows = {{"node", "state", "address", "devices", "last seen",
                                                 "lease ends", "certificate until", "running"}};
  for (const v1::NodeStatus& node : nodes.nodes()) {
    std::map<std::string, int> device_counts;  // "cuda NVIDIA H100 PCIe 79.6 GiB" -> count
    for (const v1::Device& device : node.devices()) {
      char memory[32];
      std::snprintf(memory, sizeof memory, " %.1f GiB",
                    static_cast<double>(device.memory_bytes()) / (1LL << 30));
      ++device_counts[OnOneLine(device.type() + " " + device.name()) + memory];
    }
    std::string devices;
    for (const auto& [description, count] : device_counts) {
      if (!devices.empty()) devices += ", ";
      devices += std::to_string(count) + "x " + description;
    }
    // A node whose agent has never answered is not yet reached, not lost: the embedded agent in
    // the seconds after the daemons start, which read "unreachable, last seen never".
    const std::string state = node.state() == "unreachable" && node.last_seen_unix() <= 0
                                  ? "not reached yet"
                                  : node.state();
    // The controller's words (and its agents'), each on the table's one line.
    rows.push_back({OnOneLine(node.name()), OnOneLine(state), OnOneLine(node.address()),
                    devices.empty() ? "–" : devices,
                    node.last_seen_unix() > 0 ? FormatUnixTime(node.last_seen_unix()) : "never",
                    node.has_lease() ? FormatUnixTime(node.lease().ends_unix()) : "–",
                    node.certificate_expires_unix() > 0
                        ? FormatUnixTime(node.certificate_expires_unix())
                        : "–",
                    node.running().empty() ? "–" : OnOneLine(node.running())});
  }
  context_.out << FormatColumns(rows);
  // Each node's own rates as measured (llm-train --probe), beside its device's data sheet, and
  // what its agent says of them while it measures them (again) or could not.
  for (const v1::NodeStatus& node : nodes.nodes()) {
    if (!node.rate_probe_json().empty()) {
      context_.out << NodeRatesText(node.name() + " rates:", node.rate_probe_json());
    }
    if (!node.rate_probe_pending().empty()) {
      context_.out << OnOneLine(node.name()) << " rates: " << OnOneLine(node.rate_probe_pending())
                   << (node.rate_probe_json().empty() ? "" : " (those above serve meanwhile)")
                   << "\n";
    }
  }
  for (const v1::NodeStatus& node : nodes.nodes()) {
    if (!node.unusable().empty()) context_.out << "! " << OnOneLine(node.unusable()) << "\n";
  }
  return kExitOk;
}

int Llmctl::MeasureNode(const std::string& node, bool wait) {
  StatusOr<ControllerAddress> address = ResolveControllerAddress(context_.env);
  if (!address.ok()) return Fail(address.status());
  // Measured here and now: --wait has nothing more to wait for.
  if (address->embedded && node == kLocalNode) {
    StatusOr<estimate::RateProbe> probe =
        MeasureLocalProbeAgain(context_.env, context_.self, context_.err);
    if (!probe.ok()) return Fail(probe.status());
    context_.out << NodeRatesText("this machine's rates, measured again:", probe->ToJson().dump())
                 << "estimate, plan and submit take them now, and the embedded agent (node "
                 << kLocalNode << ") at the controller's next health check\n";
    return kExitOk;
  }
  StatusOr<std::unique_ptr<v1::Controller::Stub>> stub = Connect();
  if (!stub.ok()) return Fail(stub.status());
  // What the node showed before the ask, which the rates measured now differ from.
  std::optional<v1::NodeStatus> before;
  if (wait) {
    StatusOr<v1::NodeStatus> listed = ListedNode(**stub, node, *UnaryContext());
    // The controller's own refusal of an unknown node comes from the ask below.
    if (listed.ok()) {
      before = *std::move(listed);
    } else if (listed.status().code() != StatusCode::kNotFound) {
      return Fail(listed.status());
    }
  }
  v1::MeasureNodeRatesRequest request;
  request.set_name(node);
  v1::MeasureNodeRatesResponse response;
  const Status asked =
      rpc::FromGrpcStatus((*stub)->MeasureNodeRates(UnaryContext().get(), request, &response));
  if (!asked.ok()) return Fail(asked);
  if (!wait) {
    context_.out << "node " << OnOneLine(node) << " measures its rates again ("
                 << OnOneLine(response.pending(), kQuotedLineBytes)
                 << "); `llmctl nodes` shows them once they are "
                 << "measured, and the rates before serve until then\n";
    return kExitOk;
  }
  if (!before.has_value()) {
    return Fail(NotFoundError("node " + OnOneLine(node) + " is not listed (llmctl nodes)"));
  }
  context_.out << "node " << OnOneLine(node)
               << " measures its rates again: " << OnOneLine(response.pending(), kQuotedLineBytes)
               << "\n"
               << std::flush;
  // The probe is the agent's: Ctrl-C stops only the waiting.
  const InterruptNote interrupted("\nllmctl: interrupted; node " + OnOneLine(node) +
                                  " measures its rates on: `llmctl nodes` shows them once they are "
                                  "measured\n");
  const Status awaited = AwaitNodeRates(**stub, *before, response.pending());
  return awaited.ok() ? kExitOk : Fail(awaited);
}

Status Llmctl::AwaitNodeRates(v1::Controller::Stub& stub, const v1::NodeStatus& before,
                              std::string note) {
  const std::string name = OnOneLine(before.name());
  // When a node that shows nothing new is given up on; none while it shows a probe underway.
  constexpr std::chrono::steady_clock::time_point kNoLimit =
      std::chrono::steady_clock::time_point::max();
  std::chrono::steady_clock::time_point give_up_at = kNoLimit;
  while (true) {
    std::this_thread::sleep_for(context_.rates_poll_interval);
    ASSIGN_OR_RETURN(const v1::NodeStatus node, ListedNode(stub, before.name(), *UnaryContext()));
    // A node out of reach shows no note and its rates from before: neither says how its probe
    // went.
    if (!AgentAnswers(node)) {
      return FailedPreconditionError(
          "node " + name + " is " + OnOneLine(node.state()) +
          " now: whether it measured its rates again is not known; `llmctl nodes` shows them "
          "once it is connected again");
    }
    if (node.rate_probe_underway()) {
      give_up_at = kNoLimit;
      if (node.rate_probe_pending() != note) {
        note = node.rate_probe_pending();
        context_.out << "node " << name << ": " << OnOneLine(note, kQuotedLineBytes) << "\n"
                     << std::flush;
      }
      continue;
    }
    if (node.rate_probe_json() != before.rate_probe_json() ||
        node.rate_probe_pending() != before.rate_probe_pending()) {
      if (!node.rate_probe_pending().empty()) {
        return FailedPreconditionError("node " + name + ": " +
                                       OnOneLine(node.rate_probe_pending(), kQuotedLineBytes));
      }
      context_.out << NodeRatesText(name + " rates:", node.rate_probe_json());
      return Status::Ok();
    }
    // Nothing underway and nothing new: the controller read the agent before the ask, or the
    // agent forgot it (a restart); the next health checks say which.
    const auto now = std::chrono::steady_clock::now();
    if (give_up_at == kNoLimit) give_up_at = now + context_.rates_unchanged_timeout;
    if (now >= give_up_at) {
      return FailedPreconditionError(
          "node " + name +
          " shows no probe underway and the rates from before: its agent may have restarted "
          "since the ask; `llmctl nodes --measure " +
          name + "` asks again");
    }
  }
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
    const StatusOr<std::vector<std::string>> stopped = daemons.Stop(kDaemonStopGrace);
    if (!stopped.ok()) return Fail(stopped.status());
    for (const std::string& line : *stopped) context_.out << line << "\n";
    return kExitOk;
  }
  for (const std::string& line : daemons.Describe()) context_.out << line << "\n";
  return kExitOk;
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
  int code = kExitFailed;
  // Every input is checked where it enters; should one still throw, the user reads what, and the
  // command fails, instead of a 'terminate called' and a core dump.
  try {
    code = Llmctl(context).Run(args);
  } catch (const std::exception& e) {
    context.err << "llmctl: internal error: " << e.what() << "\n";
  }
  // Output lost (`llmctl submit FILE >&-`, `> file` on a full disk) fails the command, as it does
  // cat's: the experiment's id, a report, would be gone without a word.
  if (!context.out.flush()) {
    context.err << "llmctl: cannot write standard output (closed, or its disk is full)\n";
    if (code == kExitOk) code = kExitFailed;
  }
  return code;
}

}  // namespace llmctl::cli
