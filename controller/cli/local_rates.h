// The rates `llmctl estimate`, `plan` and `submit` predict a trial's time at: those of the node it
// will run on, as its agent measured them and the controller llmctl uses stored them (the embedded
// one's store read in place; a configured one's through ListNodes): a node whose probe is of the
// trial's device (a GPU trial: that GPU; a CPU trial: any CPU, this machine's first) and whose
// lease matches the experiment's target as the scheduler matches it (scheduler::LabelsMatch),
// connected nodes first. Where that node is the embedded agent (node "local"), whose stored probe
// is its copy of this machine's, and else for a CPU trial that this machine's embedded agent could
// run (the embedded controller, no target): this machine's probe (common/estimate/rate_probe.h;
// the agent's copy only where this one cannot be had), kept as probe.json in the embedded
// controller's data directory (LLMCTL_HOME), measured once by `llm-train --probe` (about 12 s) the
// first time it is needed and again when the file is missing (deleted to measure again: the
// embedded agent takes the new one at the controller's next health check), unreadable, names
// another CPU, or was measured by another llm-train or LibTorch or with other threads or vector
// kernels than the llm-train beside llmctl now takes (its `--version --json`, asked once a file is
// there: OMP_NUM_THREADS, ONEDNN_MAX_CPU_ISA and the like change them); else the data sheets'
// rates. A probe the user names (estimate's and plan's --rates FILE) comes before all of these for
// a trial on its device. The time's `rates` says which.
// LLMCTL_RATE_PROBE=off keeps the data sheets without measuring (the tests set it, so that no
// test's prediction depends on this machine's speed or pays for a probe per data directory).
#ifndef LLMCTL_CONTROLLER_CLI_LOCAL_RATES_H_
#define LLMCTL_CONTROLLER_CLI_LOCAL_RATES_H_

#include <filesystem>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "common/estimate/gpus.h"
#include "common/estimate/rate_probe.h"
#include "common/estimate/step_time.h"
#include "controller/cli/address.h"
#include "llmctl/v1/controller.pb.h"

namespace llmctl::cli {

inline constexpr char kRateProbeVariable[] = "LLMCTL_RATE_PROBE";
// This machine's probe in the embedded daemons' data directory (LLMCTL_HOME): llmctl measures it,
// and the embedded agent takes it as its node's rates rather than measuring them again.
inline constexpr char kLocalProbeFile[] = "probe.json";

// A node's own rates as the controller stored them (Store::NodeRates).
struct NodeProbe {
  std::string node;
  estimate::RateProbe probe;
  // What an experiment's target is matched against: the node's lease's site and flavor; none
  // off a lease.
  std::map<std::string, std::string> labels = {};
};

// An experiment's `target:` (Experiment::target); empty for none.
using Target = std::map<std::string, std::string>;

class LocalRates {
 public:
  // The probe at the data directory `env` names, measured first with llm-train (found as the
  // daemons are, beside `self`) when absent, saying so on `err` (by one llmctl at a time: another
  // waits up to 3 minutes for its probe, under probe.json.lock, and takes it); none (the data
  // sheets) when there is no data directory, or llm-train cannot measure (said on `err`), or
  // LLMCTL_RATE_PROBE is "off" (said nowhere: the estimate's time then names no rates, as the data
  // sheets' never do).
  static LocalRates Load(const EnvLookup& env, const std::filesystem::path& self,
                         std::ostream& err);
  // Load, put off until For is first asked about a CPU trial: a file of GPU trials never
  // measures this machine. `err` must outlive the returned object.
  static LocalRates LoadOnFirstUse(EnvLookup env, std::filesystem::path self, std::ostream& err);
  // `probe` as if read from `where` (tests).
  static LocalRates FromProbe(const estimate::RateProbe& probe, const std::string& where);
  // `probe`, read from the user's `path` (--rates), before any other for a trial on its device (a
  // CPU probe for a CPU trial, a GPU's for a trial on that GPU); the rest as before. Nothing is
  // measured or read for a trial it serves.
  void Prefer(estimate::RateProbe probe, const std::string& path);
  // Whether For has served a trial from Prefer's probe.
  bool preferred_used() const { return preferred_used_; }
  // The GPU of the table Prefer's probe was taken on; none for a CPU's, an unknown GPU's or
  // without one.
  std::optional<estimate::Gpu> preferred_gpu() const;
  // Prefer's probe's device, as RateProbe::Summary says it; "" without one.
  std::string preferred_summary() const {
    return preferred_.has_value() ? preferred_->probe.Summary() : "";
  }
  // The nodes' stored probes and no local one: a configured controller's nodes (this machine
  // runs none of its trials), or tests.
  static LocalRates FromNodeProbes(std::vector<NodeProbe> nodes);

  // The speed of a trial on `sheet`'s device, of an experiment with `target`: the rates of the
  // stored probe of a node that could run it; else this machine's probe for an untargeted CPU
  // trial (the embedded controller only); else `sheet`.
  estimate::DeviceSpeed For(const estimate::DeviceSpeed& sheet, const Target& target = {}) const;
  // For as a lookup, for estimate's and plan's options; valid while this object lives.
  estimate::SpeedLookup Lookup() const {
    return [this](const estimate::DeviceSpeed& sheet, const Target& target) {
      return For(sheet, target);
    };
  }

  const std::optional<estimate::RateProbe>& probe() const { return probe_; }

 private:
  // Load with the store's `nodes` already read.
  static LocalRates LoadBeside(const EnvLookup& env, const std::filesystem::path& self,
                               std::ostream& err, std::vector<NodeProbe> nodes);
  // Load's part for this machine's own probe (probe.json, measured when missing); where there is
  // none, `err` says the time is at `otherwise`, and why.
  static LocalRates LoadLocalProbe(const EnvLookup& env, const std::filesystem::path& self,
                                   std::ostream& err, std::string_view otherwise);
  // The stored probe of a node with `sheet`'s device that `target` lets run the trial; null when
  // none.
  const NodeProbe* NodeFor(const estimate::DeviceSpeed& sheet, const Target& target) const;

  // What Load needs, while LoadOnFirstUse's load is still to come.
  struct Deferred {
    EnvLookup env;
    std::filesystem::path self;
    std::ostream* err;
  };

  // Not thread-safe: estimate and plan ask from one thread.
  std::optional<NodeProbe> preferred_;  // node: the user's path
  mutable bool preferred_used_ = false;
  mutable std::optional<Deferred> deferred_;
  mutable std::vector<NodeProbe> nodes_;
  mutable bool nodes_read_ = false;  // LoadOnFirstUse: the store is read before any probe is run
  mutable std::optional<estimate::RateProbe> probe_;
  mutable std::string source_;  // "this machine's probe (PATH): ..."
};

// `nodes --measure local`: measures this machine's probe (probe.json in the embedded controller's
// data directory) again, whether or not there is one, under the lock Load measures under, saying
// so on `err`; the embedded agent takes it at the controller's next health check. A probe that
// fails leaves the file as it was. FailedPrecondition under LLMCTL_RATE_PROBE=off, and while the
// embedded store has a trial running on node local (nothing is measured then).
StatusOr<estimate::RateProbe> MeasureLocalProbeAgain(const EnvLookup& env,
                                                     const std::filesystem::path& self,
                                                     std::ostream& err);

// The probes the embedded controller's store holds (LLMCTL_HOME's llmctl.db), with their nodes'
// lease labels, this machine's CPU first, then by node; none without a store. A stored probe that
// does not parse is skipped, said on `err`.
std::vector<NodeProbe> ReadNodeProbes(const EnvLookup& env, std::ostream& err);

// The probes of a controller's ListNodes answer, with their nodes' lease labels, connected nodes
// first, then by node. Another process's bytes: a probe that does not parse is skipped, said on
// `err` (named by the node, as `llmctl nodes` lists it).
std::vector<NodeProbe> NodeProbesOf(const v1::ListNodesResponse& nodes, std::ostream& err);

// A probe as a controller stored it (a node's agent sent it: another process's bytes); the
// parser's message when it is not one.
StatusOr<estimate::RateProbe> ParseStoredProbe(const std::string& text);

// The probe in `path`: InvalidArgument naming the file when it cannot be read or parsed.
StatusOr<estimate::RateProbe> ReadRateProbe(const std::filesystem::path& path);

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_LOCAL_RATES_H_
