// The trainer's `result` event (the last line of a run: its outcome), as far as another process
// reads it: llm-train writes it (trainer/train/), the controller copies the checkpoint it names
// (controller/dispatch/checkpoint_copy.cc) and resumes a trial from it
// (controller/store/attempts.cc). One reading, so that what the copy takes for a checkpoint is what
// `llmctl resume` continues, and the error the agent reports is the error the controller quotes.
#ifndef LLMCTL_COMMON_RESULT_EVENT_H_
#define LLMCTL_COMMON_RESULT_EVENT_H_

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace llmctl::result_event {

inline constexpr std::string_view kType = "result";
// The run's reason for failing, a string; absent or "" when it has none.
inline constexpr std::string_view kError = "error";
// {"step": S, "path": P}: the last checkpoint the run wrote; absent when it wrote none.
inline constexpr std::string_view kCheckpoint = "checkpoint";
inline constexpr std::string_view kCheckpointStep = "step";
inline constexpr std::string_view kCheckpointPath = "path";

struct Checkpoint {
  std::string path;  // on the node that wrote it
  int64_t step = 0;  // counted from 0: the checkpoint is after step + 1 complete steps
};

// The checkpoint `result` names: its `checkpoint` is an object with an integer step >= 0 and a
// non-empty string path. Nothing otherwise (no checkpoint, or one no trainer writes).
std::optional<Checkpoint> CheckpointOf(const nlohmann::json& result);

// The error `result` states, quoted as another process's line is (common/text.h): on one line and
// cut to kQuotedLineBytes, as the agent quotes a trainer's last stderr line. The event line is the
// trainer's and may hold up to its limit (common/event_line.h) of newlines and escape sequences.
// "" when `error` is absent or not a string.
std::string ErrorOf(const nlohmann::json& result);

}  // namespace llmctl::result_event

#endif  // LLMCTL_COMMON_RESULT_EVENT_H_
