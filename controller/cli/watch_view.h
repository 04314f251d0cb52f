// `llmctl watch`: an experiment's live status as a terminal table, with a running trial's devices
// under it as bars, as nvtop draws them, from their latest sample (a second old at most). On a TTY
// the table is redrawn in place (ANSI cursor movement); elsewhere (a pipe, a log file) the output
// reads as a short log: a trial's line when its state changes, a notice when it appears, and a
// progress line at most every 10 s, then further apart, without the device bars (they change every
// second).
#ifndef LLMCTL_CONTROLLER_CLI_WATCH_VIEW_H_
#define LLMCTL_CONTROLLER_CLI_WATCH_VIEW_H_

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "llmctl/v1/controller.pb.h"

namespace llmctl::cli {

// "[########------------]" for step/total, `width` cells between the brackets; all '-' when total
// is unknown (0).
std::string ProgressBar(int64_t step, int64_t total, int width);

// nvtop's meter: `label[` + `width` cells, the first `fraction` of them '|', with `text`
// right-aligned over the end + `]`. "GPU[||||||||      45%]".
std::string Meter(const std::string& label, double fraction, const std::string& text, int width);

// A device's name as watch and report show it: "cuda:0", or with several nodes (a multi-node
// attempt's samples, any of them from a node rank above 0) its node's rank first, "node 1 cuda:0".
std::string DeviceName(const std::string& device, int32_t node_rank, bool several_nodes);

// One device's bars, its name (DeviceName) padded to `name_width`:
//   cuda:0 GPU[|||||||||        45%] MEM[|||||||||||||||||61.2/80.0 GiB] 312 W 64°C
//   cpu    CPU[||||||||||||||||180%] RSS[||                1.6/24.0 GiB]
// A CPU's percent is of one core (180% = 1.8 cores busy): its bar is full from 100% on. Figures a
// sample lacks are left out, or "?" for a CPU's percent before its second reading.
std::string DeviceLine(const v1::DeviceSample& sample, const std::string& name, size_t name_width);

// Per trial: its line (name, state, progress bar and step/total, tokens/s, current and peak memory
// in MiB, and the error for a failed trial; columns aligned across the experiment's trials), then
// its notice ("    ! ...") and its devices' lines, indented, when it has them.
std::vector<std::string> WatchLines(const v1::ExperimentStatus& status);

// Writes successive statuses of one experiment. Not thread-safe.
class WatchPrinter {
 public:
  using Clock = std::chrono::steady_clock;
  // Plain output's silence while steps move before a progress line says how far they got. Each
  // progress line doubles it, up to kLongestProgressInterval, and state lines leave it as it is:
  // the progress lines of a whole run are about log2(its length / 10 s) plus one per 5 minutes
  // past the first ten, so a run of 14 trials fits a screen however slow its machine.
  static constexpr std::chrono::seconds kProgressInterval{10};
  static constexpr std::chrono::seconds kLongestProgressInterval{300};

  explicit WatchPrinter(bool tty) : tty_(tty) {}

  // The text to write for `status`, received at `now`. On a TTY: the cursor moved back over the
  // previous table and the whole table redrawn. Otherwise, appended lines: the first call's header
  // (the experiment, its trial count and how many are queued); a trial's line (WatchLines' without
  // devices) when its state changes, a queued trial's first state being in the header; a new
  // notice once for all the trials that got it; and when no line was written for the progress
  // interval while some step moved, one progress line (seconds since the first call, trials
  // ended, each running trial's step/total and tokens/s).
  std::string Update(const v1::ExperimentStatus& status, Clock::time_point now = Clock::now());

 private:
  // What plain output last saw of a trial.
  struct Seen {
    std::string state;
    std::string notice;
    int64_t step = 0;
  };

  std::string Redraw(const v1::ExperimentStatus& status);
  std::string AppendChanges(const v1::ExperimentStatus& status, Clock::time_point now);

  const bool tty_;
  size_t drawn_lines_ = 0;                    // TTY: lines of the table on screen
  std::map<std::string, Seen> seen_;          // plain: by trial name
  std::optional<Clock::time_point> started_;  // plain: the first call
  Clock::time_point last_written_;            // plain: when a line was last written
  bool steps_moved_ = false;                  // plain: since the last line written
  std::chrono::seconds progress_interval_ = kProgressInterval;  // plain: the silence allowed now
};

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_WATCH_VIEW_H_
