// The files of a trial's ranks: a rule llm-train (which writes them), the agent (which streams
// them) and the tests share.
#ifndef LLMCTL_COMMON_RANK_FILES_H_
#define LLMCTL_COMMON_RANK_FILES_H_

#include <string>

namespace llmctl {

// Rank 0's events file in the agent's run directory (llm-train --events).
inline constexpr char kEventsFile[] = "events.jsonl";

// The events file of `rank`: rank 0 writes `path` itself, rank r > 0 writes it with ".rank<r>"
// before the extension (events.jsonl -> events.rank1.jsonl). "" stays "".
std::string RankEventsPath(const std::string& path, int rank);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_RANK_FILES_H_
