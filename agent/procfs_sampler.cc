#include "agent/procfs_sampler.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "agent/node_info.h"
#include "common/event_stream.h"
#include "common/files.h"

namespace llmctl::agent {
namespace {

// /proc/<pid>/stat lines are short; a longer one is no stat line.
constexpr size_t kMaxStatBytes = 4096;

std::optional<int64_t> ParseField(std::string_view field) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (error != std::errc() || end != field.data() + field.size()) return std::nullopt;
  return value;
}

}  // namespace

bool AddStatLine(std::string_view stat, pid_t process_group, ProcessGroupUsage& usage) {
  // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so fields count from
  // the last ')'; field 3 (state) is the first after it.
  const size_t close = stat.rfind(')');
  if (close == std::string_view::npos) return false;
  std::vector<std::string_view> fields;  // fields[0] is field 3
  std::string_view rest = stat.substr(close + 1);
  while (!rest.empty() && fields.size() < 22) {
    const size_t start = rest.find_first_not_of(" \n");
    if (start == std::string_view::npos) break;
    rest.remove_prefix(start);
    const size_t end = std::min(rest.find_first_of(" \n"), rest.size());
    fields.push_back(rest.substr(0, end));
    rest.remove_prefix(end);
  }
  if (fields.size() < 22) return false;
  const auto field = [&](int number) { return ParseField(fields[number - 3]); };
  const std::optional<int64_t> group = field(5);
  if (!group) return false;
  if (*group != process_group) return true;
  int64_t ticks = 0;
  for (int number : {14, 15, 16, 17}) {  // utime, stime, cutime, cstime
    const std::optional<int64_t> value = field(number);
    if (!value) return false;
    ticks += *value;
  }
  const std::optional<int64_t> rss = field(24);
  if (!rss) return false;
  ++usage.processes;
  usage.cpu_ticks += ticks;
  usage.rss_pages += std::max<int64_t>(*rss, 0);
  return true;
}

ProcfsSampler::ProcfsSampler(std::string proc)
    : proc_(std::move(proc)),
      ticks_per_second_(static_cast<double>(::sysconf(_SC_CLK_TCK))),
      page_bytes_(::sysconf(_SC_PAGESIZE)) {}

StatusOr<ProcessGroupUsage> ProcfsSampler::ReadGroup(pid_t process_group) const {
  DIR* dir = ::opendir(proc_.c_str());
  if (dir == nullptr) {
    return UnavailableError("cannot list " + proc_ + ": " + std::strerror(errno));
  }
  ProcessGroupUsage usage;
  while (const dirent* entry = ::readdir(dir)) {
    if (!ParseField(entry->d_name)) continue;  // not a process
    // A process that exits meanwhile is simply not counted.
    auto stat = ReadFileToString(proc_ + "/" + entry->d_name + "/stat", kMaxStatBytes);
    if (stat.ok()) AddStatLine(*stat, process_group, usage);
  }
  ::closedir(dir);
  return usage;
}

StatusOr<std::vector<DeviceReading>> ProcfsSampler::Sample(const SampleTarget& target) {
  std::vector<DeviceReading> readings;
  if (target.process_group <= 0) return readings;
  const auto now = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(const ProcessGroupUsage usage, ReadGroup(target.process_group));
  if (usage.processes == 0) return readings;  // not started yet, or gone
  DeviceReading reading;
  reading.device = event_stream::kHostDevice;
  reading.memory_used_bytes = usage.rss_pages * page_bytes_;
  ASSIGN_OR_RETURN(const std::string meminfo, ReadFileToString(proc_ + "/meminfo", 1 << 20));
  ASSIGN_OR_RETURN(reading.memory_total_bytes, ParseMemTotal(meminfo));
  if (auto previous = previous_.find(target.run_dir); previous != previous_.end()) {
    const double seconds = std::chrono::duration<double>(now - previous->second.at).count();
    // A process that exited unreaped since takes its time along: never below zero.
    const int64_t ticks = std::max<int64_t>(usage.cpu_ticks - previous->second.cpu_ticks, 0);
    if (seconds > 0) reading.utilization_percent = ticks / ticks_per_second_ / seconds * 100;
  }
  previous_[target.run_dir] = Previous{now, usage.cpu_ticks};
  readings.push_back(reading);
  return readings;
}

}  // namespace llmctl::agent
