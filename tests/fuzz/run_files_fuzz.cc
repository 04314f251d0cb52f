// Fuzz target for the small parsers the agent runs on files that another process wrote, read back
// after a restart: a line of a run's samples.jsonl (ParseSampleLine, agent/sample_recorder.h), a
// run's ended.json (RunEndFromJson, agent/run_files.h) and exit.json (ParseWorkerExit,
// agent/supervisor.h), /proc/meminfo (ParseMemTotal, agent/node_info.h), and the supervisor's
// command line (ParseSupervisorArgs, agent/supervisor.h; the arguments are the input's
// NUL-separated pieces). The first input byte picks the parser (its value modulo 5); the rest is
// the text. Never a crash, an exception or a hang, and the headers' promises:
// - sample line: InvalidArgument "device sample line ..." or a reading with unix_ms and memory
//   figures >= 0, a device named, finite optional figures, that FormatSampleLine writes back as a
//   line that parses to the same reading;
// - ended.json: an end or none; an end written back (RunEndToJson, as WriteJsonFile dumps it)
//   reads back the same;
// - exit.json: DataLoss naming the file, or exactly one of an exit code 0-255 or a signal 1-64;
// - meminfo: InvalidArgument, or bytes from 0 to INT64_MAX, whole KiB;
// - supervisor arguments: InvalidArgument with the usage or the limit, or a command whose grace is
//   0 to kMaxSupervisorGrace (the supervisor adds it to the steady clock: an overflow there is
//   UBSan's report) and whose SupervisorArgv parses back to the same command.
//
// Replayed over tests/fuzz/corpus/run_files/ by the `run_files_fuzz_replay` test, with seeded
// mutations. To fuzz for real (clang with libFuzzer: apt-get install clang libclang-rt-14-dev),
// from the repository root, in bash:
//
//   SRCS="tests/fuzz/run_files_fuzz.cc agent/sample_line.cc agent/run_files.cc
//         agent/supervisor.cc agent/node_info.cc agent/process.cc common/status.cc
//         common/foreign_json.cc common/files.cc common/atomic_file.cc common/text.cc
//         common/cpu_model.cc common/trainer_versions.cc common/byte_size.cc
//         common/nvml/gpu_probe.cc common/logging.cc common/child_process.cc
//         common/errno_status.cc"
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
//       -I. $SRCS $(pkg-config --cflags --libs spdlog) -ldl -o /tmp/run_files_fuzz  # one line
//   mkdir -p /tmp/run_files_corpus
//   /tmp/run_files_fuzz -max_total_time=300 -max_len=4096 -timeout=10
//       -dict=tests/fuzz/run_files_fuzz.dict /tmp/run_files_corpus
//       tests/fuzz/corpus/run_files                                               # one line
//
// Inputs that crash go into tests/fuzz/corpus/run_files/ with the fix.
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/node_info.h"
#include "agent/outcome.h"
#include "agent/run_files.h"
#include "agent/sample_recorder.h"
#include "agent/supervisor.h"
#include "common/foreign_json.h"
#include "common/status.h"

namespace {

using llmctl::StatusCode;
namespace agent = llmctl::agent;

void Check(bool condition) {
  if (!condition) std::abort();
}

void CheckFiniteOrNone(const std::optional<double>& value) {
  Check(!value.has_value() || std::isfinite(*value));
}

void SampleLine(std::string_view text) {
  const llmctl::StatusOr<agent::TimedReading> timed = agent::ParseSampleLine(text);
  if (!timed.ok()) {
    Check(timed.status().code() == StatusCode::kInvalidArgument);
    Check(timed.status().message().starts_with("device sample line "));
    return;
  }
  const agent::DeviceReading& reading = timed->reading;
  Check(timed->unix_ms >= 0 && reading.memory_used_bytes >= 0 && reading.memory_total_bytes >= 0);
  Check(!reading.device.empty());
  CheckFiniteOrNone(reading.utilization_percent);
  CheckFiniteOrNone(reading.power_watts);
  CheckFiniteOrNone(reading.temperature_celsius);
  const llmctl::StatusOr<agent::TimedReading> again =
      agent::ParseSampleLine(agent::FormatSampleLine(*timed));
  Check(again.ok() && again->unix_ms == timed->unix_ms && again->reading == reading);
}

void EndedJson(std::string_view text) {
  const nlohmann::json json = llmctl::ParseForeignJson(text);
  if (json.is_discarded()) return;
  const std::optional<agent::RunEnd> end = agent::RunEndFromJson(json);
  if (!end) return;
  const std::optional<agent::RunEnd> again =
      agent::RunEndFromJson(llmctl::ParseForeignJson(llmctl::DumpLossy(agent::RunEndToJson(*end))));
  Check(again.has_value() && again->outcome == end->outcome && again->exit_code == end->exit_code &&
        again->error == end->error);
}

void ExitJson(std::string_view text) {
  constexpr char kPath[] = "/var/lib/llmctl/runs/7/t/1/exit.json";
  const llmctl::StatusOr<agent::WorkerExit> exit = agent::ParseWorkerExit(text, kPath);
  if (!exit.ok()) {
    Check(exit.status().code() == StatusCode::kDataLoss);
    Check(exit.status().message().starts_with(std::string(kPath) + " does not say"));
    return;
  }
  if (exit->signal != 0) {
    Check(exit->signal >= 1 && exit->signal <= 64 && exit->exit_code == 0);
  } else {
    Check(exit->exit_code >= 0 && exit->exit_code <= 255);
  }
}

void MemInfo(std::string_view text) {
  const llmctl::StatusOr<int64_t> bytes = agent::ParseMemTotal(text);
  if (!bytes.ok()) {
    Check(bytes.status().code() == StatusCode::kInvalidArgument);
    Check(!bytes.status().message().empty());
    return;
  }
  Check(*bytes >= 0 && *bytes % 1024 == 0);
}

void SupervisorArgs(std::string_view text) {
  std::vector<std::string> args;
  for (size_t start = 0;;) {
    const size_t end = text.find('\0', start);
    args.emplace_back(text.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  const llmctl::StatusOr<agent::SupervisorCommand> command = agent::ParseSupervisorArgs(args);
  if (!command.ok()) {
    Check(command.status().code() == StatusCode::kInvalidArgument);
    Check(command.status().message().find("usage: ") != std::string::npos ||
          command.status().message().starts_with("--grace-ms "));
    return;
  }
  Check(command->grace.count() >= 0 && command->grace <= agent::kMaxSupervisorGrace);
  // What RunSupervisor does with it; an overflow is UBSan's report.
  const auto kill_at = std::chrono::steady_clock::now() + command->grace;
  Check(kill_at > std::chrono::steady_clock::time_point());
  Check(args.size() >= 7 && command->run_dir == args[2] && !command->worker_argv.empty());
  Check(std::vector<std::string>(args.begin() + 6, args.end()) == command->worker_argv);
  const llmctl::StatusOr<agent::SupervisorCommand> again =
      agent::ParseSupervisorArgs(agent::SupervisorArgv(args[0], *command));
  Check(again.ok() && again->run_dir == command->run_dir && again->grace == command->grace &&
        again->worker_argv == command->worker_argv);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 5) {
    case 0:
      SampleLine(text);
      break;
    case 1:
      EndedJson(text);
      break;
    case 2:
      ExitJson(text);
      break;
    case 3:
      MemInfo(text);
      break;
    default:
      SupervisorArgs(text);
      break;
  }
  return 0;
}
