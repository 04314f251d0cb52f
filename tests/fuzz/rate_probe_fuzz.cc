// Fuzz target for a node's probe (common/estimate/rate_probe.h): the JSON `llm-train --probe`
// writes, which the agent reads, the controller takes in RegisterNode and stores, and `llmctl
// estimate`, `plan` and `submit` time trials at (ListNodes, `--rates`, LLMCTL_HOME/probe.json).
// Every hop is another process's bytes.
//
// Beyond "no crash": a refusal is InvalidArgument; a probe that parses writes itself back as the
// same document (what the store keeps is what was sent); and the time of each of a few fixed
// trials at its rates (full fine-tuning in fp32 and bf16, LoRA, QLoRA, 8-bit AdamW, the optimizer
// offloaded) is a finite, positive step and tokens/s, with every term of the step finite and not
// negative, and the probe's reference steps' calibration, where it gives one, inside the range the
// estimator accepts (a probe that parses cannot make the estimate print an absurd figure).
//
// Replayed over tests/fuzz/corpus/rate_probe/ by the `rate_probe_fuzz_replay` test, with seeded
// mutations. To fuzz for real (clang with libFuzzer: apt-get install clang libclang-rt-14-dev),
// from the repository root, in bash:
//
//   SRCS="tests/fuzz/rate_probe_fuzz.cc
//         $(ls common/*.cc common/estimate/*.cc |
//           grep -v -e _test.cc -e _main.cc -e logging.cc -e trainer_runs.cc)"
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
//       -I. $SRCS $(pkg-config --cflags --libs yaml-cpp) -o /tmp/rate_probe_fuzz  # one line
//   mkdir -p /tmp/rate_probe_corpus
//   /tmp/rate_probe_fuzz -runs=200000 -max_len=8192 -timeout=10 -rss_limit_mb=2048
//       -dict=tests/fuzz/rate_probe_fuzz.dict /tmp/rate_probe_corpus
//       tests/fuzz/corpus/rate_probe                                             # one line
//
// Inputs that crash go into tests/fuzz/corpus/rate_probe/ with the fix.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/estimate/gpus.h"
#include "common/estimate/rate_probe.h"
#include "common/estimate/reference_step.h"
#include "common/estimate/step_memory.h"
#include "common/estimate/step_time.h"
#include "common/estimate/step_work.h"
#include "common/trial_config.h"

namespace {

namespace estimate = llmctl::estimate;

void Check(bool condition) {
  if (!condition) std::abort();
}

// The reference trial of `c` with `sets` on top: the works the probe's rates time below.
estimate::StepWork WorkOf(estimate::MatmulClass c,
                          const std::vector<std::pair<std::string, std::string>>& sets) {
  llmctl::StatusOr<llmctl::TrialConfig> trial = estimate::ReferenceTrial(c);
  Check(trial.ok());
  for (const auto& [key, value] : sets) Check(trial->SetFromText(key, value).ok());
  llmctl::StatusOr<estimate::StepWork> work =
      estimate::EstimateStepWork(*trial, estimate::ReferenceModel());
  Check(work.ok());
  return *std::move(work);
}

// `work` with every micro-batch at a length new to the run: what the probe's new-shape cells and
// reference steps price (NewLengthCost).
estimate::StepWork AtNewLengths(estimate::StepWork work) {
  work.new_length_micro_batches = static_cast<double>(work.micro_batches);
  return work;
}

const std::vector<estimate::StepWork>& Works() {
  using estimate::MatmulClass;
  static const std::vector<estimate::StepWork> works = {
      WorkOf(MatmulClass::kFp32, {}),
      WorkOf(MatmulClass::kBf16, {}),
      AtNewLengths(WorkOf(MatmulClass::kFp32, {})),
      AtNewLengths(WorkOf(MatmulClass::kBf16, {})),
      WorkOf(MatmulClass::kFp32, {{"peft.method", "lora"}, {"peft.dropout", "0.05"}}),
      WorkOf(MatmulClass::kFp32, {{"peft.method", "qlora"}, {"peft.compute_dtype", "bf16"}}),
      WorkOf(MatmulClass::kFp32, {{"optimizer", "adamw_8bit"}}),
      WorkOf(MatmulClass::kFp32, {{"offload", "optimizer"}}),
  };
  return works;
}

// The reference trials' peaks with the probe's matmul buffers: each at least the peak without
// them and at most that plus the largest buffer.
void CheckPeaks(const estimate::MatmulBuffers& buffers) {
  uint64_t largest = 0;
  for (const auto* heads : {&buffers.fp32, &buffers.bf16}) {
    for (const estimate::HeadProductBuffers& h : *heads) {
      largest = std::max(largest, h.Largest());
    }
  }
  for (const estimate::MatmulClass c :
       {estimate::MatmulClass::kFp32, estimate::MatmulClass::kBf16}) {
    const llmctl::StatusOr<llmctl::TrialConfig> trial = estimate::ReferenceTrial(c);
    Check(trial.ok());
    const auto bare = estimate::EstimateStepMemory(*trial, estimate::ReferenceModel(), {});
    const auto buffered = estimate::EstimateStepMemory(*trial, estimate::ReferenceModel(), buffers);
    Check(bare.ok() && buffered.ok());
    Check(buffered->peak_bytes >= bare->peak_bytes &&
          buffered->peak_bytes - bare->peak_bytes <= largest);
  }
}

void CheckTimes(const estimate::RateProbe& probe) {
  const estimate::DeviceSpeed sheet = probe.device == "cuda"
                                          ? estimate::GpuSpeed(*estimate::GpuNamed("h100-80gb"))
                                          : estimate::CpuSpeed();
  const estimate::DeviceSpeed speed = estimate::ProbedSpeed(sheet, probe, "fuzz");
  CheckPeaks(speed.matmul_buffers);
  for (const double factor : {speed.probed_fp32_factor, speed.probed_bf16_factor}) {
    Check(factor == 0 ||
          (factor >= estimate::kMinMeasuredFactor && factor <= estimate::kMaxMeasuredFactor));
  }
  for (const estimate::StepWork& work : Works()) {
    const estimate::TimeEstimate time =
        estimate::EstimateTime(work, speed, estimate::DefaultCalibration(speed, work.family), 10);
    Check(std::isfinite(time.step_seconds) && time.step_seconds > 0);
    Check(std::isfinite(time.tokens_per_second) && time.tokens_per_second > 0);
    Check(std::isfinite(time.trial_seconds));
    for (const estimate::TimeTerm& term : time.terms) {
      Check(std::isfinite(term.seconds) && term.seconds >= 0);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const nlohmann::json json = nlohmann::json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return 0;
  const llmctl::StatusOr<estimate::RateProbe> probe = estimate::RateProbe::FromJson(json);
  if (!probe.ok()) {
    Check(probe.status().code() == llmctl::StatusCode::kInvalidArgument);
    return 0;
  }
  // What the controller stores and sends on is the same probe.
  const std::string written = probe->ToJson().dump();
  const llmctl::StatusOr<estimate::RateProbe> again =
      estimate::RateProbe::FromJson(nlohmann::json::parse(written));
  Check(again.ok() && again->ToJson().dump() == written);
  CheckTimes(*probe);
  return 0;
}
