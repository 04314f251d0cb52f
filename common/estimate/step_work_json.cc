// StepWork's JSON form (common/estimate/step_work.h): what `llmctl submit` sends with each trial's
// prediction, the controller checks and stores, and the calibration reads back from the store, so
// FromJson takes no field on trust.
#include <cmath>
#include <string>
#include <utility>

#include "common/estimate/step_time.h"
#include "common/estimate/step_work.h"

namespace llmctl::estimate {
namespace {

using nlohmann::json;

// A finite non-negative number, else InvalidArgument naming `what`. A non-finite number has no
// JSON form (it is written as null), so a work that holds one could not be stored and read back.
StatusOr<double> WorkNumber(const json& object, const char* key, const std::string& what) {
  const auto value = object.find(key);
  if (value == object.end() || !value->is_number() || !std::isfinite(value->get<double>()) ||
      !(value->get<double>() >= 0)) {
    return InvalidArgumentError("step work: " + what + " must be a finite non-negative number");
  }
  return value->get<double>();
}

// A matmul class's name at `path`: bf16 or fp32.
StatusOr<MatmulClass> ParseMatmulClass(const json& value, const std::string& path) {
  const std::string name = value.is_string() ? value.get<std::string>() : "";
  if (name != "bf16" && name != "fp32") {
    return InvalidArgumentError("step work: " + path + " must be bf16 or fp32");
  }
  return MatmulClassNamed(name);
}

// The work's attention by shape: its attention_shapes, else (a work stored before 12-01) all of
// attention_flops as one shape at attention_seq tokens on attention_head_width-wide heads, each 0
// in a work stored before 11-30 (then the probe's kProbeAttentionTokens and
// kProbeAttentionHeadWidth). Their FLOPs must add up to attention_flops.
Status ParseAttentionShapes(const json& j, StepWork& w) {
  if (!j.contains("attention_shapes")) {
    double seq = 0, head_width = 0;
    if (j.contains("attention_seq")) {
      ASSIGN_OR_RETURN(seq, WorkNumber(j, "attention_seq", "attention_seq"));
    }
    if (j.contains("attention_head_width")) {
      ASSIGN_OR_RETURN(head_width, WorkNumber(j, "attention_head_width", "attention_head_width"));
    }
    if (w.attention_flops > 0) {
      if (seq == 0) seq = static_cast<double>(kProbeAttentionTokens);
      if (head_width == 0) head_width = static_cast<double>(kProbeAttentionHeadWidth);
      w.attention_shapes.push_back(
          {.queries = seq, .keys = seq, .head_width = head_width, .flops = w.attention_flops});
    }
    return Status::Ok();
  }
  if (!j["attention_shapes"].is_array()) {
    return InvalidArgumentError("step work: attention_shapes must be a list");
  }
  double counted = 0;
  for (size_t i = 0; i < j["attention_shapes"].size(); ++i) {
    const json& row = j["attention_shapes"][i];
    const std::string path = "attention_shapes[" + std::to_string(i) + "]";
    if (!row.is_object()) return InvalidArgumentError("step work: " + path + " must be an object");
    AttentionShape shape;
    for (auto [key, field] :
         {std::pair{"queries", &shape.queries}, std::pair{"keys", &shape.keys},
          std::pair{"head_width", &shape.head_width}, std::pair{"flops", &shape.flops}}) {
      ASSIGN_OR_RETURN(*field, WorkNumber(row, key, path + "." + key));
    }
    const double tokens = static_cast<double>(kMaxAttentionTokens);
    if (!(shape.queries >= 1 && shape.queries <= tokens && shape.keys >= 1 &&
          shape.keys <= tokens && shape.head_width >= 1 &&
          shape.head_width <= static_cast<double>(kMaxAttentionHeadWidth))) {
      return InvalidArgumentError(
          "step work: " + path + " must have 1 to " + std::to_string(kMaxAttentionTokens) +
          " queries and keys and a head 1 to " + std::to_string(kMaxAttentionHeadWidth) + " wide");
    }
    counted += shape.flops;
    w.attention_shapes.push_back(shape);
  }
  // Parts of attention_flops: their sum may round a little off it, not more.
  if (std::abs(counted - w.attention_flops) > w.attention_flops * 1e-9) {
    return InvalidArgumentError(
        "step work: attention_shapes' FLOPs do not add up to attention_flops");
  }
  return Status::Ok();
}

// The work's matmul_shapes, attention_class, attention_flops, attention's shapes and
// new_length_micro_batches, which a work stored before them lacks (then every FLOP is taken at one
// rate, as it was, and no micro-batch at a new length).
Status ParseMatmulShapes(const json& j, StepWork& w) {
  if (j.contains("attention_flops")) {
    ASSIGN_OR_RETURN(w.attention_flops, WorkNumber(j, "attention_flops", "attention_flops"));
  }
  if (j.contains("attention_class")) {
    ASSIGN_OR_RETURN(w.attention_class, ParseMatmulClass(j["attention_class"], "attention_class"));
  }
  RETURN_IF_ERROR(ParseAttentionShapes(j, w));
  if (j.contains("new_length_micro_batches")) {
    ASSIGN_OR_RETURN(w.new_length_micro_batches,
                     WorkNumber(j, "new_length_micro_batches", "new_length_micro_batches"));
    if (w.new_length_micro_batches > static_cast<double>(w.micro_batches)) {
      return InvalidArgumentError("step work: new_length_micro_batches exceeds micro_batches");
    }
  }
  if (!j.contains("matmul_shapes")) return Status::Ok();
  if (!j["matmul_shapes"].is_array()) {
    return InvalidArgumentError("step work: matmul_shapes must be a list");
  }
  double counted = w.attention_flops;
  for (size_t i = 0; i < j["matmul_shapes"].size(); ++i) {
    const json& row = j["matmul_shapes"][i];
    const std::string path = "matmul_shapes[" + std::to_string(i) + "]";
    MatmulShape shape;
    for (auto [key, field] : {std::pair{"rows", &shape.rows}, std::pair{"in", &shape.in},
                              std::pair{"out", &shape.out}}) {
      if (!row.is_object() || !row.contains(key) || !row[key].is_number_integer() ||
          row[key].get<int64_t>() < 1) {
        return InvalidArgumentError("step work: " + path + "." + key +
                                    " must be a positive integer");
      }
      *field = row[key].get<int64_t>();
    }
    ASSIGN_OR_RETURN(shape.flops, WorkNumber(row, "flops", path + ".flops"));
    if (row.contains("class")) {
      ASSIGN_OR_RETURN(shape.matmul_class, ParseMatmulClass(row["class"], path + ".class"));
    }
    if (row.contains("frozen")) {
      if (!row["frozen"].is_boolean()) {
        return InvalidArgumentError("step work: " + path + ".frozen must be true or false");
      }
      shape.frozen = row["frozen"].get<bool>();
    }
    counted += shape.flops;
    w.matmul_shapes.push_back(shape);
  }
  // Parts of matmul_flops: their sum may round a little above it, not more.
  if (counted > w.matmul_flops * (1 + 1e-9)) {
    return InvalidArgumentError(
        "step work: matmul_shapes' and attention_flops' FLOPs exceed matmul_flops");
  }
  return Status::Ok();
}

}  // namespace

json StepWork::ToJson() const {
  json shapes = json::array();
  for (const MatmulShape& s : matmul_shapes) {
    json shape = {{"rows", s.rows}, {"in", s.in}, {"out", s.out}, {"flops", s.flops}};
    if (s.matmul_class) shape["class"] = MatmulClassName(*s.matmul_class);
    if (s.frozen) shape["frozen"] = true;
    shapes.push_back(std::move(shape));
  }
  json attention = json::array();
  for (const AttentionShape& s : attention_shapes) {
    attention.push_back({{"queries", s.queries},
                         {"keys", s.keys},
                         {"head_width", s.head_width},
                         {"flops", s.flops}});
  }
  json j = {{"family", ModelFamilyName(family)},
            {"matmul_class", MatmulClassName(matmul_class)},
            {"tokens", tokens},
            {"micro_batches", micro_batches},
            {"world_size", world_size},
            {"nodes", nodes},
            {"matmul_flops", matmul_flops},
            {"matmul_shapes", shapes},
            {"attention_flops", attention_flops},
            {"attention_shapes", attention},
            {"new_length_micro_batches", new_length_micro_batches},
            {"memory_bytes", memory_bytes},
            {"elementwise_tensor_bytes", elementwise_tensor_bytes},
            {"elementwise_class", MatmulClassName(elementwise_class)},
            {"state_memory_bytes", state_memory_bytes},
            {"cast_memory_bytes", cast_memory_bytes},
            {"layer_memory_bytes", layer_memory_bytes},
            {"layer_projected_class", MatmulClassName(layer_projected_class)},
            {"layer_kernels", KernelsName(layer_kernels)},
            {"launches", launches},
            {"host_optimizer_values", host_optimizer_values},
            {"adamw_8bit_values", adamw_8bit_values},
            {"nf4_dequant_values", nf4_dequant_values},
            {"dropout_values", dropout_values},
            {"loss_logits", loss_logits},
            {"loss_kernels", KernelsName(loss_kernels)},
            {"loss_class", MatmulClassName(loss_class)},
            {"jpeg_pixels", jpeg_pixels},
            {"png_pixels", png_pixels},
            {"host_link_bytes", host_link_bytes},
            {"interconnect_bytes", interconnect_bytes},
            {"network_bytes", network_bytes},
            {"model_bytes", model_bytes},
            {"pretrained", pretrained}};
  if (attention_class) j["attention_class"] = MatmulClassName(*attention_class);
  return j;
}

namespace {

// `key`'s member of `j`, or null where it has none. Read in place, never copied: another
// process's JSON may nest deep.
const json& MemberOrNull(const json& j, const char* key) {
  static const json kAbsent;
  const auto member = j.find(key);
  return member == j.end() ? kAbsent : *member;
}

// The kernels named at `key` of `j`: aten or fused.
StatusOr<Kernels> WorkKernels(const json& j, const char* key) {
  const json& name = MemberOrNull(j, key);
  if (name != "aten" && name != "fused") {
    return InvalidArgumentError(std::string("step work: ") + key + " must be aten or fused");
  }
  return KernelsNamed(name.get<std::string>());
}

// What every stored work has: its family and matmul class, its counts, and the totals of its work.
Status ParseTotals(const json& j, StepWork& w) {
  ASSIGN_OR_RETURN(w.matmul_class,
                   ParseMatmulClass(MemberOrNull(j, "matmul_class"), "matmul_class"));
  // A work stored before BLIP-2 has no family: a LLaMA's.
  const auto family = j.find("family");
  const bool blip2 = family != j.end() && *family == "blip2";
  if (family != j.end() && !blip2 && *family != "llama") {
    return InvalidArgumentError("step work: family must be llama or blip2");
  }
  w.family = blip2 ? ModelFamily::kBlip2 : ModelFamily::kLlama;
  for (auto [key, field] :
       {std::pair{"tokens", &w.tokens}, std::pair{"micro_batches", &w.micro_batches},
        std::pair{"world_size", &w.world_size}, std::pair{"nodes", &w.nodes}}) {
    const json& count = MemberOrNull(j, key);
    if (!count.is_number_integer() || count.get<int64_t>() < 1) {
      return InvalidArgumentError(std::string("step work: ") + key + " must be a positive integer");
    }
    *field = count.get<int64_t>();
  }
  for (auto [key, field] :
       {std::pair{"matmul_flops", &w.matmul_flops}, std::pair{"memory_bytes", &w.memory_bytes},
        std::pair{"launches", &w.launches},
        std::pair{"host_optimizer_values", &w.host_optimizer_values},
        std::pair{"host_link_bytes", &w.host_link_bytes},
        std::pair{"interconnect_bytes", &w.interconnect_bytes},
        std::pair{"network_bytes", &w.network_bytes}, std::pair{"model_bytes", &w.model_bytes}}) {
    ASSIGN_OR_RETURN(*field, WorkNumber(j, key, key));
  }
  return Status::Ok();
}

// The work a rate of its own times, each read where a work has it: one stored before 11-30 counted
// the CPU's 8-bit step in memory_bytes, before 11-30's stop its NF4 dequantisation, before 12-02
// its loss; before 11-30's eighteenth stop the dropout draws and before 12-01 a captioning step's
// images were not counted at all. And whether the model was pretrained.
Status ParseOwnRateWork(const json& j, StepWork& w) {
  for (auto [key, field] :
       {std::pair{"adamw_8bit_values", &w.adamw_8bit_values},
        std::pair{"nf4_dequant_values", &w.nf4_dequant_values},
        std::pair{"dropout_values", &w.dropout_values}, std::pair{"jpeg_pixels", &w.jpeg_pixels},
        std::pair{"png_pixels", &w.png_pixels}}) {
    if (j.contains(key)) {
      ASSIGN_OR_RETURN(*field, WorkNumber(j, key, key));
    }
  }
  if (j.contains("loss_logits")) {
    ASSIGN_OR_RETURN(w.loss_logits, WorkNumber(j, "loss_logits", "loss_logits"));
    ASSIGN_OR_RETURN(w.loss_kernels, WorkKernels(j, "loss_kernels"));
    ASSIGN_OR_RETURN(w.loss_class, ParseMatmulClass(MemberOrNull(j, "loss_class"), "loss_class"));
  }
  if (j.contains("pretrained")) {
    if (!j["pretrained"].is_boolean()) {
      return InvalidArgumentError("step work: pretrained must be true or false");
    }
    w.pretrained = j["pretrained"].get<bool>();
  }
  return Status::Ok();
}

// The parts of memory_bytes, each read where a work has it, each within what it is a part of
// (rounding may put it a little past, no more): since 12-05 the size and dtype of its element-wise
// ops' tensors, the part over the model's state; since 12-06 the part of the rest converted
// between dtypes, and since the sixty-third stop the part the layers' own element-wise ops make,
// with the dtypes and kernels that key its rate.
Status ParseMemoryParts(const json& j, StepWork& w) {
  if (j.contains("elementwise_tensor_bytes")) {
    ASSIGN_OR_RETURN(w.elementwise_tensor_bytes,
                     WorkNumber(j, "elementwise_tensor_bytes", "elementwise_tensor_bytes"));
    ASSIGN_OR_RETURN(w.elementwise_class,
                     ParseMatmulClass(MemberOrNull(j, "elementwise_class"), "elementwise_class"));
  }
  if (j.contains("state_memory_bytes")) {
    ASSIGN_OR_RETURN(w.state_memory_bytes,
                     WorkNumber(j, "state_memory_bytes", "state_memory_bytes"));
    if (w.state_memory_bytes > w.memory_bytes * (1 + 1e-9)) {
      return InvalidArgumentError("step work: state_memory_bytes exceeds memory_bytes");
    }
  }
  if (j.contains("cast_memory_bytes")) {
    ASSIGN_OR_RETURN(w.cast_memory_bytes, WorkNumber(j, "cast_memory_bytes", "cast_memory_bytes"));
    if (w.cast_memory_bytes > (w.memory_bytes - w.state_memory_bytes) * (1 + 1e-9)) {
      return InvalidArgumentError(
          "step work: cast_memory_bytes exceeds memory_bytes beyond state_memory_bytes");
    }
  }
  if (j.contains("layer_memory_bytes")) {
    ASSIGN_OR_RETURN(w.layer_memory_bytes,
                     WorkNumber(j, "layer_memory_bytes", "layer_memory_bytes"));
    if (w.layer_memory_bytes + w.cast_memory_bytes >
        (w.memory_bytes - w.state_memory_bytes) * (1 + 1e-9)) {
      return InvalidArgumentError(
          "step work: layer_memory_bytes and cast_memory_bytes exceed memory_bytes beyond "
          "state_memory_bytes");
    }
    ASSIGN_OR_RETURN(
        w.layer_projected_class,
        ParseMatmulClass(MemberOrNull(j, "layer_projected_class"), "layer_projected_class"));
    ASSIGN_OR_RETURN(w.layer_kernels, WorkKernels(j, "layer_kernels"));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<StepWork> StepWork::FromJson(const json& j) {
  if (!j.is_object()) return InvalidArgumentError("step work: expected an object");
  StepWork w;
  RETURN_IF_ERROR(ParseTotals(j, w));
  RETURN_IF_ERROR(ParseOwnRateWork(j, w));
  RETURN_IF_ERROR(ParseMemoryParts(j, w));
  RETURN_IF_ERROR(ParseMatmulShapes(j, w));
  return w;
}
}  // namespace llmctl::estimate
