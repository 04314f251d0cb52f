// A trial's outcome, one spelling for every process that names it: llm-train's `result` event
// (trainer/train/), the agent's end of a run (agent/outcome.cc, from llm-train's exit code,
// common/trainer_exit.h), the store, and the report's verdicts (controller/cli/report.cc).
#ifndef LLMCTL_COMMON_TRIAL_OUTCOME_H_
#define LLMCTL_COMMON_TRIAL_OUTCOME_H_

#include <string_view>

namespace llmctl::trial_outcome {

inline constexpr std::string_view kOk = "ok";
inline constexpr std::string_view kFailed = "failed";
inline constexpr std::string_view kInvalid = "invalid";  // an input was refused: nothing ran
inline constexpr std::string_view kOom = "oom";
inline constexpr std::string_view kDiverged = "diverged";
inline constexpr std::string_view kCancelled = "cancelled";

}  // namespace llmctl::trial_outcome

#endif  // LLMCTL_COMMON_TRIAL_OUTCOME_H_
