#include "trainer/train/trainer.h"

#include "trainer/train/events.h"
#include "trainer/train/trial_run.h"

namespace llmctl::trainer {

std::string_view OutcomeName(Outcome outcome) {
  return trainer_exit::OutcomeName(ExitCodeFor(outcome));
}

int ExitCodeFor(Outcome outcome) {
  switch (outcome) {
    case Outcome::kOk:
      return trainer_exit::kOk;
    case Outcome::kOom:
      return trainer_exit::kOom;
    case Outcome::kDiverged:
      return trainer_exit::kDiverged;
    case Outcome::kFailed:
      return trainer_exit::kFailed;
    case Outcome::kCancelled:
      return trainer_exit::kCancelled;
  }
  return trainer_exit::kFailed;
}

bool IsInputsFault(const Status& status) {
  return status.code() != StatusCode::kUnavailable && status.code() != StatusCode::kUnknown;
}

TrialResult RunTrial(const TrialConfig& config, const RunOptions& options) {
  auto events = EventLog::Open(options.events_path);
  if (!events.ok()) {
    TrialResult result;
    result.outcome = Outcome::kFailed;
    result.invalid_input = IsInputsFault(events.status());
    result.error = events.status().message();
    result.recorded = false;
    return result;
  }
  TrialRun run(config, options, **events);
  return run.Run();
}

}  // namespace llmctl::trainer
