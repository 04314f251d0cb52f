// How a run ended: the worker's exit status, read together with its event file.
#ifndef LLMCTL_AGENT_OUTCOME_H_
#define LLMCTL_AGENT_OUTCOME_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "agent/supervisor.h"

namespace llmctl::agent {

// agent.proto's RunEnded as plain values.
struct RunEnd {
  std::string outcome;  // ok | oom | diverged | failed | cancelled | invalid
  int exit_code = 0;    // -signal when killed by a signal
  std::string error;
};

// What the event file says about the end.
struct ResultEvent {
  bool present = false;  // a `result` line was written
  std::string error;     // its `error`, if any, quoted on one line (result_event::ErrorOf)
};

// The trainer's exit codes (README "llm-train": 0 ok, 1 failed, 2 invalid input, 3 oom,
// 4 diverged, 5 cancelled). SIGKILL without a result event is "oom" when the host's count of the
// kernel's out-of-memory kills rose during the run (`oom_kills_during_run` > 0), "failed" when it
// did not (someone's kill -9), and a presumed "oom" when the count could not be read (nullopt); any
// other signal is "failed" naming it. A cancel that was asked for makes any unsuccessful end
// "cancelled". The error comes from the result event, else from the last line of the worker's
// stderr.
RunEnd DecideOutcome(const WorkerExit& exit, const ResultEvent& result, bool cancel_requested,
                     std::optional<uint64_t> oom_kills_during_run, std::string_view stderr_tail);

// How one rank of a multi-rank run ended (llm-train's launcher records the first to fail).
struct RankExit {
  int rank = 0;
  WorkerExit exit;
};

// A multi-rank run's end from its first failed rank: DecideOutcome of that rank's exit and its own
// event file's result, the error naming it ("rank 1 of 2: out of memory ..."), so that rank 1's
// out-of-memory makes the attempt oom even though the others were stopped. Without a result event's
// error, the launcher's last stderr line, which names the rank and quotes the rank's, is the error.
RunEnd DecideRankOutcome(const RankExit& failed, int ranks, const ResultEvent& result,
                         bool cancel_requested, std::optional<uint64_t> oom_kills_during_run,
                         std::string_view stderr_tail);

// The kernel's count of out-of-memory kills since boot: the `oom_kill` line of /proc/vmstat's
// text (Linux 4.13 and later); nullopt without one. It counts the whole host's kills (runs have no
// cgroup of their own), so a run's SIGKILL is the OOM killer's only when the count rose meanwhile.
std::optional<uint64_t> ParseOomKillCount(std::string_view vmstat_text);
// The same of /proc/vmstat now; nullopt when it cannot be read.
std::optional<uint64_t> ReadOomKillCount();

// Scans a worker's event file text for its `result` line; a line that is not a JSON object with a
// string `type` is no result.
ResultEvent FindResultEvent(std::string_view events_text);
// The same of the event file at `events_path`, read in bounded chunks (agent/event_reader.h); no
// result when it cannot be read.
ResultEvent ReadResultEvent(const std::string& events_path);

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_OUTCOME_H_
