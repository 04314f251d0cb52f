#include "controller/cli/local_rates.h"

#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "common/atomic_file.h"
#include "common/child_process.h"
#include "common/cpu_model.h"
#include "common/estimate/gpus.h"
#include "common/file_lock.h"
#include "common/files.h"
#include "common/foreign_json.h"
#include "common/text.h"
#include "common/trainer_versions.h"
#include "controller/cli/daemons.h"
#include "controller/scheduler/scheduler.h"
#include "controller/store/store.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

// A probe's JSON is a few kilobytes; anything much larger is not one.
constexpr size_t kMaxProbeBytes = 1 << 20;
// Held by the llmctl measuring this machine's rates, beside probe.json: another llmctl that needs
// them meanwhile waits for them rather than measuring at the same time, which would halve both
// measurements (and the probe refuses rates a busy machine gives). Longer than a probe takes.
constexpr char kLocalProbeLockFile[] = "probe.json.lock";
constexpr std::chrono::minutes kProbeLockWait{3};
// `llm-train --version --json` answers in about half a second (LibTorch's start).
constexpr std::chrono::seconds kTrainerVersionTimeout{60};

// Runs `llm-train --probe --probe-output PATH` and waits for it; its messages go to the
// terminal. Internal naming the exit when it does not end well. The probe dies with this llmctl:
// one killed alone (`kill`, a supervisor's SIGTERM; a terminal's Ctrl-C reaches both) left it
// measuring on, outside probe.json.lock, beside the next llmctl's probe, and both kept half a
// machine's rates.
Status RunProbe(const fs::path& llm_train, const fs::path& path) {
  ChildSpec spec;
  spec.argv = {llm_train.string(), "--probe", "--probe-output", path.string()};
  // The probe's parent-death signal comes when this thread ends, which waits for it below.
  StatusOr<pid_t> pid = StartChild(spec);
  if (!pid.ok() && pid.status().code() == StatusCode::kNotFound) {
    return InternalError(llm_train.string() + ": cannot start: " + pid.status().message());
  }
  if (!pid.ok()) return InternalError(pid.status().message());
  int status = 0;
  while (::waitpid(*pid, &status, 0) < 0) {
    if (errno != EINTR) return InternalError(std::string("waitpid: ") + std::strerror(errno));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 1) {
    // llm-train's refusal of rates measured beside other work (trainer/train/rate_probe.h), said
    // on its standard error, which is this llmctl's: nothing was written.
    return UnavailableError(llm_train.string() +
                            " --probe found this machine busy (exit code 1, said above); it is "
                            "measured again the next time its rates are needed");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return InternalError(
        llm_train.string() + " --probe ended with " +
        (WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status)) : "a signal"));
  }
  return Status::Ok();
}

// probe.json.lock in the data directory `dir` (made here, private, when missing), waiting for
// the llmctl that measures now, saying so on `err`; `path` is the probe it measures.
StatusOr<FileLock> LockProbe(const fs::path& dir, const fs::path& path, std::ostream& err) {
  // The data directory as the daemons make and check it: private when made here, any mode when
  // there (LLMCTL_HOME may be shared on purpose), never a link to a directory elsewhere.
  RETURN_IF_ERROR(EnsureOwnDirectory(dir.string(), 0700, OthersMay::kAnything));
  const fs::path lock_path = dir / kLocalProbeLockFile;
  StatusOr<FileLock> free = FileLock::AcquireWithin(lock_path, std::chrono::milliseconds(0));
  if (free.status().code() != StatusCode::kDeadlineExceeded) return free;
  err << "waiting for the llmctl that measures this machine's rates into "
      << OnOneLine(path.string()) << " (at most " << kProbeLockWait.count() << " minutes)\n"
      << std::flush;
  return FileLock::AcquireWithin(lock_path, kProbeLockWait);
}

// Measures this machine's rates into `path` with `llm_train`, under probe.json.lock (LockProbe):
// llm-train writes the file whole or not at all, so a failed probe leaves the one before.
StatusOr<estimate::RateProbe> MeasureInto(const fs::path& llm_train, const fs::path& path) {
  RETURN_IF_ERROR(RunProbe(llm_train, path));
  return ReadRateProbe(path);
}

// `probe`'s summary, and, where it warns of the moment it was measured at, how to measure `node`
// again: a first run's prediction is only as good as that moment (a slow spell of a shared host
// put 2 of the lab's 11 rows outside 20% on 12-06).
std::string SummaryForNode(const estimate::RateProbe& probe, std::string_view node) {
  std::string summary = probe.Summary();
  if (probe.WarnsOfItsMoment()) {
    summary.append("; `llmctl nodes --measure ").append(node).append("` measures again");
  }
  return summary;
}

// Whether `probe` measured `sheet`'s device: a CPU probe any CPU's (the trials' rates are the
// node's, whatever its model); a GPU's only the GPU it names.
bool ProbeIsOf(const estimate::RateProbe& probe, const estimate::DeviceSpeed& sheet) {
  if (sheet.name == "cpu") return probe.device == "cpu";
  const std::optional<estimate::Gpu> gpu = estimate::GpuOfDeviceName(probe.device_name);
  return probe.device == "cuda" && gpu.has_value() && gpu->name == sheet.name;
}

// How the llm-train beside this llmctl computes now: none when it cannot be asked or does not
// answer, when a kept probe is taken as it is.
using TrainerNow = std::function<const std::optional<TrainerVersions>&()>;

// The probe in `path` when this llmctl takes it as this machine's (of this version, measured on
// this CPU and, where `trainer_now` says how llm-train computes now, by that llm-train computing
// so); none when there is none, or when it is not taken (`stale` says why). An error when whether
// there is one cannot be told. `trainer_now` is asked only of a probe of this version and CPU.
StatusOr<std::optional<estimate::RateProbe>> CurrentLocalProbe(const fs::path& path,
                                                               const TrainerNow& trainer_now,
                                                               std::string& stale) {
  std::error_code lookup;
  const bool kept = fs::exists(path, lookup);
  if (lookup) return UnavailableError(path.string() + ": " + lookup.message());
  if (!kept) return std::optional<estimate::RateProbe>();
  StatusOr<estimate::RateProbe> probe = ReadRateProbe(path);
  if (!probe.ok()) {
    stale = probe.status().message();
  } else if (probe->version != estimate::kRateProbeVersion) {
    stale = path.string() + " is a probe of version " + std::to_string(probe->version) +
            ", older than this llmctl's " + std::to_string(estimate::kRateProbeVersion) +
            " (matmul rates by shape, each a median of rounds)";
  } else if (probe->device_name != CpuModelName()) {
    stale = path.string() + " was measured on " + probe->device_name;
  } else if (const std::optional<TrainerVersions>& trainer = trainer_now();
             trainer.has_value() && probe->versions.Summary() != trainer->Summary()) {
    stale = path.string() + " was measured by " + probe->versions.Summary() +
            ", and llm-train is now " + trainer->Summary();
  } else if (trainer.has_value() &&
             probe->versions.CpuKernelsOrUnrecorded() != trainer->CpuKernelsOrUnrecorded()) {
    stale = path.string() + " was measured with " + probe->versions.CpuKernelsOrUnrecorded() +
            ", and llm-train now runs with " + trainer->CpuKernelsOrUnrecorded();
  } else {
    return std::optional<estimate::RateProbe>(*std::move(probe));
  }
  return std::optional<estimate::RateProbe>();
}

// The experiment of a trial the embedded store has running on this machine (node local), if any;
// none without a store. A probe is never taken beside one, as the agents never take one: it would
// slow the trial, and take what the trial leaves of the CPUs for the machine's speed.
StatusOr<std::optional<int64_t>> ExperimentRunningHere(const fs::path& dir) {
  StatusOr<std::unique_ptr<store::Store>> opened =
      store::Store::OpenReadOnly((dir / "llmctl.db").string());
  if (!opened.ok()) return std::nullopt;
  ASSIGN_OR_RETURN(const std::vector<store::RunningAttempt> running,
                   (*opened)->ListRunningAttempts());
  for (const store::RunningAttempt& attempt : running) {
    if (attempt.RunsOn(kLocalNode)) return attempt.experiment_id;
  }
  return std::nullopt;
}

// Why no probe is taken while `experiment`'s trial runs here.
std::string TrialRunsHere(int64_t experiment) {
  return "a trial of experiment " + std::to_string(experiment) +
         " runs on this machine now: a probe beside it would slow it and read the CPUs it leaves "
         "as the machine's speed";
}

}  // namespace

StatusOr<estimate::RateProbe> ParseStoredProbe(const std::string& text) {
  const nlohmann::json json = ParseForeignJson(text);
  if (json.is_discarded()) return InvalidArgumentError("not JSON");
  return estimate::RateProbe::FromJson(json);
}

StatusOr<estimate::RateProbe> ReadRateProbe(const fs::path& path) {
  StatusOr<std::string> text = ReadFileToString(path.string(), kMaxProbeBytes);
  if (!text.ok()) return InvalidArgumentError(text.status().message());
  const nlohmann::json json = ParseForeignJson(*text);
  if (json.is_discarded()) return InvalidArgumentError(path.string() + ": not JSON");
  StatusOr<estimate::RateProbe> probe = estimate::RateProbe::FromJson(json);
  if (!probe.ok()) return InvalidArgumentError(path.string() + ": " + probe.status().message());
  return probe;
}

std::vector<NodeProbe> ReadNodeProbes(const EnvLookup& env, std::ostream& err) {
  StatusOr<fs::path> dir = EmbeddedDataDir(env);
  if (!dir.ok()) return {};
  StatusOr<std::unique_ptr<store::Store>> opened =
      store::Store::OpenReadOnly((*dir / "llmctl.db").string());
  // No store yet (before the first submit), or one this build cannot read: the calibration's
  // note says so.
  if (!opened.ok()) return {};
  StatusOr<std::map<std::string, std::string>> stored = (*opened)->NodeRates();
  StatusOr<std::vector<store::NodeRecord>> records = (*opened)->ListNodes();
  if (!stored.ok() || !records.ok()) return {};
  std::map<std::string, std::map<std::string, std::string>> labels;
  for (const store::NodeRecord& record : *records) {
    if (record.lease)
      labels[record.name] = scheduler::LeaseLabels(record.lease->site, record.lease->flavor);
  }
  std::vector<NodeProbe> nodes;
  for (const auto& [node, text] : *stored) {
    StatusOr<estimate::RateProbe> probe = ParseStoredProbe(text);
    if (!probe.ok()) {
      err << "note: node " << OnOneLine(node)
          << "'s stored rates are not used: " << OnOneLine(probe.status().message()) << "\n";
      continue;
    }
    nodes.push_back({node, *std::move(probe), labels[node]});
  }
  // A CPU trial run through the embedded controller runs on this machine's agent.
  std::stable_partition(nodes.begin(), nodes.end(), [cpu = CpuModelName()](const NodeProbe& node) {
    return node.probe.device == "cpu" && node.probe.device_name == cpu;
  });
  return nodes;
}

std::vector<NodeProbe> NodeProbesOf(const v1::ListNodesResponse& nodes, std::ostream& err) {
  std::vector<NodeProbe> probes;
  std::set<std::string> connected;
  for (const v1::NodeStatus& node : nodes.nodes()) {
    if (node.state() == "connected") connected.insert(node.name());
    if (node.rate_probe_json().empty()) continue;
    StatusOr<estimate::RateProbe> probe = ParseStoredProbe(node.rate_probe_json());
    if (!probe.ok()) {
      // The controller's answer: its names and the probe's bytes stay on the note's line.
      err << "note: node " << OnOneLine(node.name())
          << "'s rates are not used: " << OnOneLine(probe.status().message()) << "\n";
      continue;
    }
    probes.push_back({node.name(), *std::move(probe),
                      node.has_lease()
                          ? scheduler::LeaseLabels(node.lease().site(), node.lease().flavor())
                          : std::map<std::string, std::string>{}});
  }
  std::sort(probes.begin(), probes.end(),
            [](const NodeProbe& a, const NodeProbe& b) { return a.node < b.node; });
  // A connected node is where a trial goes now; an unreachable one's probe is still its hardware.
  std::stable_partition(probes.begin(), probes.end(), [&connected](const NodeProbe& probe) {
    return connected.contains(probe.node);
  });
  return probes;
}

LocalRates LocalRates::FromNodeProbes(std::vector<NodeProbe> nodes) {
  LocalRates rates;
  rates.nodes_ = std::move(nodes);
  rates.nodes_read_ = true;
  return rates;
}

LocalRates LocalRates::FromProbe(const estimate::RateProbe& probe, const std::string& where) {
  LocalRates rates;
  rates.probe_ = probe;
  rates.source_ = "this machine's probe (" + where + "): " + SummaryForNode(probe, kLocalNode);
  return rates;
}

LocalRates LocalRates::Load(const EnvLookup& env, const fs::path& self, std::ostream& err) {
  if (const std::optional<std::string> setting = env(kRateProbeVariable); setting.has_value()) {
    if (*setting == "off") return LocalRates();
    err << "note: " << kRateProbeVariable << "='" << *setting
        << "' is not 'off' (the only value it takes); this machine's probe is used\n";
  }
  return LoadBeside(env, self, err, ReadNodeProbes(env, err));
}

LocalRates LocalRates::LoadBeside(const EnvLookup& env, const fs::path& self, std::ostream& err,
                                  std::vector<NodeProbe> nodes) {
  // A node's stored CPU probe is what an untargeted CPU trial takes (For): nothing to measure here
  // then. The embedded agent's (node "local") is the exception: it is its copy of this machine's
  // probe.json (the agent takes it, and a new one within a health check), which is loaded, and
  // measured when missing, to serve in the copy's place (For): deleting probe.json then measures
  // again, where the copy would serve on unchanged.
  LocalRates stored = FromNodeProbes(std::move(nodes));
  const NodeProbe* cpu_node = stored.NodeFor(estimate::CpuSpeed(), {});
  if (cpu_node != nullptr && cpu_node->node != kLocalNode) return stored;
  LocalRates local = LoadLocalProbe(env, self, err,
                                    cpu_node != nullptr
                                        ? "the embedded agent's stored copy of this machine's rates"
                                        : "the data sheets' rates");
  local.nodes_ = std::move(stored.nodes_);
  local.nodes_read_ = true;
  return local;
}

LocalRates LocalRates::LoadLocalProbe(const EnvLookup& env, const fs::path& self, std::ostream& err,
                                      std::string_view otherwise) {
  StatusOr<fs::path> dir = EmbeddedDataDir(env);
  if (!dir.ok()) return LocalRates();  // the calibration's note says why
  const fs::path path = *dir / kLocalProbeFile;
  // The paths below are LLMCTL_HOME's text, the user's environment's: an escape in one would act
  // on the terminal.
  const auto sheets = [&err, otherwise](const std::string& why) {
    err << "note: the time is at " << otherwise << ": " << ForTerminal(why) << "\n";
    return LocalRates();
  };
  StatusOr<DaemonBinaries> binaries = LocateDaemonBinaries(self, env);
  // llm-train's --version --json, asked once at most, and only of a probe that could be taken.
  bool asked = false;
  std::optional<TrainerVersions> trainer;
  const TrainerNow trainer_now = [&]() -> const std::optional<TrainerVersions>& {
    if (!asked && binaries.ok()) {
      StatusOr<TrainerVersions> said =
          AskTrainerVersions(binaries->llm_train.string(), kTrainerVersionTimeout);
      if (said.ok()) trainer = *std::move(said);
    }
    asked = true;
    return trainer;
  };
  std::string stale;
  StatusOr<std::optional<estimate::RateProbe>> kept = CurrentLocalProbe(path, trainer_now, stale);
  if (!kept.ok()) return sheets(kept.status().message());
  if (kept->has_value()) return FromProbe(**kept, path.string());
  if (!stale.empty()) {
    err << "note: measuring this machine's rates again: " << ForTerminal(stale) << "\n";
  }
  if (!binaries.ok()) {
    return sheets("this machine's are not measured (" + binaries.status().message() + ")");
  }
  const StatusOr<FileLock> measuring = LockProbe(*dir, path, err);
  if (!measuring.ok()) return sheets(measuring.status().message());
  // Only the probe of the llmctl that holds probe.json.lock writes probe.json, and this one's has
  // not started: a temporary beside it (probe.json.tmp.PID.N) is what a probe killed mid-write
  // left, there for good otherwise. One that cannot be removed costs only its few kilobytes.
  (void)RemoveAtomicWriteLeftovers(path.string());
  // What the llmctl that held the lock measured, if it did.
  kept = CurrentLocalProbe(path, trainer_now, stale);
  if (!kept.ok()) return sheets(kept.status().message());
  if (kept->has_value()) return FromProbe(**kept, path.string());
  // A store that cannot be read here says nothing of the trials: the probe is taken as before.
  if (const StatusOr<std::optional<int64_t>> running = ExperimentRunningHere(*dir);
      running.ok() && running->has_value()) {
    return sheets("this machine's are not measured: " + TrialRunsHere(**running) +
                  "; `llmctl nodes --measure local` measures them once it has ended");
  }
  err << "measuring this machine's rates once (llm-train --probe, about 12 s) into "
      << OnOneLine(path.string()) << "; `llmctl nodes --measure local` measures again\n"
      << std::flush;
  StatusOr<estimate::RateProbe> probe = MeasureInto(binaries->llm_train, path);
  if (!probe.ok()) return sheets(probe.status().message());
  return FromProbe(*probe, path.string());
}

StatusOr<estimate::RateProbe> MeasureLocalProbeAgain(const EnvLookup& env, const fs::path& self,
                                                     std::ostream& err) {
  if (env(kRateProbeVariable) == "off") {
    return FailedPreconditionError(std::string(kRateProbeVariable) +
                                   "=off: this machine's rates are not measured");
  }
  ASSIGN_OR_RETURN(const fs::path dir, EmbeddedDataDir(env));
  ASSIGN_OR_RETURN(const std::optional<int64_t> running, ExperimentRunningHere(dir));
  if (running.has_value()) {
    return FailedPreconditionError(TrialRunsHere(*running) +
                                   "; measure again once it has ended (llmctl status " +
                                   std::to_string(*running) + ")");
  }
  ASSIGN_OR_RETURN(const DaemonBinaries binaries, LocateDaemonBinaries(self, env));
  const fs::path path = dir / kLocalProbeFile;
  ASSIGN_OR_RETURN(const FileLock measuring, LockProbe(dir, path, err));
  (void)RemoveAtomicWriteLeftovers(path.string());
  err << "measuring this machine's rates again (llm-train --probe, about 12 s) into "
      << OnOneLine(path.string()) << "\n"
      << std::flush;
  StatusOr<estimate::RateProbe> probe = MeasureInto(binaries.llm_train, path);
  // Not Unavailable, which the command line reads as an unreachable controller.
  if (probe.status().code() == StatusCode::kUnavailable) {
    return FailedPreconditionError(binaries.llm_train.string() +
                                   " --probe found this machine busy (exit code 1, said above); " +
                                   path.string() +
                                   " is as it was: measure again when the machine is idle");
  }
  return probe;
}

LocalRates LocalRates::LoadOnFirstUse(EnvLookup env, fs::path self, std::ostream& err) {
  LocalRates rates;
  rates.deferred_ = Deferred{std::move(env), std::move(self), &err};
  return rates;
}

void LocalRates::Prefer(estimate::RateProbe probe, const std::string& path) {
  preferred_ = NodeProbe{path, std::move(probe)};
}

std::optional<estimate::Gpu> LocalRates::preferred_gpu() const {
  if (!preferred_.has_value() || preferred_->probe.device != "cuda") return std::nullopt;
  return estimate::GpuOfDeviceName(preferred_->probe.device_name);
}

const NodeProbe* LocalRates::NodeFor(const estimate::DeviceSpeed& sheet,
                                     const Target& target) const {
  const Target placement = scheduler::PlacementTarget(target);
  for (const NodeProbe& node : nodes_) {
    if (ProbeIsOf(node.probe, sheet) && scheduler::LabelsMatch(node.labels, placement)) {
      return &node;
    }
  }
  return nullptr;
}

estimate::DeviceSpeed LocalRates::For(const estimate::DeviceSpeed& sheet,
                                      const Target& target) const {
  if (preferred_.has_value() && ProbeIsOf(preferred_->probe, sheet)) {
    preferred_used_ = true;
    return estimate::ProbedSpeed(
        sheet, preferred_->probe,
        "the probe in " + preferred_->node + " (--rates): " + preferred_->probe.Summary());
  }
  if (deferred_.has_value() && sheet.name != "cpu" && !nodes_read_) {
    // A GPU trial reads the store only: nothing is measured here for it.
    const std::optional<std::string> setting = deferred_->env(kRateProbeVariable);
    if (setting != "off") nodes_ = ReadNodeProbes(deferred_->env, *deferred_->err);
    nodes_read_ = true;
  }
  if (deferred_.has_value() && sheet.name == "cpu") {
    // The store is read once: a GPU trial may have read it already.
    const std::optional<std::string> setting = deferred_->env(kRateProbeVariable);
    LocalRates loaded =
        nodes_read_ && !setting.has_value()
            ? LoadBeside(deferred_->env, deferred_->self, *deferred_->err, std::move(nodes_))
            : Load(deferred_->env, deferred_->self, *deferred_->err);
    deferred_.reset();
    nodes_ = std::move(loaded.nodes_);
    nodes_read_ = true;
    probe_ = std::move(loaded.probe_);
    source_ = std::move(loaded.source_);
  }
  const NodeProbe* node = NodeFor(sheet, target);
  // The embedded agent's stored probe is its copy of this machine's (LoadBeside), which serves in
  // its place; the copy serves where this machine's could not be had.
  const bool own_in_its_place = node != nullptr && node->node == kLocalNode && probe_.has_value() &&
                                ProbeIsOf(*probe_, sheet);
  if (node != nullptr && !own_in_its_place) {
    return estimate::ProbedSpeed(sheet, node->probe,
                                 "node " + node->node + "'s probe (stored by the controller): " +
                                     SummaryForNode(node->probe, node->node));
  }
  // This machine's embedded agent has no lease: a targeted trial never runs on it.
  const bool could_run_here = scheduler::PlacementTarget(target).empty();
  if (sheet.name != "cpu" || !could_run_here || !probe_ || probe_->device != "cpu") return sheet;
  return estimate::ProbedSpeed(sheet, *probe_, source_);
}

}  // namespace llmctl::cli
