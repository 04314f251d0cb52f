#include "controller/cli/watch_view.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace llmctl::cli {
namespace {

constexpr int kBarWidth = 20;
constexpr int kMeterWidth = 20;
constexpr int kMemoryMeterWidth = 30;  // its text ("61.2/80.0 GiB") takes half
constexpr double kGib = 1 << 30;

std::string Mib(int64_t bytes) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buffer;
}

std::string Pad(const std::string& text, size_t width) {
  return text.size() >= width ? text : text + std::string(width - text.size(), ' ');
}

std::string Format(const char* format, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, value);
  return buffer;
}

// The widths of the name and state columns: aligned across the experiment's trials.
struct Columns {
  size_t name = 5;
  size_t state = 9;
};

Columns ColumnsOf(const v1::ExperimentStatus& status) {
  Columns columns;
  for (const v1::TrialStatus& trial : status.trials()) {
    columns.name = std::max(columns.name, trial.name().size());
    columns.state = std::max(columns.state, trial.state().size());
  }
  return columns;
}

// A trial's own line and its notice, without its devices: what plain output compares.
std::vector<std::string> TrialLines(const v1::TrialStatus& trial, const Columns& columns) {
  std::string line =
      Pad(trial.name(), columns.name) + "  " + Pad(trial.state(), columns.state) + "  " +
      ProgressBar(trial.step(), trial.total_steps(), kBarWidth) + " " +
      Pad(std::to_string(trial.step()) + "/" +
              (trial.total_steps() > 0 ? std::to_string(trial.total_steps()) : std::string("?")),
          9);
  char speed[32];
  std::snprintf(speed, sizeof speed, "%8.0f tok/s", trial.tokens_per_second());
  line += std::string(speed) + "  mem " + Mib(trial.allocated_bytes()) + " (peak " +
          Mib(trial.peak_bytes());
  if (trial.ranks_size() > 1) {
    // A multi-rank trial: the highest rank's peak, then each rank's.
    line += ", max of ";
    line += std::to_string(trial.ranks_size());
    line += " ranks:";
    for (const v1::RankMemory& rank : trial.ranks()) {
      line += ' ';
      line += Mib(rank.peak_bytes());
    }
  }
  line += ')';
  if (!trial.node().empty()) line += "  on " + trial.node();
  if (!trial.error().empty()) line += "  " + trial.error();
  std::vector<std::string> lines = {std::move(line)};
  if (!trial.notice().empty()) lines.push_back("    ! " + trial.notice());
  return lines;
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
  return several_nodes ? "node " + std::to_string(node_rank) + " " + device : device;
}

std::string DeviceLine(const v1::DeviceSample& sample, const std::string& name, size_t name_width) {
  const bool cpu = sample.device() == "cpu";
  std::string line = Pad(name, name_width) + " ";
  if (sample.has_utilization_percent()) {
    line += Meter(cpu ? "CPU" : "GPU", sample.utilization_percent() / 100,
                  Format("%.0f%%", sample.utilization_percent()), kMeterWidth);
  } else {
    line += Meter(cpu ? "CPU" : "GPU", 0, "?", kMeterWidth);
  }
  const double total = static_cast<double>(sample.memory_total_bytes());
  const double used = static_cast<double>(sample.memory_used_bytes());
  const std::string amount = Format("%.1f/", used / kGib) + Format("%.1f GiB", total / kGib);
  line += ' ';
  line += Meter(cpu ? "RSS" : "MEM", total > 0 ? used / total : 0, amount, kMemoryMeterWidth);
  if (sample.has_power_watts()) line += Format(" %.0f W", sample.power_watts());
  if (sample.has_temperature_celsius()) {
    line += Format(" %.0f\u00b0C", sample.temperature_celsius());
  }
  return line;
}

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
  const Columns columns = ColumnsOf(status);
  std::vector<std::string> lines;
  for (const v1::TrialStatus& trial : status.trials()) {
    for (std::string& line : TrialLines(trial, columns)) {
      lines.push_back(std::move(line));
    }
    const bool several_nodes =
        std::any_of(trial.devices().begin(), trial.devices().end(),
                    [](const v1::DeviceSample& device) { return device.node_rank() > 0; });
    std::vector<std::string> names;
    size_t device_width = 0;
    for (const v1::DeviceSample& device : trial.devices()) {
      names.push_back(DeviceName(device.device(), device.node_rank(), several_nodes));
      device_width = std::max(device_width, names.back().size());
    }
    for (int i = 0; i < trial.devices_size(); ++i) {
      lines.push_back("    " +
                      DeviceLine(trial.devices(i), names[static_cast<size_t>(i)], device_width));
    }
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
  const Columns columns = ColumnsOf(status);
  for (const v1::TrialStatus& trial : status.trials()) {
    std::string text;
    for (const std::string& line : TrialLines(trial, columns)) {
      text += line + "\n";
    }
    std::string& last = last_[trial.name()];
    if (last == text) continue;
    last = text;
    out += text;
  }
  return out;
}

}  // namespace llmctl::cli
