// How long a lease `llmctl submit --provision` reserves: long enough for the node to boot and for
// every trial's predicted time with a margin, so that a lease does not end mid-row; the labs' fixed
// 2 h 50 min when some trial's time cannot be predicted.
#ifndef LLMCTL_CONTROLLER_CLI_LEASE_SIZING_H_
#define LLMCTL_CONTROLLER_CLI_LEASE_SIZING_H_

#include <chrono>
#include <string>
#include <vector>

#include "common/experiment.h"
#include "controller/cli/estimate.h"

namespace llmctl::cli {

// The margin on the predicted time (the calibration's spread, start-up the prediction leaves out),
// and the node's boot (bare metal takes 10 to 15 minutes, then the agent's image is pulled).
inline constexpr double kLeaseTimeMargin = 0.25;
inline constexpr std::chrono::minutes kNodeBootAllowance{20};
// Leases are reserved in whole steps of this.
inline constexpr std::chrono::minutes kLeaseGranularity{10};
inline constexpr char kDefaultLeaseDuration[] = "2h50m";

struct LeaseSizing {
  std::string duration;     // as `llmctl lease create --duration` takes it: "3h40m"
  std::string explanation;  // how it was reached, for the user
};

// The lease for `experiment`'s trials from their `predictions` (PredictTrials): boot + the sum of
// the trials' predicted times x (1 + margin), rounded up; trials are summed as if run one after
// another, an upper bound when the node runs several at once. The default duration, said why, when
// a trial has no predicted time.
LeaseSizing SizeLease(const Experiment& experiment,
                      const std::vector<TrialPrediction>& predictions);

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_LEASE_SIZING_H_
