// The rates `llmctl estimate`, `plan` and `submit` predict a CPU trial's time at when it runs on
// this machine (the embedded agent's node): this machine's probe (common/estimate/rate_probe.h),
// kept as probe.json in the embedded controller's data directory (LLMCTL_HOME). Measured once, by
// `llm-train --probe` (about 10 s), the first time it is needed, and again when the file is
// unreadable or names another CPU; without a data directory or llm-train, the data sheets' rates.
// LLMCTL_RATE_PROBE=off keeps the data sheets without measuring (the tests set it, so that no
// test's prediction depends on this machine's speed or pays for a probe per data directory).
#ifndef LLMCTL_CONTROLLER_CLI_LOCAL_RATES_H_
#define LLMCTL_CONTROLLER_CLI_LOCAL_RATES_H_

#include <filesystem>
#include <optional>
#include <ostream>
#include <string>

#include "common/estimate/rate_probe.h"
#include "common/estimate/step_time.h"
#include "controller/cli/address.h"

namespace llmctl::cli {

inline constexpr char kRateProbeVariable[] = "LLMCTL_RATE_PROBE";

class LocalRates {
 public:
  // The probe at the data directory `env` names, measured first with llm-train (found as the
  // daemons are, beside `self`) when absent, saying so on `err`; none (the data sheets) when there
  // is no data directory, or llm-train cannot measure (said on `err`), or LLMCTL_RATE_PROBE is
  // "off" (said nowhere: the estimate's time then names no rates, as the data sheets' never do).
  static LocalRates Load(const EnvLookup& env, const std::filesystem::path& self, std::ostream& err);
  // Load, put off until For is first asked about a CPU trial: a file of GPU trials never
  // measures this machine. `err` must outlive the returned object.
  static LocalRates LoadOnFirstUse(EnvLookup env, std::filesystem::path self, std::ostream& err);
  // `probe` as if read from `where` (tests).
  static LocalRates FromProbe(const estimate::RateProbe& probe, const std::string& where);

  // The speed of a trial on `sheet`'s device: the probe's rates for a CPU trial when there is a
  // CPU probe; else `sheet`.
  estimate::DeviceSpeed For(const estimate::DeviceSpeed& sheet) const;
  // For as a lookup, for estimate's and plan's options; valid while this object lives.
  estimate::SpeedLookup Lookup() const {
    return [this](const estimate::DeviceSpeed& sheet) { return For(sheet); };
  }

  const std::optional<estimate::RateProbe>& probe() const { return probe_; }

 private:
  // What Load needs, while LoadOnFirstUse's load is still to come.
  struct Deferred {
    EnvLookup env;
    std::filesystem::path self;
    std::ostream* err;
  };

  // Not thread-safe: estimate and plan ask from one thread.
  mutable std::optional<Deferred> deferred_;
  mutable std::optional<estimate::RateProbe> probe_;
  mutable std::string source_;  // "this machine's probe (PATH): ..."
};

// The probe in `path`: InvalidArgument naming the file when it cannot be read or parsed.
StatusOr<estimate::RateProbe> ReadRateProbe(const std::filesystem::path& path);

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_LOCAL_RATES_H_
