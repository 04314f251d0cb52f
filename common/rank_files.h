// The files of a trial's ranks: a rule llm-train (which writes them), the agent (which streams
// them), the controller (which copies checkpoints) and the tests share.
#ifndef LLMCTL_COMMON_RANK_FILES_H_
#define LLMCTL_COMMON_RANK_FILES_H_

#include <string>

namespace llmctl {

// Rank 0's events file in the agent's run directory (llm-train --events).
inline constexpr char kEventsFile[] = "events.jsonl";

// The events file of `rank`: rank 0 writes `path` itself, rank r > 0 writes it with ".rank<r>"
// before the extension (events.jsonl -> events.rank1.jsonl). "" stays "".
std::string RankEventsPath(const std::string& path, int rank);

// A checkpoint directory's state (next step, data position, resolved config). llm-train writes it
// last (trainer/train/checkpoints.cc), so a directory holding it is a complete checkpoint: the
// agent checks for it before resuming from a directory, the controller before keeping its copy.
inline constexpr char kCheckpointStateFile[] = "trainer_state.json";

// Strategy fsdp's checkpoints hold each rank's optimizer shard: rank 0's in optimizer.safetensors,
// rank r's in optimizer.rank<r>.safetensors. Each node's ranks write theirs on that node; the
// controller's copy of a multi-node checkpoint gathers them from every node.
std::string RankOptimizerFile(int rank);

// The rank whose optimizer shard `file` is by RankOptimizerFile's rule (0 for
// optimizer.safetensors); -1 when it is no such file.
int RankOfOptimizerFile(const std::string& file);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_RANK_FILES_H_
