// BLIP-2's model state (blip2_memory.h): the model's tensors as llm-train allocates them, counted
// by weight_tensors.h's rules.
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "common/estimate/blip2_memory.h"
#include "common/estimate/blip2_trace.h"
#include "common/estimate/weight_tensors.h"

namespace llmctl::estimate {
namespace {

// Far beyond any real model, and small enough that no byte count can overflow 64 bits.
constexpr int64_t kMaxBlip2Parameters = int64_t{1} << 50;

// Builds the tensor list in named_parameters() order: a module's own parameters, then its children
// in registration order (BLIP-2's own query_tokens come before every part).
class Blip2Tensors {
 public:
  Blip2Tensors(const TrialConfig& config, const Blip2Config& model) : model_(model) {
    const PeftSettings& peft = config.settings().peft;
    adapters_ = peft.method != trial::PeftMethod::kNone;
    qlora_ = peft.method == trial::PeftMethod::kQlora;
    if (adapters_) targets_ = peft.targets;
    rank_ = peft.r;
    frozen_parts_ = peft.freeze;
  }

  // The tensors, and the projection names the language model has (for peft.targets' check).
  void Build() {
    part_ = "qformer";  // the query tokens belong to the Q-Former for `freeze`
    Add(model_.num_query_tokens * model_.qformer.hidden_size);
    BuildVision();
    BuildQFormer();
    part_ = "language_projection";
    Linear(model_.qformer.hidden_size, model_.text_hidden_size(), true);
    part_ = "language_model";
    if (const T5Config* t5 = model_.t5()) {
      BuildT5(*t5);
    } else {
      BuildOpt(*model_.opt());
    }
  }

  const std::vector<WeightTensor>& tensors() const { return tensors_; }
  const std::vector<std::string>& projection_names() const { return projection_names_; }

 private:
  // A parameter of `numel` values in the current part and unit.
  void Add(int64_t numel, bool nf4 = false) {
    const bool frozen = adapters_ || std::find(frozen_parts_.begin(), frozen_parts_.end(), part_) !=
                                         frozen_parts_.end();
    tensors_.push_back({numel, unit_, !frozen, nf4});
  }
  // torch::nn::Linear / LayerNorm: weight, then bias.
  void Linear(int64_t in, int64_t out, bool bias) {
    Add(in * out);
    if (bias) Add(out);
  }
  void LayerNorm(int64_t width) {
    Add(width);
    Add(width);
  }
  // The language model's Projection named `name`: its base weight (NF4 under QLoRA when
  // `quantized`) and bias, then a LoRA adapter's A (r, in) and B (out, r) when targeted.
  void Projection(std::string_view name, int64_t in, int64_t out, bool bias, bool quantized) {
    if (std::find(projection_names_.begin(), projection_names_.end(), name) ==
        projection_names_.end()) {
      projection_names_.emplace_back(name);
    }
    Add(in * out, qlora_ && quantized);
    if (bias) Add(out);
    if (std::find(targets_.begin(), targets_.end(), name) != targets_.end()) {
      tensors_.push_back({rank_ * in, unit_, true, false});
      tensors_.push_back({out * rank_, unit_, true, false});
    }
  }

  void BuildVision() {
    const Blip2VisionConfig& v = model_.vision;
    const int64_t c = v.hidden_size;
    const int64_t patches = (v.image_size / v.patch_size) * (v.image_size / v.patch_size);
    part_ = "vision_model";
    Add(c);                                    // embeddings.class_embedding
    Add((patches + 1) * c);                    // embeddings.position_embedding
    Add(3 * v.patch_size * v.patch_size * c);  // embeddings.patch_embedding (conv)
    Add(c);
    for (int64_t i = 0; i < v.num_hidden_layers; ++i) {
      unit_ = next_unit_++;
      LayerNorm(c);
      Linear(c, 3 * c, v.qkv_bias);  // self_attn.qkv
      Linear(c, c, true);            // self_attn.projection
      LayerNorm(c);
      Linear(c, v.intermediate_size, true);  // mlp.fc1
      Linear(v.intermediate_size, c, true);  // mlp.fc2
    }
    unit_ = -1;
    LayerNorm(c);  // post_layernorm
  }

  // Blip2QFormerAttention: attention.query, key, value (the latter two over `context` features),
  // output.dense, output.LayerNorm.
  void QFormerAttention(int64_t context) {
    const int64_t cq = model_.qformer.hidden_size;
    Linear(cq, cq, true);
    Linear(context, cq, true);
    Linear(context, cq, true);
    Linear(cq, cq, true);
    LayerNorm(cq);
  }

  void BuildQFormer() {
    const Blip2QFormerConfig& q = model_.qformer;
    part_ = "qformer";
    LayerNorm(q.hidden_size);  // layernorm
    for (int64_t i = 0; i < q.num_hidden_layers; ++i) {
      unit_ = next_unit_++;
      QFormerAttention(q.hidden_size);
      if (i % q.cross_attention_frequency == 0) QFormerAttention(q.encoder_hidden_size);
      Linear(q.hidden_size, q.intermediate_size, true);  // intermediate_query.dense
      Linear(q.intermediate_size, q.hidden_size, true);  // output_query.dense
      LayerNorm(q.hidden_size);                          // output_query.LayerNorm
    }
    unit_ = -1;
  }

  void BuildOpt(const OptConfig& o) {
    const int64_t c = o.hidden_size;
    Add(o.vocab_size * c);                     // embed_tokens, the tied head too
    Add((o.max_position_embeddings + 2) * c);  // embed_positions (offset 2)
    for (int64_t i = 0; i < o.num_hidden_layers; ++i) {
      unit_ = next_unit_++;
      for (const char* name : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
        Projection(name, c, c, true, true);
      }
      LayerNorm(c);  // self_attn_layer_norm
      Projection("fc1", c, o.ffn_dim, true, true);
      Projection("fc2", o.ffn_dim, c, true, true);
      LayerNorm(c);  // final_layer_norm
    }
    unit_ = -1;
    LayerNorm(c);  // decoder.final_layer_norm
  }

  // T5Attention: q, k, v, o, then block 0's relative_attention_bias (the root unit's).
  void T5Attention(const T5Config& t, bool relative_bias) {
    const int64_t inner = t.inner_dim();
    Projection("q", t.d_model, inner, false, true);
    Projection("k", t.d_model, inner, false, true);
    Projection("v", t.d_model, inner, false, true);
    Projection("o", inner, t.d_model, false, true);
    if (relative_bias) {
      const int64_t unit = unit_;
      unit_ = -1;
      Add(t.relative_attention_num_buckets * t.num_heads);
      unit_ = unit;
    }
  }

  void T5Stack(const T5Config& t, bool decoder) {
    const int64_t blocks = decoder ? t.num_decoder_layers : t.num_layers;
    for (int64_t i = 0; i < blocks; ++i) {
      unit_ = next_unit_++;
      T5Attention(t, i == 0);
      Add(t.d_model);  // layer.0.layer_norm (T5's RMS norm: a weight only)
      if (decoder) {
        T5Attention(t, false);  // EncDecAttention
        Add(t.d_model);
      }
      if (t.gated_gelu) {
        Projection("wi_0", t.d_model, t.d_ff, false, true);
        Projection("wi_1", t.d_model, t.d_ff, false, true);
      } else {
        Projection("wi", t.d_model, t.d_ff, false, true);
      }
      Projection("wo", t.d_ff, t.d_model, false, false);  // dense under QLoRA
      Add(t.d_model);                                     // the FFN's layer_norm
    }
    unit_ = -1;
    Add(t.d_model);  // final_layer_norm
  }

  void BuildT5(const T5Config& t) {
    Add(t.vocab_size * t.d_model);  // shared
    T5Stack(t, false);
    T5Stack(t, true);
    if (!t.tie_word_embeddings) {
      Projection("lm_head", t.d_model, t.vocab_size, false, false);
      return;
    }
    // A tied head is the shared matrix: only an adapter's A and B are its own.
    const size_t before = tensors_.size();
    Projection("lm_head", t.d_model, t.vocab_size, false, false);
    tensors_.erase(tensors_.begin() + static_cast<std::ptrdiff_t>(before));
  }

  const Blip2Config& model_;
  bool adapters_ = false;
  bool qlora_ = false;
  std::vector<std::string> targets_;
  int64_t rank_ = 0;
  std::vector<std::string> frozen_parts_;
  std::string part_;
  int64_t unit_ = -1;
  int64_t next_unit_ = 0;
  std::vector<WeightTensor> tensors_;
  std::vector<std::string> projection_names_;
};

}  // namespace

std::vector<Blip2UnitSize> Blip2UnitSizes(const TrialConfig& config, const Blip2Config& model) {
  Blip2Tensors tensors(config, model);
  tensors.Build();
  const bool double_quant = config.settings().peft.double_quant;
  std::vector<Blip2UnitSize> units;
  for (const WeightTensor& t : tensors.tensors()) {
    const size_t index = static_cast<size_t>(t.unit + 1);
    if (units.size() <= index) units.resize(index + 1);
    Blip2UnitSize& unit = units[index];
    if (t.trainable) unit.trainable += t.numel;
    if (t.nf4) {
      unit.nf4_bytes += Nf4Bytes(t.numel, double_quant);
    } else {
      unit.dense += t.numel;
    }
  }
  return units;
}

StatusOr<ModelStateEstimate> EstimateBlip2ModelState(const TrialConfig& config,
                                                     const Blip2Config& model, int64_t rank) {
  if (std::optional<ConfigProblem> problem = FindModelFamilyProblem(config, /*blip2=*/true)) {
    return InvalidArgumentError(problem->message);
  }
  RETURN_IF_ERROR(ValidateTrialConfig(config, nullptr));
  const TrialSettings& s = config.settings();
  Blip2Tensors tensors(config, model);
  tensors.Build();
  if (s.peft.method != trial::PeftMethod::kNone) {
    // llm-train's CheckLoraTargets: a name the language model lacks is refused.
    const std::vector<std::string>& names = tensors.projection_names();
    for (const std::string& target : s.peft.targets) {
      if (std::find(names.begin(), names.end(), target) != names.end()) continue;
      std::string known;
      for (const std::string& name : names) known += (known.empty() ? "" : ", ") + name;
      return InvalidArgumentError("peft.targets: this model has no projection named " + target +
                                  " (its projections: " + known + ")");
    }
  }
  int64_t total = 0;
  for (const WeightTensor& t : tensors.tensors()) {
    if (t.numel > kMaxBlip2Parameters - total) {
      return InvalidArgumentError("model: too many parameters to estimate");
    }
    total += t.numel;
  }
  ModelStateEstimate estimate = EstimateStateOfTensors(config, tensors.tensors(), rank);
  // The class embedding (1, 1, C) is expanded over the batch and concatenated before the patches:
  // at one image a micro-batch the expand's backward reduces nothing, so its gradient is the
  // concatenation gradient's slice, a view that keeps the whole (1, P, C) storage, and
  // AccumulateGrad keeps that view (the position embedding, added to the same gradient, gets a
  // copy). An fsdp shard's gradient is the flat buffer's slice instead.
  const std::vector<std::string>& frozen = s.peft.freeze;
  const bool vision_trains =
      estimate.parameters_trainable > 0 && s.peft.method == trial::PeftMethod::kNone &&
      std::find(frozen.begin(), frozen.end(), "vision_model") == frozen.end();
  if (vision_trains && estimate.grads_bytes > 0 && s.train.micro_batch_size == 1 &&
      !(s.parallel.strategy == trial::Strategy::kFsdp && estimate.world_size > 1)) {
    const Blip2VisionConfig& v = model.vision;
    const int64_t patches = (v.image_size / v.patch_size) * (v.image_size / v.patch_size);
    estimate.grads_bytes +=
        ParamBytes(s.memory.precision) * static_cast<uint64_t>(patches * v.hidden_size);
  }
  return estimate;
}

}  // namespace llmctl::estimate
