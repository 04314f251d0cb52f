// Runs one trial: the one place that knows the step anatomy.
//
// For each micro-batch: phase0_before_fwd → forward → phase1_after_fwd → backward →
// phase2_after_bwd; after the last micro-batch of a global batch: optimizer step →
// phase3_after_opt_step. Snapshots are taken at step 0, step 1 and every `snapshot_every` steps
// (every micro-batch of such a step).
#ifndef LLMCTL_TRAINER_TRAIN_TRAINER_H_
#define LLMCTL_TRAINER_TRAIN_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "common/trainer_exit.h"
#include "common/trial_config.h"
#include "trainer/dist/rank_env.h"

namespace llmctl::trainer {

enum class Outcome { kOk, kOom, kDiverged, kFailed, kCancelled };

std::string_view OutcomeName(Outcome outcome);

// llm-train's exit code for the outcome (common/trainer_exit.h).
int ExitCodeFor(Outcome outcome);

// Whether `status`, a failure before training (or of --prepare), is the input's fault, exit
// kInvalidInput: a read or write the system refused (a full disk, EFBIG: Unavailable from
// common/atomic_file.h's writes; EIO: Unknown from common/files.h's reads) is not, and exits
// kFailed.
bool IsInputsFault(const Status& status);

struct TrialResult {
  Outcome outcome = Outcome::kFailed;
  bool invalid_input = false;  // failed before training started because an input was bad
  double train_seconds = 0.0;
  double tokens_per_second = 0.0;
  uint64_t peak_bytes = 0;
  std::optional<double> final_loss;
  int64_t steps_done = 0;
  std::string error;
  // Whether the run's end is on its [done] line and in its result event: false only when its
  // events file could not be opened, which ends it before anything runs (the caller says why).
  bool recorded = true;
};

struct RunOptions {
  std::string events_path;        // JSON lines; empty = none
  std::ostream* human = nullptr;  // the labs' human lines; null = silent
  const std::atomic<bool>* cancel =
      nullptr;  // set by a signal handler to stop between micro-batches
  // Set before `cancel` (llm-train's SIGUSR1, which the agent sends when the node's lease ends):
  // the stop first writes a checkpoint of the last complete step into output_dir, whether or not
  // the trial keeps periodic checkpoints (checkpoint_every).
  const std::atomic<bool>* checkpoint_on_cancel = nullptr;
  // Free bytes on the filesystem that holds `path`, asked before a stop checkpoint is written (a
  // checkpoint that does not fit is not started); statvfs when unset. Tests give a full disk.
  std::function<StatusOr<uint64_t>(const std::string& path)> free_disk_bytes;
  std::string resume_from;  // a checkpoint directory written by an earlier run
  // Paths as messages should name them: a path in the config → the name the user knows it by. The
  // agent runs trials on copies of the user's inputs in its cache; errors name the path the user
  // wrote in the experiment file instead of the cache's.
  std::map<std::string, std::string> input_names;
  // This process's place in a strategy: ddp job (torchrun's variables); required when the trial has
  // strategy ddp and devices > 1, whose WORLD_SIZE it must equal.
  std::optional<dist::RankEnv> rank_env;
};

// Runs the trial in this process and reports how it ended. Never throws.
TrialResult RunTrial(const TrialConfig& config, const RunOptions& options);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_TRAINER_H_
