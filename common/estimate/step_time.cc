#include "common/estimate/step_time.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/printf.h"

namespace llmctl::estimate {
namespace {

std::string Seconds(double s) {
  if (s >= 1) return Printf("%.2f s", s);
  if (s >= 1e-3) return Printf("%.2f ms", s * 1e3);
  return Printf("%.1f us", s * 1e6);
}

std::string Quantity(double x, const char* unit) {
  const char* prefixes[] = {"", "k", "M", "G", "T", "P", "E"};
  int i = 0;
  while (x >= 1000 && i < 6) {
    x /= 1000;
    ++i;
  }
  return Printf("%.3g ", x) + prefixes[i] + unit;
}

}  // namespace

namespace {

// A class's matmul rates: by shape from a probe, else the data sheet's one rate; a head's from the
// probe's head cells (empty: none).
struct ClassRates {
  const std::vector<ShapeRate>* by_shape;
  double flat;
  const std::vector<ShapeRate>* heads;
};

ClassRates RatesOf(const DeviceSpeed& d, MatmulClass c) {
  return c == MatmulClass::kBf16
             ? ClassRates{&d.bf16_flops_by_shape, d.bf16_flops, &d.bf16_head_flops_by_shape}
             : ClassRates{&d.fp32_flops_by_shape, d.fp32_flops, &d.fp32_head_flops_by_shape};
}

// Whether a probe's head cells `heads` time a head `in` wide: up to their widest hidden width. A
// head wider than that is a GEMM nearer the grid's square weights (a 1B model's 2,048 into
// 128,256), which the grid's rate at its sqrt(in x out) times, as it timed every head before
// version 11.
bool HeadCellsCover(const std::vector<ShapeRate>& heads, int64_t in) {
  return std::any_of(heads.begin(), heads.end(),
                     [in](const ShapeRate& cell) { return cell.width >= in; });
}

// `rates`' rate at `rows` token rows through a `width`-wide weight: the probe's at that shape, else
// the flat rate.
double RateAt(const ClassRates& rates, double rows, double width) {
  return rates.by_shape->empty() ? rates.flat : RateAtShape(*rates.by_shape, rows, width);
}

// The seconds of the step's matmuls (`flops`: attention's among them when the device has no SDPA
// rates, `attention` of them) and a formula saying how: each counted shape at its class's rate at
// its own shape (a probe's; the data sheet's one rate a class at any shape), the FLOPs counted by
// no shape (all of a work that has no shapes) at the work's class's rate for one micro-batch's rows
// through the probe's middle width, and attention's there at its own class's.
TimeTerm Matmuls(const StepWork& w, const DeviceSpeed& d, double flops, double attention) {
  struct Span {
    int shapes = 0;
    double slowest = 0, fastest = 0;
  };
  Span spans[2];  // by class: bf16, fp32
  auto span_of = [&spans](MatmulClass c) -> Span& {
    return spans[c == MatmulClass::kBf16 ? 0 : 1];
  };
  double seconds = 0, counted = 0;
  for (const MatmulShape& shape : w.matmul_shapes) {
    const MatmulClass c = ShapeClass(w, shape);
    const ClassRates rates = RatesOf(d, c);
    const double rows = static_cast<double>(shape.rows);
    const double rate =
        IsHeadShape(shape) && HeadCellsCover(*rates.heads, shape.in)
            ? RateAtShape(*rates.heads, rows, static_cast<double>(shape.in))
            : RateAt(rates, rows, std::sqrt(static_cast<double>(shape.in * shape.out)));
    seconds += shape.flops / rate;
    counted += shape.flops;
    Span& span = span_of(c);
    ++span.shapes;
    span.slowest = span.slowest > 0 ? std::min(span.slowest, rate) : rate;
    span.fastest = std::max(span.fastest, rate);
  }
  const ClassRates own = RatesOf(d, w.matmul_class);
  const MatmulClass other =
      w.matmul_class == MatmulClass::kBf16 ? MatmulClass::kFp32 : MatmulClass::kBf16;
  const Span& others = span_of(other);
  const std::string name(MatmulClassName(w.matmul_class));
  std::string how;
  if (own.by_shape->empty()) {
    // The data sheet's one rate a class.
    how = name;
    if (others.shapes > 0) {
      how += ", " + std::string(MatmulClassName(other)) + " for " + std::to_string(others.shapes) +
             " shapes";
    }
  } else {
    for (const MatmulClass c : {w.matmul_class, other}) {
      const Span& span = span_of(c);
      if (span.shapes == 0) continue;
      how += (how.empty() ? "" : "; ") + std::string(MatmulClassName(c)) +
             " by shape: " + std::to_string(span.shapes) + " shapes at " +
             Quantity(span.slowest, "FLOP/s") + " to " + Quantity(span.fastest, "FLOP/s");
    }
  }
  // The shapes' FLOPs add up to the work's up to rounding.
  if (const double rest = flops - counted; rest > 1e-9 * flops || w.matmul_shapes.empty()) {
    const double rows =
        static_cast<double>(w.tokens) / static_cast<double>(std::max<int64_t>(1, w.micro_batches));
    const double width = static_cast<double>(kProbeMatmulSizeUsed);
    seconds += (rest - attention) / RateAt(own, rows, width) +
               attention / RateAt(RatesOf(d, AttentionClass(w)), rows, width);
    if (!own.by_shape->empty()) {
      const std::string at_rows = Printf("%.0f tokens a micro-batch", rows);
      how = how.empty() ? name + " at " + at_rows : how + ", the rest at " + at_rows;
    }
    if (attention > 0 && AttentionClass(w) != w.matmul_class) {
      how += ", attention " + std::string(MatmulClassName(AttentionClass(w)));
    }
  }
  return {"matmuls",
          Quantity(flops, "FLOP") + " / " + Quantity(flops / seconds, "FLOP/s") + " (" + how + ")",
          seconds};
}

double AttentionShapeFlops(const StepWork& w) {
  double flops = 0;
  for (const AttentionShape& shape : w.attention_shapes) flops += shape.flops;
  return flops;
}

// The attention term: every attention shape of `w` at its own rate from `d`'s attention rates of
// its class; 0 seconds when `d` has none (or `w` no shapes), whose FLOPs are then matmuls'.
TimeTerm AttentionTerm(const StepWork& w, const DeviceSpeed& d) {
  const MatmulClass c = AttentionClass(w);
  const bool bf16 = c == MatmulClass::kBf16;
  const std::vector<ShapeRate>& rates =
      bf16 ? d.bf16_attention_by_length : d.fp32_attention_by_length;
  if (rates.empty() || w.attention_shapes.empty()) return {"attention", "", 0};
  const double share = bf16 ? d.bf16_attention_block_share : d.fp32_attention_block_share;
  double flops = 0, seconds = 0, slowest = 0, fastest = 0;
  for (const AttentionShape& shape : w.attention_shapes) {
    if (!(shape.flops > 0)) continue;
    const double own = AttentionSeconds(shape, rates, share);
    flops += shape.flops;
    seconds += own;
    const double rate = shape.flops / own;
    slowest = slowest > 0 ? std::min(slowest, rate) : rate;
    fastest = std::max(fastest, rate);
  }
  std::string how(MatmulClassName(c));
  if (w.attention_shapes.size() == 1) {
    const AttentionShape& shape = w.attention_shapes.front();
    how += shape.queries == shape.keys ? Printf(" SDPA at %.0f tokens a sequence", shape.queries)
                                       : Printf(" SDPA at %.0f queries", shape.queries) +
                                             Printf(" over %.0f keys", shape.keys);
    how += Printf(", %.0f-wide heads", shape.head_width);
  } else {
    how += " SDPA by shape: " + std::to_string(w.attention_shapes.size()) + " shapes at " +
           Quantity(slowest, "FLOP/s") + " to " + Quantity(fastest, "FLOP/s");
  }
  if (share > 0) how += Printf(", partial query blocks at %.2f of a whole one's cost", share);
  // Uncalibrated: the probe times SDPA's forward and backward whole, as the step calls them, so
  // what the factor stands for (the work the counted terms miss) is in its rate already. Scaled by
  // a CPU's bf16 factor (1.5 on the Xeon with AMX) it priced a 104-token sequence's attention 1.5x
  // what the step spent, and put bf16 rows of `plan` 13-21% slow (12-06).
  return {"attention",
          Quantity(flops, "FLOP") + " / " + Quantity(flops / seconds, "FLOP/s") + " (" + how + ")",
          seconds, /*calibrated=*/false};
}

// `amount` of `unit` at `rate` of them a second: "1.2 G values / 0.8 G values/s" and its time.
TimeTerm RateTerm(const char* name, double amount, double rate, const std::string& unit,
                  bool calibrated = true, const std::string& note = "") {
  return {name,
          Quantity(amount, unit.c_str()) + " / " + Quantity(rate, (unit + "/s").c_str()) + note,
          amount / rate, calibrated};
}

// The part of the step's memory traffic its layers' own element-wise ops make, where a probe's
// layer cell measured their dtypes and kernels: those bytes and their rate (0 and 0 otherwise).
struct LayerTraffic {
  double bytes = 0;
  double bytes_per_s = 0;
};
LayerTraffic LayerTrafficOf(const StepWork& w, const DeviceSpeed& d) {
  if (!(w.layer_memory_bytes > 0)) return {};
  const double rate = LayerElementwiseRateAt(d.layer_elementwise, w);
  if (!(rate > 0)) return {};
  const double activations = w.memory_bytes - std::min(w.state_memory_bytes, w.memory_bytes);
  return {std::min(w.layer_memory_bytes, activations), rate};
}

// The layers' own element-wise ops at the rate of a probe's layer cell (LayerTrafficOf), seconds 0
// without one. Calibrated, as the memory traffic is, though the cell runs those ops whole: taken
// out of the factor (12-06), the layer ops left the reference steps' time to the factor's other
// terms so thinly that a 0.05 s probe in CI's noisy minute found them 0.0095 of their counted time
// in five of six tries, and refused itself; the bf16 factor (1.43 on the Xeon) then prices
// `plan`'s bf16 LoRA rows at 16 x 104 tokens slow.
TimeTerm LayerOpsTerm(const StepWork& w, const LayerTraffic& layers) {
  if (!(layers.bytes > 0)) return {"layer ops", "", 0};
  return {"layer ops",
          Quantity(layers.bytes, "B") + " / " + Quantity(layers.bytes_per_s, "B/s") + " (" +
              std::string(KernelsName(w.layer_kernels)) +
              " norms, RoPE, activation, residual adds and layout copies: " +
              std::string(MatmulClassName(w.elementwise_class)) + " stream, " +
              std::string(MatmulClassName(w.layer_projected_class)) + " projections)",
          layers.bytes / layers.bytes_per_s};
}

// The step's memory traffic beyond the `layers` bytes LayerOpsTerm times: where a probe's
// element-wise rates of its stream's dtype and its stream's tensor size are both known, the
// traffic over activations at the element-wise rate at that size and the traffic over the model's
// state at the memory copy's rate; else all of it at the device's one memory rate.
TimeTerm MemoryTerm(const StepWork& w, const DeviceSpeed& d, double layers) {
  const std::vector<ElementwiseRate>& rates =
      w.elementwise_class == MatmulClass::kBf16 ? d.bf16_elementwise : d.fp32_elementwise;
  if (rates.empty() || !(w.elementwise_tensor_bytes > 0)) {
    return RateTerm("memory", w.memory_bytes - layers, d.memory_bytes_per_s, "B");
  }
  const double state = std::min(w.state_memory_bytes, w.memory_bytes);
  const double activations = w.memory_bytes - state - layers;
  const double elementwise = ElementwiseRateAt(rates, w.elementwise_tensor_bytes);
  const double seconds = activations / elementwise + state / d.memory_bytes_per_s;
  const std::string casts = w.cast_memory_bytes > 0
                                ? ", of it " + Quantity(w.cast_memory_bytes, "B") + " dtype casts"
                                : "";
  return {"memory",
          Quantity(activations, "B") + " / " + Quantity(elementwise, "B/s") + " (" +
              std::string(MatmulClassName(w.elementwise_class)) + " element-wise at " +
              Quantity(w.elementwise_tensor_bytes, "B") + " tensors" + casts + ") + " +
              Quantity(state, "B") + " over the model's state / " +
              Quantity(d.memory_bytes_per_s, "B/s"),
          seconds};
}

// A CPU step's loss over its logits at the rate of its kernels and dtype, else (a device that has
// none, as a GPU's data sheet) as the memory traffic of a GPU's.
TimeTerm LossTerm(const StepWork& w, const DeviceSpeed& d, bool calibrated) {
  const std::string how = " (" + std::string(KernelsName(w.loss_kernels)) + " cross-entropy, " +
                          std::string(MatmulClassName(w.loss_class)) + " logits)";
  if (const double rate = d.loss_logits_per_s.Of(w.loss_kernels, w.loss_class); rate > 0) {
    return RateTerm("loss", w.loss_logits, rate, "logits", calibrated, how);
  }
  const double bytes = LossBytesPerLogit(w.loss_kernels == Kernels::kFused,
                                         w.loss_class == MatmulClass::kFp32 ? 4 : 2);
  return RateTerm("loss", w.loss_logits * bytes, d.memory_bytes_per_s, "B", true,
                  how + " as memory traffic");
}

// A captioning step's images, decoded and resized on one host thread before the step's device
// work (llm-train does not overlap them): their own rate, no factor.
TimeTerm ImagesTerm(const StepWork& w, const DeviceSpeed& d) {
  std::string formula;
  double seconds = 0;
  for (const auto& [name, pixels, rate] : {std::tuple{"JPEG", w.jpeg_pixels, d.jpeg_pixels_per_s},
                                           std::tuple{"PNG", w.png_pixels, d.png_pixels_per_s}}) {
    if (!(pixels > 0)) continue;
    formula += (formula.empty() ? "" : " + ") + Quantity(pixels, "pixels") + " " + name + " / " +
               Quantity(rate, "pixels/s");
    seconds += pixels / rate;
  }
  return {"images", formula + " (decoded and resized)", seconds, false};
}

// Micro-batches at sequence lengths new to the run, measured by the probe's own cells and
// reference steps, so taken as they are (no factor): each class's cost at its weight shapes.
// Seconds 0 without such a cost.
TimeTerm NewLengthsTerm(const StepWork& w, const DeviceSpeed& d) {
  std::string how;
  double seconds = 0;
  for (const MatmulClass c : {MatmulClass::kBf16, MatmulClass::kFp32}) {
    const NewLengthCost& cost = c == MatmulClass::kBf16 ? d.bf16_new_length : d.fp32_new_length;
    const std::vector<WeightShape> weights = WeightShapes(w, c);
    const double micro_batch = cost.MicroBatchSeconds(weights);
    if (!(micro_batch > 0)) continue;
    seconds += w.new_length_micro_batches * micro_batch;
    double values = 0, shapes = 0;
    for (const WeightShape& weight : weights) {
      values += weight.values();
      shapes += cost.WeightSeconds(weight);
    }
    how += (how.empty() ? "" : " + ") + Seconds(micro_batch) + " " +
           std::string(MatmulClassName(c)) + ": " + std::to_string(weights.size()) +
           " weight shapes of " + Quantity(values, "values") + " " + Seconds(shapes) +
           (cost.per_micro_batch < 0 ? " - " : " + ") + Seconds(std::abs(cost.per_micro_batch)) +
           " a micro-batch";
  }
  return {"new lengths",
          Printf("%.2f", w.new_length_micro_batches) +
              " micro-batches at lengths new to the run x (" + how + ")",
          seconds, false};
}

// Issuing the step's ops. On a GPU the host issues kernels ahead of the device: only what issuing
// takes beyond the kernels' own time (the calibrated `terms`) shows.
TimeTerm LaunchesTerm(const StepWork& w, const DeviceSpeed& d, const std::vector<TimeTerm>& terms) {
  const double issuing = w.launches * d.launch_seconds;
  const std::string launches = Printf("%.0f", w.launches) + " x " + Seconds(d.launch_seconds);
  if (!d.launches_overlap) return {"launches", launches, issuing};
  double kernels = 0;
  for (const TimeTerm& term : terms) kernels += term.calibrated ? term.seconds : 0;
  return {
      "launches",
      launches + (issuing > kernels ? ", beyond the kernels' time" : ", hidden behind the kernels"),
      std::max(0.0, issuing - kernels)};
}

// The ranks of a CPU trial on one host share its cores: llm-train's launcher gives each of a
// host's R ranks 1/R of the CPUs it may use (OMP_NUM_THREADS, trainer/dist/rank_launcher.cc), and
// ranks started with more threads than that contend for the same cores. So the work a probe timed
// over all the host's threads (GEMMs, attention, memory traffic, the loss, the optimizer steps,
// NF4's dequantisation) runs at 1/R of its rate on each rank (12-04, the 2-core Zen 4: cpu-multi's
// two-rank fsdp rows ran at 1,680 and 1,762 tokens/s where the whole host's rates had predicted
// 3,288 and 3,326). What one thread does anyway (each op's dispatch, dropout's draws, a new
// length's kernels, a captioning step's images) keeps its time while the host has a core a rank.
// On a GPU node the host's share is its offloaded optimizer step (not yet run on a GPU).
void ShareHostCores(TimeTerm& term, int64_t ranks_on_host) {
  if (ranks_on_host <= 1) return;
  term.seconds *= static_cast<double>(ranks_on_host);
  term.formula += " x " + std::to_string(ranks_on_host) + " ranks sharing the host's cores";
}

// The nominal terms of a step, uncalibrated.
std::vector<TimeTerm> NominalTerms(const StepWork& w, const DeviceSpeed& d) {
  // On a CPU the host is the device: every term is its work.
  const bool host_is_device = !d.launches_overlap;
  const int64_t ranks_on_host = std::max<int64_t>(1, w.world_size / std::max<int64_t>(1, w.nodes));
  // The host's own work: on a CPU every parallel term, on a GPU node the offloaded optimizer step.
  const auto shared = [ranks_on_host](TimeTerm term) {
    ShareHostCores(term, ranks_on_host);
    return term;
  };
  const auto on_device = [&](TimeTerm term) {
    return host_is_device ? shared(std::move(term)) : term;
  };
  std::vector<TimeTerm> terms;
  // A probe's attention rates take each attention shape's FLOPs (SDPA's kernels, not a GEMM's)
  // at its own sequence length and head width: a short sequence's attention runs far below a long
  // one's (11-30, Zen 4, bf16: 30 GFLOP/s at 82 tokens, 46 at 128, 109 at 512). Without them they
  // are matmuls like the others.
  const TimeTerm attention = AttentionTerm(w, d);
  const double counted = attention.seconds > 0 ? AttentionShapeFlops(w) : 0;
  terms.push_back(on_device(Matmuls(w, d, w.matmul_flops - counted, w.attention_flops - counted)));
  if (attention.seconds > 0) terms.push_back(on_device(attention));
  const LayerTraffic layers = LayerTrafficOf(w, d);
  if (layers.bytes > 0) terms.push_back(on_device(LayerOpsTerm(w, layers)));
  terms.push_back(on_device(MemoryTerm(w, d, layers.bytes)));
  // A probe times the optimizer steps below with the trainer's own kernels on this machine: what
  // the factor stands for (the work the counted terms miss) is in their rate already, so a probe's
  // rates leave them uncalibrated. The sheet's are another machine's, and take it.
  const bool probed = !d.rates.empty();
  if (w.adamw_8bit_values > 0) {
    terms.push_back(on_device(RateTerm("8-bit AdamW", w.adamw_8bit_values,
                                       d.adamw_8bit_values_per_s, "values", !probed)));
  }
  if (w.nf4_dequant_values > 0) {
    terms.push_back(on_device(RateTerm("NF4 dequant", w.nf4_dequant_values,
                                       d.nf4_dequant_values_per_s, "values", !probed)));
  }
  if (w.dropout_values > 0 && d.dropout_values_per_s > 0) {
    terms.push_back(RateTerm("dropout", w.dropout_values, d.dropout_values_per_s, "values", !probed,
                             " (masks' draws)"));
  }
  if (w.loss_logits > 0) terms.push_back(on_device(LossTerm(w, d, !probed)));
  if (w.jpeg_pixels > 0 || w.png_pixels > 0) terms.push_back(ImagesTerm(w, d));
  if (w.host_optimizer_values > 0) {
    terms.push_back(
        shared(RateTerm("host optimizer", w.host_optimizer_values, d.host_optimizer_values_per_s,
                        "values", host_is_device && !probed)));
  }
  if (w.host_link_bytes > 0 && d.host_link_bytes_per_s > 0) {
    terms.push_back(RateTerm("host link", w.host_link_bytes, d.host_link_bytes_per_s, "B"));
  }
  if (w.interconnect_bytes > 0) {
    terms.push_back(RateTerm("ranks", w.interconnect_bytes, d.interconnect_bytes_per_s, "B"));
  }
  if (w.network_bytes > 0) {
    terms.push_back(RateTerm("network", w.network_bytes, d.network_bytes_per_s, "B"));
  }
  if (w.new_length_micro_batches > 0) {
    if (TimeTerm new_lengths = NewLengthsTerm(w, d); new_lengths.seconds > 0) {
      terms.push_back(std::move(new_lengths));
    }
  }
  terms.push_back(LaunchesTerm(w, d, terms));
  return terms;
}

}  // namespace

namespace {

// (x, rate) points sorted by x: the rate at `x`, linear in log(x) between the two points around
// it, the nearest point's outside them.
double LogLinear(const std::vector<std::pair<double, double>>& points, double x) {
  if (x <= points.front().first) return points.front().second;
  for (size_t i = 1; i < points.size(); ++i) {
    const auto& [low_x, low] = points[i - 1];
    const auto& [high_x, high] = points[i];
    if (x <= high_x) return low + std::log(x / low_x) / std::log(high_x / low_x) * (high - low);
  }
  return points.back().second;
}

}  // namespace

double& LossRates::Of(Kernels kernels, MatmulClass c) {
  const bool fp32 = c == MatmulClass::kFp32;
  if (kernels == Kernels::kFused) return fp32 ? fused_fp32 : fused_bf16;
  return fp32 ? aten_fp32 : aten_bf16;
}

double LossRates::Of(Kernels kernels, MatmulClass c) const {
  return LossRates(*this).Of(kernels, c);
}

namespace {

// The seconds at `values` from one row count's costs (`costs`, fewest values first, not empty):
// NewLengthCost::by_values' rule at one row count.
double SecondsAtValues(const std::vector<NewLengthCost::AtValues>& costs, double values) {
  if (costs.size() == 1 || values <= costs.front().values) return costs.front().seconds;
  size_t hi = 1;
  while (hi + 1 < costs.size() && costs[hi].values < values) ++hi;
  const NewLengthCost::AtValues& a = costs[hi - 1];
  const NewLengthCost::AtValues& b = costs[hi];
  const double along =
      a.seconds + (b.seconds - a.seconds) * (values - a.values) / (b.values - a.values);
  return values > b.values ? std::max(b.seconds, along) : along;
}

}  // namespace

double NewLengthCost::ShapeSeconds(double values, double rows) const {
  if (by_values.empty()) return 0;
  // Each row count's costs, fewest rows first.
  std::vector<std::vector<AtValues>> groups;
  for (const AtValues& at : by_values) {
    if (groups.empty() || groups.back().front().rows != at.rows) groups.emplace_back();
    groups.back().push_back(at);
  }
  // (rows, seconds at `values`) at each row count: past a later row count's most values, the
  // fewest rows' cost there scaled by the two's ratio at those most values.
  std::vector<std::pair<double, double>> at_rows;
  for (const std::vector<AtValues>& costs : groups) {
    const double most = costs.back().values;
    const double first_at_most =
        &costs == &groups.front() || values <= most ? 0 : SecondsAtValues(groups.front(), most);
    const double seconds = first_at_most > 0 ? SecondsAtValues(groups.front(), values) *
                                                   SecondsAtValues(costs, most) / first_at_most
                                             : SecondsAtValues(costs, values);
    at_rows.emplace_back(costs.front().rows, seconds);
  }
  if (at_rows.size() == 1 || rows <= at_rows.front().first) return at_rows.front().second;
  if (rows >= at_rows.back().first) return at_rows.back().second;
  size_t hi = 1;
  while (at_rows[hi].first < rows) ++hi;
  const auto [rows_a, seconds_a] = at_rows[hi - 1];
  const auto [rows_b, seconds_b] = at_rows[hi];
  return seconds_a + (seconds_b - seconds_a) * std::log(rows / rows_a) / std::log(rows_b / rows_a);
}

double NewLengthCost::WeightSeconds(const WeightShape& weight) const {
  return ShapeSeconds(weight.values(), static_cast<double>(weight.rows)) *
         (weight.frozen ? 2.0 / 3 : 1);
}

double NewLengthCost::MicroBatchSeconds(const std::vector<WeightShape>& weights) const {
  if (weights.empty()) return 0;
  double seconds = per_micro_batch;
  for (const WeightShape& weight : weights) seconds += WeightSeconds(weight);
  return std::max(0.0, seconds);
}

double ElementwiseRateAt(const std::vector<ElementwiseRate>& rates, double tensor_bytes) {
  std::vector<std::pair<double, double>> points;
  for (const ElementwiseRate& rate : rates)
    points.emplace_back(rate.tensor_bytes, rate.bytes_per_s);
  return LogLinear(points, tensor_bytes);
}

double LayerElementwiseRateAt(const std::vector<LayerElementwiseRate>& rates, const StepWork& w) {
  std::vector<std::pair<double, double>> points;
  for (const LayerElementwiseRate& rate : rates) {
    if (rate.stream == w.elementwise_class && rate.projected == w.layer_projected_class &&
        rate.kernels == w.layer_kernels && rate.bytes_per_s > 0) {
      points.emplace_back(rate.tensor_bytes, rate.bytes_per_s);
    }
  }
  if (points.empty()) return 0;
  std::sort(points.begin(), points.end());
  return LogLinear(points, w.elementwise_tensor_bytes);
}

double PaddedQueries(double queries) {
  const double block = queries >= 768 ? 256 : queries >= 192 ? 64 : 32;
  return std::ceil(queries / block) * block;
}

double AttentionSeconds(const AttentionShape& shape, const std::vector<ShapeRate>& rates,
                        double block_share) {
  // The shape's FLOPs scaled to `queries` over `keys`, at the rate there.
  auto seconds_at = [&](double queries, double keys) {
    const double flops = shape.flops * (queries * keys) / (shape.queries * shape.keys);
    return flops / RateAtShape(rates, std::sqrt(queries * keys), shape.head_width);
  };
  const double own = seconds_at(shape.queries, shape.keys);
  if (!(block_share > 0)) return own;
  const double queries = PaddedQueries(shape.queries);
  const double keys = shape.keys == shape.queries ? queries : shape.keys;
  return own + block_share * (seconds_at(queries, keys) - own);
}

bool IsHeadShape(const MatmulShape& shape) {
  return shape.out >= kHeadMinOutput && shape.out >= kHeadMinRatio * shape.in;
}

double RateAtShape(const std::vector<ShapeRate>& rates, double rows, double width) {
  std::vector<ShapeRate> sorted = rates;
  std::sort(sorted.begin(), sorted.end(), [](const ShapeRate& a, const ShapeRate& b) {
    return a.width != b.width ? a.width < b.width : a.rows < b.rows;
  });
  // Each measured width's (rows, rate) points, by width.
  std::vector<std::pair<double, std::vector<std::pair<double, double>>>> widths;
  for (const ShapeRate& r : sorted) {
    if (widths.empty() || widths.back().first != static_cast<double>(r.width)) {
      widths.emplace_back(static_cast<double>(r.width), std::vector<std::pair<double, double>>{});
    }
    widths.back().second.emplace_back(static_cast<double>(r.rows), r.flops_per_s);
  }
  // Past a width's most rows (the probe leaves a wide weight's many-row cells out, past what one
  // call may take), its rate there follows the row trend of the nearest width measured further
  // (as far as that one is measured): a GEMM's rate climbs with its rows at every width (11-30,
  // Zen 4, fp32: 1,024 wide 50, 98 and 117 GFLOP/s at 32, 128 and 512 rows), and holding the last
  // measured rate put llama-3.2-tiny's 4,052-wide head (256 rows) at the 32-row rate, a step
  // predicted 3x too slow (12-02).
  auto rate_along = [&](size_t i) {
    const std::vector<std::pair<double, double>>& points = widths[i].second;
    const double most = points.back().first;
    if (rows <= most) return LogLinear(points, rows);
    const std::vector<std::pair<double, double>>* trend = nullptr;
    double nearest = 0;  // the trend's distance from width i, in log(width)
    for (const auto& [other, other_points] : widths) {
      const double distance = std::abs(std::log(other / widths[i].first));
      if (other_points.back().first > most && (trend == nullptr || distance < nearest)) {
        trend = &other_points;
        nearest = distance;
      }
    }
    if (trend == nullptr) return points.back().second;
    return points.back().second * LogLinear(*trend, rows) / LogLinear(*trend, most);
  };
  std::vector<std::pair<double, double>> by_width;
  for (size_t i = 0; i < widths.size(); ++i) by_width.emplace_back(widths[i].first, rate_along(i));
  return LogLinear(by_width, width);
}

NominalStep NominalStepSeconds(const StepWork& work, const DeviceSpeed& device) {
  NominalStep step;
  for (const TimeTerm& term : NominalTerms(work, device)) {
    (term.calibrated ? step.calibrated : step.fixed) += term.seconds;
  }
  return step;
}

double MeasuredFactor(const StepWork& work, const DeviceSpeed& device, double measured_seconds) {
  const NominalStep nominal = NominalStepSeconds(work, device);
  if (!(nominal.calibrated > 0) || !(measured_seconds > nominal.fixed)) return 0;
  return (measured_seconds - nominal.fixed) / nominal.calibrated;
}

TimeEstimate EstimateTime(const StepWork& work, const DeviceSpeed& device,
                          const Calibration& calibration, int64_t steps) {
  TimeEstimate e;
  e.factor = calibration.Factor(work.matmul_class);
  e.terms = NominalTerms(work, device);
  // The machine's usual pace against its probe's moment slows or speeds every term alike.
  e.pace = calibration.pace > 0 ? calibration.pace : 1.0;
  for (TimeTerm& term : e.terms) {
    if (term.calibrated) term.seconds *= e.factor;
    term.seconds /= e.pace;
    e.step_seconds += term.seconds;
  }
  e.tokens_per_second = static_cast<double>(work.tokens * work.world_size) / e.step_seconds;
  e.startup_seconds = device.startup_seconds +
                      work.model_bytes / (work.pretrained ? device.model_load_bytes_per_s
                                                          : device.model_build_bytes_per_s);
  e.steps = steps;
  if (steps > 0) {
    e.trial_seconds = e.startup_seconds + static_cast<double>(steps) * e.step_seconds;
  }
  return e;
}

}  // namespace llmctl::estimate
