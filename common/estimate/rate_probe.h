// A node's own rates, measured once by `llm-train --probe` (trainer/train/rate_probe.h) on the
// machine its trials run on, and what the time estimate (step_time.h) makes of them: the probe's
// matmul, attention, memory, launch and optimizer rates in place of the data sheet's. No LibTorch:
// the CLI reads the probe's JSON and the estimator uses it.
//
// The JSON (version 20), one document:
//   {"version": 20, "measured_at": "2026-11-29T12:20:00Z", "seconds": 11.2, "rounds": 12,
//    "speed_spread": 0.04, "others_cpu_share": 0.03, "kernel_cpu_share": 0.07,
//    "pace_seconds": 0.0011,
//    "identity": {"device": "cpu", "device_name": "AMD EPYC 7763 64-Core Processor", "threads": 2,
//                 "versions": {llm-train --version --json}},
//    "matmul": [{"dtype": "fp32", "size": 512, "tokens": 256, "flops_per_s": 5.1e10}, ...],
//    "head_matmul": [{"dtype": "fp32", "tokens": 256, "hidden": 128, "vocab": 16384,
//                     "flops_per_s": 9.8e10}, ...],
//    "head_buffers": [{"dtype": "bf16", "tokens": 256, "hidden": 128, "vocab": 2048,
//                      "logits_bytes": 165504, "input_gradient_bytes": 394880,
//                      "weight_gradient_bytes": 460544}, ...],
//    "sdpa": [{"dtype": "fp32", "tokens": 128, "head_width": 64, "flops_per_s": 2.0e10}, ...],
//    "sdpa_partial_block": [{"dtype": "fp32", "tokens": 65, "head_width": 64,
//                            "flops_per_s": 1.6e10}, ...],
//    "memory_bytes_per_s": 1.2e10, "launch_seconds": 4e-6,
//    "host_adamw_values_per_s": 3e8, "adamw_8bit_values_per_s": 9e7,
//    "nf4_dequant_values_per_s": 7.5e8, "dropout_values_per_s": 2e8,
//    "loss": [{"kernels": "aten", "dtype": "fp32", "logits_per_s": 2.2e8}, ...],
//    "jpeg_pixels_per_s": 6e7, "png_pixels_per_s": 3e7,
//    "host_to_device_bytes_per_s": 0, "device_to_host_bytes_per_s": 0,
//    "reference_steps": [{"dtype": "fp32", "lengths": "new", "seconds": 0.21},
//                        {"dtype": "fp32", "lengths": "repeated", "seconds": 0.2}, ...],
//    "new_shapes": [{"dtype": "bf16", "in": 512, "out": 1408, "rows": 128,
//                    "new_seconds": 0.0078, "repeated_seconds": 0.0011}, ...],
//    "elementwise": [{"dtype": "fp32", "bytes": 262144, "bytes_per_s": 1.4e11}, ...],
//    "layer_elementwise": [{"stream": "fp32", "projected": "bf16", "kernels": "aten",
//                           "tokens": 512, "hidden": 512, "q_width": 512, "kv_width": 512,
//                           "inter": 1408, "seconds": 0.0021}, ...]}
// A matmul is a projection's forward and both backward matmuls, (tokens x size) times (size x
// size), over a grid of token rows (a micro-batch's: the fewer, the shorter the weight gradient's
// reduction and the worse a GEMM splits over threads) and sizes (the narrower, the less a GEMM
// reuses what it loads), the cells past what one call may take left out; sdpa is causal attention
// over 2 x 8 heads of sequences of `tokens` tokens, `head_width` wide, forward and backward (its
// rate counts 3x the forward's FLOPs, as a step's attention does), over (B, H, T, D) views of
// (B, T, H, D) operands as a step's are (version 19), at a few lengths (version 5; the
// longest past what one call may take left out) and head widths (version 6: on a CPU 32 and 64,
// version 8's 24 and 64; on a GPU 64 and 128) for fp32 and bf16, at 128 tokens and 64 wide for
// fp16; sdpa_partial_block (version 8, a CPU's) the same at 65 tokens; an image (version 8) is a
// synthetic 640 x 480 photo decoded from JPEG or PNG, resized to 224 x 224 and normalised, as
// llm-train makes a captioning step's; version 6's CPU grid
// starts at 64-wide weights (256 before); memory is one
// copy of 64 MiB (bytes read plus written); a launch is on CUDA a one-element add, on a CPU one op
// of an autograd step (version 4: a chain of four small ops forward and backward, over its nine
// kernels); the host's AdamW is one fused step over 4 Mi fp32 values (an offloaded step); the 8-bit
// AdamW is the trainer's CPU step over 1 Mi fp32 values (0 on a GPU); dropout (version 7, a CPU's;
// 0 on a GPU) is a mask's Bernoulli draws over 1 Mi fp32 values; loss (version 10, a CPU's;
// empty on a GPU) is the loss over 64 x 32,768 logits, forward and backward, by ATen's
// cross-entropy (CausalLmLoss's) and by the fused kernel (the chunked loss'), over fp32 and bf16
// logits; head_matmul (version 11) is a vocabulary head's three GEMMs as the chunked loss runs
// them, a chunk's `tokens` rows by `hidden` through a `vocab`-wide output, at a few hidden widths
// for fp32 and bf16 (the dearest past what one call may take left out); head_buffers (version 13,
// a CPU's; empty on a GPU) is, for each head cell's dtype and hidden width at two vocabularies
// (kProbeHeadBufferVocabs), the bytes each of the three GEMMs took from LibTorch's allocator beside
// its operands and output while it ran (matmul_buffers.h: a CPU's 16-bit GEMMs pack their operands
// into such buffers, one a thread), which the memory estimate adds where one of the chunked loss'
// products runs; a reference step is one step of reference_step.h's trial (a CPU's only), each
// class's at lengths new to the run and (version 5) at one length every step had; new_shapes
// (version 14, a CPU's; empty on a GPU) is, for fp32 and bf16 at each weight of NewShapeWeights
// (reference_step.h), a projection's three GEMMs at token rows new to the process and at `rows`
// rows, which it had (ProbedNewShape); elementwise (version 15, a CPU's; empty on a GPU) is an
// out-of-place product of two tensors at each of kProbeElementwiseBytes, fp32 and bf16
// (ProbedElementwise); layer_elementwise (version 16, a CPU's; empty on a GPU) is one decoder
// layer's element-wise ops forward and backward, as the trainer runs them, at each of
// kProbeLayerTokens, by the dtypes of 32-true, bf16-true and autocast and by kernels
// (ProbedLayerElementwise). Every figure is
// the median of `rounds` samples taken in turn across the whole probe, so a machine whose speed
// drifts while it runs slows every rate alike. A rate of 0 was not measured (copies without a
// device). speed_spread (version 9) is how much the machine's own speed moved while it was probed:
// the median over the probe's measurements of their slowest sample over their quickest, less one
// (SpeedSpread). A time predicted from the probe is no more certain than that. pace_seconds
// (version 20, a CPU's) is the machine's pace over the same rounds: the seconds of the trainer's
// pace canary (trainer/train/machine_pace.h), which a one-process CPU trial times again after each
// step, so the report can set the machine's speed while a trial ran against its speed while its
// rates were measured. Versions 1 to 19 are read, and the agent and llmctl measure them again.
// Version 19 (12-07) had no pace_seconds (the report says no pace). Version 18 (12-07) timed
// attention over contiguous (B, H, T, D) operands, where every model of the trainer attends over
// (B, H, T, D) views of (B, T, H, D) projections: on a CPU without native bf16 its bf16 rates
// read 1.7x the step's (12-07, Zen 3). Version 17 (12-06 to 12-07) timed new_shapes at 128 rows
// alone, which priced a new length at a micro-batch of four rows (12-07, Xeon with AMX,
// bf16: 1.2-1.3x the cells' cost at 384 rows) as at one of one or two. Version 16 (12-06) has
// version 17's fields; on
// a CPU without a native bf16 GEMM its bf16 cells timed the trainer's fp32 route while it converted
// a transposed operand by a copy that transposes (trainer/kernels/linear.h), since converted in its
// own order: its 2,048 and 4,096-wide cells read 40-55% below what the trainer now runs (12-06,
// the Xeon held to AVX512_CORE_VNNI). Version 15 (12-05 to 12-06) had no
// layer_elementwise (a layer's norms, RoPE, activation and adds at the contiguous product's rate,
// which their many small ops and backward nodes run below: on the Xeon held to AVX2, 12-06, the
// CPU lab's rows predicted up to 19% fast). Version 14 (12-05) had no elementwise (a
// step's memory traffic at the 64 MiB copy's rate, which a small model's element-wise ops beat
// several times from the caches: 12-05, Xeon, 28 GB/s against 137-172 at 256 KiB to 1 MiB).
// Version 13 (12-04 to 12-05) had no new_shapes
// (a new length costs each of a micro-batch's weight shapes alike: the reference steps' difference
// over the reference's shapes). Version 12 (12-04) had no head_buffers (none
// known: the memory estimate adds none). Version 11 (12-03 to 12-04) has version 12's fields; on an
// AVX-512 CPU without avx512_bf16 its bf16 cells timed oneDNN's gemm:jit:bf16, where the trainer
// now forms bf16 products as fp32 GEMMs (common/cpu_matmul.h), 1.2-1.8x faster. Version 10 (12-02
// to 12-03) had no head cells (a head takes the grid's rate at its weight's sqrt(in x out)).
// Version 9 (12-01 to 12-02) had no loss rates (the data sheet's serve). Version 8 (11-30 to 12-01)
// did not say how steady the machine was. Version 7 (11-30) had no partial-block attention (a
// sequence pays none of its padding) and timed a CPU's attention on 32-wide heads where version 8
// times 24-wide ones. Version 6 (11-30) had no dropout rate (the data sheet's serves). Version 5
// (11-30) timed attention 64 wide alone (its rows have no "head_width": read as 64). Version 4
// (11-30) timed attention at 128 tokens alone (its rows have no "tokens": read as 128). Version 3
// (11-29 to 11-30) timed attention's forward alone, which ProbedSpeed does not use, and had no
// 8-bit AdamW; version 2 (11-29's tenth stop) timed each rate in one stretch, fp32 and bf16 at 128,
// 256 and 512 tokens, without "rounds"; version 1 (before it) had no "tokens": its matmuls were 512
// tokens, and it is read as such.
#ifndef LLMCTL_COMMON_ESTIMATE_RATE_PROBE_H_
#define LLMCTL_COMMON_ESTIMATE_RATE_PROBE_H_

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/estimate/matmul_buffers.h"
#include "common/estimate/step_time.h"
#include "common/status.h"
#include "common/trainer_versions.h"

namespace llmctl::estimate {

inline constexpr int kRateProbeVersion = 20;
// The pace canary's seconds (trainer/train/machine_pace.h) a reader takes, a probe's pace_seconds
// and a step event's: about 1 ms on 2 cores; past a second is a stalled machine, not its pace.
inline constexpr double kPaceSecondsMin = 1e-7;
inline constexpr double kPaceSecondsMax = 1;
inline bool IsPaceSeconds(double seconds) {
  return seconds >= kPaceSecondsMin && seconds <= kPaceSecondsMax;
}
// NodeInfo.rate_probe_pending while the agent's probe runs (agent/node_rates.h): no trial starts on
// the node meanwhile, so the controller places none there.
inline constexpr std::string_view kRateProbeMeasuring = "measuring";
// The most bytes of NodeInfo.rate_probe_pending the controller takes (a longer one refuses the
// node's whole description, so it runs nothing): the agent cuts its reason to fit.
inline constexpr size_t kRateProbePendingMaxBytes = 1024;
// The length of a version 8 CPU probe's partial-block attention: a block of 32 (PaddedQueries) and
// one query of the next.
inline constexpr int64_t kProbePartialBlockTokens = 65;
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
  int64_t tokens = kProbeAttentionTokens;  // a sequence's
  // Each head's width (version 6; before it 64): a CPU's attention runs far below its 64-wide
  // rate on narrower heads (Zen 4, bf16 at 64 tokens: 14 GFLOP/s 24 wide, 34 at 64).
  int64_t head_width = kProbeAttentionHeadWidth;
};

// A vocabulary head's GEMMs (version 11): the logits of `tokens` rows of hidden states `hidden`
// wide through a (vocab x hidden) weight, x W^T, and both gradients, dy W and dy^T x, as the
// chunked loss runs them over a chunk (trainer/model/loss.cc). A GEMM with a narrow inner dimension
// and a long output runs at another rate than a square one of the same FLOPs a row (12-02, Zen 4:
// llama-3.2-tiny's head, 128 x 128,256, at 98 GFLOP/s where the grid's rate at sqrt(in x out) was
// 75).
struct ProbedHead {
  std::string dtype;  // "fp32", "bf16"
  int64_t tokens = 0;
  int64_t hidden = 0;
  int64_t vocab = 0;
  double flops_per_s = 0;
};

// What a vocabulary head's three GEMMs (ProbedHead's) each took from LibTorch's allocator beside
// its operands and output while it ran, at a chunk's `tokens` rows by `hidden` through a
// `vocab`-wide output (version 13).
struct ProbedHeadBuffers {
  std::string dtype;  // "fp32", "bf16"
  int64_t tokens = 0;
  int64_t hidden = 0;
  int64_t vocab = 0;
  uint64_t logits_bytes = 0;           // x W^T
  uint64_t input_gradient_bytes = 0;   // dy W
  uint64_t weight_gradient_bytes = 0;  // dy^T x
};

// The vocabularies a CPU probe measures its heads' buffers at: the demo's and lab stand-ins' (a
// narrow output splits over fewer threads, so its products take fewer buffers) and the head cells'
// (as wide as a real vocabulary splits: 16 threads on the Zen 4).
inline constexpr int64_t kProbeHeadBufferVocabs[] = {2048, 16384};

// The loss over a step's logits on a CPU (version 10), forward and backward, by the kernels that
// run it and the logits' dtype, in logits a second (StepWork::loss_logits).
struct ProbedLoss {
  std::string kernels;  // "aten", "fused"
  std::string dtype;    // "fp32", "bf16"
  double logits_per_s = 0;
};

// A projection's three GEMMs (x W^T, dy W, dy^T x, as the trainer's Linear runs them) through an
// `in` x `out` weight (version 14, a CPU's): a call at token rows no earlier call in the process
// had, and one at `rows` rows, which every call but the first had. The first builds the GEMMs'
// kernels for its shapes and packs the weight into fresh buffers, so their difference is what a
// micro-batch at a new length costs at that weight (NewLengthCost).
struct ProbedNewShape {
  std::string dtype;  // "fp32", "bf16"
  int64_t in = 0;
  int64_t out = 0;
  int64_t rows = 0;
  double new_seconds = 0;
  double repeated_seconds = 0;
};

// An out-of-place product of two tensors of `bytes` bytes each (ATen's mul, as a step's
// element-wise ops run) in `dtype` (version 15, a CPU's): bytes read and written a second, three
// tensors' worth a call. A CPU runs it from its caches at a small model's tensors and from memory
// at a large one's, and in bf16 at a third of fp32's rate in cache, converting each value.
struct ProbedElementwise {
  std::string dtype;  // "fp32", "bf16"
  int64_t bytes = 0;
  double bytes_per_s = 0;
};

// One decoder layer's element-wise ops as the trainer runs them (version 16, a CPU's): its two
// RMSNorms, RoPE on q and k, the MLP's activation (SwiGLU), the two residual adds and the attention
// output's layout copy, forward and backward, `tokens` tokens through a layer `hidden` wide with
// `q_width`-wide queries, `kv_width`-wide keys and values and an `inter`-wide MLP, its residual
// stream in `stream` and its projections' outputs in `projected` (fp32 and fp32 as 32-true runs
// them, bf16 and bf16 as bf16-true, fp32 and bf16 as autocast), by `kernels` (trainer/kernels/
// fused_ops.h's ATen compositions or fused kernels); seconds a call. Its rate is the bytes
// step_work.h's LayerElementwiseBytes counts for the cell over those seconds
// (RateProbe::LayerElementwiseRates).
struct ProbedLayerElementwise {
  std::string stream;     // "fp32", "bf16"
  std::string projected;  // "fp32", "bf16"
  std::string kernels;    // "aten", "fused"
  int64_t tokens = 0;
  int64_t hidden = 0;
  int64_t q_width = 0;
  int64_t kv_width = 0;
  int64_t inter = 0;
  double seconds = 0;
};

// The token counts a CPU probe times a layer's element-wise ops at (ProbedLayerElementwise), on
// the reference model's layer (reference_step.h, 512 wide): its residual stream at 256 KiB and
// 1 MiB in fp32, around the CPU lab's micro-batches (290-580 KiB). A larger stream takes the
// 512-token rate: on the 2-core Xeon (12-06) the layer ran at 1,536 tokens within 15% of its rate
// at 384, where a third size cost the probe 1-2 s of its 15.
inline constexpr int64_t kProbeLayerTokens[] = {128, 512};

// The tensor sizes a CPU probe times its element-wise product at (kProbeElementwiseBytes): from a
// small model's residual stream (the CPU lab's: 290-580 KiB a micro-batch) past a 1B model's (a
// 2,048-wide micro-batch of 1,024 fp32 tokens: 8 MiB).
inline constexpr int64_t kProbeElementwiseBytes[] = {256 << 10, 1 << 20, 4 << 20, 16 << 20};

// The seconds of one step of the reference trial of `dtype`'s matmul class (reference_step.h), its
// micro-batches at lengths new to the run or at one every step had.
struct ProbedStep {
  std::string dtype;  // "fp32", "bf16"
  double seconds = 0;
  bool new_lengths = true;  // "lengths": "new" or "repeated"; a version 4 step's are new
};

struct RateProbe {
  int version = kRateProbeVersion;
  std::string measured_at;  // UTC, ISO 8601
  double seconds = 0;       // how long the probe took
  int rounds = 1;           // the samples each rate is the median of (1: one stretch, before 3)
  // How much the machine's speed moved while it was probed (version 9; none before): SpeedSpread
  // over the probe's measurements' samples.
  std::optional<double> speed_spread;
  // The share of the time of the CPUs the probe may run on (0 to 1) that other processes took
  // while it was probed (common/machine_cpu.h; since 12-03, optional in version 11: none from an
  // older llm-train or where /proc/stat cannot be read). Rates measured on a busy machine are its
  // load's.
  std::optional<double> others_cpu_share;
  // The share of the probe's own CPU time that the kernel spent on its behalf, page faults above
  // all (common/machine_cpu.h's OwnKernelShare; a CPU probe's, since 12-06, optional in version 15:
  // none from an older llm-train). A CPU's 16-bit GEMMs build their kernels for each new shape, and
  // building one faults in fresh pages: where those faults run slow, a new length's cost
  // (new_shapes, the reference steps' difference) reads high while the rest does not
  // (kKernelShareWorthSaying).
  std::optional<double> kernel_cpu_share;
  // The seconds of one run of the trainer's pace canary (version 20, a CPU's: none on a GPU or from
  // an older llm-train): what a trial's steps' own pace_seconds are set against.
  std::optional<double> pace_seconds;
  // What it was measured on: a change of any of these calls for a new probe.
  std::string device;       // "cpu" or "cuda"
  std::string device_name;  // the CPU's model name or the GPU's
  int threads = 0;          // LibTorch's intra-op threads
  TrainerVersions versions;
  std::vector<ProbedMatmul> matmul;
  std::vector<ProbedHead> head_matmul;          // version 11; none before
  std::vector<ProbedHeadBuffers> head_buffers;  // version 13, a CPU's; none before
  std::vector<ProbedAttention> sdpa;
  // Attention at a length one past a query block (version 8, a CPU's: kProbePartialBlockTokens on
  // kProbeAttentionHeadWidth-wide heads, fp32 and bf16; none on a GPU): what a partial block costs
  // (step_time.h's AttentionSeconds), which the grid's whole-block lengths do not show.
  std::vector<ProbedAttention> sdpa_partial_block;
  double memory_bytes_per_s = 0;
  double launch_seconds = 0;
  double host_adamw_values_per_s = 0;   // fp32 AdamW on the host (an offloaded step)
  double adamw_8bit_values_per_s = 0;   // the trainer's 8-bit AdamW on the CPU (0 on a GPU)
  double nf4_dequant_values_per_s = 0;  // the trainer's NF4 dequantisation on the CPU (version 5)
  double dropout_values_per_s = 0;      // a dropout mask's draws on the CPU (version 7)
  // The loss' rates on a CPU (version 10; none on a GPU, whose loss its bytes time): ATen's and
  // the fused kernel's, over fp32 and bf16 logits.
  std::vector<ProbedLoss> loss;
  // A captioning step's images, decoded, resized and normalised on one host thread, in source
  // pixels a second (version 8; the host's, on a GPU machine too).
  double jpeg_pixels_per_s = 0;
  double png_pixels_per_s = 0;
  double host_to_device_bytes_per_s = 0;
  double device_to_host_bytes_per_s = 0;
  // The reference trial's step per matmul class (version 4, a CPU's; none on a GPU, where a small
  // model's step is all launches and says little of a real one's).
  std::vector<ProbedStep> reference_steps;
  // A projection's GEMMs at new and at repeated rows by weight shape, fp32 and bf16 (version 14, a
  // CPU's; none on a GPU or before).
  std::vector<ProbedNewShape> new_shapes;
  // The element-wise product by tensor size, fp32 and bf16 (version 15, a CPU's; none on a GPU or
  // before: the step's memory traffic at memory_bytes_per_s).
  std::vector<ProbedElementwise> elementwise;
  // One decoder layer's element-wise ops by dtypes, kernels and tokens (version 16, a CPU's; none
  // on a GPU or before: the layers' traffic at the element-wise product's rate).
  std::vector<ProbedLayerElementwise> layer_elementwise;

  nlohmann::ordered_json ToJson() const;
  // InvalidArgument naming the field: not an object, another version, a field missing, of the
  // wrong type, negative or not finite, or no fp32 matmul.
  static StatusOr<RateProbe> FromJson(const nlohmann::json& json);

  // The rate of `dtype`'s matmul at (tokens, size), interpolated between the measured ones as
  // step_time.h's RateAtShape does (0: none measured).
  double MatmulFlops(const std::string& dtype, int64_t size,
                     int64_t tokens = kProbeMatmulTokens) const;
  // `dtype`'s measured matmul rates by shape (empty: none).
  std::vector<ShapeRate> MatmulRates(const std::string& dtype) const;
  // `dtype`'s measured head rates by a chunk's rows (ShapeRate's rows) and hidden width (its
  // width), empty: none.
  std::vector<ShapeRate> HeadRates(const std::string& dtype) const;
  // head_buffers by dtype and vocabulary, each product's most over the hidden widths ({} before
  // version 13).
  MatmulBuffers HeadBuffers() const;
  // `dtype`'s element-wise rates by tensor size, fewest bytes first, one a size (empty: none).
  std::vector<ElementwiseRate> ElementwiseRates(const std::string& dtype) const;
  // The layer cells' rates (LayerElementwiseBytes over their seconds less their ops' dispatch at
  // launch_seconds, which the step's launches count), by dtypes and kernels, fewest bytes first,
  // one a size (empty: none).
  std::vector<LayerElementwiseRate> LayerElementwiseRates() const;
  // `dtype`'s measured causal attention rates by sequence length (ShapeRate's rows) and head
  // width (its width), empty: none.
  std::vector<ShapeRate> AttentionRates(const std::string& dtype) const;
  // Whether `other` was measured on the same device, versions and threads.
  bool SameIdentity(const RateProbe& other) const;
  // One line: "cpu AMD EPYC 7763 (2 threads, LibTorch 2.9.1), 2026-11-29T01:20:00Z", and from a
  // spread of kSpreadWorthSaying on ", its speed moving 22% while measured"; likewise other
  // processes' share of the CPUs from kBusyMachineShare and the kernel's from
  // kKernelShareWorthSaying.
  std::string Summary() const;
  // Whether Summary warns of the moment it was measured at (any of those three): a probe worth
  // measuring again, as `llmctl nodes --measure NODE` does.
  bool WarnsOfItsMoment() const;
};

// A probe whose kernel took this share of its CPU time or more is named so wherever it is. On the
// 2-core Xeon with AMX (12-06, 19 probes timed with their CPU time) the probes whose kernel took
// 6-13% of it measured the bf16 new-length cost of a reference micro-batch at 48-58 ms, which
// predicts the CPU lab's bf16 rows within a few percent; those at 15-29% measured 60-104 ms, their
// user time the same (18-19 s): a new shape's oneDNN kernel build faults in fresh pages (42 a
// call of the 128-wide cell, 2,500-2,650 a reference step at new lengths), and those faults ran
// several times slower, in the probe and not in the trials (the lab's bf16-true row run alone
// meanwhile: 2,384-2,401 tokens/s, as before). The day's first `make demo` took such a probe
// (91 ms) and predicted its bf16 rows 24% slow.
inline constexpr double kKernelShareWorthSaying = 0.15;

// A machine whose speed moved this much while it was probed is named so wherever its probe is:
// the goal for a probe taken twice is 10%.
inline constexpr double kSpreadWorthSaying = 0.10;

// How much a machine's speed moved over a probe's rounds: for each measurement with two samples or
// more (seconds a call, one a round), its slowest over its quickest, less one; the median of those
// (0 without any). A machine shared with others' work moves from one second to the next (12-01,
// this project's 2-vCPU VM: a 512-wide fp32 matmul at 147-190 GFLOP/s over 1-s windows, medians of
// 21-26% over five probes, whose cpu-lab predictions then spread 7-26% from probe to probe).
double SpeedSpread(const std::vector<std::vector<double>>& samples);

// `sheet` (a data sheet's DeviceSpeed) with the probe's rates in place of its nominal ones: fp32
// and bf16 matmuls by shape, heads and attention, memory, launches, the host's optimizer step and
// the host link, and the heads' buffers (HeadBuffers); the rest (start-up, links to other ranks and
// nodes) stays the sheet's. `source` names the probe. The probe must be of the same kind of device
// (cpu for cpu). With reference steps, the factor of each class they measured (reference_step.h:
// measured over nominal at these rates) is the speed's probed_factor.
DeviceSpeed ProbedSpeed(const DeviceSpeed& sheet, const RateProbe& probe,
                        const std::string& source);

}  // namespace llmctl::estimate

#endif  // LLMCTL_COMMON_ESTIMATE_RATE_PROBE_H_
