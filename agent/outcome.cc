#include "agent/outcome.h"

#include <signal.h>

#include <charconv>
#include <nlohmann/json.hpp>

#include "agent/event_reader.h"
#include "common/files.h"
#include "common/foreign_json.h"
#include "common/process_end.h"
#include "common/result_event.h"
#include "common/text.h"
#include "common/trainer_exit.h"
#include "common/trial_outcome.h"

namespace llmctl::agent {
namespace {

// Records `line` in `result` when it is a `result` event.
void ReadResultLine(std::string_view line, ResultEvent& result) {
  if (line.find("\"result\"") == std::string_view::npos) return;
  // Any line may be here (the trainer's file is not trusted): every type is checked before it is
  // read, since nlohmann's value() and get() throw on a mismatch.
  const nlohmann::json event = ParseForeignJson(line);
  if (!event.is_object()) return;
  const auto type = event.find("type");
  if (type == event.end() || !type->is_string() ||
      type->get_ref<const std::string&>() != "result") {
    return;
  }
  result.present = true;
  result.error = result_event::ErrorOf(event);
}

}  // namespace

ResultEvent FindResultEvent(std::string_view events_text) {
  ResultEvent result;
  size_t start = 0;
  while (start < events_text.size()) {
    const size_t end = events_text.find('\n', start);
    if (end == std::string_view::npos) break;  // an unfinished line is no event
    ReadResultLine(events_text.substr(start, end - start), result);
    start = end + 1;
  }
  return result;
}

ResultEvent ReadResultEvent(const std::string& events_path) {
  ResultEvent result;
  EventReader reader(events_path);
  while (true) {
    auto lines = reader.ReadNewLines();
    if (!lines.ok()) return result;
    for (const EventLine& line : *lines) ReadResultLine(line.text, result);
    if (reader.at_end()) return result;
  }
}

RunEnd DecideOutcome(const WorkerExit& exit, const ResultEvent& result, bool cancel_requested,
                     std::optional<uint64_t> oom_kills_during_run, std::string_view stderr_tail) {
  RunEnd end;
  // The stderr tail is cut at a byte count, and the trainer's text is any bytes: its last line,
  // which may be the whole tail, is quoted on one line, cut and made UTF-8 here, before the run's
  // files and the gRPC answer carry it, as the result event's error was when it was read.
  const std::string reported = !result.error.empty()
                                   ? result.error
                                   : OnOneLine(LastNonBlankLine(stderr_tail), kQuotedLineBytes);
  if (exit.signal != 0) {
    end.exit_code = -exit.signal;
    if (exit.signal == SIGKILL && !result.present) {
      // Anyone may send SIGKILL (a user's kill -9): only a rise in the kernel's count of its
      // out-of-memory kills tells the OOM killer's apart; without the count, the likelier cause.
      if (!oom_kills_during_run.has_value()) {
        end.outcome = trial_outcome::kOom;
        end.error = "killed by SIGKILL, presumably by the kernel for host memory";
      } else if (*oom_kills_during_run > 0) {
        end.outcome = trial_outcome::kOom;
        end.error = "killed by the kernel's out-of-memory killer (host memory)";
      } else {
        end.outcome = trial_outcome::kFailed;
        end.error = "killed by SIGKILL, not by the kernel's out-of-memory killer";
      }
    } else {
      end.outcome = trial_outcome::kFailed;
      end.error = "killed by " + SignalName(exit.signal);
    }
  } else {
    end.exit_code = exit.exit_code;
    end.outcome = std::string(trainer_exit::OutcomeName(exit.exit_code));
    if (end.outcome.empty()) {
      end.outcome = trial_outcome::kFailed;
      end.error = "llm-train exited with code " + std::to_string(exit.exit_code);
      if (!reported.empty()) end.error += ": " + reported;
    }
    if (end.error.empty() && exit.exit_code != 0) end.error = reported;
    // llm-train ends cancelled on SIGINT or SIGTERM from anyone: one llmctl did not send (a user's
    // kill, a scheduler's) must not read as `llmctl cancel`.
    if (end.outcome == trial_outcome::kCancelled && !cancel_requested) {
      constexpr std::string_view kUnasked = "stopped by a signal llmctl did not send";
      end.error = end.error.empty() ? std::string(kUnasked)
                                    : std::string(end.error).append("; ").append(kUnasked);
    }
  }
  if (cancel_requested && end.outcome != trial_outcome::kOk) {
    end.outcome = trial_outcome::kCancelled;
    end.error = "cancelled on request; the worker " +
                (exit.signal != 0 ? "was killed by " + SignalName(exit.signal)
                                  : "exited with code " + std::to_string(exit.exit_code));
  }
  return end;
}

RunEnd DecideRankOutcome(const RankExit& failed, int ranks, const ResultEvent& result,
                         bool cancel_requested, std::optional<uint64_t> oom_kills_during_run,
                         std::string_view stderr_tail) {
  RunEnd end =
      DecideOutcome(failed.exit, result, cancel_requested, oom_kills_during_run, stderr_tail);
  const std::string rank = "rank " + std::to_string(failed.rank) + " of " + std::to_string(ranks);
  // The stderr is the launcher's, whose last line already names the rank and quotes the rank's own
  // last line ("llm-train: rank R of W exited with code C: <line>; the other ranks were stopped",
  // trainer/dist/rank_launcher.cc): without a result event's error it is the error, less the
  // launcher's program name.
  constexpr std::string_view kLauncherName = "llm-train: ";
  // The launcher's words around its quote ("rank R of W exited with code C: ", "; the other ranks
  // were stopped") are under 100 bytes.
  constexpr size_t kLauncherWordsBytes = 128;
  const std::string line =
      OnOneLine(LastNonBlankLine(stderr_tail), kQuotedLineBytes + kLauncherWordsBytes);
  const bool launchers_line =
      result.error.empty() && failed.exit.signal == 0 && end.outcome != trial_outcome::kCancelled &&
      line.starts_with(std::string(kLauncherName).append(rank).append(" exited with code "));
  if (launchers_line) {
    end.error = line.substr(kLauncherName.size());
  } else if (end.error.empty()) {
    end.error = rank + " " +
                (failed.exit.signal != 0 ? "was killed"
                                         : "exited with code " + std::to_string(end.exit_code)) +
                "; the other ranks were stopped";
  } else {
    end.error = rank + ": " + end.error;
  }
  return end;
}

std::optional<uint64_t> ParseOomKillCount(std::string_view vmstat_text) {
  constexpr std::string_view kKey = "oom_kill ";
  size_t start = 0;
  while (start < vmstat_text.size()) {
    size_t end = vmstat_text.find('\n', start);
    if (end == std::string_view::npos) end = vmstat_text.size();
    const std::string_view line = vmstat_text.substr(start, end - start);
    if (line.starts_with(kKey)) {
      const std::string_view digits = Trim(line.substr(kKey.size()));
      uint64_t count = 0;
      const auto [rest, error] =
          std::from_chars(digits.data(), digits.data() + digits.size(), count);
      if (error != std::errc() || rest != digits.data() + digits.size()) return std::nullopt;
      return count;
    }
    start = end + 1;
  }
  return std::nullopt;
}

std::optional<uint64_t> ReadOomKillCount() {
  // /proc files report a size of 0: ReadFileToString reads to the end all the same.
  const StatusOr<std::string> vmstat = ReadFileToString("/proc/vmstat", 1 << 20);
  if (!vmstat.ok()) return std::nullopt;
  return ParseOomKillCount(*vmstat);
}

}  // namespace llmctl::agent
