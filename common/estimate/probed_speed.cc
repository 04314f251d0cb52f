// ProbedSpeed (rate_probe.h): a probe's figures turned into the rates a step's time takes, with
// what its reference steps and new-shape cells say of the factor and of a new length's cost.
#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/estimate/rate_probe.h"
#include "common/estimate/reference_step.h"

namespace llmctl::estimate {
namespace {

// `dtype`'s reference step at new lengths or at repeated ones (null: not measured).
const ProbedStep* FindStep(const RateProbe& probe, const std::string& dtype, bool new_lengths) {
  for (const ProbedStep& step : probe.reference_steps) {
    if (step.dtype == dtype && step.new_lengths == new_lengths) return &step;
  }
  return nullptr;
}

// What `dtype`'s new_shapes cells say a projection's GEMMs at a new length cost by the cells' rows
// and the weight's values: each cell's call at new rows less its call at repeated rows (never below
// 0), cells of the same rows and values averaged, fewest rows, then values, first. Empty without
// cells.
std::vector<NewLengthCost::AtValues> NewShapeCosts(const RateProbe& probe,
                                                   const std::string& dtype) {
  // (rows, values): (seconds summed, cells)
  std::map<std::pair<double, double>, std::pair<double, int>> by_rows_values;
  for (const ProbedNewShape& n : probe.new_shapes) {
    if (n.dtype != dtype || !(n.new_seconds > 0) || !(n.repeated_seconds > 0)) continue;
    auto& [seconds, cells] =
        by_rows_values[{static_cast<double>(n.rows), WeightShape{n.in, n.out}.values()}];
    seconds += std::max(0.0, n.new_seconds - n.repeated_seconds);
    ++cells;
  }
  std::vector<NewLengthCost::AtValues> costs;
  for (const auto& [rows_values, sum] : by_rows_values) {
    costs.push_back({.values = rows_values.second,
                     .seconds = sum.first / static_cast<double>(sum.second),
                     .rows = rows_values.first});
  }
  return costs;
}

// From `dtype`'s reference steps: the factor (step_time.h's MeasuredFactor of the reference trial's
// counted work) of the step at repeated lengths, else (a version 4 probe) of the one at new
// lengths; and, with both, what a micro-batch at a new length costs (NewLengthCost): the steps'
// difference a micro-batch, of which the new_shapes cells (NewShapeCosts) take the part of the
// reference's weight shapes and leave the rest a micro-batch's (attention's kernels for the
// length; 12-05, Xeon with AMX, bf16: 38-46 ms a micro-batch, of which the cells say 34-41), or
// without cells (before version 14) each of the reference's weight shapes an equal part. Nothing
// when not implied.
// The step at new lengths does the same work and more, so it bounds the repeated one: where the
// repeated step measured slower, its own median took the machine's slow spell, and the quicker
// is the step's time (12-05, Xeon with AMX: one probe's fp32 repeated step at 0.164 s where its
// new-length one took 0.117 and five other probes' both 0.109-0.120; its factor 1.54 against
// 1.06-1.10 set every fp32 row 8-38% slow).
std::pair<double, NewLengthCost> ReferenceCosts(const RateProbe& probe, const std::string& dtype,
                                                const DeviceSpeed& speed) {
  const ProbedStep* fresh = FindStep(probe, dtype, true);
  const ProbedStep* repeated = FindStep(probe, dtype, false);
  const ProbedStep* steady = repeated != nullptr ? repeated : fresh;
  if (steady == nullptr) return {0, {}};
  if (fresh != nullptr && fresh->seconds < steady->seconds) steady = fresh;
  const StatusOr<StepWork> work = ReferenceWork(MatmulClassNamed(dtype));
  if (!work.ok()) return {0, {}};
  const double factor = MeasuredFactor(*work, speed, steady->seconds);
  // Every micro-batch of the step at new lengths is at one; the difference is noise when the two
  // steps are within each other's spread, and never below 0.
  if (fresh == nullptr || repeated == nullptr || !(fresh->seconds > repeated->seconds)) {
    return {factor, {}};
  }
  const double micro_batch =
      (fresh->seconds - repeated->seconds) / static_cast<double>(work->micro_batches);
  const std::vector<WeightShape> weights = WeightShapes(*work, work->matmul_class);
  NewLengthCost cost = {.by_values = NewShapeCosts(probe, dtype)};
  if (cost.by_values.empty()) {
    const double per_shape = micro_batch / static_cast<double>(std::max<size_t>(1, weights.size()));
    return {factor, {.by_values = {{0, per_shape}}}};
  }
  double shapes = 0;
  for (const WeightShape& weight : weights) shapes += cost.WeightSeconds(weight);
  cost.per_micro_batch = micro_batch - shapes;
  return {factor, cost};
}

// The share of a partial query block's padding `dtype`'s attention paid in the probe's row one past
// a block (AttentionSeconds' block_share): where its time lies between the whole-block grid's
// `rates` at its own length (0) and at its queries padded to the next block (1). 0 without such a
// row.
double BlockShare(const RateProbe& probe, const std::string& dtype,
                  const std::vector<ShapeRate>& rates) {
  if (rates.empty()) return 0;
  for (const ProbedAttention& a : probe.sdpa_partial_block) {
    if (a.dtype != dtype || !(a.flops_per_s > 0)) continue;
    // FLOPs on any scale: the share is a ratio of times.
    const double tokens = static_cast<double>(a.tokens);
    const AttentionShape shape = {.queries = tokens,
                                  .keys = tokens,
                                  .head_width = static_cast<double>(a.head_width),
                                  .flops = tokens * tokens};
    const double own = AttentionSeconds(shape, rates, 0);
    const double padded = AttentionSeconds(shape, rates, 1);
    if (!(padded > own)) return 0;
    return std::clamp((shape.flops / a.flops_per_s - own) / (padded - own), 0.0, 1.0);
  }
  return 0;
}

}  // namespace

DeviceSpeed ProbedSpeed(const DeviceSpeed& sheet, const RateProbe& probe,
                        const std::string& source) {
  DeviceSpeed speed = sheet;
  speed.rates = source;
  speed.pace_seconds = probe.pace_seconds.value_or(0);
  speed.fp32_flops = probe.MatmulFlops("fp32", kProbeMatmulSizeUsed);
  speed.fp32_flops_by_shape = probe.MatmulRates("fp32");
  speed.fp32_head_flops_by_shape = probe.HeadRates("fp32");
  // Before version 4 the probe timed attention's forward alone, which a step's attention (forward
  // and backward) ran up to 3x slower than on a CPU in bf16: such a probe's attention is left out,
  // and the step's attention FLOPs take its matmul rate, as a data sheet's do.
  const bool attention = probe.version >= 4;
  if (attention) speed.fp32_attention_by_length = probe.AttentionRates("fp32");
  // The bf16 class's matmuls run as bf16 (fp16 only under 16-mixed, a GPU's case, where both
  // are tensor-core rates). On a CPU without LibTorch's bf16 GEMM the trainer forms them as fp32
  // GEMMs over converted blocks (trainer/kernels/linear.h): the probe's rate is that path's.
  const double bf16 = probe.MatmulFlops("bf16", kProbeMatmulSizeUsed);
  if (bf16 > 0) {
    speed.bf16_flops = bf16;
    speed.bf16_flops_by_shape = probe.MatmulRates("bf16");
    speed.bf16_head_flops_by_shape = probe.HeadRates("bf16");
  }
  if (attention) speed.bf16_attention_by_length = probe.AttentionRates("bf16");
  speed.memory_bytes_per_s = probe.memory_bytes_per_s;
  speed.fp32_elementwise = probe.ElementwiseRates("fp32");
  speed.bf16_elementwise = probe.ElementwiseRates("bf16");
  speed.layer_elementwise = probe.LayerElementwiseRates();
  if (probe.launch_seconds > 0) speed.launch_seconds = probe.launch_seconds;
  if (probe.host_adamw_values_per_s > 0) {
    speed.host_optimizer_values_per_s = probe.host_adamw_values_per_s;
  }
  if (probe.adamw_8bit_values_per_s > 0) {
    speed.adamw_8bit_values_per_s = probe.adamw_8bit_values_per_s;
  }
  if (probe.nf4_dequant_values_per_s > 0) {
    speed.nf4_dequant_values_per_s = probe.nf4_dequant_values_per_s;
  }
  if (probe.dropout_values_per_s > 0) speed.dropout_values_per_s = probe.dropout_values_per_s;
  speed.matmul_buffers = probe.HeadBuffers();
  for (const ProbedLoss& l : probe.loss) {
    if (!(l.logits_per_s > 0)) continue;
    speed.loss_logits_per_s.Of(KernelsNamed(l.kernels), MatmulClassNamed(l.dtype)) = l.logits_per_s;
  }
  if (probe.jpeg_pixels_per_s > 0) speed.jpeg_pixels_per_s = probe.jpeg_pixels_per_s;
  if (probe.png_pixels_per_s > 0) speed.png_pixels_per_s = probe.png_pixels_per_s;
  if (probe.host_to_device_bytes_per_s > 0 && probe.device_to_host_bytes_per_s > 0) {
    // Offloading copies both ways about as much: the harmonic mean of the two.
    speed.host_link_bytes_per_s =
        2 / (1 / probe.host_to_device_bytes_per_s + 1 / probe.device_to_host_bytes_per_s);
  }
  // Before the reference steps' costs, whose nominal time takes it.
  speed.fp32_attention_block_share = BlockShare(probe, "fp32", speed.fp32_attention_by_length);
  speed.bf16_attention_block_share = BlockShare(probe, "bf16", speed.bf16_attention_by_length);
  std::tie(speed.probed_fp32_factor, speed.fp32_new_length) = ReferenceCosts(probe, "fp32", speed);
  std::tie(speed.probed_bf16_factor, speed.bf16_new_length) = ReferenceCosts(probe, "bf16", speed);
  return speed;
}

}  // namespace llmctl::estimate
