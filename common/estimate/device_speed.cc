// The rates a device has before anything is measured on it (the data sheets' GPUs and CPU), and the
// calibration that scales a step's nominal time to what runs measured: built in, from a probe's
// reference steps, or from the store's runs (step_time.h).

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "common/estimate/step_time.h"
#include "common/median.h"
#include "common/printf.h"

namespace llmctl::estimate {
namespace {

// Device constants the data sheets do not give. A CUDA launch costs a few microseconds of the
// host's time; a CPU ATen op about as much in dispatch and OpenMP fork/join.
constexpr double kGpuLaunchSeconds = 6e-6;
constexpr double kCpuLaunchSeconds = 6e-6;
// An offloaded AdamW step on the host: 16 B read and written per value at a server's memory rate.
constexpr double kHostAdamValuesPerSecond = 2e9;
constexpr double kNodeNetworkBytesPerSecond = 1.25e9;  // 10 GbE between Chameleon nodes
constexpr double kGpuStartupSeconds = 10;              // process, CUDA context, cuBLAS, data
constexpr double kCpuStartupSeconds = 1;
constexpr double kGpuBuildBytesPerSecond = 20e9;  // random initialisation on the device
constexpr double kLoadBytesPerSecond = 1e9;       // safetensors from a local disk
// The CPU's nominal rates: 2 cores x 32 fp32 FLOP a cycle (two 256-bit FMA pipes) x 3 GHz; bf16
// dot products twice that; memory about 20 GB/s.
constexpr double kCpuFp32Flops = 2 * 32 * 3e9;
constexpr double kCpuMemoryBytesPerSecond = 20e9;
// The CPU's 8-bit AdamW (trainer/train/adamw_8bit.cc) dequantises both moments, updates them and
// searches the nearest of 256 codes for each: about 12 ns a value on the CPU lab's 2 cores (its
// adam-8bit and activation-checkpointing rows, bench/time_rank.py), 240 B of traffic's worth at
// the nominal 20 GB/s.
constexpr double kCpuAdamW8bitValuesPerSecond = kCpuMemoryBytesPerSecond / 240;
// trainer/quant's NF4 dequantisation on the CPU: a lookup, a block's scale and a conversion a value
// (11-30, the Zen 4's probes: 0.7-0.8 G values/s on 2 threads).
constexpr double kCpuNf4DequantValuesPerSecond = 0.75e9;
// A dropout mask's Bernoulli draws on the CPU: ATen's generator, a value at a time (11-30, Zen 4:
// a LoRA row's 283k-value masks took 1.3-1.4 ms each on 2 threads, 0.2 G values/s).
constexpr double kCpuDropoutValuesPerSecond = 0.2e9;
// The loss over a step's logits on the CPU, forward and backward (12-02, the Zen 4's probe over 64
// x 32,768 logits on 2 threads): ATen's cross-entropy 0.22 G fp32 logits/s and 0.24 G bf16 (its
// exp and log, 4-5 ns a logit where a copy of it takes 0.1-0.3), the fused kernel 0.70 G and 0.48
// G.
constexpr LossRates kCpuLossLogitsPerSecond = {
    .aten_fp32 = 0.22e9, .aten_bf16 = 0.24e9, .fused_fp32 = 0.70e9, .fused_bf16 = 0.48e9};
// A captioning step's images on one host thread (common/image: libjpeg-turbo or libpng, PIL's
// bicubic resize to 224 x 224, CLIP's normalisation), in source pixels a second: the probe's
// 640 x 480 synthetic photo on the 2-core Zen 4 here (11-30: JPEG 1 image in 4.6 ms, PNG in
// 9.2 ms). No GPU host has been measured; a server core is taken to match.
constexpr double kHostJpegPixelsPerSecond = 67e6;
constexpr double kHostPngPixelsPerSecond = 33e6;
// Measured over nominal: the calibration without measured runs. H200: the median over the 11-26
// run's finished LLaMA rows (step_time_test.cc recomputes it); CPU: the CPU lab's rows on the
// machine CpuSpeed describes (bench/time_rank.py).
constexpr double kH200Bf16Factor = 1.774;
constexpr double kH200Fp32Factor = 1.4251;
constexpr double kCpuLabBf16Factor = 1.1400;
constexpr double kCpuLabFp32Factor = 0.9657;
// BLIP-2 on the CPU spends about twice its counted work: image decoding and the Q-Former's and
// T5's attention on ATen's fp32 math path are not in it (the cpu-lab-blip2 rows,
// bench/time_rank.py). No BLIP-2 row has run on a GPU: there the LLaMA rows' factors serve.
constexpr double kCpuLabBlip2Bf16Factor = 2.2512;
constexpr double kCpuLabBlip2Fp32Factor = 1.6867;
// With a probe's rates (rate_probe.h) the terms are the node's own: no factor from another
// machine.
constexpr double kProbedFactor = 1;

// How fast a stored run's steps ran against the device's probe: the probe's pace canary seconds
// over the run's (1.5: 1.5x as fast); none where either has no pace.
std::optional<double> PaceAgainstProbe(const DeviceSpeed& device, const MeasuredRun& run) {
  if (!(device.pace_seconds > 0 && run.pace_seconds > 0)) return std::nullopt;
  return device.pace_seconds / run.pace_seconds;
}

}  // namespace

DeviceSpeed GpuSpeed(const Gpu& gpu) {
  const GpuRates& r = gpu.rates;
  return {.name = gpu.name,
          .bf16_flops = r.bf16_tflops * 1e12,
          .fp32_flops = r.fp32_tflops * 1e12,
          .bf16_flops_by_shape = {},
          .fp32_flops_by_shape = {},
          .bf16_head_flops_by_shape = {},
          .fp32_head_flops_by_shape = {},
          .bf16_attention_by_length = {},
          .fp32_attention_by_length = {},
          .memory_bytes_per_s = r.memory_tbps * 1e12,
          .launch_seconds = kGpuLaunchSeconds,
          .launches_overlap = true,
          .host_optimizer_values_per_s = kHostAdamValuesPerSecond,
          // A GPU's own 8-bit step is memory traffic (StepWork::memory_bytes); a CPU work's timed
          // here (any work has a finite time on any device) moves CUDA's 16 B a value.
          .adamw_8bit_values_per_s = r.memory_tbps * 1e12 / 16,
          // Likewise its NF4 dequantisation's 22.5 B a value.
          .nf4_dequant_values_per_s = r.memory_tbps * 1e12 / 22.5,
          .dropout_values_per_s = 0,
          // A GPU's loss is memory-bound: its bytes time it (LossTerm).
          .loss_logits_per_s = {},
          .jpeg_pixels_per_s = kHostJpegPixelsPerSecond,
          .png_pixels_per_s = kHostPngPixelsPerSecond,
          .host_link_bytes_per_s = r.host_link_gbps * 1e9,
          .interconnect_bytes_per_s = r.peer_link_gbps * 1e9,
          .network_bytes_per_s = kNodeNetworkBytesPerSecond,
          .startup_seconds = kGpuStartupSeconds,
          .model_build_bytes_per_s = kGpuBuildBytesPerSecond,
          .model_load_bytes_per_s = kLoadBytesPerSecond,
          .rates = ""};
}

DeviceSpeed CpuSpeed() {
  return {.name = "cpu",
          .bf16_flops = kCpuFp32Flops * 2,
          .fp32_flops = kCpuFp32Flops,
          .bf16_flops_by_shape = {},
          .fp32_flops_by_shape = {},
          .bf16_head_flops_by_shape = {},
          .fp32_head_flops_by_shape = {},
          .bf16_attention_by_length = {},
          .fp32_attention_by_length = {},
          .memory_bytes_per_s = kCpuMemoryBytesPerSecond,
          .launch_seconds = kCpuLaunchSeconds,
          .host_optimizer_values_per_s = kCpuMemoryBytesPerSecond / 16,
          .adamw_8bit_values_per_s = kCpuAdamW8bitValuesPerSecond,
          .nf4_dequant_values_per_s = kCpuNf4DequantValuesPerSecond,
          .dropout_values_per_s = kCpuDropoutValuesPerSecond,
          .loss_logits_per_s = kCpuLossLogitsPerSecond,
          .jpeg_pixels_per_s = kHostJpegPixelsPerSecond,
          .png_pixels_per_s = kHostPngPixelsPerSecond,
          .host_link_bytes_per_s = 0,  // the same memory
          .interconnect_bytes_per_s = kCpuMemoryBytesPerSecond / 4,
          .network_bytes_per_s = kNodeNetworkBytesPerSecond,
          .startup_seconds = kCpuStartupSeconds,
          .model_build_bytes_per_s = kCpuMemoryBytesPerSecond / 8,
          .model_load_bytes_per_s = kLoadBytesPerSecond,
          .rates = ""};
}

Calibration DefaultCalibration(const DeviceSpeed& device, ModelFamily family) {
  if (!device.rates.empty() && family == ModelFamily::kLlama &&
      (device.probed_bf16_factor > 0 || device.probed_fp32_factor > 0)) {
    // A class the probe did not step takes the other's factor, as Calibrate does.
    const double bf16 =
        device.probed_bf16_factor > 0 ? device.probed_bf16_factor : device.probed_fp32_factor;
    const double fp32 =
        device.probed_fp32_factor > 0 ? device.probed_fp32_factor : device.probed_bf16_factor;
    return {.bf16_factor = bf16,
            .fp32_factor = fp32,
            .source = "the probe's reference steps (bf16 " + Printf("%.3f", bf16) + ", fp32 " +
                      Printf("%.3f", fp32) + ")"};
  }
  if (!device.rates.empty()) {
    return {.bf16_factor = kProbedFactor,
            .fp32_factor = kProbedFactor,
            .source = "built-in for measured rates"};
  }
  if (device.name == "cpu" && family == ModelFamily::kBlip2) {
    return {.bf16_factor = kCpuLabBlip2Bf16Factor,
            .fp32_factor = kCpuLabBlip2Fp32Factor,
            .source = "built-in: the BLIP-2 CPU lab on a 2-core AMD EPYC (Zen 4)"};
  }
  if (device.name == "cpu") {
    return {.bf16_factor = kCpuLabBf16Factor,
            .fp32_factor = kCpuLabFp32Factor,
            .source = "built-in: the CPU lab on a 2-core AMD EPYC (Zen 4)"};
  }
  return {.bf16_factor = kH200Bf16Factor,
          .fp32_factor = kH200Fp32Factor,
          .source = "built-in: the 11-26 H200 run's LLaMA rows (docs/gpu-runs/2026-11-26-h200)"};
}

Calibration Calibrate(const DeviceSpeed& device, ModelFamily family,
                      const std::vector<MeasuredRun>& runs) {
  // A LLaMA run stored before 12-05 has its memory traffic at the one memory rate, where a work
  // counted now takes the probe's element-wise rates (several times it on a CPU): its factor
  // would scale another nominal time.
  // Likewise one stored before the sixty-third stop (12-06) has its layers' element-wise ops at
  // the element-wise product's rate, where a probe's layer cells now time them.
  const bool elementwise_rates =
      !device.fp32_elementwise.empty() || !device.bf16_elementwise.empty();
  const bool layer_rates = !device.layer_elementwise.empty();
  std::vector<double> ratios[2];
  int paced_runs = 0;
  for (const MeasuredRun& run : runs) {
    if (run.work.family != family) continue;
    if (family == ModelFamily::kLlama &&
        ((elementwise_rates && !(run.work.elementwise_tensor_bytes > 0)) ||
         (layer_rates && !(run.work.layer_memory_bytes > 0)))) {
      continue;
    }
    // The measured step: its tokens over all ranks at the measured rate, at the probe's pace
    // where both have one.
    const std::optional<double> pace = PaceAgainstProbe(device, run);
    const double measured = run.seconds_per_token *
                            static_cast<double>(run.work.tokens * run.work.world_size) *
                            pace.value_or(1.0);
    const double factor = MeasuredFactor(run.work, device, measured);
    // A time no step of this work takes on this device: another process's error, not a run.
    if (!(factor >= kMinMeasuredFactor && factor <= kMaxMeasuredFactor)) continue;
    ratios[run.work.matmul_class == MatmulClass::kBf16 ? 0 : 1].push_back(factor);
    if (pace) ++paced_runs;
  }
  Calibration c = DefaultCalibration(device, family);
  // The machine's pace is its own, whichever model ran: every run with a pace counts.
  std::vector<double> paces;
  for (const MeasuredRun& run : runs) {
    if (const std::optional<double> pace = PaceAgainstProbe(device, run)) paces.push_back(*pace);
  }
  if (!paces.empty()) c.pace = Median(paces);
  const std::string pace_said =
      paces.empty() ? ""
                    : Printf("; the machine at %.2f of its probe's pace over ", c.pace) +
                          std::to_string(paces.size()) + (paces.size() == 1 ? " run" : " runs");
  if (ratios[0].empty() && ratios[1].empty()) {
    c.source += pace_said;
    return c;
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  };
  c.bf16_runs = static_cast<int>(ratios[0].size());
  c.fp32_runs = static_cast<int>(ratios[1].size());
  c.paced_runs = paced_runs;
  const double bf16 = ratios[0].empty() ? median(ratios[1]) : median(ratios[0]);
  const double fp32 = ratios[1].empty() ? median(ratios[0]) : median(ratios[1]);
  c.bf16_factor = bf16;
  c.fp32_factor = fp32;
  c.source = std::to_string(c.runs()) + " measured " + std::string(ModelFamilyName(family)) +
             " run" + (c.runs() == 1 ? "" : "s") + " on " + device.name + " (" +
             std::to_string(c.bf16_runs) + " bf16, " + std::to_string(c.fp32_runs) + " fp32" +
             (paced_runs > 0 ? ", " + std::to_string(paced_runs) + " at the probe's pace" : "") +
             ")" + pace_said;
  return c;
}

}  // namespace llmctl::estimate
