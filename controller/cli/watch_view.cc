#include "controller/cli/watch_view.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "common/printf.h"
#include "common/text.h"
#include "common/trial_name.h"
#include "controller/cli/report_format.h"

namespace llmctl::cli {
namespace {

constexpr int kBarWidth = 20;
constexpr int kMeterWidth = 20;
constexpr int kMemoryMeterWidth = 30;  // its text ("61.2/80.0 GiB") takes half
constexpr double kGib = 1 << 30;

// "61.2 MiB": report_format.h's Mib, ungrouped, with its unit.
std::string MibWithUnit(int64_t bytes) {
  return Printf("%.1f MiB", static_cast<double>(bytes) / kMiB);
}

std::string Pad(const std::string& text, size_t width) {
  return text.size() >= width ? text : text + std::string(width - text.size(), ' ');
}

// The widths of the name and state columns: aligned across the experiment's trials.
struct Columns {
  size_t name = 5;
  size_t state = 9;
};

// The widest a column is padded to: a trial's name is at most kMaxTrialNameBytes, a state one of a
// few words. The status is the controller's: a longer name is printed, not padded to, so that one
// such name cannot make every line that long.
constexpr size_t kMaxStateWidth = 16;
constexpr size_t kMaxDeviceNameWidth = 32;

Columns ColumnsOf(const v1::ExperimentStatus& status) {
  Columns columns;
  for (const v1::TrialStatus& trial : status.trials()) {
    columns.name = std::max(columns.name, std::min(trial.name().size(), kMaxTrialNameBytes));
    columns.state = std::max(columns.state, std::min(trial.state().size(), kMaxStateWidth));
  }
  return columns;
}

// A trial's own line, without its notice and devices.
std::string TrialLine(const v1::TrialStatus& trial, const Columns& columns) {
  std::string line =
      Pad(OnOneLine(trial.name(), kMaxTrialNameBytes), columns.name) + "  " +
      Pad(OnOneLine(trial.state(), kMaxShownBytes), columns.state) + "  " +
      ProgressBar(trial.step(), trial.total_steps(), kBarWidth) + " " +
      Pad(std::to_string(trial.step()) + "/" +
              (trial.total_steps() > 0 ? std::to_string(trial.total_steps()) : std::string("?")),
          9);
  line += Printf("%8.0f tok/s", trial.tokens_per_second()) + "  mem " +
          MibWithUnit(trial.allocated_bytes()) + " (peak " + MibWithUnit(trial.peak_bytes());
  if (trial.ranks_size() > 1) {
    // A multi-rank trial: the highest rank's peak, then each rank's.
    line += ", max of ";
    line += std::to_string(trial.ranks_size());
    line += " ranks:";
    for (const v1::RankMemory& rank : trial.ranks()) {
      line += ' ';
      line += MibWithUnit(rank.peak_bytes());
    }
  }
  line += ')';
  // The node's name and the trial's error are other processes' text (a trainer's error may span
  // lines): kept on the trial's one line, which the watch redraws in place.
  if (!trial.node().empty()) line += "  on " + OnOneLine(trial.node(), kMaxShownBytes);
  if (!trial.error().empty()) line += "  " + OnOneLine(trial.error(), kMaxShownBytes);
  return line;
}

bool HasEnded(const v1::TrialStatus& trial) {
  return trial.state() != "queued" && trial.state() != "running";
}

// Plain output's first line: "experiment 3 cpu-lab: 14 trials, 14 queued".
std::string PlainHeader(const v1::ExperimentStatus& status) {
  const auto queued =
      std::count_if(status.trials().begin(), status.trials().end(),
                    [](const v1::TrialStatus& trial) { return trial.state() == "queued"; });
  return "experiment " + std::to_string(status.id()) + " " +
         OnOneLine(status.name(), kMaxShownBytes) + ": " +
         CountOf(status.trials_size(), "trial", "trials") + ", " + std::to_string(queued) +
         " queued";
}

// "    ! baseline: TEXT", or for several trials "    ! baseline and 13 other trials: TEXT".
std::string NoticeLine(const std::string& text, const std::vector<std::string>& trials) {
  std::string who = trials.front();
  if (trials.size() == 2) who += " and " + trials[1];
  if (trials.size() > 2) who += " and " + std::to_string(trials.size() - 1) + " other trials";
  return "    ! " + who + ": " + OnOneLine(text, kMaxShownBytes);
}

// "85 s: 3 of 14 trials ended; running: bf16-true 4/6 at 1435 tok/s".
std::string ProgressLine(const v1::ExperimentStatus& status, std::chrono::seconds elapsed) {
  const auto ended = std::count_if(status.trials().begin(), status.trials().end(),
                                   [](const v1::TrialStatus& trial) { return HasEnded(trial); });
  std::string line = std::to_string(elapsed.count()) + " s: " + std::to_string(ended) + " of " +
                     CountOf(status.trials_size(), "trial", "trials") + " ended";
  std::string running;
  for (const v1::TrialStatus& trial : status.trials()) {
    if (trial.state() != "running") continue;
    running += running.empty() ? "; running: " : ", ";
    running += OnOneLine(trial.name(), kMaxTrialNameBytes) + " " + std::to_string(trial.step()) +
               "/" + (trial.total_steps() > 0 ? std::to_string(trial.total_steps()) : "?") +
               Printf(" at %.0f tok/s", trial.tokens_per_second());
  }
  return line + running;
}

}  // namespace

std::string Meter(const std::string& label, double fraction, const std::string& text, int width) {
  std::string cells(static_cast<size_t>(width), ' ');
  const double clamped = std::isfinite(fraction) ? std::clamp(fraction, 0.0, 1.0) : 0.0;
  const auto filled = static_cast<size_t>(std::lround(clamped * width));
  std::fill_n(cells.begin(), filled, '|');
  const size_t shown = std::min(text.size(), cells.size());
  cells.replace(cells.size() - shown, shown, text.substr(text.size() - shown));
  return label + "[" + cells + "]";
}

std::string DeviceName(const std::string& device, int32_t node_rank, bool several_nodes) {
  const std::string shown = OnOneLine(device, kMaxShownBytes);
  return several_nodes ? "node " + std::to_string(node_rank) + " " + shown : shown;
}

std::string DeviceLine(const v1::DeviceSample& sample, const std::string& name, size_t name_width) {
  const bool cpu = sample.device() == "cpu";
  std::string line = Pad(name, name_width) + " ";
  if (sample.has_utilization_percent()) {
    line += Meter(cpu ? "CPU" : "GPU", sample.utilization_percent() / 100,
                  Printf("%.0f%%", sample.utilization_percent()), kMeterWidth);
  } else {
    line += Meter(cpu ? "CPU" : "GPU", 0, "?", kMeterWidth);
  }
  const double total = static_cast<double>(sample.memory_total_bytes());
  const double used = static_cast<double>(sample.memory_used_bytes());
  const std::string amount = Printf("%.1f/", used / kGib) + Printf("%.1f GiB", total / kGib);
  line += ' ';
  line += Meter(cpu ? "RSS" : "MEM", total > 0 ? used / total : 0, amount, kMemoryMeterWidth);
  if (sample.has_power_watts()) line += Printf(" %.0f W", sample.power_watts());
  if (sample.has_temperature_celsius()) {
    line += Printf(" %.0f\u00b0C", sample.temperature_celsius());
  }
  return line;
}

std::string ProgressBar(int64_t step, int64_t total, int width) {
  int filled = 0;
  if (total > 0) {
    // In double: step x width overflows int64_t for the step counts a node may report.
    const double done =
        static_cast<double>(std::clamp<int64_t>(step, 0, total)) / static_cast<double>(total);
    filled = std::clamp(static_cast<int>(done * width), 0, width);
  }
  std::string bar = "[";
  bar.append(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(width - filled), '-');
  bar.push_back(']');
  return bar;
}

std::vector<std::string> WatchLines(const v1::ExperimentStatus& status) {
  const Columns columns = ColumnsOf(status);
  std::vector<std::string> lines;
  for (const v1::TrialStatus& trial : status.trials()) {
    lines.push_back(TrialLine(trial, columns));
    if (!trial.notice().empty()) {
      lines.push_back("    ! " + OnOneLine(trial.notice(), kMaxShownBytes));
    }
    const bool several_nodes =
        std::any_of(trial.devices().begin(), trial.devices().end(),
                    [](const v1::DeviceSample& device) { return device.node_rank() > 0; });
    std::vector<std::string> names;
    size_t device_width = 0;
    for (const v1::DeviceSample& device : trial.devices()) {
      names.push_back(DeviceName(device.device(), device.node_rank(), several_nodes));
      device_width = std::max(device_width, std::min(names.back().size(), kMaxDeviceNameWidth));
    }
    for (int i = 0; i < trial.devices_size(); ++i) {
      lines.push_back("    " +
                      DeviceLine(trial.devices(i), names[static_cast<size_t>(i)], device_width));
    }
  }
  return lines;
}

std::string WatchPrinter::Update(const v1::ExperimentStatus& status, Clock::time_point now) {
  return tty_ ? Redraw(status) : AppendChanges(status, now);
}

std::string WatchPrinter::Redraw(const v1::ExperimentStatus& status) {
  const std::vector<std::string> lines = WatchLines(status);
  // Up over the old table, then each line cleared and rewritten: no flicker, no scrollback spam.
  // The way up counts lines, so each line must take one row: the terminal's auto-wrap is off
  // while the table is drawn (DECAWM), and a line wider than the terminal is cut at its right
  // edge rather than wrapped onto a row the next redraw would not go back over.
  std::string out = "\x1b[?7l";
  if (drawn_lines_ > 0) out += "\x1b[" + std::to_string(drawn_lines_) + "F";
  const std::string header = "experiment " + std::to_string(status.id()) + " " +
                             OnOneLine(status.name(), kMaxShownBytes) + ": " +
                             OnOneLine(status.state(), kMaxShownBytes);
  out += "\x1b[2K" + header + "\n";
  for (const std::string& line : lines) out += "\x1b[2K" + line + "\n";
  // A table that shrank leaves old lines below; clear them.
  for (size_t i = lines.size() + 1; i < drawn_lines_; ++i) out += "\x1b[2K\n";
  drawn_lines_ = std::max(drawn_lines_, lines.size() + 1);
  return out + "\x1b[?7h";
}

std::string WatchPrinter::AppendChanges(const v1::ExperimentStatus& status, Clock::time_point now) {
  std::string out;
  if (!started_) {
    out += PlainHeader(status) + "\n";
    started_ = now;
  }
  const Columns columns = ColumnsOf(status);
  // Each new notice's text with the trials that got it, in the order first seen; indexed by text.
  std::vector<std::pair<std::string, std::vector<std::string>>> notices;
  std::map<std::string, size_t> notice_index;
  for (const v1::TrialStatus& trial : status.trials()) {
    const auto [found, first_seen] = seen_.try_emplace(trial.name());
    Seen& seen = found->second;
    if (seen.state != trial.state() && !(first_seen && trial.state() == "queued")) {
      out += TrialLine(trial, columns) + "\n";
    } else if (seen.step != trial.step()) {
      steps_moved_ = true;
    }
    if (!trial.notice().empty() && trial.notice() != seen.notice) {
      const auto [it, added] = notice_index.try_emplace(trial.notice(), notices.size());
      if (added) notices.emplace_back(trial.notice(), std::vector<std::string>());
      notices[it->second].second.push_back(OnOneLine(trial.name(), kMaxTrialNameBytes));
    }
    seen = {.state = trial.state(), .notice = trial.notice(), .step = trial.step()};
  }
  for (const auto& [text, trials] : notices) out += NoticeLine(text, trials) + "\n";
  if (out.empty() && steps_moved_ && now - last_written_ >= progress_interval_) {
    out = ProgressLine(status, std::chrono::duration_cast<std::chrono::seconds>(now - *started_)) +
          "\n";
    progress_interval_ = std::min(2 * progress_interval_, kLongestProgressInterval);
  }
  if (!out.empty()) {
    last_written_ = now;
    steps_moved_ = false;
  }
  return out;
}

}  // namespace llmctl::cli
