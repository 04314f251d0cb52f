#include "common/machine_cpu.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace llmctl {
namespace {

// A line's fields after its name, as counters; nullopt when one is not a non-negative integer.
std::optional<std::vector<int64_t>> Counters(std::string_view fields) {
  std::vector<int64_t> values;
  size_t i = 0;
  while (i < fields.size()) {
    if (fields[i] == ' ') {
      ++i;
      continue;
    }
    int64_t value = 0;
    const auto [end, error] =
        std::from_chars(fields.data() + i, fields.data() + fields.size(), value);
    if (error != std::errc() || value < 0 ||
        (end != fields.data() + fields.size() && *end != ' ')) {
      return std::nullopt;
    }
    values.push_back(value);
    i = static_cast<size_t>(end - fields.data());
  }
  return values;
}

double Seconds(const timeval& t) {
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
}

}  // namespace

StatusOr<MachineTicks> ParseProcStat(std::string_view text) {
  MachineTicks ticks;
  bool summed = false;
  std::istringstream lines{std::string(text)};
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("cpu ", 0) == 0) {
      const std::optional<std::vector<int64_t>> v = Counters(std::string_view(line).substr(4));
      // user nice system idle iowait irq softirq steal (guest and guest_nice follow, inside user).
      if (!v || v->size() < 8) {
        return InvalidArgumentError("/proc/stat: the cpu line has not 8 counters: " + line);
      }
      const std::vector<int64_t>& c = *v;
      ticks.busy = c[0] + c[1] + c[2] + c[5] + c[6] + c[7];
      summed = true;
    } else if (line.size() > 3 && line.rfind("cpu", 0) == 0 &&
               std::isdigit(static_cast<unsigned char>(line[3]))) {
      ++ticks.cpus;
    }
  }
  if (!summed) return InvalidArgumentError("/proc/stat: no cpu line");
  if (ticks.cpus == 0) return InvalidArgumentError("/proc/stat: no cpuN line");
  return ticks;
}

std::optional<CpuCounters> ReadCpuCounters() {
  std::ifstream file("/proc/stat");
  if (!file) return std::nullopt;
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  StatusOr<MachineTicks> machine = ParseProcStat(text);
  if (!machine.ok()) return std::nullopt;
  rusage own{};
  if (getrusage(RUSAGE_SELF, &own) != 0) return std::nullopt;
  return CpuCounters{.at = std::chrono::steady_clock::now(),
                     .machine = *machine,
                     .own_seconds = Seconds(own.ru_utime) + Seconds(own.ru_stime)};
}

std::optional<double> OthersCpuShare(const CpuCounters& before, const CpuCounters& after,
                                     double ticks_per_second) {
  const double wall = std::chrono::duration<double>(after.at - before.at).count();
  const int cpus = after.machine.cpus;
  if (!(wall > 0) || cpus <= 0 || !(ticks_per_second > 0)) return std::nullopt;
  const double busy =
      static_cast<double>(after.machine.busy - before.machine.busy) / ticks_per_second;
  const double others = busy - (after.own_seconds - before.own_seconds);
  return std::clamp(others / (wall * cpus), 0.0, 1.0);
}

double ProcStatTicksPerSecond() {
  const long ticks = sysconf(_SC_CLK_TCK);
  return ticks > 0 ? static_cast<double>(ticks) : 100.0;
}

}  // namespace llmctl
