// RateProbe's JSON (rate_probe.h): every field read and checked at the edge, and written back in
// the same form. The rates derived from it: rate_probe.cc.
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/estimate/rate_probe.h"
#include "common/estimate/reference_step.h"
#include "common/text.h"

namespace llmctl::estimate {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

constexpr char kWhere[] = "rate probe";
// A CPU's model name (/proc/cpuinfo) or a GPU's (NVML) is well under it.
constexpr size_t kMaxDeviceNameBytes = 256;
// The probe's other texts: a dtype, a device kind, a time in ISO 8601.
constexpr size_t kMaxTextBytes = 64;

Status Refuse(const std::string& field, const std::string& problem) {
  return InvalidArgumentError(std::string(kWhere) + ": '" + field + "' " + problem);
}

// What a measured quantity of one machine can be: a probe's figure is 0 (not measured) or inside
// its unit's range, wide enough for any CPU or GPU (a 2-core CPU's 64-wide fp32 GEMM: 24 GFLOP/s;
// an H200's bf16: about 1e15; its memory: 4.8e12 B/s), so that another process's broken or
// hostile figure (1e-300 FLOP/s) cannot time a step at 1e300 s, or at 0.
struct Bounds {
  double min;
  double max;
  const char* unit;
};
constexpr Bounds kFlopRate = {1e6, 1e17, "FLOP/s"};
constexpr Bounds kByteRate = {1e6, 1e15, "B/s"};
constexpr Bounds kValueRate = {1e3, 1e14, "values/s"};
constexpr Bounds kPixelRate = {1e3, 1e13, "pixels/s"};
constexpr Bounds kLogitRate = {1e3, 1e14, "logits/s"};
constexpr Bounds kLaunchSeconds = {1e-9, 1, "s"};
// A bound no real step nears (0.1-0.2 s here), above a step that fast timers can tell apart.
constexpr Bounds kStepSeconds = {1e-6, 3600, "s"};
constexpr Bounds kPaceSeconds = {kPaceSecondsMin, kPaceSecondsMax, "s"};
// The probe's own duration: informational, any finite time up to a day.
constexpr Bounds kProbeSeconds = {0, 86400, "s"};
// A slowest sample 1,000 times the quickest is no machine's speed moving but a stalled one.
// A GEMM's buffers: past a terabyte is no measurement.
constexpr uint64_t kMaxBufferBytes = uint64_t{1} << 40;
constexpr Bounds kSpread = {0, 1000, "(the slowest sample over the quickest, less one)"};

std::string Number(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", x);
  return text;
}

// A number at `key` of `object` that is 0 or inside `bounds`, or InvalidArgument naming `path`.
StatusOr<double> Rate(const json& object, const std::string& key, const std::string& path,
                      const Bounds& bounds) {
  const auto found = object.find(key);
  if (found == object.end()) return Refuse(path, "is missing");
  const double x = found->is_number() ? found->get<double>() : -1;
  if (!(x == 0 || (x >= bounds.min && x <= bounds.max))) {
    return Refuse(path, "must be 0 (not measured) or from " + Number(bounds.min) + " to " +
                            Number(bounds.max) + " " + bounds.unit);
  }
  return x;
}

// A string at `key` of `object` of at most `max_bytes` printable bytes (PrintableTextProblem), or
// InvalidArgument naming `path`: Summary prints the probe's texts under estimate's and plan's
// tables, and `llmctl nodes` a node's.
StatusOr<std::string> Text(const json& object, const std::string& key, const std::string& path,
                           size_t max_bytes = kMaxTextBytes) {
  const auto found = object.find(key);
  if (found == object.end() || !found->is_string()) {
    return Refuse(path, found == object.end() ? "is missing" : "must be a string");
  }
  std::string text = found->get<std::string>();
  if (const std::string problem = PrintableTextProblem(text, max_bytes); !problem.empty()) {
    return Refuse(path, problem);
  }
  return text;
}

// "fp32", "bf16" or "fp16" at `path`.dtype of `row`.
StatusOr<std::string> Dtype(const json& row, const std::string& path) {
  ASSIGN_OR_RETURN(std::string dtype, Text(row, "dtype", path + ".dtype"));
  if (dtype != "fp32" && dtype != "bf16" && dtype != "fp16") {
    return Refuse(path + ".dtype", "must be fp32, bf16 or fp16");
  }
  return dtype;
}

// The list at `key` of `j`, each element an object that `parse_row(row, "key[i]")` turns into a
// Row.
template <typename Row, typename ParseRow>
StatusOr<std::vector<Row>> ParseRows(const json& j, const std::string& key, ParseRow parse_row) {
  const auto found = j.find(key);
  if (found == j.end() || !found->is_array()) return Refuse(key, "must be a list");
  std::vector<Row> rows;
  for (size_t i = 0; i < found->size(); ++i) {
    const json& row = (*found)[i];
    const std::string path = key + "[" + std::to_string(i) + "]";
    if (!row.is_object()) return Refuse(path, "must be an object");
    ASSIGN_OR_RETURN(Row parsed, parse_row(row, path));
    rows.push_back(std::move(parsed));
  }
  return rows;
}

// Every row of the list at `key` (ParseRows read it) has `field`, which a row parser takes as
// optional for older versions: InvalidArgument naming the first row without it.
Status RequireInEveryRow(const json& j, const std::string& key, const std::string& field) {
  const json& rows = j.at(key);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!rows[i].contains(field)) {
      return Refuse(key + "[" + std::to_string(i) + "]." + field, "is missing");
    }
  }
  return Status::Ok();
}

// An integer from 1 to `most` at `key` of `row`, or InvalidArgument naming `path`.key: a cell's
// shape, which the estimate multiplies, so bounded well inside a double's exact integers.
StatusOr<int64_t> CountAt(const json& row, const std::string& key, const std::string& path,
                          int64_t most) {
  const auto found = row.find(key);
  if (found == row.end() || !found->is_number_integer() || found->get<int64_t>() < 1 ||
      found->get<int64_t>() > most) {
    return Refuse(path + "." + key, "must be an integer from 1 to " + std::to_string(most));
  }
  return found->get<int64_t>();
}

// "aten" or "fused" at `path`.kernels of `row`.
StatusOr<std::string> KernelsAt(const json& row, const std::string& path) {
  ASSIGN_OR_RETURN(std::string kernels, Text(row, "kernels", path + ".kernels"));
  if (kernels != "aten" && kernels != "fused") {
    return Refuse(path + ".kernels", "must be aten or fused");
  }
  return kernels;
}

StatusOr<ProbedMatmul> ParseMatmul(const json& row, const std::string& path) {
  ProbedMatmul m;
  ASSIGN_OR_RETURN(m.dtype, Dtype(row, path));
  const auto size = row.find("size");
  if (size == row.end() || !size->is_number_integer() || size->get<int64_t>() < 1) {
    return Refuse(path + ".size", "must be a positive integer");
  }
  m.size = size->get<int64_t>();
  // Version 1 has no tokens: 512, what it measured (FromJson refuses the field's absence in 2).
  if (const auto tokens = row.find("tokens"); tokens != row.end()) {
    if (!tokens->is_number_integer() || tokens->get<int64_t>() < 1) {
      return Refuse(path + ".tokens", "must be a positive integer");
    }
    m.tokens = tokens->get<int64_t>();
  }
  ASSIGN_OR_RETURN(m.flops_per_s, Rate(row, "flops_per_s", path + ".flops_per_s", kFlopRate));
  return m;
}

// A head row's dtype (fp32 or bf16) and shape: a chunk's `tokens` rows by `hidden` through a
// `vocab`-wide output (ProbedHead's and ProbedHeadBuffers').
Status ParseHeadShape(const json& row, const std::string& path, std::string& dtype, int64_t& tokens,
                      int64_t& hidden, int64_t& vocab) {
  ASSIGN_OR_RETURN(dtype, Dtype(row, path));
  if (dtype == "fp16") return Refuse(path + ".dtype", "must be fp32 or bf16");
  for (auto [key, field] :
       {std::pair{"tokens", &tokens}, std::pair{"hidden", &hidden}, std::pair{"vocab", &vocab}}) {
    const auto found = row.find(key);
    if (found == row.end() || !found->is_number_integer() || found->get<int64_t>() < 1) {
      return Refuse(path + "." + key, "must be a positive integer");
    }
    *field = found->get<int64_t>();
  }
  return Status::Ok();
}

StatusOr<ProbedHead> ParseHead(const json& row, const std::string& path) {
  ProbedHead h;
  RETURN_IF_ERROR(ParseHeadShape(row, path, h.dtype, h.tokens, h.hidden, h.vocab));
  ASSIGN_OR_RETURN(h.flops_per_s, Rate(row, "flops_per_s", path + ".flops_per_s", kFlopRate));
  return h;
}

StatusOr<ProbedHeadBuffers> ParseHeadBuffers(const json& row, const std::string& path) {
  ProbedHeadBuffers b;
  RETURN_IF_ERROR(ParseHeadShape(row, path, b.dtype, b.tokens, b.hidden, b.vocab));
  for (auto [key, field] : {std::pair{"logits_bytes", &b.logits_bytes},
                            std::pair{"input_gradient_bytes", &b.input_gradient_bytes},
                            std::pair{"weight_gradient_bytes", &b.weight_gradient_bytes}}) {
    const auto found = row.find(key);
    if (found == row.end() || !found->is_number_unsigned() ||
        found->get<uint64_t>() > kMaxBufferBytes) {
      return Refuse(path + "." + key,
                    "must be an integer from 0 to " + std::to_string(kMaxBufferBytes));
    }
    *field = found->get<uint64_t>();
  }
  return b;
}

StatusOr<ProbedAttention> ParseAttention(const json& row, const std::string& path) {
  ProbedAttention a;
  ASSIGN_OR_RETURN(a.dtype, Dtype(row, path));
  // Before version 5 no tokens: 128, what it measured (FromJson refuses the field's absence in 5).
  if (row.contains("tokens")) {
    ASSIGN_OR_RETURN(a.tokens, CountAt(row, "tokens", path, kMaxAttentionTokens));
  }
  // Before version 6 no head_width: 64, what it measured (FromJson refuses its absence in 6).
  if (row.contains("head_width")) {
    ASSIGN_OR_RETURN(a.head_width, CountAt(row, "head_width", path, kMaxAttentionHeadWidth));
  }
  ASSIGN_OR_RETURN(a.flops_per_s, Rate(row, "flops_per_s", path + ".flops_per_s", kFlopRate));
  return a;
}

StatusOr<ProbedLoss> ParseLoss(const json& row, const std::string& path) {
  ProbedLoss l;
  ASSIGN_OR_RETURN(l.kernels, KernelsAt(row, path));
  ASSIGN_OR_RETURN(l.dtype, Dtype(row, path));
  if (l.dtype == "fp16") return Refuse(path + ".dtype", "must be fp32 or bf16");
  ASSIGN_OR_RETURN(l.logits_per_s, Rate(row, "logits_per_s", path + ".logits_per_s", kLogitRate));
  return l;
}

StatusOr<ProbedStep> ParseStep(const json& row, const std::string& path) {
  ProbedStep s;
  ASSIGN_OR_RETURN(s.dtype, Dtype(row, path));
  if (s.dtype == "fp16") return Refuse(path + ".dtype", "must be fp32 or bf16");
  // Version 4's steps were at new lengths (FromJson refuses the field's absence in 5).
  if (const auto lengths = row.find("lengths"); lengths != row.end()) {
    if (!lengths->is_string() || (*lengths != "new" && *lengths != "repeated")) {
      return Refuse(path + ".lengths", "must be new or repeated");
    }
    s.new_lengths = *lengths == "new";
  }
  ASSIGN_OR_RETURN(s.seconds, Rate(row, "seconds", path + ".seconds", kStepSeconds));
  return s;
}

// A weight's side or a cell's rows: a projection of any model is well under it, and the product
// of two stays far inside a double's exact integers.
constexpr int64_t kMaxNewShapeDimension = int64_t{1} << 20;

StatusOr<ProbedNewShape> ParseNewShape(const json& row, const std::string& path) {
  ProbedNewShape n;
  ASSIGN_OR_RETURN(n.dtype, Dtype(row, path));
  if (n.dtype == "fp16") return Refuse(path + ".dtype", "must be fp32 or bf16");
  for (auto [key, field] :
       {std::pair{"in", &n.in}, std::pair{"out", &n.out}, std::pair{"rows", &n.rows}}) {
    ASSIGN_OR_RETURN(*field, CountAt(row, key, path, kMaxNewShapeDimension));
  }
  ASSIGN_OR_RETURN(n.new_seconds, Rate(row, "new_seconds", path + ".new_seconds", kStepSeconds));
  ASSIGN_OR_RETURN(n.repeated_seconds,
                   Rate(row, "repeated_seconds", path + ".repeated_seconds", kStepSeconds));
  return n;
}

// A tensor of an element-wise cell: a step's are well under it.
constexpr int64_t kMaxElementwiseBytes = int64_t{1} << 40;

StatusOr<ProbedElementwise> ParseElementwise(const json& row, const std::string& path) {
  ProbedElementwise e;
  ASSIGN_OR_RETURN(e.dtype, Dtype(row, path));
  if (e.dtype == "fp16") return Refuse(path + ".dtype", "must be fp32 or bf16");
  ASSIGN_OR_RETURN(e.bytes, CountAt(row, "bytes", path, kMaxElementwiseBytes));
  ASSIGN_OR_RETURN(e.bytes_per_s, Rate(row, "bytes_per_s", path + ".bytes_per_s", kByteRate));
  return e;
}

// A layer cell's width or tokens: a decoder layer of any model is well under it.
constexpr int64_t kMaxLayerDimension = int64_t{1} << 20;

StatusOr<ProbedLayerElementwise> ParseLayerElementwise(const json& row, const std::string& path) {
  ProbedLayerElementwise l;
  for (auto [key, field] : {std::pair{"stream", &l.stream}, std::pair{"projected", &l.projected}}) {
    ASSIGN_OR_RETURN(*field, Text(row, key, path + "." + key));
    if (*field != "fp32" && *field != "bf16") {
      return Refuse(path + "." + key, "must be fp32 or bf16");
    }
  }
  ASSIGN_OR_RETURN(l.kernels, KernelsAt(row, path));
  for (auto [key, field] : {std::pair{"tokens", &l.tokens}, std::pair{"hidden", &l.hidden},
                            std::pair{"q_width", &l.q_width}, std::pair{"kv_width", &l.kv_width},
                            std::pair{"inter", &l.inter}}) {
    ASSIGN_OR_RETURN(*field, CountAt(row, key, path, kMaxLayerDimension));
  }
  ASSIGN_OR_RETURN(l.seconds, Rate(row, "seconds", path + ".seconds", kStepSeconds));
  return l;
}

Status ParseIdentity(const json& j, RateProbe& probe) {
  const auto identity = j.find("identity");
  if (identity == j.end() || !identity->is_object()) return Refuse("identity", "must be an object");
  ASSIGN_OR_RETURN(probe.device, Text(*identity, "device", "identity.device"));
  if (probe.device != "cpu" && probe.device != "cuda") {
    return Refuse("identity.device", "must be cpu or cuda");
  }
  ASSIGN_OR_RETURN(probe.device_name,
                   Text(*identity, "device_name", "identity.device_name", kMaxDeviceNameBytes));
  const auto threads = identity->find("threads");
  if (threads == identity->end() || !threads->is_number_integer() || threads->get<int64_t>() < 1 ||
      threads->get<int64_t>() > 1 << 20) {
    return Refuse("identity.threads", "must be a positive integer");
  }
  probe.threads = threads->get<int>();
  const auto versions = identity->find("versions");
  if (versions == identity->end() || !versions->is_object()) {
    return Refuse("identity.versions", "must be an object");
  }
  StatusOr<TrainerVersions> parsed = ParseTrainerVersions(versions->dump());
  if (!parsed.ok()) return Refuse("identity.versions", "is wrong: " + parsed.status().message());
  probe.versions = *parsed;
  return Status::Ok();
}

// Each reference step's calibration factor at the probe's own rates (ProbedSpeed's) inside
// [kMinMeasuredFactor, kMaxMeasuredFactor] (step_time.h): a step a hundredfold faster or slower
// than its work at the rates measured beside it is not a measurement of this machine, and would
// scale every trial's time by that. Only a CPU probe has reference steps.
Status CheckReferenceSteps(const RateProbe& probe) {
  if (probe.reference_steps.empty()) return Status::Ok();
  if (probe.device != "cpu") {
    return Refuse("reference_steps",
                  "must be empty on " + probe.device + " (llm-train --probe times them on a CPU)");
  }
  const DeviceSpeed speed = ProbedSpeed(CpuSpeed(), probe, "");
  for (size_t i = 0; i < probe.reference_steps.size(); ++i) {
    const ProbedStep& step = probe.reference_steps[i];
    if (step.seconds == 0) continue;  // not measured
    ASSIGN_OR_RETURN(const StepWork work, ReferenceWork(MatmulClassNamed(step.dtype)));
    const double factor = MeasuredFactor(work, speed, step.seconds);
    if (!(factor >= kMinMeasuredFactor && factor <= kMaxMeasuredFactor)) {
      return Refuse("reference_steps[" + std::to_string(i) + "].seconds",
                    "is " + Number(step.seconds) + " s, " + Number(factor) +
                        " times the reference step's work at this probe's own rates (a measured "
                        "step is " +
                        Number(kMinMeasuredFactor) + " to " + Number(kMaxMeasuredFactor) +
                        " times it): not a measurement of this "
                        "machine; run llm-train --probe again");
    }
  }
  return Status::Ok();
}

// Each table's row as the JSON writes it, field for field as its Parse* reads it.
ordered_json MatmulRow(const ProbedMatmul& m) {
  return {
      {"dtype", m.dtype}, {"size", m.size}, {"tokens", m.tokens}, {"flops_per_s", m.flops_per_s}};
}

ordered_json HeadRow(const ProbedHead& h) {
  return {{"dtype", h.dtype},
          {"tokens", h.tokens},
          {"hidden", h.hidden},
          {"vocab", h.vocab},
          {"flops_per_s", h.flops_per_s}};
}

ordered_json HeadBuffersRow(const ProbedHeadBuffers& b) {
  return {{"dtype", b.dtype},
          {"tokens", b.tokens},
          {"hidden", b.hidden},
          {"vocab", b.vocab},
          {"logits_bytes", b.logits_bytes},
          {"input_gradient_bytes", b.input_gradient_bytes},
          {"weight_gradient_bytes", b.weight_gradient_bytes}};
}

ordered_json LossRow(const ProbedLoss& l) {
  return {{"kernels", l.kernels}, {"dtype", l.dtype}, {"logits_per_s", l.logits_per_s}};
}

ordered_json NewShapeRow(const ProbedNewShape& n) {
  return {{"dtype", n.dtype},
          {"in", n.in},
          {"out", n.out},
          {"rows", n.rows},
          {"new_seconds", n.new_seconds},
          {"repeated_seconds", n.repeated_seconds}};
}

ordered_json ElementwiseRow(const ProbedElementwise& e) {
  return {{"dtype", e.dtype}, {"bytes", e.bytes}, {"bytes_per_s", e.bytes_per_s}};
}

ordered_json LayerElementwiseRow(const ProbedLayerElementwise& l) {
  return {{"stream", l.stream},     {"projected", l.projected}, {"kernels", l.kernels},
          {"tokens", l.tokens},     {"hidden", l.hidden},       {"q_width", l.q_width},
          {"kv_width", l.kv_width}, {"inter", l.inter},         {"seconds", l.seconds}};
}

// `rows` as a JSON array, each row by `to_row`.
template <typename Row, typename ToRow>
ordered_json RowsToJson(const std::vector<Row>& rows, ToRow to_row) {
  ordered_json out = ordered_json::array();
  for (const Row& row : rows) out.push_back(to_row(row));
  return out;
}

}  // namespace

ordered_json RateProbe::ToJson() const {
  // An attention row's and a reference step's fields as this probe's version has them.
  const auto attention_row = [this](const ProbedAttention& a) {
    ordered_json row = {{"dtype", a.dtype}};
    if (version >= 5) row["tokens"] = a.tokens;
    if (version >= 6) row["head_width"] = a.head_width;
    row["flops_per_s"] = a.flops_per_s;
    return row;
  };
  const auto step_row = [this](const ProbedStep& s) {
    ordered_json step = {{"dtype", s.dtype}};
    if (version >= 5) step["lengths"] = s.new_lengths ? "new" : "repeated";
    step["seconds"] = s.seconds;
    return step;
  };
  ordered_json j = {{"version", version}, {"measured_at", measured_at}, {"seconds", seconds}};
  if (version >= 3) j["rounds"] = rounds;
  if (version >= 9) j["speed_spread"] = speed_spread.value_or(0);
  if (others_cpu_share) j["others_cpu_share"] = *others_cpu_share;
  if (kernel_cpu_share) j["kernel_cpu_share"] = *kernel_cpu_share;
  if (pace_seconds) j["pace_seconds"] = *pace_seconds;
  j["identity"] = {{"device", device},
                   {"device_name", device_name},
                   {"threads", threads},
                   {"versions", ordered_json::parse(versions.ToJson())}};
  j["matmul"] = RowsToJson(matmul, MatmulRow);
  if (version >= 11) j["head_matmul"] = RowsToJson(head_matmul, HeadRow);
  if (version >= 13) j["head_buffers"] = RowsToJson(head_buffers, HeadBuffersRow);
  j["sdpa"] = RowsToJson(sdpa, attention_row);
  if (version >= 8) j["sdpa_partial_block"] = RowsToJson(sdpa_partial_block, attention_row);
  j["memory_bytes_per_s"] = memory_bytes_per_s;
  j["launch_seconds"] = launch_seconds;
  j["host_adamw_values_per_s"] = host_adamw_values_per_s;
  if (version >= 4) j["adamw_8bit_values_per_s"] = adamw_8bit_values_per_s;
  if (version >= 5) j["nf4_dequant_values_per_s"] = nf4_dequant_values_per_s;
  if (version >= 7) j["dropout_values_per_s"] = dropout_values_per_s;
  if (version >= 10) j["loss"] = RowsToJson(loss, LossRow);
  if (version >= 8) {
    j["jpeg_pixels_per_s"] = jpeg_pixels_per_s;
    j["png_pixels_per_s"] = png_pixels_per_s;
  }
  j["host_to_device_bytes_per_s"] = host_to_device_bytes_per_s;
  j["device_to_host_bytes_per_s"] = device_to_host_bytes_per_s;
  if (version >= 4) j["reference_steps"] = RowsToJson(reference_steps, step_row);
  if (version >= 14) j["new_shapes"] = RowsToJson(new_shapes, NewShapeRow);
  if (version >= 15) j["elementwise"] = RowsToJson(elementwise, ElementwiseRow);
  if (version >= 16) j["layer_elementwise"] = RowsToJson(layer_elementwise, LayerElementwiseRow);
  return j;
}

namespace {

// `key`'s share from 0 to 1, none when the probe has no such field (an older llm-train's).
StatusOr<std::optional<double>> OptionalShare(const json& j, const std::string& key) {
  const auto share = j.find(key);
  if (share == j.end()) return std::optional<double>();
  if (!share->is_number() || !(share->get<double>() >= 0) || share->get<double>() > 1) {
    return Refuse(key, "must be a share from 0 to 1");
  }
  return std::optional<double>(share->get<double>());
}

// When and how the probe measured: measured_at, seconds, rounds, speed_spread, others_cpu_share,
// kernel_cpu_share, pace_seconds.
Status ParseMeasurement(const json& j, RateProbe& probe) {
  ASSIGN_OR_RETURN(probe.measured_at, Text(j, "measured_at", "measured_at"));
  ASSIGN_OR_RETURN(probe.seconds, Rate(j, "seconds", "seconds", kProbeSeconds));
  if (probe.version >= 3) {
    const auto rounds = j.find("rounds");
    if (rounds == j.end() || !rounds->is_number_integer() || rounds->get<int64_t>() < 1 ||
        rounds->get<int64_t>() > 1 << 20) {
      return Refuse("rounds", "must be a positive integer");
    }
    probe.rounds = rounds->get<int>();
  }
  if (probe.version >= 9) {
    ASSIGN_OR_RETURN(probe.speed_spread, Rate(j, "speed_spread", "speed_spread", kSpread));
  }
  ASSIGN_OR_RETURN(probe.others_cpu_share, OptionalShare(j, "others_cpu_share"));
  ASSIGN_OR_RETURN(probe.kernel_cpu_share, OptionalShare(j, "kernel_cpu_share"));
  if (j.contains("pace_seconds")) {
    ASSIGN_OR_RETURN(const double pace, Rate(j, "pace_seconds", "pace_seconds", kPaceSeconds));
    if (pace > 0) probe.pace_seconds = pace;
  }
  return Status::Ok();
}

// The rates measured at shapes (the matmul grid, the head, attention and its partial block), each
// table from the version that has it, and version 8's image decoding beside the partial block.
Status ParseTables(const json& j, RateProbe& probe) {
  ASSIGN_OR_RETURN(probe.matmul, ParseRows<ProbedMatmul>(j, "matmul", ParseMatmul));
  if (probe.version >= 2) RETURN_IF_ERROR(RequireInEveryRow(j, "matmul", "tokens"));
  if (probe.version >= 11) {
    ASSIGN_OR_RETURN(probe.head_matmul, ParseRows<ProbedHead>(j, "head_matmul", ParseHead));
  }
  if (probe.version >= 13) {
    ASSIGN_OR_RETURN(probe.head_buffers,
                     ParseRows<ProbedHeadBuffers>(j, "head_buffers", ParseHeadBuffers));
  }
  ASSIGN_OR_RETURN(probe.sdpa, ParseRows<ProbedAttention>(j, "sdpa", ParseAttention));
  if (probe.version >= 5) RETURN_IF_ERROR(RequireInEveryRow(j, "sdpa", "tokens"));
  if (probe.version >= 6) RETURN_IF_ERROR(RequireInEveryRow(j, "sdpa", "head_width"));
  if (probe.version >= 8) {
    ASSIGN_OR_RETURN(probe.jpeg_pixels_per_s,
                     Rate(j, "jpeg_pixels_per_s", "jpeg_pixels_per_s", kPixelRate));
    ASSIGN_OR_RETURN(probe.png_pixels_per_s,
                     Rate(j, "png_pixels_per_s", "png_pixels_per_s", kPixelRate));
    ASSIGN_OR_RETURN(probe.sdpa_partial_block,
                     ParseRows<ProbedAttention>(j, "sdpa_partial_block", ParseAttention));
    RETURN_IF_ERROR(RequireInEveryRow(j, "sdpa_partial_block", "tokens"));
    RETURN_IF_ERROR(RequireInEveryRow(j, "sdpa_partial_block", "head_width"));
  }
  if (probe.version >= 15) {
    ASSIGN_OR_RETURN(probe.elementwise,
                     ParseRows<ProbedElementwise>(j, "elementwise", ParseElementwise));
    if (probe.device != "cpu" && !probe.elementwise.empty()) {
      return Refuse("elementwise", "must be empty on " + probe.device +
                                       " (llm-train --probe times element-wise ops on a CPU)");
    }
  }
  if (probe.version >= 16) {
    ASSIGN_OR_RETURN(probe.layer_elementwise, ParseRows<ProbedLayerElementwise>(
                                                  j, "layer_elementwise", ParseLayerElementwise));
    if (probe.device != "cpu" && !probe.layer_elementwise.empty()) {
      return Refuse("layer_elementwise",
                    "must be empty on " + probe.device +
                        " (llm-train --probe times a layer's element-wise ops on a CPU)");
    }
  }
  return Status::Ok();
}

// The rates measured once: memory, dispatch, the host's AdamW, copies, 8-bit AdamW, NF4, dropout,
// the loss, the reference steps and the GEMMs at new shapes.
Status ParseScalarRates(const json& j, RateProbe& probe) {
  for (auto [key, field, bounds] :
       {std::tuple{"memory_bytes_per_s", &probe.memory_bytes_per_s, kByteRate},
        std::tuple{"launch_seconds", &probe.launch_seconds, kLaunchSeconds},
        std::tuple{"host_adamw_values_per_s", &probe.host_adamw_values_per_s, kValueRate},
        std::tuple{"host_to_device_bytes_per_s", &probe.host_to_device_bytes_per_s, kByteRate},
        std::tuple{"device_to_host_bytes_per_s", &probe.device_to_host_bytes_per_s, kByteRate}}) {
    ASSIGN_OR_RETURN(*field, Rate(j, key, key, bounds));
  }
  if (probe.version >= 4) {
    ASSIGN_OR_RETURN(probe.adamw_8bit_values_per_s,
                     Rate(j, "adamw_8bit_values_per_s", "adamw_8bit_values_per_s", kValueRate));
    ASSIGN_OR_RETURN(probe.reference_steps, ParseRows<ProbedStep>(j, "reference_steps", ParseStep));
  }
  if (probe.version >= 5) {
    ASSIGN_OR_RETURN(probe.nf4_dequant_values_per_s,
                     Rate(j, "nf4_dequant_values_per_s", "nf4_dequant_values_per_s", kValueRate));
    RETURN_IF_ERROR(RequireInEveryRow(j, "reference_steps", "lengths"));
  }
  if (probe.version >= 7) {
    ASSIGN_OR_RETURN(probe.dropout_values_per_s,
                     Rate(j, "dropout_values_per_s", "dropout_values_per_s", kValueRate));
  }
  if (probe.version >= 10) {
    ASSIGN_OR_RETURN(probe.loss, ParseRows<ProbedLoss>(j, "loss", ParseLoss));
    if (probe.device != "cpu" && !probe.loss.empty()) {
      return Refuse("loss", "must be empty on " + probe.device +
                                " (llm-train --probe times the loss on a CPU)");
    }
  }
  if (probe.version >= 14) {
    ASSIGN_OR_RETURN(probe.new_shapes, ParseRows<ProbedNewShape>(j, "new_shapes", ParseNewShape));
    if (probe.device != "cpu" && !probe.new_shapes.empty()) {
      return Refuse("new_shapes", "must be empty on " + probe.device +
                                      " (llm-train --probe times new shapes on a CPU)");
    }
  }
  return Status::Ok();
}

}  // namespace

StatusOr<RateProbe> RateProbe::FromJson(const json& j) {
  if (!j.is_object()) return InvalidArgumentError(std::string(kWhere) + ": expected an object");
  RateProbe probe;
  const auto version = j.find("version");
  if (version == j.end() || !version->is_number_integer() || version->get<int64_t>() < 1) {
    return Refuse("version", "must be an integer from 1 to " + std::to_string(kRateProbeVersion));
  }
  if (version->get<int64_t>() > kRateProbeVersion) {
    return Refuse("version", "is " + std::to_string(version->get<int64_t>()) +
                                 ", newer than this llmctl reads (1 to " +
                                 std::to_string(kRateProbeVersion) +
                                 "): a newer llm-train --probe wrote it; measure again with this "
                                 "llmctl's llm-train --probe");
  }
  probe.version = version->get<int>();
  RETURN_IF_ERROR(ParseMeasurement(j, probe));
  RETURN_IF_ERROR(ParseIdentity(j, probe));
  RETURN_IF_ERROR(ParseTables(j, probe));
  RETURN_IF_ERROR(ParseScalarRates(j, probe));
  if (!(probe.MatmulFlops("fp32", kProbeMatmulSizeUsed) > 0)) {
    return Refuse("matmul", "has no fp32 rate");
  }
  if (!(probe.memory_bytes_per_s > 0)) return Refuse("memory_bytes_per_s", "must be above 0");
  RETURN_IF_ERROR(CheckReferenceSteps(probe));
  return probe;
}

}  // namespace llmctl::estimate
