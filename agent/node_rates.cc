#include "agent/node_rates.h"

#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>

#include "agent/run_launch.h"
#include "common/atomic_file.h"
#include "common/cpu_model.h"
#include "common/estimate/rate_probe.h"
#include "common/files.h"
#include "common/foreign_json.h"
#include "common/logging.h"
#include "common/run_command.h"
#include "common/text.h"
#include "common/trainer_exit.h"

namespace llmctl::agent {
namespace {

constexpr char kRatesFile[] = "rates.json";
// The kept file is a probe of a few kilobytes and its fingerprint.
constexpr size_t kMaxRatesBytes = 1 << 20;

// `report`, then `then`, within what the controller takes of a report (a longer one refuses the
// node's whole description): `report` is cut, for the trainer's path and a failed probe's own
// reason in it are as long as they come.
std::string WithinReport(std::string_view report, std::string_view then) {
  return OnOneLine(report, estimate::kRateProbePendingMaxBytes - then.size()).append(then);
}

// The probe kept in `path` when it was measured on a node of `fingerprint`; "" otherwise (none
// kept, another node, a file this build cannot read or an older probe version: each measures
// again).
std::string KeptProbe(const std::string& path, const std::string& fingerprint) {
  StatusOr<std::string> text = ReadFileToString(path, kMaxRatesBytes);
  if (!text.ok()) return "";
  const nlohmann::json kept = ParseForeignJson(*text);
  if (!kept.is_object() || kept.value("fingerprint", nlohmann::json()) != fingerprint ||
      !kept.contains("probe")) {
    return "";
  }
  // A probe of an older version reads, but misses what this llm-train measures: measure again.
  const StatusOr<estimate::RateProbe> probe = estimate::RateProbe::FromJson(kept["probe"]);
  if (!probe.ok() || probe->version != estimate::kRateProbeVersion) return "";
  return kept["probe"].dump();
}

// The probe in `path` when this node may take it as its own: a probe of the current version, of
// the CPU `facts` name, measured by the llm-train `facts` describe, on a node without a GPU; ""
// otherwise (each then measures). `refused` says why a file that is there was not taken.
std::string AdoptableProbe(const std::string& path, const NodeFacts& facts, std::string& refused) {
  if (path.empty()) return "";
  const bool cpu_only = std::all_of(facts.devices.begin(), facts.devices.end(),
                                    [](const DeviceInfo& device) { return device.type == "cpu"; });
  if (!cpu_only) return "";
  StatusOr<std::string> text = ReadFileToString(path, kMaxRatesBytes);
  if (!text.ok()) return "";
  const nlohmann::json json = ParseForeignJson(*text);
  const StatusOr<estimate::RateProbe> probe = estimate::RateProbe::FromJson(json);
  if (!probe.ok()) {
    refused = json.is_discarded() ? "not JSON" : probe.status().message();
  } else if (probe->version != estimate::kRateProbeVersion) {
    refused = "version " + std::to_string(probe->version) + ", this llm-train measures version " +
              std::to_string(estimate::kRateProbeVersion);
  } else if (probe->device != "cpu" || probe->device_name != CpuModelName() ||
             probe->versions.Summary() != facts.trainer_version) {
    refused = "measured on another device or by another llm-train";
  } else if (probe->versions.CpuKernelsOrUnrecorded() != facts.trainer_cpu_kernels) {
    refused = "measured with " + probe->versions.CpuKernelsOrUnrecorded() +
              ", where this node's llm-train runs with " + facts.trainer_cpu_kernels;
  } else {
    return json.dump();
  }
  return "";
}

// When the file at `path` was last written; none when there is none (or no path).
std::optional<std::filesystem::file_time_type> ModifiedAt(const std::string& path) {
  if (path.empty()) return std::nullopt;
  std::error_code error;
  const std::filesystem::file_time_type modified = std::filesystem::last_write_time(path, error);
  if (error) return std::nullopt;
  return modified;
}

// Where the probe measures: the node's GPU when it has one.
std::string ProbeDevice(const NodeFacts& facts) {
  const bool has_gpu = std::any_of(facts.devices.begin(), facts.devices.end(),
                                   [](const DeviceInfo& device) { return device.type == "cuda"; });
  return has_gpu ? "cuda" : "cpu";
}

// How a failed probe is reported: a node with rates from before keeps them.
std::string NotMeasured(bool again) { return again ? "not measured again: " : "not measured: "; }

// "2 of 3".
std::string AttemptOf(int attempt, int attempts) {
  return std::to_string(attempt) + " of " + std::to_string(attempts);
}

// "40 s", "5 min": the time until a probe is measured again, rounded up, as a person reads it.
std::string TimeLeft(std::chrono::steady_clock::duration left) {
  const int64_t seconds =
      std::max<int64_t>(0, std::chrono::ceil<std::chrono::seconds>(left).count());
  if (seconds < 120) return std::to_string(seconds) + " s";
  return std::to_string((seconds + 59) / 60) + " min";
}

}  // namespace

std::string NodeRatesFingerprint(const NodeFacts& facts) {
  std::string fingerprint = "cpu " + CpuModelName();
  for (const DeviceInfo& device : facts.devices) {
    fingerprint += "; " + device.type + " " + std::to_string(device.index) + " " + device.name;
  }
  fingerprint += "; driver " + facts.nvidia_driver_version + "; " + facts.trainer_version;
  if (!facts.trainer_cpu_kernels.empty()) fingerprint += "; " + facts.trainer_cpu_kernels;
  return fingerprint;
}

NodeRates::NodeRates(NodeRatesOptions options, std::function<bool()> trial_running)
    : options_(std::move(options)), trial_running_(std::move(trial_running)) {
  // A node that measures is underway until Start measures or takes its kept rates.
  measuring_ = options_.measure;
  report_.pending = options_.measure ? "waiting for the node's description"
                                     : "not measured: LLMCTL_RATE_PROBE=off";
}

NodeRates::~NodeRates() {
  Stop();
  MutexLock lock(thread_mutex_);
  if (thread_.joinable()) thread_.join();
}

void NodeRates::Stop() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  stop_.request_stop();
  changed_.NotifyAll();
}

void NodeRates::Start(const NodeFacts& facts) {
  // Only this agent writes DATA/rates.json, and not before now: a temporary beside it
  // (rates.json.tmp.PID.N) is what an agent killed mid-write left, there for good otherwise. One
  // that cannot be removed costs only its few kilobytes.
  (void)RemoveAtomicWriteLeftovers(options_.data_dir + "/" + kRatesFile);
  if (!options_.measure) return;
  MutexLock thread_lock(thread_mutex_);
  {
    MutexLock lock(mutex_);
    facts_ = facts;
    local_probe_seen_ = ModifiedAt(options_.adoptable_probe);
  }
  const std::string fingerprint = NodeRatesFingerprint(facts);
  std::string kept = KeptProbe(options_.data_dir + "/" + kRatesFile, fingerprint);
  // The probe another process measured here is the original and comes first: one measured again
  // since this agent kept its copy (llmctl measures probe.json again when it is deleted) replaces
  // the copy, as llmctl's estimates already take it.
  std::string refused;
  if (std::string adopted = AdoptableProbe(options_.adoptable_probe, facts, refused);
      !adopted.empty() && adopted != kept) {
    std::cerr << LogLinePrefix(LogLevel::kInfo) << "llm-agent: the node's rates are "
              << options_.adoptable_probe << "'s, measured on this machine by this llm-train"
              << (kept.empty() ? "" : " after the ones this agent kept") << std::endl;
    Finish(std::move(adopted), fingerprint);
    return;
  }
  if (!kept.empty()) {
    MutexLock lock(mutex_);
    report_ = Report{std::move(kept), ""};
    measuring_ = false;
    return;
  }
  if (!refused.empty()) {
    std::cerr << LogLinePrefix(LogLevel::kWarning) << "llm-agent: not taking "
              << options_.adoptable_probe << " as the node's rates: " << refused << std::endl;
  }
  StartMeasuring(facts);
}

void NodeRates::StartMeasuring(const NodeFacts& facts) {
  if (thread_.joinable()) thread_.join();
  thread_ = std::thread([this, fingerprint = NodeRatesFingerprint(facts),
                         device = ProbeDevice(facts)] { Measure(fingerprint, device); });
}

StatusOr<std::string> NodeRates::MeasureAgain() {
  if (!options_.measure) {
    return FailedPreconditionError("this agent measures no rates (LLMCTL_RATE_PROBE=off)");
  }
  if (!options_.adoptable_probe.empty()) {
    return FailedPreconditionError(
        "this node's rates are llmctl's probe of its machine, " + options_.adoptable_probe +
        ": llmctl measures that file again (`llmctl nodes --measure local`)");
  }
  MutexLock thread_lock(thread_mutex_);
  NodeFacts facts;
  {
    MutexLock lock(mutex_);
    if (stopping_) return UnavailableError("the agent is stopping");
    if (!facts_.has_value()) return UnavailableError("the agent has not described its node yet");
    if (measuring_) {
      // A busy machine's probe waiting to be retried is measured once the node is idle.
      if (retry_.has_value() && retry_->at.has_value())
        retry_->at = std::chrono::steady_clock::now();
      changed_.NotifyAll();
      return Pending();
    }
    facts = *facts_;
    // Underway from now, as the note says: a health check between here and StartMeasuring reads
    // both together.
    measuring_ = true;
    report_.pending = starting_ > 0 || trial_running_()
                          ? "waiting for the running trial to end"
                          : std::string(estimate::kRateProbeMeasuring);
  }
  std::cerr << LogLinePrefix(LogLevel::kInfo)
            << "llm-agent: measuring the node's rates again, as the controller asked" << std::endl;
  StartMeasuring(facts);
  return Current().pending;
}

void NodeRates::Measure(const std::string& fingerprint, const std::string& device) {
  const int attempts = 1 + static_cast<int>(options_.retry_after.size());
  for (int attempt = 1; AwaitIdle(); ++attempt) {
    std::cerr << LogLinePrefix(LogLevel::kInfo)
              << "llm-agent: measuring the node's rates (llm-train --probe --probe-device "
              << device
              << (attempt > 1 ? std::string(", attempt ").append(AttemptOf(attempt, attempts)) : "")
              << ")" << std::endl;
    StatusOr<std::string> probe = RunProbe(device);
    // Unavailable: the machine was busy (RunProbe), or had no process or pipe to spare for it.
    if (probe.ok() || probe.status().code() != StatusCode::kUnavailable) {
      if (probe.ok())
        std::cerr << LogLinePrefix(LogLevel::kInfo) << "llm-agent: the node's rates are measured"
                  << std::endl;
      Finish(std::move(probe), fingerprint);
      return;
    }
    if (attempt == attempts) {
      // Rates reported before (a measurement asked for again) are kept on.
      const bool again = !Current().probe_json.empty();
      Finish(std::move(probe), fingerprint,
             std::string("; that was attempt ")
                 .append(AttemptOf(attempt, attempts))
                 .append(again ? "; the rates measured before serve on"
                               : ", measuring again at the agent's next start"));
      return;
    }
    if (!AwaitRetry(probe.status(), attempt + 1)) return;
  }
}

bool NodeRates::AwaitIdle() {
  MutexLock lock(mutex_);
  while (!stopping_) {
    // A trial that is starting is not listed as running yet: wait for its guard too.
    const bool busy = starting_ > 0 || trial_running_();
    if (!busy) {
      probing_ = true;
      retry_.reset();
      report_.pending = std::string(estimate::kRateProbeMeasuring);
      return true;
    }
    if (retry_.has_value()) {
      retry_->at.reset();  // its wait is over: report_.pending still says why it failed
    } else {
      report_.pending = "waiting for the running trial to end";
    }
    changed_.WaitUntil(mutex_, std::chrono::steady_clock::now() + options_.idle_check);
  }
  return false;
}

bool NodeRates::AwaitRetry(const Status& failure, int next_attempt) {
  const auto at = std::chrono::steady_clock::now() + options_.retry_after[next_attempt - 2];
  std::string pending;
  {
    MutexLock lock(mutex_);
    probing_ = false;
    report_.pending = NotMeasured(!report_.probe_json.empty()).append(failure.message());
    retry_ = Retry{next_attempt, at};
    pending = Pending();
  }
  changed_.NotifyAll();  // trials may start meanwhile
  std::cerr << LogLinePrefix(LogLevel::kWarning) << "llm-agent: the node's rates are " << pending
            << std::endl;
  MutexLock lock(mutex_);
  // MeasureAgain ends the wait early (retry_->at becomes now).
  while (!stopping_ && retry_.has_value() && retry_->at.has_value() &&
         std::chrono::steady_clock::now() < *retry_->at) {
    changed_.WaitUntil(mutex_, *retry_->at);
  }
  return !stopping_;
}

StatusOr<std::string> NodeRates::RunProbe(const std::string& device) const {
  ASSIGN_OR_RETURN(const CommandOutput output,
                   RunCommand({options_.llm_train, "--probe", "--probe-device", device},
                              options_.timeout, stop_.get_token(), ProbeEnvironment(device)));
  if (output.exit_code < 0) {
    return InternalError(options_.llm_train + " --probe was killed or timed out");
  }
  if (output.exit_code != 0) {
    // Its reason, such as rates that disagree on a machine other work holds, is its last line on
    // stderr; the report is one line of `llmctl nodes`.
    const std::string reason = OnOneLine(LastNonBlankLine(output.stderr_tail), kQuotedLineBytes);
    std::string message =
        options_.llm_train + " --probe exited with " + std::to_string(output.exit_code);
    if (!reason.empty()) message.append(": ").append(reason);
    // llm-train --probe fails (rather than refusing its input) only when its rates disagree, as
    // on a machine other work holds: measuring again may help. Its other exits (no CUDA device,
    // a crash) would come again.
    if (output.exit_code == trainer_exit::kFailed) return UnavailableError(message);
    return InternalError(message);
  }
  const nlohmann::json json = ParseForeignJson(output.stdout_text);
  if (json.is_discarded()) return InvalidArgumentError("llm-train --probe wrote no JSON");
  RETURN_IF_ERROR(estimate::RateProbe::FromJson(json).status().WithContext("llm-train --probe"));
  return json.dump();
}

void NodeRates::Finish(StatusOr<std::string> probe_json, const std::string& fingerprint,
                       std::string_view then) {
  if (probe_json.ok()) Keep(*probe_json, fingerprint);
  std::string failure;
  {
    MutexLock lock(mutex_);
    probing_ = false;
    measuring_ = false;
    if (probe_json.ok()) {
      report_ = Report{*std::move(probe_json), ""};
    } else {
      // Rates measured before (a measurement asked for again) stay reported, as they stay kept.
      failure = NotMeasured(!report_.probe_json.empty()).append(probe_json.status().message());
      report_.pending = WithinReport(failure, then);
    }
  }
  if (!failure.empty()) {
    std::cerr << LogLinePrefix(LogLevel::kWarning) << "llm-agent: the node's rates are " << failure
              << then << std::endl;
  }
  changed_.NotifyAll();
}

void NodeRates::Keep(const std::string& probe_json, const std::string& fingerprint) const {
  const std::string kept =
      nlohmann::json{{"fingerprint", fingerprint}, {"probe", nlohmann::json::parse(probe_json)}}
          .dump() +
      "\n";
  const Status written = WriteFileAtomically(options_.data_dir + "/" + kRatesFile, [&kept](int fd) {
    return WriteAll(fd, kept.data(), kept.size());
  });
  // Reported all the same; the next start measures again.
  if (!written.ok())
    std::cerr << LogLinePrefix(LogLevel::kWarning) << "llm-agent: " << written.message()
              << std::endl;
}

void NodeRates::TakeChangedLocalProbe() {
  if (!options_.measure) return;
  const std::optional<std::filesystem::file_time_type> modified =
      ModifiedAt(options_.adoptable_probe);
  NodeFacts facts;
  {
    MutexLock lock(mutex_);
    if (!facts_.has_value() || !modified.has_value() || modified == local_probe_seen_) return;
    local_probe_seen_ = modified;
    facts = *facts_;
  }
  std::string refused;
  std::string adopted = AdoptableProbe(options_.adoptable_probe, facts, refused);
  if (adopted.empty()) return;
  {
    MutexLock lock(mutex_);
    // A probe measured, waited for or failed is the measurement thread's to report.
    if (probing_ || !report_.pending.empty() || adopted == report_.probe_json) return;
    report_.probe_json = adopted;
  }
  std::cerr << LogLinePrefix(LogLevel::kInfo) << "llm-agent: the node's rates are now "
            << options_.adoptable_probe << "'s, measured again on this machine by this llm-train"
            << std::endl;
  Keep(adopted, NodeRatesFingerprint(facts));
}

NodeRates::Report NodeRates::Current() const {
  MutexLock lock(mutex_);
  return Report{report_.probe_json, Pending(), measuring_};
}

std::string NodeRates::Pending() const {
  if (!retry_.has_value()) return report_.pending;
  const int attempts = 1 + static_cast<int>(options_.retry_after.size());
  const std::string then =
      std::string("; measuring again ")
          .append(retry_->at.has_value() ? std::string("in ").append(TimeLeft(
                                               *retry_->at - std::chrono::steady_clock::now()))
                                         : "once the running trial ends")
          .append(" (attempt ")
          .append(AttemptOf(retry_->attempt, attempts))
          .append(")");
  return WithinReport(report_.pending, then);
}

NodeRates::StartingTrial::StartingTrial(NodeRates& rates,
                                        std::chrono::steady_clock::time_point wait_until)
    : rates_(rates) {
  const bool unlimited = wait_until == std::chrono::steady_clock::time_point();
  MutexLock lock(rates_.mutex_);
  while (rates_.probing_ && (unlimited || std::chrono::steady_clock::now() < wait_until)) {
    if (unlimited) {
      rates_.changed_.Wait(rates_.mutex_);  // the probe's timeout bounds it
    } else {
      rates_.changed_.WaitUntil(rates_.mutex_, wait_until);
    }
  }
  free_ = !rates_.probing_;
  if (free_) ++rates_.starting_;
}

NodeRates::StartingTrial::~StartingTrial() {
  if (!free_) return;
  {
    MutexLock lock(rates_.mutex_);
    --rates_.starting_;
  }
  rates_.changed_.NotifyAll();
}

}  // namespace llmctl::agent
