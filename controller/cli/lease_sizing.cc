#include "controller/cli/lease_sizing.h"

#include <cmath>
#include <map>

#include "common/printf.h"
#include "common/text.h"

namespace llmctl::cli {
namespace {

std::string DurationText(int64_t minutes) {
  const int64_t hours = minutes / 60;
  const int64_t rest = minutes % 60;
  if (hours == 0) return std::to_string(rest) + "m";
  return std::to_string(hours) + "h" + (rest > 0 ? std::to_string(rest) + "m" : "");
}

}  // namespace

LeaseSizing SizeLease(const Experiment& experiment,
                      const std::vector<TrialPrediction>& predictions) {
  std::map<std::string, const TrialPrediction*> by_trial;
  for (const TrialPrediction& p : predictions) by_trial[p.trial] = &p;
  double seconds = 0;
  std::vector<std::string> unpredicted;
  for (const Trial& trial : experiment.trials) {
    auto found = by_trial.find(trial.name);
    if (found == by_trial.end() || found->second->trial_seconds <= 0) {
      unpredicted.push_back(trial.name);
      continue;
    }
    seconds += found->second->trial_seconds;
  }
  if (!unpredicted.empty()) {
    std::string names;
    for (size_t i = 0; i < unpredicted.size() && i < 3; ++i) {
      names += (i > 0 ? ", " : "") + unpredicted[i];
    }
    if (unpredicted.size() > 3) names += ", ...";
    return {kDefaultLeaseDuration,
            "the labs' " + std::string(kDefaultLeaseDuration) + ": " +
                CountOf(static_cast<int64_t>(unpredicted.size()), "trial has", "trials have") +
                " no predicted time (" + names + "; `llmctl estimate` says why)"};
  }
  const double predicted_minutes = seconds / 60;
  const double with_margin =
      predicted_minutes * (1 + kLeaseTimeMargin) + static_cast<double>(kNodeBootAllowance.count());
  const int64_t step = kLeaseGranularity.count();
  const int64_t minutes =
      static_cast<int64_t>(std::ceil(with_margin / static_cast<double>(step))) * step;
  const std::string predicted = Printf("%.1f", predicted_minutes);
  return {DurationText(minutes),
          std::string("sized from the prediction: ") +
              CountOf(static_cast<int64_t>(experiment.trials.size()), "trial", "trials") + ", " +
              predicted + " min predicted, + " +
              std::to_string(static_cast<int>(kLeaseTimeMargin * 100)) + "% + " +
              std::to_string(kNodeBootAllowance.count()) +
              " min for the node to boot, in steps of " + std::to_string(step) + " min"};
}

}  // namespace llmctl::cli
