#include "common/machine_cpu.h"

#include <sched.h>
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

StatusOr<MachineTicks> ParseProcStat(std::string_view text, const std::set<int>& only) {
  MachineTicks ticks;
  int listed = 0;
  std::istringstream lines{std::string(text)};
  for (std::string line; std::getline(lines, line);) {
    // "cpuN user nice system idle iowait irq softirq steal guest guest_nice"; the "cpu " line
    // before them is their sum over every CPU.
    if (line.size() <= 3 || line.rfind("cpu", 0) != 0 ||
        !std::isdigit(static_cast<unsigned char>(line[3]))) {
      continue;
    }
    const size_t name_end = std::min(line.find(' '), line.size());
    int cpu = 0;
    const auto [id_end, id_error] = std::from_chars(line.data() + 3, line.data() + name_end, cpu);
    const std::optional<std::vector<int64_t>> v = Counters(std::string_view(line).substr(name_end));
    if (id_error != std::errc() || id_end != line.data() + name_end || !v || v->size() < 8) {
      return InvalidArgumentError("/proc/stat: a cpuN line without a CPU's 8 counters: " + line);
    }
    ++listed;
    if (!only.empty() && !only.contains(cpu)) continue;
    const std::vector<int64_t>& c = *v;
    ticks.busy += c[0] + c[1] + c[2] + c[5] + c[6] + c[7];
    ++ticks.cpus;
  }
  if (listed == 0) return InvalidArgumentError("/proc/stat: no cpuN line");
  if (ticks.cpus == 0) {
    return InvalidArgumentError("/proc/stat: none of this process's " +
                                std::to_string(only.size()) + " CPUs is listed");
  }
  return ticks;
}

std::set<int> AllowedCpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return {};
  std::set<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &mask)) cpus.insert(cpu);
  }
  return cpus;
}

std::optional<CpuCounters> ReadCpuCounters() {
  std::ifstream file("/proc/stat");
  if (!file) return std::nullopt;
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  StatusOr<MachineTicks> machine = ParseProcStat(text, AllowedCpus());
  if (!machine.ok()) return std::nullopt;
  rusage own{};
  if (getrusage(RUSAGE_SELF, &own) != 0) return std::nullopt;
  return CpuCounters{.at = std::chrono::steady_clock::now(),
                     .machine = *machine,
                     .own_seconds = Seconds(own.ru_utime) + Seconds(own.ru_stime),
                     .own_system_seconds = Seconds(own.ru_stime)};
}

std::optional<double> OwnKernelShare(const CpuCounters& before, const CpuCounters& after) {
  const double own = after.own_seconds - before.own_seconds;
  if (!(own > 0)) return std::nullopt;
  return std::clamp((after.own_system_seconds - before.own_system_seconds) / own, 0.0, 1.0);
}

std::optional<double> OthersCpuShare(const CpuCounters& before, const CpuCounters& after,
                                     double ticks_per_second) {
  const double wall = std::chrono::duration<double>(after.at - before.at).count();
  const int cpus = after.machine.cpus;
  // A process moved to other CPUs between the readings (its affinity changed) has two sums of
  // different CPUs' ticks.
  if (!(wall > 0) || cpus <= 0 || cpus != before.machine.cpus || !(ticks_per_second > 0)) {
    return std::nullopt;
  }
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
