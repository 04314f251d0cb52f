// Fuzz target for an experiment file with `--set key=value` overrides on top, as llm-train takes
// them (ParseExperiment; trainer/cli/trial_args.cc's ApplyOverrides: TrialConfig::SetFromText per
// override, LocalizeNodePaths, ApplyLabSpellings; then ValidateTrialConfig), and for the estimate
// of every trial that passes on a LLaMA-family preset (common/estimate: what `llmctl estimate` and
// llmctld's Submit compute from the same keys). The input is the file's text, optionally followed
// by a line
// `#--set` (a YAML comment, so the file parses the same) and one `key=value` a line.
//
// Beyond "no crash": refusals are InvalidArgument, and the estimate of a valid trial is a finite,
// positive time over finite work (JSON has no infinity: a non-finite prediction could not be
// stored; issue 37).
//
// Replayed over tests/fuzz/corpus/experiment_set/ by the `experiment_set_fuzz_replay` test, with
// seeded mutations. To fuzz for real (clang with libFuzzer: apt-get install clang
// libclang-rt-14-dev), from the repository root, in bash:
//
//   SRCS="tests/fuzz/experiment_set_fuzz.cc
//         $(ls common/*.cc common/estimate/*.cc |
//           grep -v -e _test.cc -e _main.cc -e logging.cc -e trainer_runs.cc)"
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
//       -I. $SRCS $(pkg-config --cflags --libs yaml-cpp) -o /tmp/experiment_set_fuzz  # one line
//   mkdir -p /tmp/experiment_set_corpus
//   /tmp/experiment_set_fuzz -runs=200000 -max_len=4096 -timeout=10 -rss_limit_mb=2048
//       -dict=tests/fuzz/experiment_set_fuzz.dict /tmp/experiment_set_corpus
//       tests/fuzz/corpus/experiment_set                                          # one line
//
// Inputs that crash go into tests/fuzz/corpus/experiment_set/ with the fix.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/estimate/gpus.h"
#include "common/estimate/step_memory.h"
#include "common/estimate/step_time.h"
#include "common/estimate/step_work.h"
#include "common/experiment.h"
#include "common/model_config.h"
#include "common/trial_config.h"

namespace {

void Check(bool condition) {
  if (!condition) std::abort();
}

constexpr std::string_view kSetMarker = "#--set\n";

// The checks of a trial that passed: its estimate on a CPU and on a GPU of the table.
void CheckEstimate(const llmctl::TrialConfig& config, const llmctl::ModelConfig& model) {
  namespace estimate = llmctl::estimate;
  llmctl::StatusOr<estimate::StepMemoryEstimate> memory =
      estimate::EstimateStepMemory(config, model, {});
  if (!memory.ok()) {
    Check(memory.status().code() == llmctl::StatusCode::kInvalidArgument);
    return;
  }
  llmctl::StatusOr<estimate::StepWork> work = estimate::EstimateStepWork(config, model);
  if (!work.ok()) {
    Check(work.status().code() == llmctl::StatusCode::kInvalidArgument);
    return;
  }
  Check(estimate::StepWork::FromJson(work->ToJson()).ok());
  for (const estimate::DeviceSpeed& speed :
       {estimate::CpuSpeed(), estimate::GpuSpeed(*estimate::GpuNamed("h100-80gb"))}) {
    const estimate::TimeEstimate time =
        estimate::EstimateTime(*work, speed, estimate::DefaultCalibration(speed, work->family),
                               config.GetInt("train.max_steps"));
    Check(std::isfinite(time.step_seconds) && time.step_seconds > 0);
    Check(std::isfinite(time.tokens_per_second) && std::isfinite(time.trial_seconds));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t marker = input.find(kSetMarker);
  const std::string_view yaml = input.substr(0, marker);
  std::string_view sets =
      marker == std::string_view::npos ? "" : input.substr(marker + kSetMarker.size());

  llmctl::ExperimentParseOptions options;
  options.resolve_local_paths = false;
  llmctl::StatusOr<llmctl::Experiment> experiment =
      llmctl::ParseExperiment(yaml, "fuzz.yaml", options);
  if (!experiment.ok()) {
    Check(experiment.status().code() == llmctl::StatusCode::kInvalidArgument);
    return 0;
  }
  // llm-train runs one trial; the first stands for it (more would only repeat the sets' work).
  llmctl::TrialConfig config = experiment->trials.front().config;
  while (!sets.empty()) {
    const size_t newline = sets.find('\n');
    const std::string_view line = sets.substr(0, newline);
    sets = newline == std::string_view::npos ? "" : sets.substr(newline + 1);
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) return 0;  // llm-train: "--set expects key=value"
    const llmctl::Status status = config.SetFromText(line.substr(0, eq), line.substr(eq + 1));
    if (!status.ok()) {
      Check(status.code() == llmctl::StatusCode::kInvalidArgument);
      return 0;
    }
  }
  llmctl::LocalizeNodePaths(config);
  llmctl::ApplyLabSpellings(config);
  const llmctl::ModelConfig* model = llmctl::FindPreset(config.GetString("model"));
  const llmctl::Status valid = llmctl::ValidateTrialConfig(config, model);
  if (!valid.ok()) {
    Check(valid.code() == llmctl::StatusCode::kInvalidArgument);
    return 0;
  }
  if (model != nullptr && config.GetString("data.format") != "imagefolder") {
    CheckEstimate(config, *model);
  }
  return 0;
}
