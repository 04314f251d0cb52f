// Fuzz target for ParseExperiment (common/experiment.h), with resolve_local_paths off so no input
// ever touches the file system: any bytes must parse or fail with a one-line
// "fuzz.yaml:LINE:COLUMN: problem" Status, never crash, hang, leak or trip a sanitizer. yaml-cpp is
// part of what runs, so this also watches for its known loops on bad input (see yaml_document.cc).
//
// Replayed over tests/fuzz/corpus/experiment/ by the `experiment_fuzz_replay` test. To fuzz for
// real (clang with libFuzzer; on Debian: apt-get install clang libclang-rt-14-dev), from the
// repository root, in bash:
//
//   SRCS="tests/fuzz/experiment_fuzz.cc
//         $(ls common/*.cc | grep -v -e _test.cc -e _main.cc -e logging.cc)"
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I.
//       $SRCS $(pkg-config --cflags --libs yaml-cpp) -o /tmp/experiment_fuzz    # (one line)
//   mkdir -p /tmp/experiment_corpus
//   OPTS="-max_total_time=180 -max_len=4096 -timeout=10 -rss_limit_mb=2048
//         -dict=tests/fuzz/experiment_fuzz.dict"
//   /tmp/experiment_fuzz $OPTS /tmp/experiment_corpus tests/fuzz/corpus/experiment
//
// New inputs land in /tmp/experiment_corpus. Inputs that crash (crash-*, timeout-*, leak-*, oom-*)
// go into tests/fuzz/corpus/experiment/ with the fix; so do a few that reach new code (`-merge=1`
// finds them), keeping the checked-in corpus small. yaml-cpp (the system library) has no coverage
// instrumentation, so only llmctl's own code guides the search.
//
// Beyond "no crash", the target checks the parser's promises: messages are UTF-8 whatever the
// input; an accepted experiment has at least one trial, unique non-empty names, UTF-8 text, each
// trial valid for its model when that is a preset, and each trial's config serialises to JSON text
// and reads back unchanged (as checkpoints store it).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>

#include "common/experiment.h"
#include "common/model_config.h"
#include "common/trial_config.h"

namespace {

void Check(bool condition) {
  if (!condition) std::abort();
}

// Strict UTF-8 (no overlong forms, surrogates or code points past U+10FFFF), what nlohmann::json
// insists on when it writes a string.
bool IsUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto byte = [&](size_t at) { return static_cast<unsigned char>(text[at]); };
    const unsigned char lead = byte(i);
    size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
    if (lead < 0x80) {
      length = 1;
    } else if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) low = 0xA0;
      if (lead == 0xED) high = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) low = 0x90;
      if (lead == 0xF4) high = 0x8F;
    } else {
      return false;
    }
    if (text.size() - i < length) return false;
    for (size_t k = 1; k < length; ++k) {
      const unsigned char c = byte(i + k);
      if (k == 1 ? (c < low || c > high) : (c < 0x80 || c > 0xBF)) return false;
    }
    i += length;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view yaml(reinterpret_cast<const char*>(data), size);
  llmctl::ExperimentParseOptions options;
  options.resolve_local_paths = false;
  llmctl::StatusOr<llmctl::Experiment> experiment =
      llmctl::ParseExperiment(yaml, "fuzz.yaml", options);
  if (!experiment.ok()) {
    Check(experiment.status().code() == llmctl::StatusCode::kInvalidArgument);
    Check(experiment.status().message().rfind("fuzz.yaml:", 0) == 0);
    // Messages must be UTF-8 whatever the input, so that they can be put into JSON.
    Check(IsUtf8(experiment.status().message()));
    return 0;
  }
  Check(!experiment->name.empty() && IsUtf8(experiment->name));
  Check(IsUtf8(experiment->description));
  for (const auto& [key, value] : experiment->target) Check(IsUtf8(key) && IsUtf8(value));
  Check(!experiment->trials.empty());
  std::set<std::string> names;
  for (const llmctl::Trial& trial : experiment->trials) {
    Check(!trial.name.empty());
    Check(names.insert(trial.name).second);
    Check(IsUtf8(trial.name) && IsUtf8(trial.description));
    const llmctl::ModelConfig* model = llmctl::FindPreset(trial.config.GetString("model"));
    if (model != nullptr) Check(llmctl::ValidateTrialConfig(trial.config, model).ok());
    const nlohmann::json json = trial.config.ToJson();
    const std::string text = json.dump();
    llmctl::StatusOr<llmctl::TrialConfig> back =
        llmctl::TrialConfig::FromJson(nlohmann::json::parse(text));
    Check(back.ok());
    Check(*back == trial.config);
    // ToJson carries which keys were set, so the checks that look at them agree after the trip.
    if (model != nullptr) Check(llmctl::ValidateTrialConfig(*back, model).ok());
  }
  return 0;
}
