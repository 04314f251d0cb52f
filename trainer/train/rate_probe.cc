#include "trainer/train/rate_probe.h"

#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/cpu_model.h"
#include "common/estimate/reference_step.h"
#include "common/image/image.h"
#include "common/image/resample.h"
#include "common/machine_cpu.h"
#include "common/nvml/gpu_probe.h"
#include "common/trial_config.h"
#include "common/utc_time.h"
#include "trainer/kernels/fused_ops.h"
#include "trainer/memory/host_heap.h"
#include "trainer/model/llama.h"
#include "trainer/quant/quant.h"
#include "trainer/train/adamw_8bit.h"
#include "trainer/train/machine_pace.h"
#include "trainer/train/optimizer.h"
#include "trainer/train/probe_layer_elementwise.h"
#include "trainer/train/probe_matmuls.h"
#include "trainer/train/probe_rounds.h"
#include "trainer/train/reference_steps.h"
#include "trainer/train/versions.h"

#ifdef LLMCTL_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace llmctl::trainer {
namespace {

// One matmul call may take at most this share of the rounds' time: the grid's cells past it (the
// wide ones) are left out, and the estimate takes the nearest measured cell's rate there. The
// cells' FLOPs go up by factors of two, and 83 ms (6.5 s / 78; 8 s / 96 before version 8) sits
// between two of them on the Zen 3 here for fp32 (58 and 117 ms a call); bf16, formed there as
// fp32 GEMMs over converted blocks (trainer/kernels/linear.h), runs at 23-106 GFLOP/s and measures
// the same 14 cells (at LibTorch's scalar bf16 GEMM, 14-18 GFLOP/s, it measured 10, and at 8 s /
// 128 its 61 ms cells were in one probe and out of the next).
constexpr double kCallShare = 1.0 / 78;
// Causal attention as a small model's micro-batch has it: batch 2, 8 heads 64 wide, at sequence
// lengths from a short row's to a long one's (a CPU's rate at 82 tokens is a third of its rate at
// 512: 11-30, Zen 4, bf16 30 and 109 GFLOP/s), the longest past what one call may take left out.
constexpr int64_t kSdpaBatch = 2, kSdpaHeads = 8;
constexpr int64_t kCpuSdpaTokens[] = {32, 64, 128, 256, 512};
constexpr int64_t kCudaSdpaTokens[] = {512, 2048, 8192};
// Each at these head widths (version 6): a CPU's attention slows on narrow heads (11-30, Zen 4,
// bf16 at 64 tokens: 14, 19, 34 and 57 GFLOP/s 24, 32, 64 and 128 wide), a LLaMA's are 64 wide, a
// 7B's 128, BLIP-2's ViT 88 and OPT-2.7b's 80; the CPU lab's small BLIP-2's ViT 24 (version 8's
// narrow width, where version 6 and 7 timed 32: at 257 tokens its bf16 attention ran at 42
// GFLOP/s where the 32-wide rate said 80). A CPU's probe leaves 128 out to stay under 15 s on 2
// cores (with it: 12.3-14.0 s of its own); wider heads take the 64-wide rate there, a little below
// theirs, and 32-wide ones a rate between 24's and 64's, a little below theirs.
constexpr int64_t kCpuSdpaHeadWidths[] = {24, 64};
constexpr int64_t kCudaSdpaHeadWidths[] = {64, 128};
constexpr int64_t kCopyBytes = 64 << 20;
// The CPU's launch: a chain of four ops on this many values, forward and backward (the backward's
// five kernels: the two products' and silu's gradients and the sum into x's), nine kernels.
constexpr int64_t kLaunchChainValues = 4096;
constexpr double kLaunchChainKernels = 9;
constexpr int64_t kAdamValues = 4 << 20;
// About 10 ms of 8-bit AdamW on 2 cores.
constexpr int64_t kAdamW8bitValues = 1 << 20;
// QLoRA's NF4 weight, dequantised: 1,024 x 1,024 (about 1.3 ms on 2 cores).
constexpr int64_t kNf4Width = 1024;
// A dropout mask's draws: 1 Mi values (about 5 ms on 2 cores).
constexpr int64_t kDropoutValues = 1 << 20;
// The loss over 64 tokens' logits of a 32,768-token vocabulary (2 Mi logits, 8 MiB in fp32, past
// a core's L2 as a real step's logits are): about 8 ms for ATen's on 2 cores, 4 for the fused.
constexpr int64_t kLossRows = 64;
constexpr int64_t kLossVocab = 32768;

// Causal attention forward and backward, as a training step runs it: the rate counts 3 x the
// forward's FLOPs (backward twice the forward, as step_work.h counts a step's attention). A CPU's
// flash-attention backward in bf16 runs far below its forward (11-30, Zen 4: the cpu-lab bf16-true
// row's attention took 5x its forward's time in backward), which a forward alone does not see.
// Its operands are laid out as every model of the trainer gives them (llama.cc, opt.cc, t5.cc,
// blip2.cc): each a (B, H, T, D) view of a (B, T, H, D) projection, the output's gradient too
// (version 19). Where bf16 is not native, a CPU's bf16 attention over such queries and keys runs
// 1.7x slower than over contiguous ones, fp32's at the same rate (12-07, Zen 3, 4 x 8 heads x 96
// tokens, 64 wide, interleaved: 11.4 against 19.7 GFLOP/s): the CPU lab's sgd row's attention took
// 247 ms a step in a profile there, which contiguous cells priced at 187-200 ms and these at
// 248-257 (probes just before and after it).
// One dtype's rows at `lengths` with heads `head_width` wide, shortest first, added to `rows` (the
// probe's, which outlives the rounds); a length past `kept_through` whose call would take longer
// than `longest_call` at the best rate so far is left out, and so is every longer one.
void AddAttentionLengths(ProbeRounds& rounds, const std::string& dtype,
                         const std::vector<int64_t>& lengths, int64_t head_width,
                         double longest_call, int64_t kept_through,
                         std::vector<estimate::ProbedAttention>& rows) {
  const auto options = torch::TensorOptions().dtype(ProbeDtype(dtype)).device(rounds.device());
  double rate = 0;
  for (const int64_t tokens : lengths) {
    // Scores and weighted sum, the causal half not discounted (as step_work.h counts them).
    const double flops =
        3 * 4.0 * static_cast<double>(kSdpaBatch * kSdpaHeads * tokens * tokens * head_width);
    if (tokens > kept_through && rate > 0 && flops / rate > longest_call) break;
    const std::vector<int64_t> projected = {kSdpaBatch, tokens, kSdpaHeads, head_width};
    // (B, H, T, D) over (B, T, H, D) memory.
    const auto heads = [&projected, &options] {
      return ProbeOperand(projected, options).transpose(1, 2);
    };
    const torch::Tensor q = heads().requires_grad_();
    const torch::Tensor k = heads().requires_grad_();
    const torch::Tensor v = heads().requires_grad_();
    const torch::Tensor grad_out = heads();
    const size_t row = rows.size();
    rows.push_back({dtype, 0, tokens, head_width});
    const double once = rounds.Add(
        [q, k, v, grad_out] {
          torch::AutoGradMode grad_mode(true);
          const torch::Tensor out = at::scaled_dot_product_attention(
              q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
          (void)torch::autograd::grad({out}, {q, k, v}, {grad_out});
        },
        [&rows, row, flops](double seconds) { rows[row].flops_per_s = flops / seconds; });
    rate = std::max(rate, flops / once);
  }
}

// fp32 and bf16 (the estimate's two classes) at every length and head width, and on a CPU once
// more one query past a block (what a partial block costs: in bf16 on the Zen 4 here about half a
// block's, 2.5 ms at 65 tokens where 64 took 1.9 and 96 about 3.0); fp16, which no estimate uses,
// at kProbeAttentionTokens and kProbeAttentionHeadWidth, for `llmctl nodes`.
//
// A CPU's lengths up to the reference steps' longest rows are measured whatever a call takes: the
// estimate prices attention at these rates uncalibrated and takes the reference steps' factor
// over the rest of their time, so their attention must be priced at rates measured at their own
// lengths. A short probe (0.05 s, the trainer's tests) measured bf16 at 32 tokens alone, a
// quarter of its rate at 128, priced the reference steps' 97-128-token attention at that rate,
// nearly their whole measured time, and left a factor of 0.0074 over the rest (12-06, the Xeon
// with AMX).
void AddAttention(ProbeRounds& rounds, double longest_call, estimate::RateProbe& probe) {
  const std::vector<int64_t> lengths = ForDevice(rounds.device(), kCudaSdpaTokens, kCpuSdpaTokens);
  const std::vector<int64_t> widths =
      ForDevice(rounds.device(), kCudaSdpaHeadWidths, kCpuSdpaHeadWidths);
  const int64_t kept_through =
      rounds.device().is_cuda() ? 0 : estimate::kReferenceTokens + estimate::kReferenceLengthSpread;
  for (const char* dtype : {"fp32", "bf16"}) {
    for (const int64_t width : widths) {
      AddAttentionLengths(rounds, dtype, lengths, width, longest_call, kept_through, probe.sdpa);
    }
    if (!rounds.device().is_cuda()) {
      AddAttentionLengths(rounds, dtype, {estimate::kProbePartialBlockTokens},
                          estimate::kProbeAttentionHeadWidth, longest_call, kept_through,
                          probe.sdpa_partial_block);
    }
  }
  AddAttentionLengths(rounds, "fp16", {estimate::kProbeAttentionTokens},
                      estimate::kProbeAttentionHeadWidth, longest_call, /*kept_through=*/0,
                      probe.sdpa);
}

void AddMemoryAndLaunches(ProbeRounds& rounds, estimate::RateProbe& probe) {
  const auto options = torch::TensorOptions().dtype(torch::kFloat).device(rounds.device());
  const torch::Tensor source = ProbeOperand({kCopyBytes / 4}, options);
  const torch::Tensor target = torch::empty_like(source);
  rounds.Add([source, target] { target.copy_(source); },
             [&probe](double seconds) { probe.memory_bytes_per_s = 2.0 * kCopyBytes / seconds; });
  if (rounds.device().is_cuda()) {
    // A kernel launch: what the host spends issuing one.
    const torch::Tensor one = torch::zeros({1}, options);
    rounds.Add([one] { one.add_(1); },
               [&probe](double seconds) { probe.launch_seconds = seconds; });
    return;
  }
  // On a CPU an op of a training step costs its dispatch, its output's allocation, its autograd
  // node and, in backward, the engine's turn: a chain of four small ops (4,096 values, so their
  // arithmetic is a fraction of a microsecond) forward and backward, nine kernels in all, over
  // nine. 11-30, Zen 4: 3.9-4.1 us an op this way where a one-element add_ takes 1.6 us.
  const torch::Tensor x = ProbeOperand({kLaunchChainValues}, options).requires_grad_();
  const torch::Tensor grad_out = ProbeOperand({kLaunchChainValues}, options);
  rounds.Add(
      [x, grad_out] {
        torch::AutoGradMode grad_mode(true);
        torch::Tensor y = x * 2.0;
        y = y + 1.0;
        y = y * x;
        y = torch::silu(y);
        (void)torch::autograd::grad({y}, {x}, {grad_out});
      },
      [&probe](double seconds) { probe.launch_seconds = seconds / kLaunchChainKernels; });
}

// One fused AdamW step over kAdamValues fp32 values on the host: an offloaded optimizer's step
// (on a GPU machine too: the rounds' synchronisation after it finds nothing to wait for).
void AddHostAdamW(ProbeRounds& rounds, estimate::RateProbe& probe) {
  const torch::Tensor param = ProbeOperand({kAdamValues}, torch::kFloat);
  const torch::Tensor grad = ProbeOperand({kAdamValues}, torch::kFloat);
  const torch::Tensor exp_avg = torch::zeros({kAdamValues});
  const torch::Tensor exp_avg_sq = torch::zeros({kAdamValues});
  const torch::Tensor step = torch::zeros({1});
  rounds.Add(
      [=] {
        step.add_(1);
        at::_fused_adamw_({param}, {grad}, {exp_avg}, {exp_avg_sq}, /*max_exp_avg_sqs=*/{}, {step},
                          1e-6, 0.9, 0.999, 0.0, 1e-8, /*amsgrad=*/false,
                          /*maximize=*/false);
      },
      [&probe](double seconds) { probe.host_adamw_values_per_s = kAdamValues / seconds; });
}

// The trainer's own 8-bit AdamW step over kAdamW8bitValues fp32 values on the CPU
// (trainer/train/adamw_8bit.cc): per value both moments dequantised, updated and requantised to
// the nearest of 256 codes, bound by those searches rather than by memory (11-30, Zen 4: 11 ns a
// value on 2 threads where the probe's copy moved 70 GB/s). CUDA's 8-bit step is ATen's
// elementwise ops, which the memory rate times. Returns the optimizer the rounds step, which the
// caller keeps until they have run (std::function needs a copyable callable, so it cannot own it).
std::unique_ptr<Optimizer> AddAdamW8bit(ProbeRounds& rounds, estimate::RateProbe& probe) {
  torch::Tensor param = ProbeOperand({kAdamW8bitValues}, torch::kFloat).requires_grad_();
  param.mutable_grad() = ProbeOperand({kAdamW8bitValues}, torch::kFloat);
  OptimizerOptions options;
  options.name = "adamw_8bit";
  options.lr = 1e-6;
  auto optimizer = MakeAdamW8bit(options, {param});
  if (!optimizer.ok()) return nullptr;  // one fp32 tensor above the 8-bit minimum: not refused
  Optimizer* step = optimizer->get();
  rounds.Add([step] { step->Step(1e-6); },
             [&probe](double seconds) {
               probe.adamw_8bit_values_per_s = static_cast<double>(kAdamW8bitValues) / seconds;
             });
  return std::move(*optimizer);
}

// The trainer's NF4 dequantisation on the CPU (trainer/quant), as QLoRA's layers run it before each
// of their matmuls: a double-quantised 64-value-block weight into bf16, a lookup, a block's scale
// and a conversion a value (11-30, Zen 4: 0.75 G values/s on 2 threads, where a memory-bound pass
// over its 2.5 B a value would be 12). CUDA's is ATen's elementwise ops, which the memory rate
// times.
void AddNf4Dequant(ProbeRounds& rounds, estimate::RateProbe& probe) {
  const Nf4Weight weight =
      QuantizeNf4(ProbeOperand({kNf4Width, kNf4Width}, torch::kFloat), /*double_quant=*/true);
  rounds.Add([weight] { (void)DequantizeNf4(weight, torch::kBFloat16); },
             [&probe](double seconds) {
               probe.nf4_dequant_values_per_s =
                   static_cast<double>(kNf4Width * kNf4Width) / seconds;
             });
}

// A captioning step's images (version 8): each decoded, resized to 224 x 224 (PIL's bicubic) and
// made CLIP pixel values on one host thread, as trainer/train/caption_batches.cc makes them, over a
// synthetic 640 x 480 photo (COCO's usual size) as a JPEG at quality 90 and as a PNG. Rates in
// source pixels a second, which the estimate takes at each dataset's own images' sizes.
constexpr int kProbeImageWidth = 640, kProbeImageHeight = 480, kProbeImageSide = 224;

// Smooth gradients under a little noise, as a photo's pixels are: what a JPEG's entropy coding and
// a PNG's filters and deflate work through (a flat image would cost either far less).
image::RgbImage ProbeImage() {
  image::RgbImage image{
      kProbeImageWidth, kProbeImageHeight,
      std::vector<uint8_t>(static_cast<size_t>(kProbeImageWidth) * kProbeImageHeight * 3)};
  uint32_t noise = 12345;
  for (int y = 0; y < image.height; ++y) {
    for (int x = 0; x < image.width; ++x) {
      for (int c = 0; c < 3; ++c) {
        noise = noise * 1664525u + 1013904223u;  // Numerical Recipes' LCG
        const double value = 128 + 60 * std::sin(x / 37.0 + c) + 50 * std::cos(y / 23.0 - c) +
                             static_cast<double>(noise >> 28) - 8;
        image.pixels[(static_cast<size_t>(y) * image.width + x) * 3 + c] =
            static_cast<uint8_t>(std::clamp(value, 0.0, 255.0));
      }
    }
  }
  return image;
}

// Internal when the images it made do not decode (a broken libjpeg or libpng).
Status AddImages(ProbeRounds& rounds, estimate::RateProbe& probe) {
  const image::RgbImage photo = ProbeImage();
  const double pixels = static_cast<double>(kProbeImageWidth) * kProbeImageHeight;
  for (const bool jpeg : {true, false}) {
    const std::string bytes = jpeg ? image::EncodeJpeg(photo, 90) : image::EncodePng(photo);
    if (StatusOr<image::RgbImage> once = image::DecodeImage(bytes, "the probe's image");
        !once.ok()) {
      return InternalError(once.status().message());
    }
    rounds.Add(
        [bytes] {
          // The same bytes as above, which decoded.
          const StatusOr<image::RgbImage> decoded = image::DecodeImage(bytes, "the probe's image");
          (void)image::NormalizedPixels(
              image::ResizeBicubic(*decoded, kProbeImageSide, kProbeImageSide), image::kClipMean,
              image::kClipStd);
        },
        [&probe, jpeg, pixels](double seconds) {
          (jpeg ? probe.jpeg_pixels_per_s : probe.png_pixels_per_s) = pixels / seconds;
        });
  }
  return Status::Ok();
}

// A dropout mask's Bernoulli draws on the CPU, as ATen's dropout makes them for LoRA's adapters
// (keep probability 0.95): its generator draws a value at a time, far below memory's rate (11-30,
// Zen 4: 0.2 G values/s on 2 threads). CUDA's draws are elementwise kernels the memory rate times.
void AddDropout(ProbeRounds& rounds, estimate::RateProbe& probe) {
  const torch::Tensor mask = torch::empty({kDropoutValues});
  rounds.Add([mask] { mask.bernoulli_(0.95); },
             [&probe](double seconds) {
               probe.dropout_values_per_s = static_cast<double>(kDropoutValues) / seconds;
             });
}

// The machine's pace (version 20, a CPU's): PaceCanary's seconds over the same rounds as every
// rate, timed as a one-process CPU trial times them after each of its steps.
std::unique_ptr<PaceCanary> AddPace(ProbeRounds& rounds, estimate::RateProbe& probe) {
  auto canary = std::make_unique<PaceCanary>();
  PaceCanary* timed = canary.get();
  rounds.AddInterleaved([timed] { return timed->Seconds(); },
                        [&probe](double seconds) { probe.pace_seconds = seconds; });
  return canary;
}

// The loss over a step's logits on the CPU (version 10), forward and backward, in fp32 and bf16
// logits: ATen's cross-entropy as CausalLmLoss runs it (a float32 copy, log-softmax, the NLL and
// their gradients) and the fused kernel as the chunked loss runs it over a chunk (a row's
// log-sum-exp and its gradient in place, trainer/kernels/cpu_kernels.cc). Both take an exp a logit
// at least, which bounds them rather than their bytes (12-02, Zen 4, 2 threads: ATen's 3-6 ns a
// fp32 logit where a copy of it takes 0.1-0.3). CUDA's are memory-bound, as their bytes count.
void AddLoss(ProbeRounds& rounds, estimate::RateProbe& probe) {
  for (const char* dtype : {"fp32", "bf16"}) {
    const auto options = torch::TensorOptions().dtype(ProbeDtype(dtype));
    const torch::Tensor labels = torch::randint(kLossVocab, {1, kLossRows}, torch::kInt64);
    const torch::Tensor logits = ProbeOperand({1, kLossRows, kLossVocab}, options).requires_grad_();
    // CausalLmLoss scores each position against the next label: the last is unscored.
    const double aten_logits = static_cast<double>((kLossRows - 1) * kLossVocab);
    const size_t aten_row = probe.loss.size();
    probe.loss.push_back({"aten", dtype, 0});
    rounds.Add(
        [logits, labels] {
          torch::AutoGradMode grad_mode(true);
          const torch::Tensor loss = CausalLmLoss(logits, labels);
          (void)torch::autograd::grad({loss}, {logits});
        },
        [&probe, aten_row, aten_logits](double seconds) {
          probe.loss[aten_row].logits_per_s = aten_logits / seconds;
        });
    // The fused kernel overwrites its logits with their gradient, on which the next call runs:
    // its arithmetic is the same whatever the values.
    torch::Tensor chunk = ProbeOperand({kLossRows, kLossVocab}, options);
    const torch::Tensor row_labels = labels.reshape({kLossRows});
    const torch::Tensor inverse_count = torch::full({}, 1.0 / kLossRows, torch::kFloat32);
    const size_t fused_row = probe.loss.size();
    probe.loss.push_back({"fused", dtype, 0});
    rounds.Add(
        [chunk, row_labels, inverse_count]() mutable {
          (void)FusedCrossEntropyGrad(chunk, row_labels, inverse_count);
        },
        [&probe, fused_row](double seconds) {
          probe.loss[fused_row].logits_per_s =
              static_cast<double>(kLossRows * kLossVocab) / seconds;
        });
  }
}

// A step's element-wise ops at each of kProbeElementwiseBytes, fp32 and bf16 (version 15, a
// CPU's): an out-of-place product of two tensors, as autograd's ops make a new output each. Its
// calls run back to back on the same operands, which then stay in the caches as a step's
// recently written activations do. 12-05, Xeon, 2 threads, fp32: 137-172 GB/s at 256 KiB to 1 MiB,
// where the 64 MiB copy moves 28-40.
void AddElementwise(ProbeRounds& rounds, estimate::RateProbe& probe) {
  for (const char* dtype : {"fp32", "bf16"}) {
    const auto options = torch::TensorOptions().dtype(ProbeDtype(dtype));
    for (const int64_t bytes : estimate::kProbeElementwiseBytes) {
      const int64_t values = bytes / static_cast<int64_t>(c10::elementSize(ProbeDtype(dtype)));
      const torch::Tensor a = ProbeOperand({values}, options);
      const torch::Tensor b = ProbeOperand({values}, options);
      const size_t row = probe.elementwise.size();
      probe.elementwise.push_back({dtype, bytes, 0});
      rounds.Add([a, b] { (void)torch::mul(a, b); },
                 [&probe, row, bytes](double seconds) {
                   probe.elementwise[row].bytes_per_s = 3.0 * static_cast<double>(bytes) / seconds;
                 });
    }
  }
}

void AddHostLink(ProbeRounds& rounds, estimate::RateProbe& probe) {
  const torch::Tensor host = torch::empty({kCopyBytes / 4}, torch::kFloat).pin_memory();
  const torch::Tensor device = torch::empty({kCopyBytes / 4}, torch::kFloat).to(rounds.device());
  rounds.Add([host, device] { device.copy_(host, /*non_blocking=*/true); },
             [&probe](double seconds) { probe.host_to_device_bytes_per_s = kCopyBytes / seconds; });
  rounds.Add([host, device] { host.copy_(device, /*non_blocking=*/true); },
             [&probe](double seconds) { probe.device_to_host_bytes_per_s = kCopyBytes / seconds; });
}

// What a refused probe's message ends with: its rates are the moment's, not the machine's.
constexpr char kMeasureAgain[] = ". Nothing is written; measure again when the machine is idle";

// " (load average 3.2 now)"; "" where it cannot be read.
std::string LoadAverageNow() {
  double load[1] = {0};
  if (::getloadavg(load, 1) != 1) return "";
  char text[48];
  std::snprintf(text, sizeof text, " (load average %.1f now)", load[0]);
  return text;
}

// The name of the GPU the cells ran on: CUDA's device 0's, since NVML numbers the devices by
// their PCI bus and CUDA_VISIBLE_DEVICES does not renumber them; NVML's first where CUDA gives
// none. A probe named only "cuda" maps to no data sheet, and the estimate then leaves it unused.
std::string GpuName() {
#ifdef LLMCTL_HAVE_CUDA
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, 0) == cudaSuccess) {
    const std::string name(properties.name, strnlen(properties.name, sizeof properties.name));
    if (!name.empty()) return name;
  }
#endif
  auto nvml = nvml::OpenNvml();
  if (!nvml.ok()) return "cuda";
  auto name = (*nvml)->Name(0);
  return name.ok() ? *name : "cuda";
}

}  // namespace

StatusOr<estimate::RateProbe> ProbeRates(const RateProbeOptions& options) {
  if (options.device != "cpu" && options.device != "cuda") {
    return InvalidArgumentError("--probe-device: expected cpu or cuda, got '" + options.device +
                                "'");
  }
  const bool cuda = options.device == "cuda";
  if (cuda && !torch::cuda::is_available()) {
    return FailedPreconditionError(
        "--probe-device cuda: LibTorch sees no CUDA device on this machine (a CPU LibTorch, no "
        "GPU, or a driver too old for it)");
  }
  const std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  const std::optional<CpuCounters> cpu_at_start = ReadCpuCounters();
  estimate::RateProbe probe;
  probe.measured_at = FormatUtc(std::chrono::system_clock::now(), "%Y-%m-%dT%H:%M:%SZ");
  probe.device = options.device;
  probe.device_name = cuda ? GpuName() : CpuModelName();
  probe.threads = at::get_num_threads();
  probe.versions = ProbeTrainerVersions();
  torch::manual_seed(0);
  torch::NoGradGuard no_grad;
  // Under the heap policy every trial runs under (host_heap.h): glibc's own maps and unmaps a
  // large block by the sizes freed so far, so a measurement that allocates past 128 KiB faults
  // its pages in or not by what ran before it (12-05, Xeon: ATen's fp32 loss at 115-593 M
  // logits/s over seven probes, the 16 MiB bf16 product at 6-35 GB/s).
  KeepFreedHostMemory();
  ProbeRounds rounds(cuda ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU));
  AddMatmulGrid(rounds, options.seconds * kCallShare, probe);
  if (!cuda) {
    for (const char* dtype : {"fp32", "bf16"}) {
      AddHeadMatmuls(rounds, dtype, options.seconds * kCallShare, probe);
    }
  }
  AddAttention(rounds, options.seconds * kCallShare, probe);
  AddMemoryAndLaunches(rounds, probe);
  AddHostAdamW(rounds, probe);
  const std::unique_ptr<Optimizer> adamw_8bit = cuda ? nullptr : AddAdamW8bit(rounds, probe);
  if (!cuda) AddNf4Dequant(rounds, probe);
  if (!cuda) AddDropout(rounds, probe);
  const std::unique_ptr<PaceCanary> pace = cuda ? nullptr : AddPace(rounds, probe);
  if (!cuda) AddLoss(rounds, probe);
  if (!cuda) AddElementwise(rounds, probe);
  if (!cuda) AddLayerElementwise(rounds, probe);
  RETURN_IF_ERROR(AddImages(rounds, probe));
  std::vector<std::unique_ptr<ReferenceTrainer>> reference;
  if (!cuda) {
    ASSIGN_OR_RETURN(reference, AddReferenceSteps(rounds, probe));
    RETURN_IF_ERROR(AddNewShapes(rounds, probe));
  }
  if (cuda) AddHostLink(rounds, probe);
  probe.rounds = rounds.Run(options.seconds);
  probe.speed_spread = rounds.SpeedSpread();
  if (!cuda) RETURN_IF_ERROR(AddHeadBuffers(probe));
  probe.seconds = SecondsSince(start);
  if (const std::optional<CpuCounters> now = cpu_at_start ? ReadCpuCounters() : std::nullopt) {
    probe.others_cpu_share = OthersCpuShare(*cpu_at_start, *now, ProcStatTicksPerSecond());
    // A CPU's: on a GPU the driver's own system calls would fill it.
    if (!cuda) probe.kernel_cpu_share = OwnKernelShare(*cpu_at_start, *now);
  }
  RETURN_IF_ERROR(CheckMeasuredProbe(probe));
  return probe;
}

Status CheckMeasuredProbe(const estimate::RateProbe& probe) {
  if (probe.device == "cpu" && probe.others_cpu_share.has_value() &&
      *probe.others_cpu_share >= kBusyMachineShare) {
    char busy[200];
    std::snprintf(busy, sizeof busy,
                  "other processes took %.0f%% of the time of the CPUs the probe ran on while it "
                  "measured (from %.0f%%, its rates are their load's as much as this machine's)",
                  *probe.others_cpu_share * 100, kBusyMachineShare * 100);
    return UnavailableError(std::string(busy).append(LoadAverageNow()).append(kMeasureAgain));
  }
  const StatusOr<estimate::RateProbe> read =
      estimate::RateProbe::FromJson(nlohmann::json::parse(probe.ToJson().dump()));
  if (read.ok()) return Status::Ok();
  return UnavailableError(
      std::string("the rates measured disagree with each other, as when other work holds this "
                  "machine's cores while the probe runs")
          .append(LoadAverageNow())
          .append(": ")
          .append(read.status().message())
          .append(kMeasureAgain));
}

}  // namespace llmctl::trainer
