// Fuzz target for llmctld's config file (controller/config.h): ApplyConfigYaml on any bytes as
// /etc/llmctl/controller.yaml, then the listen address it set through ValidateListenAddress as
// ResolveControllerConfig checks it, and ParseDuration on the whole input. A user's file: it must
// give settings or a refusal, never a crash, an exception (yaml-cpp throws; nothing of it may
// escape) or a hang.
//
// Beyond "no crash", the header's promises:
// - a refusal is InvalidArgument naming the file and a line from 1 up ("controller.yaml:L:C: ...");
// - the settings kept are usable: every duration is above 0 and the daemon's deadlines (now plus
//   it, on the system and the steady clock, in nanoseconds) do not overflow, which UBSan would
//   report; min_transfer_rate is above 0;
// - a listen address ValidateListenAddress takes is "unix:/absolute" or "host:port" with a port
//   from 0 to 65535 whose host is loopback unless allow_remote_listen said true;
// - a duration ParseDuration takes is digits then ms, s, m or h, and at most kMaxDuration.
//
// Replayed over tests/fuzz/corpus/controller_config/ by the `controller_config_fuzz_replay` test,
// with seeded mutations. To fuzz for real (clang with libFuzzer: apt-get install clang
// libclang-rt-14-dev), from the repository root, in bash:
//
//   SRCS="tests/fuzz/controller_config_fuzz.cc controller/config.cc common/byte_size.cc
//         common/files.cc common/text.cc common/status.cc common/errno_status.cc
//         common/atomic_file.cc common/yaml_document.cc"
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
//       -I. $SRCS $(pkg-config --cflags grpc++) $(pkg-config --cflags --libs yaml-cpp)
//       -o /tmp/controller_config_fuzz                                            # one line
//   mkdir -p /tmp/controller_config_corpus
//   /tmp/controller_config_fuzz -max_total_time=300 -max_len=4096 -timeout=10
//       -dict=tests/fuzz/controller_config_fuzz.dict /tmp/controller_config_corpus
//       tests/fuzz/corpus/controller_config                                       # one line
//
// Inputs that crash go into tests/fuzz/corpus/controller_config/ with the fix.
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "controller/config.h"

namespace {

using llmctl::StatusCode;
using llmctl::controller::ControllerConfig;

void Check(bool condition) {
  if (!condition) std::abort();
}

constexpr char kFile[] = "/etc/llmctl/controller.yaml";

// What the daemon does with a duration: deadlines on both clocks (dispatcher.cc, agent_links.cc,
// dispatcher_core.cc). An overflow here is UBSan's report.
void CheckUsable(std::chrono::milliseconds duration) {
  Check(duration.count() > 0);
  Check(duration <= llmctl::controller::kMaxDuration);
  const auto system_deadline = std::chrono::system_clock::now() + duration;
  const auto steady_deadline = std::chrono::steady_clock::now() + duration;
  Check(system_deadline > std::chrono::system_clock::time_point());
  Check(steady_deadline > std::chrono::steady_clock::time_point());
}

// "FILE:LINE:COLUMN: ..." with LINE at least 1.
void CheckNamesFileAndLine(std::string_view message) {
  const std::string prefix = std::string(kFile) + ":";
  Check(message.starts_with(prefix));
  const std::string_view rest = message.substr(prefix.size());
  int64_t line = 0;
  const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), line);
  Check(error == std::errc() && line >= 1 && end != rest.data() + rest.size() && *end == ':');
  Check(message.find(": ", prefix.size()) != std::string_view::npos);
}

bool IsLoopback(std::string_view host) {
  return host == "127.0.0.1" || host == "[::1]" || host == "localhost";
}

// An address ValidateListenAddress took, by a rule of this file's own.
void CheckListenAddress(std::string_view address, bool allow_remote) {
  if (address.starts_with("unix:")) {
    Check(address.size() > 5 && address[5] == '/');
    Check(llmctl::controller::UnixSocketPath(address) == std::string(address.substr(5)));
    return;
  }
  Check(!llmctl::controller::UnixSocketPath(address).has_value());
  const size_t colon = address.rfind(':');
  Check(colon != std::string_view::npos && colon > 0);
  const std::string_view port = address.substr(colon + 1);
  // Digits only (leading zeros are still the port's number).
  Check(!port.empty() && port.find_first_not_of("0123456789") == std::string_view::npos);
  int value = 0;
  const auto [end, error] = std::from_chars(port.data(), port.data() + port.size(), value);
  Check(error == std::errc() && end == port.data() + port.size() && value >= 0 && value <= 65535);
  Check(allow_remote || IsLoopback(address.substr(0, colon)));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  ControllerConfig config;
  const llmctl::Status applied = llmctl::controller::ApplyConfigYaml(text, kFile, config);
  if (!applied.ok()) {
    Check(applied.code() == StatusCode::kInvalidArgument);
    CheckNamesFileAndLine(applied.message());
  } else {
    CheckUsable(config.requeue_after);
    CheckUsable(config.agent_call_deadline);
    CheckUsable(config.health_interval);
    Check(config.min_transfer_bytes_per_second > 0);
    if (!config.listen.empty()) {
      const llmctl::Status listen =
          llmctl::controller::ValidateListenAddress(config.listen, config.allow_remote_listen);
      if (listen.ok()) {
        CheckListenAddress(config.listen, config.allow_remote_listen);
      } else {
        Check(listen.code() == StatusCode::kInvalidArgument);
        Check(listen.message().starts_with("listen address '"));
      }
    }
  }

  const llmctl::StatusOr<std::chrono::milliseconds> duration =
      llmctl::controller::ParseDuration(text);
  if (duration.ok()) {
    CheckUsable(*duration);
    const size_t digits = text.find_first_not_of("0123456789");
    Check(digits > 0 && digits != std::string_view::npos);
    const std::string_view unit = text.substr(digits);
    Check(unit == "ms" || unit == "s" || unit == "m" || unit == "h");
  } else {
    Check(duration.status().code() == StatusCode::kInvalidArgument);
    Check(duration.status().message().starts_with("expected a duration"));
  }
  return 0;
}
