#include "controller/cli/watch_view.h"

#include <algorithm>
#include <cstdio>

namespace llmctl::cli {
namespace {

constexpr int kBarWidth = 20;

std::string Mib(int64_t bytes) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buffer;
}

std::string Pad(const std::string& text, size_t width) {
  return text.size() >= width ? text : text + std::string(width - text.size(), ' ');
}

}  // namespace

std::string ProgressBar(int64_t step, int64_t total, int width) {
  int filled = 0;
  if (total > 0) {
    filled = static_cast<int>(std::clamp<int64_t>(step, 0, total) * width / total);
  }
  std::string bar = "[";
  bar.append(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(width - filled), '-');
  bar.push_back(']');
  return bar;
}

std::vector<std::string> WatchLines(const v1::ExperimentStatus& status) {
  size_t name_width = 5, state_width = 9;
  for (const v1::TrialStatus& trial : status.trials()) {
    name_width = std::max(name_width, trial.name().size());
    state_width = std::max(state_width, trial.state().size());
  }
  std::vector<std::string> lines;
  for (const v1::TrialStatus& trial : status.trials()) {
    std::string line =
        Pad(trial.name(), name_width) + "  " + Pad(trial.state(), state_width) + "  " +
        ProgressBar(trial.step(), trial.total_steps(), kBarWidth) + " " +
        Pad(std::to_string(trial.step()) + "/" +
                (trial.total_steps() > 0 ? std::to_string(trial.total_steps()) : std::string("?")),
            9);
    char speed[32];
    std::snprintf(speed, sizeof speed, "%8.0f tok/s", trial.tokens_per_second());
    line += std::string(speed) + "  mem " + Mib(trial.allocated_bytes()) + " (peak " +
            Mib(trial.peak_bytes()) + ")";
    if (!trial.node().empty()) line += "  on " + trial.node();
    if (!trial.error().empty()) line += "  " + trial.error();
    lines.push_back(std::move(line));
    if (!trial.notice().empty()) lines.push_back("    ! " + trial.notice());
  }
  return lines;
}

std::string WatchPrinter::Update(const v1::ExperimentStatus& status) {
  const std::vector<std::string> lines = WatchLines(status);
  std::string out;
  if (tty_) {
    // Up over the old table, then each line cleared and rewritten: no flicker, no scrollback spam.
    if (drawn_lines_ > 0) out += "\x1b[" + std::to_string(drawn_lines_) + "F";
    const std::string header =
        "experiment " + std::to_string(status.id()) + " " + status.name() + ": " + status.state();
    out += "\x1b[2K" + header + "\n";
    for (const std::string& line : lines) out += "\x1b[2K" + line + "\n";
    // A table that shrank leaves old lines below; clear them.
    for (size_t i = lines.size() + 1; i < drawn_lines_; ++i) out += "\x1b[2K\n";
    drawn_lines_ = std::max(drawn_lines_, lines.size() + 1);
    return out;
  }
  for (int i = 0; i < status.trials_size(); ++i) {
    std::string& last = last_[status.trials(i).name()];
    if (last == lines[i]) continue;
    last = lines[i];
    out += lines[i] + "\n";
  }
  return out;
}

}  // namespace llmctl::cli
