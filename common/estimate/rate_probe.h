// A node's own rates, measured once by `llm-train --probe` (trainer/train/rate_probe.h) on the
// machine its trials run on, and what the time estimate (step_time.h) makes of them: the probe's
// matmul, memory, launch and optimizer rates in place of the data sheet's. No LibTorch: the CLI
// reads the probe's JSON and the estimator uses it.
//
// The JSON (version 2), one document:
//   {"version": 2, "measured_at": "2026-11-29T01:20:00Z", "seconds": 9.6,
//    "identity": {"device": "cpu", "device_name": "AMD EPYC 7763 64-Core Processor", "threads": 2,
//                 "versions": {llm-train --version --json}},
//    "matmul": [{"dtype": "fp32", "size": 512, "tokens": 512, "flops_per_s": 5.1e10}, ...],
//    "sdpa": [{"dtype": "fp32", "flops_per_s": 2.0e10}, ...],
//    "memory_bytes_per_s": 1.2e10, "launch_seconds": 4e-6,
//    "host_adamw_values_per_s": 3e8,
//    "host_to_device_bytes_per_s": 0, "device_to_host_bytes_per_s": 0}
// A matmul is (tokens x size) times (size x size), at each of a few token counts (a micro-batch's
// rows: the fewer, the shorter the weight gradient's reduction and the worse a GEMM splits over
// threads); sdpa is causal attention over 2 x 8 heads
// x 128 tokens x 64; memory is one copy of 64 MiB (bytes read plus written); a launch is a
// one-element add; the host's AdamW is one fused step over 4 Mi fp32 values (an offloaded step). A rate of 0 was not
// measured (a dtype too slow to finish a matmul in its share of the time; copies without a device).
// Version 1 (before 11-29's tenth stop) had no "tokens": its matmuls were 512 tokens, and it is read
// as such.
#ifndef LLMCTL_COMMON_ESTIMATE_RATE_PROBE_H_
#define LLMCTL_COMMON_ESTIMATE_RATE_PROBE_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/estimate/step_time.h"
#include "common/status.h"
#include "common/trainer_versions.h"

namespace llmctl::estimate {

inline constexpr int kRateProbeVersion = 2;
// The tokens of a version 1 probe's matmuls, and the token count a rate is taken at when a step's
// micro-batch is not known.
inline constexpr int64_t kProbeMatmulTokens = 512;

struct ProbedMatmul {
  std::string dtype;  // "fp32", "bf16", "fp16"
  int64_t size = 0;   // the weight's rows and columns
  double flops_per_s = 0;
  int64_t tokens = kProbeMatmulTokens;  // the activation's rows
};

struct ProbedAttention {
  std::string dtype;
  double flops_per_s = 0;
};

struct RateProbe {
  int version = kRateProbeVersion;
  std::string measured_at;  // UTC, ISO 8601
  double seconds = 0;       // how long the probe took
  // What it was measured on: a change of any of these calls for a new probe.
  std::string device;       // "cpu" or "cuda"
  std::string device_name;  // the CPU's model name or the GPU's
  int threads = 0;          // LibTorch's intra-op threads
  TrainerVersions versions;
  std::vector<ProbedMatmul> matmul;
  std::vector<ProbedAttention> sdpa;
  double memory_bytes_per_s = 0;
  double launch_seconds = 0;
  double host_adamw_values_per_s = 0;  // fp32 AdamW on the host (an offloaded step)
  double host_to_device_bytes_per_s = 0;
  double device_to_host_bytes_per_s = 0;

  nlohmann::ordered_json ToJson() const;
  // InvalidArgument naming the field: not an object, another version, a field missing, of the
  // wrong type, negative or not finite, or no fp32 matmul.
  static StatusOr<RateProbe> FromJson(const nlohmann::json& json);

  // The rate of `dtype`'s matmul at the size nearest `size` that was measured, at `tokens` rows:
  // linear in log(tokens) between the two measured token counts around it, the nearest one's
  // outside them (0: none measured).
  double MatmulFlops(const std::string& dtype, int64_t size,
                     int64_t tokens = kProbeMatmulTokens) const;
  // (tokens, rate) of `dtype`'s matmuls at `size`'s nearest measured size, by tokens.
  std::vector<TokenRate> MatmulRatesByTokens(const std::string& dtype, int64_t size) const;
  // Whether `other` was measured on the same device, versions and threads.
  bool SameIdentity(const RateProbe& other) const;
  // One line: "cpu AMD EPYC 7763 (2 threads, LibTorch 2.9.1), 2026-11-29T01:20:00Z".
  std::string Summary() const;
};

// The weight size whose probed matmul rate a step's matmuls take: the middle of the probe's sizes,
// near the small models' hidden sizes (384 to 768) and a LLaMA block's projections per token row.
inline constexpr int64_t kProbeMatmulSizeUsed = 512;

// `sheet` (a data sheet's DeviceSpeed) with the probe's rates in place of its nominal ones: fp32
// and bf16 matmuls, memory, launches, the host's optimizer step and the host link; the rest (start-up,
// links to other ranks and nodes) stays the sheet's. `source` names the probe. The probe must be of
// the same kind of device (cpu for cpu).
DeviceSpeed ProbedSpeed(const DeviceSpeed& sheet, const RateProbe& probe,
                        const std::string& source);

}  // namespace llmctl::estimate

#endif  // LLMCTL_COMMON_ESTIMATE_RATE_PROBE_H_
