// `llmctl watch`: an experiment's live status as a terminal table. On a TTY the table is redrawn
// in place (ANSI cursor movement); elsewhere (a pipe, a log file) each trial's line is appended
// when it changes, so the output reads as a log.
#ifndef LLMCTL_CONTROLLER_CLI_WATCH_VIEW_H_
#define LLMCTL_CONTROLLER_CLI_WATCH_VIEW_H_

#include <map>
#include <string>
#include <vector>

#include "llmctl/v1/controller.pb.h"

namespace llmctl::cli {

// "[########------------]" for step/total, `width` cells between the brackets; all '-' when total
// is unknown (0).
std::string ProgressBar(int64_t step, int64_t total, int width);

// One line per trial: name, state, progress bar and step/total, tokens/s, current and peak memory
// (MiB), and the error for a failed trial. Columns aligned across the experiment's trials.
std::vector<std::string> WatchLines(const v1::ExperimentStatus& status);

// Writes successive statuses of one experiment. Not thread-safe.
class WatchPrinter {
 public:
  explicit WatchPrinter(bool tty) : tty_(tty) {}

  // The text to write for `status`: on a TTY, the cursor moved back over the previous table and
  // the whole table redrawn; otherwise the lines of trials whose line changed since the last call.
  std::string Update(const v1::ExperimentStatus& status);

 private:
  const bool tty_;
  size_t drawn_lines_ = 0;                   // TTY: lines of the table on screen
  std::map<std::string, std::string> last_;  // plain: each trial's last line written
};

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_WATCH_VIEW_H_
