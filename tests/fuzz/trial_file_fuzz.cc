// Fuzz target for the trial JSON the controller sends an agent (agent/trial_file.h: MakeTrialFile
// turns it into the one-trial experiment file llm-train reads). The agent runs trials as root and
// takes no one's word for the JSON: any bytes must make a file or fail with InvalidArgument, never
// crash or hang.
//
// Beyond "no crash", an accepted input keeps the file's promises: the YAML reads back as one
// experiment whose output_dir stays inside the run's output/, and the rank count is the trial's
// devices (at least 1) for ddp and fsdp.
//
// Replayed over tests/fuzz/corpus/trial_file/ by the `trial_file_fuzz_replay` test, with seeded
// mutations. To fuzz for real (clang with libFuzzer: apt-get install clang libclang-rt-14-dev),
// from the repository root, in bash:
//
//   SRCS="tests/fuzz/trial_file_fuzz.cc agent/trial_file.cc
//         $(ls common/*.cc | grep -v -e _test.cc -e _main.cc -e logging.cc)"
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
//       -I. $SRCS $(pkg-config --cflags --libs yaml-cpp) -o /tmp/trial_file_fuzz  # one line
//   mkdir -p /tmp/trial_file_corpus
//   /tmp/trial_file_fuzz -runs=200000 -max_len=4096 -timeout=10
//       -dict=tests/fuzz/trial_file_fuzz.dict /tmp/trial_file_corpus
//       tests/fuzz/corpus/trial_file                                              # one line
//
// Inputs that crash go into tests/fuzz/corpus/trial_file/ with the fix.
#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "agent/trial_file.h"
#include "common/experiment.h"

namespace {

void Check(bool condition) {
  if (!condition) std::abort();
}

constexpr char kOutput[] = "/var/lib/llmctl/runs/7/output";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string json(reinterpret_cast<const char*>(data), size);
  llmctl::StatusOr<llmctl::agent::TrialFile> file = llmctl::agent::MakeTrialFile(
      json, {{"data.path", "/var/cache/llmctl/inputs/0a1b/train.jsonl"}}, kOutput);
  if (!file.ok()) {
    Check(file.status().code() == llmctl::StatusCode::kInvalidArgument);
    Check(!file.status().message().empty());
    return 0;
  }
  Check(file->ranks >= 1);
  // The file reads back as YAML, and its output_dir is the run's output/ or below it.
  const YAML::Node root = YAML::Load(file->yaml);
  Check(root.IsMap());
  const std::string output_dir = root["output_dir"].as<std::string>("");
  Check(output_dir == kOutput || output_dir.starts_with(std::string(kOutput) + "/"));
  Check(output_dir.find("/../") == std::string::npos && !output_dir.ends_with("/.."));
  llmctl::ExperimentParseOptions options;
  options.resolve_local_paths = false;
  llmctl::StatusOr<llmctl::Experiment> experiment =
      llmctl::ParseExperiment(file->yaml, "trial.yaml", options);
  if (experiment.ok()) Check(experiment->trials.size() == 1);
  return 0;
}
