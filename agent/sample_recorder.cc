#include "agent/sample_recorder.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>

#include "agent/process.h"
#include "agent/supervisor.h"
#include "common/files.h"
#include "common/foreign_json.h"
#include "common/logging.h"

namespace llmctl::agent {
namespace {

using json = nlohmann::json;

// The worker's process group while the worker runs (worker.json, written by the supervisor), else
// 0.
pid_t WorkerProcessGroup(const std::string& run_dir) {
  auto text = ReadFileToString(run_dir + "/" + kWorkerFile, 1 << 16);
  if (!text.ok()) return 0;
  const json worker = ParseForeignJson(*text);
  if (!worker.is_object()) return 0;
  // value() throws on a field of another type: each is checked first.
  const auto number = [&](const char* key) -> int64_t {
    const auto it = worker.find(key);
    return it != worker.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
  };
  const auto pid = static_cast<pid_t>(number("pid"));
  if (pid <= 0 || !IsSameProcessAlive(pid, static_cast<uint64_t>(number("start_time")))) return 0;
  const auto pgid = static_cast<pid_t>(number("pgid"));
  return pgid > 1 ? pgid : pid;
}

Status AppendLines(const std::string& path, const std::string& lines) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return UnavailableError("cannot open " + path + ": " + std::strerror(errno));
  // One write of whole lines, cut off again when it is cut short (a full disk): a reader never
  // counts half a line, and the next round's lines never join one.
  bool cut_off = false;
  const Status written = AppendWholeLines(fd, lines, cut_off);
  ::close(fd);
  if (written.ok()) return written;
  return UnavailableError(
      std::string("cannot write ")
          .append(path)
          .append(": ")
          .append(written.message())
          .append(cut_off ? "; these readings are lost" : "; a part of a line is left at its end"));
}

}  // namespace

int64_t ReadingDates::UnixMs(const std::string& run_dir,
                             std::chrono::system_clock::time_point wall_now,
                             std::chrono::steady_clock::time_point steady_now) {
  const FirstReading& first =
      first_readings_.try_emplace(run_dir, FirstReading{wall_now, steady_now}).first->second;
  const auto date = first.wall + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                     steady_now - first.steady);
  return std::chrono::duration_cast<std::chrono::milliseconds>(date.time_since_epoch()).count();
}

void ReadingDates::Forget(const std::string& run_dir) { first_readings_.erase(run_dir); }

SampleRecorder::SampleRecorder(RunManager* runs, DeviceSampler* sampler,
                               std::chrono::milliseconds interval)
    : runs_(runs), sampler_(sampler), interval_(interval) {
  thread_ = std::thread([this] { Loop(); });
}

SampleRecorder::~SampleRecorder() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  stop_.NotifyAll();
  thread_.join();
}

void SampleRecorder::Loop() {
  auto next = std::chrono::steady_clock::now();
  while (true) {
    {
      MutexLock lock(mutex_);
      while (!stopping_ && stop_.WaitUntil(mutex_, next)) {
      }
      if (stopping_) return;
    }
    SampleOnce();
    // On a fixed beat, not one interval after a slow round: readings stay a second apart.
    next += interval_;
    const auto now = std::chrono::steady_clock::now();
    if (next < now) next = now;
  }
}

void SampleRecorder::SampleOnce() {
  std::set<std::string> sampled;
  for (const RunningRun& run : runs_->Running()) {
    SampleTarget target{run.dir, run.device_type, run.device_indices, WorkerProcessGroup(run.dir)};
    sampled.insert(run.dir);
    auto readings = sampler_->Sample(target);
    const int64_t unix_ms =
        dates_.UnixMs(run.dir, std::chrono::system_clock::now(), std::chrono::steady_clock::now());
    std::string lines;
    if (readings.ok()) {
      for (const DeviceReading& reading : *readings) {
        lines += FormatSampleLine(TimedReading{unix_ms, reading}) + "\n";
      }
    }
    Status status = readings.status();
    if (status.ok() && !lines.empty()) {
      status = AppendLines(run.dir + "/" + kSamplesFile, lines);
    }
    // Once per run: a sampler that fails fails every second.
    if (!status.ok() && warned_.insert(run.dir).second) {
      std::cerr << LogLinePrefix(LogLevel::kWarning) << "llm-agent: sampling the devices of "
                << DescribeRunKey(run.key) << ": " << status.message() << std::endl;
    }
  }
  for (const std::string& dir : sampled_) {
    if (!sampled.contains(dir)) {
      sampler_->Forget(dir);
      warned_.erase(dir);
      dates_.Forget(dir);
    }
  }
  sampled_ = std::move(sampled);
}

}  // namespace llmctl::agent
