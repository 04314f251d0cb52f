// A fixed probe for the rate probe's tests: no machine's measured rates, so what a test expects
// follows from its figures by the arithmetic alone.
#ifndef LLMCTL_COMMON_ESTIMATE_RATE_PROBE_TEST_SUPPORT_H_
#define LLMCTL_COMMON_ESTIMATE_RATE_PROBE_TEST_SUPPORT_H_

#include <string>

#include "common/estimate/rate_probe.h"
#include "common/estimate/step_time.h"

namespace llmctl::estimate::test_support {

inline RateProbe FixedProbe() {
  RateProbe p;
  p.measured_at = "2026-11-29T01:00:00Z";
  p.seconds = 9.5;
  p.rounds = 8;
  p.device = "cpu";
  p.device_name = "AMD EPYC 7763 64-Core Processor";
  p.threads = 2;
  p.versions.llmctl = "0.4.0";
  p.versions.libtorch = "2.9.1";
  // fp32 at three sizes; bf16 emulated, 60x slower, at two (the third too slow to finish).
  p.matmul = {{"fp32", 256, 4e10},
              {"fp32", 512, 6e10},
              {"fp32", 1024, 7e10},
              {"bf16", 256, 0.8e9},
              {"bf16", 512, 1e9}};
  p.sdpa = {{"fp32", 2e10}, {"bf16", 1e9}, {"fp16", 1e9}};
  p.memory_bytes_per_s = 1.25e10;
  p.launch_seconds = 5e-6;
  p.host_adamw_values_per_s = 4e8;
  p.adamw_8bit_values_per_s = 9e7;
  p.nf4_dequant_values_per_s = 6e8;
  p.dropout_values_per_s = 2.5e8;
  p.loss = {{"aten", "fp32", 2e8},
            {"fused", "fp32", 7e8},
            {"aten", "bf16", 2.5e8},
            {"fused", "bf16", 5e8}};
  p.jpeg_pixels_per_s = 6e7;
  p.png_pixels_per_s = 2.5e7;
  return p;
}

// FixedProbe with its reference steps (a real CPU probe has both).
inline RateProbe FixedProbeWithReferenceSteps() {
  RateProbe p = FixedProbe();
  p.reference_steps = {{"fp32", 0.2}, {"bf16", 30}};
  return p;
}

// The seconds of `e`'s term `name` (-1: no such term).
inline double TermSeconds(const TimeEstimate& e, const std::string& name) {
  for (const TimeTerm& t : e.terms) {
    if (t.name == name) return t.seconds;
  }
  return -1.0;
}

}  // namespace llmctl::estimate::test_support

#endif  // LLMCTL_COMMON_ESTIMATE_RATE_PROBE_TEST_SUPPORT_H_
