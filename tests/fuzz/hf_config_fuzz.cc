// Fuzz target for ParseHfConfigJson (common/model_config.h): any bytes must parse or fail with an
// InvalidArgument Status, never crash, hang, leak or trip a sanitizer (signed overflow included).
//
// Replayed over tests/fuzz/corpus/hf_config/ by the `hf_config_fuzz_replay` test. To fuzz for real
// (clang with libFuzzer; on Debian: apt-get install clang libclang-rt-14-dev), from the repository
// root, in bash:
//
//   SRCS="tests/fuzz/hf_config_fuzz.cc
//         $(ls common/*.cc | grep -v -e _test.cc -e _main.cc -e logging.cc)"
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I.
//       $SRCS $(pkg-config --cflags --libs yaml-cpp) -o /tmp/hf_config_fuzz    # (one line)
//   mkdir -p /tmp/hf_config_corpus
//   OPTS="-max_total_time=180 -max_len=4096 -timeout=10 -rss_limit_mb=2048
//         -dict=tests/fuzz/hf_config_fuzz.dict"
//   /tmp/hf_config_fuzz $OPTS /tmp/hf_config_corpus tests/fuzz/corpus/hf_config
//
// New inputs land in /tmp/hf_config_corpus. Inputs that crash (crash-*, timeout-*, leak-*) go into
// tests/fuzz/corpus/hf_config/ with the fix; so do a few that reach new code (`-merge=1` finds
// them), keeping the checked-in corpus small.
//
// Beyond "no crash", the target checks the parser's promises on every accepted config: it passes
// ValidateModelConfig, ParameterCount runs without undefined behaviour, and it survives the round
// trip through ToHfConfigJson unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/model_config.h"

namespace {

void Check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  llmctl::StatusOr<llmctl::ModelConfig> config = llmctl::ParseHfConfigJson(json, "fuzz.json");
  if (!config.ok()) {
    Check(config.status().code() == llmctl::StatusCode::kInvalidArgument);
    Check(config.status().message().rfind("fuzz.json: ", 0) == 0);
    return 0;
  }
  Check(llmctl::ValidateModelConfig(*config).ok());
  volatile uint64_t parameters = llmctl::ParameterCount(*config);
  (void)parameters;
  // What llmctl writes for a checkpoint must read back as the same shape.
  const std::string written = llmctl::ToHfConfigJson(*config).dump();
  llmctl::StatusOr<llmctl::ModelConfig> back = llmctl::ParseHfConfigJson(written, "back.json");
  Check(back.ok());
  Check(*back == *config);
  return 0;
}
