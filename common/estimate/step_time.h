// A trial's time before it runs: the work of one optimizer step (step_work.h) divided by what the
// device does per second (DeviceSpeed), and corrected by how fast the same device measured earlier
// runs (Calibration). No LibTorch: the CLI (`llmctl estimate`, `llmctl plan`, `submit
// --provision`) uses it.
//
// The terms add up (no overlap is assumed), at the device's nominal rates; a calibration factor
// per matmul precision, the measured over the nominal time of earlier runs, turns them into a
// prediction.
#ifndef LLMCTL_COMMON_ESTIMATE_STEP_TIME_H_
#define LLMCTL_COMMON_ESTIMATE_STEP_TIME_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/estimate/gpus.h"
#include "common/estimate/matmul_buffers.h"
#include "common/estimate/step_work.h"
#include "common/status.h"
#include "common/trial_config.h"

namespace llmctl::estimate {

// A rate measured at one shape (rate_probe.h): a projection's forward and both backward matmuls
// over `rows` token rows of a `width` x `width` weight; or causal attention forward and backward
// over sequences of `rows` tokens, `width` a head's width.
struct ShapeRate {
  int64_t rows = 0;
  int64_t width = 0;
  double flops_per_s = 0;
};

// The rate at (rows, width) from `rates` (non-empty): along each measured width linear in
// log(rows) between the two measured row counts around it, below them the fewest rows' rate, and
// past its most rows that rate times the rise from there to `rows` of the nearest width (in log)
// measured at more rows (up to its own most; the most rows' rate where none is); then linear in
// log(width) between the two measured widths around `width`, the nearest one's outside.
double RateAtShape(const std::vector<ShapeRate>& rates, double rows, double width);

// LibTorch's CPU flash attention (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp) runs each
// sequence's queries in blocks of 32 below 192 queries, 64 below 768 and 256 from there: `queries`
// rounded up to a whole number of its blocks.
double PaddedQueries(double queries);

// The seconds of attention `shape`'s FLOPs at `rates` (non-empty; RateAtShape's rows are a
// sequence's tokens: sqrt(queries x keys) for cross-attention): at its own length, plus
// `block_share` of what its queries padded to whole blocks (PaddedQueries; a self-attention's keys
// with them) would take more.
double AttentionSeconds(const AttentionShape& shape, const std::vector<ShapeRate>& rates,
                        double block_share);

// The weight width at which the matmuls a step does not count by shape (a BLIP-2 step's) take a
// probe's rate, and at which `llmctl nodes` shows it: the middle of the probe's widths, near the
// small models' hidden sizes (384 to 768).
inline constexpr int64_t kProbeMatmulSizeUsed = 512;
// A probe's attention: causal, over sequences of 64-wide heads. A step's attention whose sequence
// length is not known (StepWork::attention_seq 0) takes the rate at kProbeAttentionTokens, the
// only length a version 4 probe measured.
inline constexpr int64_t kProbeAttentionHeadWidth = 64;
inline constexpr int64_t kProbeAttentionTokens = 128;

// Logits a second of a step's loss, forward and backward, by the kernels that run it (step_work.h's
// Kernels) and the logits' dtype.
struct LossRates {
  double aten_fp32 = 0;
  double aten_bf16 = 0;
  double fused_fp32 = 0;
  double fused_bf16 = 0;
  // The rate for `kernels` over logits of class `c` (0: not known).
  double Of(Kernels kernels, MatmulClass c) const;
  double& Of(Kernels kernels, MatmulClass c);
};

// Whether `shape` is a vocabulary head's (or its adapter's up-projection): an output of at least
// kHeadMinOutput, kHeadMinRatio times its input or more. No projection of a decoder layer is:
// LLaMA's widest, the MLP's up-projection, is 2.7-3.5 times its input (28,672 over 8,192 in a 70B);
// a head is 7.8 times (a 7B's 32,000 over 4,096) to 1,002 (llama-3.2-tiny's 128,256 over 128).
inline constexpr int64_t kHeadMinOutput = 16384;
inline constexpr int64_t kHeadMinRatio = 4;
bool IsHeadShape(const MatmulShape& shape);

// A probe's element-wise rate at one tensor size (rate_probe.h's ProbedElementwise): bytes read
// and written a second by an out-of-place product of two tensors of `tensor_bytes` each.
struct ElementwiseRate {
  double tensor_bytes = 0;
  double bytes_per_s = 0;
};

// The element-wise rate at tensors of `tensor_bytes` from `rates` (non-empty, fewest bytes
// first): linear in log(bytes) between the two measured sizes around it, the nearest one's
// outside them. A CPU's element-wise ops run from its caches at a small model's sizes and from
// memory at a large one's (12-05, the Xeon, 2 threads, fp32: 137-172 GB/s at 256 KiB to 1 MiB,
// 55-58 at 4 to 16 MiB, 37 at 64 MiB).
double ElementwiseRateAt(const std::vector<ElementwiseRate>& rates, double tensor_bytes);

// A probe's rate for one decoder layer's element-wise ops (rate_probe.h's ProbedLayerElementwise):
// the bytes LayerElementwiseBytes counts for its cell over the cell's seconds, by the dtypes and
// kernels it ran and at its residual stream's size.
struct LayerElementwiseRate {
  MatmulClass stream = MatmulClass::kFp32;
  MatmulClass projected = MatmulClass::kFp32;
  Kernels kernels = Kernels::kAten;
  double tensor_bytes = 0;  // the cell's residual stream: tokens x hidden x the stream's element
  double bytes_per_s = 0;
};

// The rate of `w`'s layers' element-wise ops (its elementwise_class, layer_projected_class and
// layer_kernels) from `rates`, at its elementwise_tensor_bytes as ElementwiseRateAt takes a size;
// 0 where none was measured for those dtypes and kernels.
double LayerElementwiseRateAt(const std::vector<LayerElementwiseRate>& rates, const StepWork& w);

// What a micro-batch at a length new to the run costs beyond one at a length every step had, in
// one matmul class: a CPU's 16-bit GEMMs build their kernels for each new shape and take fresh
// buffers for the operands they pack (12-05, Xeon with AMX, bf16, a projection's three
// GEMMs: 3.3-3.6 ms at 128-384 wide, 13-16 ms at 512 x 4,096, 22-30 ms at 2,048 x 4,096), and
// attention's kernels for the new length. From the probe (rate_probe.h's ProbedSpeed): what each of
// the micro-batch's weight shapes costs by its values, between the probe's new_shapes cells, and
// the part of a micro-batch beyond its GEMMs' (the reference steps' difference less what the cells
// say of the reference's own weights). Empty: not measured.
struct NewLengthCost {
  // A weight shape's cost at `values` weight values (in x out) and `rows` token rows (0: the
  // probe's only row count, before version 18).
  struct AtValues {
    double values = 0;
    double seconds = 0;
    double rows = 0;
  };
  // By rows, then values, fewest first. At each row count, by values: linear between two, the
  // nearest one's below the first, and past the last the last two's slope on (never below the
  // last); one: every shape's cost. Past the most values of a row count after the first, the first
  // row count's cost scaled by the two's ratio at those values (the probe times its widest weight
  // at its fewest rows alone). Between two row counts linear in log(rows), outside them the
  // nearest one's: a new length's kernels cost more at more rows, then no more (12-07, Xeon with
  // AMX, bf16, 768 x 2,048: 9.9 ms at 128 rows, 14.9 at 364, 15.4 at 728).
  std::vector<AtValues> by_values = {};
  double per_micro_batch = 0;

  // The seconds of one weight shape of `values` values at `rows` rows (0 without by_values): a
  // projection's three GEMMs, as the probe's cells run them.
  double ShapeSeconds(double values, double rows) const;
  // The seconds of `weight`'s GEMMs at its rows: ShapeSeconds, two thirds of it for a frozen
  // weight, whose backward skips the weight's gradient.
  double WeightSeconds(const WeightShape& weight) const;
  // The seconds one micro-batch at a new length costs whose matmuls in this class have `weights`:
  // 0 without any, and never below 0.
  double MicroBatchSeconds(const std::vector<WeightShape>& weights) const;
  bool measured() const { return !by_values.empty() || per_micro_batch != 0; }
};

// What a device does per second at its nominal (data-sheet) rates.
struct DeviceSpeed {
  std::string name;  // a GPU of gpus.h, or "cpu"
  double bf16_flops = 0;
  double fp32_flops = 0;
  // A probe's matmul rates by shape (empty: the flat rates above serve at any shape): a step's
  // matmuls each take the rate at their own shape (StepWork::matmul_shapes).
  std::vector<ShapeRate> bf16_flops_by_shape;
  std::vector<ShapeRate> fp32_flops_by_shape;
  // A probe's rates of a vocabulary head's GEMMs (IsHeadShape) by a chunk's rows (ShapeRate's rows)
  // and the hidden width (its width), at any wide output. Empty, or a head wider than their widest
  // hidden: a head takes the rate by shape above at its weight's sqrt(in x out).
  std::vector<ShapeRate> bf16_head_flops_by_shape;
  std::vector<ShapeRate> fp32_head_flops_by_shape;
  // A probe's causal attention (SDPA) rates by sequence length (ShapeRate's rows: tokens a
  // sequence; width: a head's), which a step's attention FLOPs take at its own sequences' length
  // (StepWork::attention_seq). Empty: the matmul rate, as the data sheets have no other.
  std::vector<ShapeRate> bf16_attention_by_length;
  std::vector<ShapeRate> fp32_attention_by_length;
  // How much of a partial query block's padding a sequence pays for (AttentionSeconds' share): a
  // probe's, from its attention at a length one past a block (0: none measured, as on a GPU or a
  // data sheet). 11-30, Zen 4: about half in bf16, whose blocks are packed whole for its dot
  // products, next to none in fp32.
  double bf16_attention_block_share = 0;
  double fp32_attention_block_share = 0;
  // Memory traffic: one copy through memory (a data sheet's bandwidth, a probe's 64 MiB copy),
  // and a probe's element-wise rates by tensor size (version 15, a CPU's; empty: the copy's rate
  // serves at any size), which a step's element-wise traffic takes at its residual stream's size
  // and dtype (StepWork::elementwise_tensor_bytes).
  double memory_bytes_per_s = 0;
  std::vector<ElementwiseRate> bf16_elementwise = {};
  std::vector<ElementwiseRate> fp32_elementwise = {};
  // A probe's rates of one decoder layer's element-wise ops (version 16, a CPU's; empty: the
  // element-wise product's rate serves), which a step's StepWork::layer_memory_bytes take.
  std::vector<LayerElementwiseRate> layer_elementwise = {};
  double launch_seconds = 0;
  // A GPU runs kernels while the host issues the next ones: launches cost only what issuing takes
  // beyond the kernels' time. A CPU runs each op's dispatch and its work one after the other.
  bool launches_overlap = false;
  double host_optimizer_values_per_s = 0;
  double adamw_8bit_values_per_s = 0;   // the CPU's 8-bit AdamW step (StepWork::adamw_8bit_values)
  double nf4_dequant_values_per_s = 0;  // the CPU's NF4 dequantisation (StepWork's)
  double dropout_values_per_s = 0;      // the CPU's dropout masks' draws (StepWork's)
  // The CPU's loss over its logits (StepWork::loss_logits), forward and backward, by the kernels
  // and the logits' dtype; 0: not known, timed as the memory traffic a GPU's loss is
  // (LossBytesPerLogit's bytes at memory_bytes_per_s).
  LossRates loss_logits_per_s;
  // The host's decoding, resizing and normalising of a captioning step's images, one thread, in
  // source pixels a second (StepWork's jpeg_pixels and png_pixels).
  double jpeg_pixels_per_s = 0;
  double png_pixels_per_s = 0;
  double host_link_bytes_per_s = 0;
  double interconnect_bytes_per_s = 0;
  double network_bytes_per_s = 0;
  double startup_seconds = 0;          // process, device and data set-up
  double model_build_bytes_per_s = 0;  // random initialisation
  double model_load_bytes_per_s = 0;   // pretrained weights from local disk
  // Where the rates come from: "" for the data sheet's nominal ones, else the probe that measured
  // them (rate_probe.h's ProbedSpeed).
  std::string rates;
  // That probe's pace_seconds, the machine's pace as it measured (trainer/train/machine_pace.h),
  // which the report sets a trial's steps' pace against; 0 without one (the data sheet's rates, a
  // GPU's probe, one before version 20).
  double pace_seconds = 0;
  // Measured over nominal for the probe's own reference step of each class (reference_step.h), at
  // lengths every step had: the LLaMA family's calibration on this device until the store has
  // runs of it. 0: none measured.
  double probed_bf16_factor = 0;
  double probed_fp32_factor = 0;
  // What a micro-batch at a length new to the run costs beyond one at a length every step had, by
  // the class of its matmuls (NewLengthCost). StepWork::new_length_micro_batches take it.
  NewLengthCost bf16_new_length = {};
  NewLengthCost fp32_new_length = {};
  // Not a rate but the same probe's measure of the same kernels: what a vocabulary head's products
  // take from LibTorch's allocator while they run, which the memory estimate adds (a CPU's; {}: not
  // measured).
  MatmulBuffers matmul_buffers = {};
};

// The speed of a GPU of gpus.h, or of the CPU a node has ("cpu" here: the rates of the machine
// the defaults were measured on, a 2-core AMD EPYC Zen 4).
DeviceSpeed GpuSpeed(const Gpu& gpu);
DeviceSpeed CpuSpeed();

// The speed a trial's time is predicted at, given its device's data-sheet speed and its
// experiment's `target:` (which nodes may run it; empty for any): the same, or the rates a probe
// measured on such a node (rate_probe.h's ProbedSpeed). Estimate's and plan's options.
using SpeedLookup = std::function<DeviceSpeed(const DeviceSpeed& sheet,
                                              const std::map<std::string, std::string>& target)>;

// How the nominal time compares with measured runs on one device model: a factor per matmul
// class, the median over those runs of (measured - fixed) / calibrated (NominalStep). With no run
// of a class, the other class's factor serves; with none at all, the built-in default (from the
// 11-26 H200 run for the GPUs, from the CPU lab on the machine CpuSpeed describes).
struct Calibration {
  double bf16_factor = 1;
  double fp32_factor = 1;
  int bf16_runs = 0;
  int fp32_runs = 0;
  // Of those runs, the ones whose measured time was set to the device's probe's pace (Calibrate).
  int paced_runs = 0;
  // How fast the machine usually runs against the moment its probe measured: the median over the
  // device's stored runs with a pace of the probe's canary seconds over theirs (0.8: the runs'
  // steps took the canary 1.25x the probe's seconds); 1 without such runs. Every term of a step's
  // time is divided by it (EstimateTime): a probe taken in a fast moment of a shared VM
  // otherwise times every later trial fast, however well the factors fit.
  double pace = 1;
  std::string source;  // "built-in (...)", or "N runs on DEVICE in the local store"

  double Factor(MatmulClass c) const { return c == MatmulClass::kBf16 ? bf16_factor : fp32_factor; }
  int runs() const { return bf16_runs + fp32_runs; }
};

Calibration DefaultCalibration(const DeviceSpeed& device, ModelFamily family);

// Where a caller finds a device's calibration for a model family (estimate's and plan's options).
using CalibrationLookup = std::function<Calibration(const DeviceSpeed&, ModelFamily)>;

// A run measured earlier: its step's work and 1 / its tokens per second (over all its ranks).
struct MeasuredRun {
  StepWork work;
  double seconds_per_token = 0;
  // The median of its steps' pace canary seconds (trainer/train/machine_pace.h): the machine's
  // pace while it ran; 0 where its steps had none.
  double pace_seconds = 0;
};

// The calibration of `family` on `device` from `runs` on it: only the runs of the same family
// count (another family's step spends its time differently), and where `device` has element-wise
// rates, only the LLaMA runs whose work says its tensors' size (stored since 12-05); without any,
// the default. A run with a pace on a device whose probe has one counts at the probe's pace: its
// measured time times the probe's pace seconds over its own, so a run measured while a shared
// machine ran 1.4x as fast as when it was probed does not set a factor 1.4x too quick; and the
// median of those paces, over the runs of every family, is the machine's usual pace
// (Calibration::pace), even where the factors are the default.
Calibration Calibrate(const DeviceSpeed& device, ModelFamily family,
                      const std::vector<MeasuredRun>& runs);

struct TimeTerm {
  std::string name;
  std::string formula;
  double seconds = 0;  // calibrated
  // Whether the calibration factor applies: the work the device itself does (on a GPU its
  // kernels; on a CPU everything but an optimizer step a probe timed). The host's optimizer step
  // and the links to the host, to other ranks and to other nodes are taken at their nominal rates.
  bool calibrated = true;
};

struct TimeEstimate {
  double step_seconds = 0;
  double tokens_per_second = 0;  // per rank x ranks: the trial's whole throughput
  double startup_seconds = 0;
  int64_t steps = 0;            // 0 when the step count is not known before the data is read
  double trial_seconds = 0;     // startup + steps x step: 0 when steps is 0
  double factor = 1;            // the calibration's, for this work's class
  double pace = 1;              // the calibration's: every term is over it
  std::vector<TimeTerm> terms;  // the step's parts, for --explain
};

// The seconds of one step of `work` on `device` at its nominal rates: `calibrated` the terms the
// calibration factor applies to, `fixed` the others. Calibrate compares measured runs with these.
struct NominalStep {
  double calibrated = 0;
  double fixed = 0;
};
NominalStep NominalStepSeconds(const StepWork& work, const DeviceSpeed& device);

// The range of calibration factors a measured step can imply. Near 1 where the rates and the step
// were measured alike (0.9 to 1.3 on an idle CPU); further where they were not (a probe run beside
// a parallel test suite measured its matmuls slowed and its reference step less so: 0.15, which
// is then the calibration that corrects those rates), and against a data sheet (bf16 emulated on a
// CPU without bf16 instructions: about 4). A hundredfold either way is not one machine's step over
// its own work: another process's error (a step of 1e-300 s), which would scale every trial's time
// by it. Calibrate leaves such a run out, and a probe whose reference step implies one is refused
// (rate_probe.h).
inline constexpr double kMinMeasuredFactor = 0.01;
inline constexpr double kMaxMeasuredFactor = 100;

// The calibration factor one measured step of `work` on `device` implies: its seconds beyond the
// fixed terms over the calibrated terms' nominal seconds. 0 when it implies none (no calibrated
// work, or a step no longer than its fixed terms). Calibrate takes it of each stored run, the
// probe's reference steps (rate_probe.h) of theirs.
double MeasuredFactor(const StepWork& work, const DeviceSpeed& device, double measured_seconds);

// The time of `work` on `device`: `steps` optimizer steps (0: unknown) after the start-up.
TimeEstimate EstimateTime(const StepWork& work, const DeviceSpeed& device,
                          const Calibration& calibration, int64_t steps);

}  // namespace llmctl::estimate

#endif  // LLMCTL_COMMON_ESTIMATE_STEP_TIME_H_
