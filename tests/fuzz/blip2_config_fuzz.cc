// Fuzz target for a BLIP-2 config.json (ParseBlip2Config, common/blip2_config.h): a model directory
// a user names, which llmctl estimate and submit, llmctld and llm-train all read.
//
// Beyond "no crash" (and no exception: nlohmann's typed reads throw on a member of another type):
// a refusal is InvalidArgument or Unimplemented and names the file; an accepted config counts its
// parameters without undefined behaviour and survives the round trip through ToHfConfigJson (what a
// merged model is saved with) unchanged.
//
// Replayed over tests/fuzz/corpus/blip2_config/ by the `blip2_config_fuzz_replay` test, with seeded
// mutations. To fuzz for real (clang with libFuzzer: apt-get install clang libclang-rt-14-dev),
// from the repository root, in bash:
//
//   SRCS="tests/fuzz/blip2_config_fuzz.cc
//         $(ls common/*.cc | grep -v -e _test.cc -e _main.cc -e logging.cc)"
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
//       -I. $SRCS $(pkg-config --cflags --libs yaml-cpp) -o /tmp/blip2_config_fuzz  # one line
//   mkdir -p /tmp/blip2_config_corpus
//   /tmp/blip2_config_fuzz -runs=200000 -max_len=4096 -timeout=10 -rss_limit_mb=2048
//       -dict=tests/fuzz/blip2_config_fuzz.dict /tmp/blip2_config_corpus
//       tests/fuzz/corpus/blip2_config                                           # one line
//
// Inputs that crash go into tests/fuzz/corpus/blip2_config/ with the fix.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/blip2_config.h"

namespace {

void Check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const nlohmann::json json = nlohmann::json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return 0;
  const llmctl::StatusOr<llmctl::Blip2Config> config =
      llmctl::ParseBlip2Config(json, "fuzz/config.json");
  if (!config.ok()) {
    Check(config.status().code() == llmctl::StatusCode::kInvalidArgument ||
          config.status().code() == llmctl::StatusCode::kUnimplemented);
    Check(config.status().message().rfind("fuzz/config.json", 0) == 0);
    return 0;
  }
  volatile int64_t parameters = llmctl::CountBlip2Parameters(*config).total();
  (void)parameters;
  const std::string written = llmctl::ToHfConfigJson(*config).dump();
  const llmctl::StatusOr<llmctl::Blip2Config> back =
      llmctl::ParseBlip2Config(nlohmann::json::parse(written), "back/config.json");
  Check(back.ok() && llmctl::ToHfConfigJson(*back).dump() == written);
  return 0;
}
