// llm-train's exit codes: a rule two processes share. llm-train exits with them
// (trainer/train/trainer.cc's ExitCodeFor); the agent turns them back into the trial's outcome
// (agent/outcome.cc). A rename or a new code changes both at compile time.
#ifndef LLMCTL_COMMON_TRAINER_EXIT_H_
#define LLMCTL_COMMON_TRAINER_EXIT_H_

#include <string_view>

#include "common/trial_outcome.h"

namespace llmctl::trainer_exit {

inline constexpr int kOk = 0;
inline constexpr int kFailed = 1;
inline constexpr int kInvalidInput = 2;  // bad config, model files, tokenizer or data: nothing ran
inline constexpr int kOom = 3;
inline constexpr int kDiverged = 4;
inline constexpr int kCancelled = 5;
// A file it had mapped (the token file, weights) shrank under it: another process truncated it or
// wrote over it in place (common/files.h, ReportShrunkMappedFiles). Its outcome is failed, its
// error the message naming the file.
inline constexpr int kInputShrank = 6;

// The outcome an exit code of llm-train stands for, as the store and the report name it; "" for a
// code llm-train never exits with.
constexpr std::string_view OutcomeName(int exit_code) {
  switch (exit_code) {
    case kOk:
      return trial_outcome::kOk;
    case kFailed:
      return trial_outcome::kFailed;
    case kInvalidInput:
      return trial_outcome::kInvalid;
    case kOom:
      return trial_outcome::kOom;
    case kDiverged:
      return trial_outcome::kDiverged;
    case kCancelled:
      return trial_outcome::kCancelled;
    case kInputShrank:
      return trial_outcome::kFailed;
    default:
      return "";
  }
}

}  // namespace llmctl::trainer_exit

#endif  // LLMCTL_COMMON_TRAINER_EXIT_H_
