#include "common/estimate/blip2_work.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "common/estimate/blip2_memory.h"

namespace llmctl::estimate {
namespace {

// Element-wise traffic of one transformer layer per token, in elements read plus written, by
// width: two LayerNorms (one kernel each: read, write), two residual adds (two reads, a write),
// two dropouts in training (read, write, a byte of mask), q, k, v and the output moved between
// (B, T, H, D) and (B, H, T, D); by intermediate width the activation (a gated one: and its
// product).
constexpr double kHiddenPasses = 2 * 2 + 2 * 3 + 2 * 2.25;
constexpr double kLayoutPasses = 4 * 2;
constexpr double kActivationPasses = 2;
constexpr double kGatePasses = 3;
// A backward pass touches about twice what its forward did; kernel launches of a layer's forward.
constexpr double kBlip2BackwardPasses = 2;
constexpr double kLayerLaunches = 40;

bool PartListHas(const std::vector<std::string>& list, std::string_view item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

// One linear layer's matmuls at its shape: its forward's FLOPs (rerun by checkpointing when in a
// block) and its backward's (the input's gradient, and the weight's when trained).
struct LinearShape {
  MatmulShape shape;  // its flops unused: forward and backward below
  bool blocked = true;
  double forward_flops = 0;
  double backward_flops = 0;
};

// One part of the model (the ViT, the Q-Former, the projection, the language model): its
// forward's work and what a backward through it adds.
struct Part {
  double forward_flops = 0;      // of its blocks: what checkpointing reruns
  double unblocked_flops = 0;    // outside them (patch embedding, projection, head): run once
  double weight_grad_flops = 0;  // 2x forward for each trained weight
  double input_grad_flops = 0;   // 2x forward for every linear layer and attention
  double forward_bytes = 0;
  double launches = 0;
  double nf4_values = 0;
  // Its dropout masks' draws, forward: in its blocks (the model's own dropout and its adapters',
  // rerun by checkpointing) and outside them.
  double dropout_values = 0;
  double unblocked_dropout_values = 0;
  double trainable_tensors = 0;
  std::vector<LinearShape> linears;       // its projections' FLOPs by shape (adapters' aside)
  std::vector<AttentionShape> attention;  // of forward_flops, attention's forward by shape
};

class PartCounter {
 public:
  // `nf4`: the class its NF4 weights' matmuls run in (QLoRA's compute dtype), unset where it has
  // none; every other matmul runs in its elements' dtype.
  PartCounter(double element, bool trained, const std::vector<std::string>* adapter_targets,
              double rank, bool adapter_dropout, std::optional<MatmulClass> nf4)
      : element_(element),
        trained_(trained),
        targets_(adapter_targets),
        rank_(rank),
        adapter_dropout_(adapter_dropout),
        nf4_(nf4) {}

  // A linear layer (in -> out) of a block applied to `tokens` tokens; `name` is its PEFT name.
  void Linear(double tokens, double in, double out, std::string_view name, bool quantised = true) {
    const double matmul = 2 * tokens * in * out;
    part_.forward_flops += matmul;
    AddShape(tokens, in, out, matmul, /*blocked=*/true, quantised);
    Backward(matmul, in, out, tokens, name, quantised);
  }

  // A linear layer outside the blocks (not rerun by checkpointing).
  void UnblockedLinear(double tokens, double in, double out, std::string_view name) {
    const double matmul = 2 * tokens * in * out;
    part_.unblocked_flops += matmul;
    AddShape(tokens, in, out, matmul, /*blocked=*/false, /*quantised=*/false);
    Backward(matmul, in, out, tokens, name, /*quantised=*/false);
  }

  // Attention's scores and weighted sum: `examples` sequences of `queries` queries over `keys`
  // keys each, `width` wide; backward forms the gradients of the scores, the values, the queries
  // and the keys. `head_width` is each of its heads' (width / heads).
  void Attention(double examples, double queries, double keys, double width, double head_width) {
    const double flops = 4 * examples * queries * keys * width;
    part_.forward_flops += flops;
    part_.input_grad_flops += 2 * flops;
    AddAttentionShape(part_.attention,
                      {.queries = queries, .keys = keys, .head_width = head_width, .flops = flops});
  }

  // A dropout mask over `values` values, drawn when its probability `p` is above 0: in a block, or
  // outside them (not rerun by checkpointing).
  void Dropout(double values, double p, bool blocked = true) {
    if (!(p > 0)) return;
    (blocked ? part_.dropout_values : part_.unblocked_dropout_values) += values;
  }

  // A layer's element-wise traffic and launches over `tokens` tokens.
  void Layer(double tokens, double width, double inter, bool gated) {
    part_.forward_bytes += tokens * element_ *
                           ((kHiddenPasses + kLayoutPasses) * width +
                            (kActivationPasses + (gated ? kGatePasses : 0)) * inter);
    part_.launches += kLayerLaunches;
  }

  const Part& part() const { return part_; }

 private:
  // What a linear layer's backward adds: its input's gradient, its weight's when trained, and its
  // adapter's work.
  // The shape of a linear layer of `tokens` rows (a micro-batch's) and its FLOPs forward and in
  // backward (the input's gradient, the weight's when trained).
  void AddShape(double tokens, double in, double out, double matmul, bool blocked, bool quantised) {
    const MatmulClass dense = element_ == 4 ? MatmulClass::kFp32 : MatmulClass::kBf16;
    part_.linears.push_back({.shape = {.rows = static_cast<int64_t>(tokens),
                                       .in = static_cast<int64_t>(in),
                                       .out = static_cast<int64_t>(out),
                                       .matmul_class = nf4_ && quantised ? *nf4_ : dense,
                                       .frozen = !trained_},
                             .blocked = blocked,
                             .forward_flops = matmul,
                             .backward_flops = matmul * (trained_ ? 2 : 1)});
  }

  void Backward(double matmul, double in, double out, double tokens, std::string_view name,
                bool quantised) {
    part_.input_grad_flops += matmul;
    if (trained_) {
      part_.weight_grad_flops += matmul;
      part_.trainable_tensors += 2;  // the weight and its bias
    }
    if (nf4_ && quantised && targets_ != nullptr) part_.nf4_values += in * out;
    if (targets_ != nullptr && PartListHas(*targets_, name)) {
      const double adapter = 2 * tokens * rank_ * (in + out);
      part_.forward_flops += adapter;
      part_.input_grad_flops += adapter;
      part_.weight_grad_flops += adapter;
      part_.forward_bytes += tokens * AdapterBytesPerToken(in, out, element_, adapter_dropout_);
      if (adapter_dropout_) part_.dropout_values += tokens * in;
      part_.trainable_tensors += 2;
    }
  }

  double element_;
  bool trained_;
  const std::vector<std::string>* targets_;  // null: no adapters in this part
  double rank_;
  bool adapter_dropout_;
  std::optional<MatmulClass> nf4_;
  Part part_;
};

// The ViT over every image's class token and patches.
void CountVisionWork(const Blip2VisionConfig& v, double examples, double image_tokens,
                     double patches, PartCounter& vision) {
  const double c = static_cast<double>(v.hidden_size);
  const double n = examples * image_tokens;
  vision.UnblockedLinear(examples * patches, 3.0 * static_cast<double>(v.patch_size * v.patch_size),
                         c, "patch_embedding");
  for (int64_t i = 0; i < v.num_hidden_layers; ++i) {
    vision.Linear(n, c, 3 * c, "qkv");
    vision.Attention(examples, image_tokens, image_tokens, c,
                     c / static_cast<double>(v.num_attention_heads));
    vision.Dropout(
        examples * static_cast<double>(v.num_attention_heads) * image_tokens * image_tokens,
        v.attention_dropout);
    vision.Linear(n, c, c, "projection");
    vision.Linear(n, c, static_cast<double>(v.intermediate_size), "fc1");
    vision.Linear(n, static_cast<double>(v.intermediate_size), c, "fc2");
    vision.Layer(n, c, static_cast<double>(v.intermediate_size), false);
  }
}

// The Q-Former over the learned queries, cross-attending to the image.
void CountQFormerWork(const Blip2QFormerConfig& q, double examples, double queries,
                      double image_tokens, PartCounter& qformer) {
  const double c = static_cast<double>(q.hidden_size);
  const double n = examples * queries;
  const double heads = static_cast<double>(q.num_attention_heads);
  const double head_width = c / heads;
  // The embeddings' layer norm's dropout, before the blocks.
  qformer.Dropout(n * c, q.hidden_dropout_prob, /*blocked=*/false);
  for (int64_t i = 0; i < q.num_hidden_layers; ++i) {
    for (const char* name : {"query", "key", "value", "output"}) qformer.Linear(n, c, c, name);
    qformer.Attention(examples, queries, queries, c, head_width);
    qformer.Dropout(examples * heads * queries * queries, q.attention_probs_dropout_prob);
    qformer.Dropout(n * c, q.hidden_dropout_prob);
    if (i % q.cross_attention_frequency == 0) {
      const double encoder = static_cast<double>(q.encoder_hidden_size);
      qformer.Linear(n, c, c, "query");
      qformer.Linear(examples * image_tokens, encoder, c, "key");
      qformer.Linear(examples * image_tokens, encoder, c, "value");
      qformer.Linear(n, c, c, "output");
      qformer.Attention(examples, queries, image_tokens, c, head_width);
      qformer.Dropout(examples * heads * queries * image_tokens, q.attention_probs_dropout_prob);
      qformer.Dropout(n * c, q.hidden_dropout_prob);
    }
    qformer.Linear(n, c, static_cast<double>(q.intermediate_size), "intermediate");
    qformer.Linear(n, static_cast<double>(q.intermediate_size), c, "output");
    qformer.Dropout(n * c, q.hidden_dropout_prob);
    qformer.Layer(n, c, static_cast<double>(q.intermediate_size), false);
  }
}

// OPT over the queries and the caption (`sequence` tokens); returns the logits' count.
double CountOptWork(const OptConfig& opt, double examples, double sequence, PartCounter& language) {
  const double h = static_cast<double>(opt.hidden_size);
  const double ffn = static_cast<double>(opt.ffn_dim);
  const double n = examples * sequence;
  for (int64_t i = 0; i < opt.num_hidden_layers; ++i) {
    for (const char* name : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      language.Linear(n, h, h, name);
    }
    language.Attention(examples, sequence, sequence, h,
                       h / static_cast<double>(opt.num_attention_heads));
    language.Dropout(examples * static_cast<double>(opt.num_attention_heads) * sequence * sequence,
                     opt.attention_dropout);
    language.Dropout(2 * n * h, opt.dropout);  // the attention's and the FFN's outputs
    language.Linear(n, h, ffn, "fc1");
    language.Linear(n, ffn, h, "fc2");
    language.Layer(n, h, ffn, false);
  }
  language.UnblockedLinear(n, h, static_cast<double>(opt.vocab_size), "lm_head");
  return n * static_cast<double>(opt.vocab_size);
}

// T5's encoder over the queries and the caption, its decoder over the caption; returns the
// logits' count.
double CountT5Work(const T5Config& t5, double examples, double queries, double caption,
                   PartCounter& language) {
  const double d = static_cast<double>(t5.d_model);
  const double inner = static_cast<double>(t5.inner_dim());
  const double ff = static_cast<double>(t5.d_ff);
  const double encoder_sequence = queries + caption;
  const double encoded = examples * encoder_sequence;
  const double decoded = examples * caption;
  auto ffn = [&](double n) {
    if (t5.gated_gelu) {
      language.Linear(n, d, ff, "wi_0");
      language.Linear(n, d, ff, "wi_1");
    } else {
      language.Linear(n, d, ff, "wi");
    }
    language.Linear(n, ff, d, "wo", /*quantised=*/false);  // transformers keeps wo dense
    language.Dropout(n * (ff + d), t5.dropout_rate);       // the inner activation's and wo's
  };
  // Each sequence's `queries` queries over `keys` keys.
  auto attention = [&](double queries, double keys) {
    language.Linear(examples * queries, d, inner, "q");
    language.Linear(examples * keys, d, inner, "k");
    language.Linear(examples * keys, d, inner, "v");
    language.Attention(examples, queries, keys, inner, static_cast<double>(t5.d_kv));
    language.Dropout(examples * static_cast<double>(t5.num_heads) * queries * keys,
                     t5.dropout_rate);
    language.Linear(examples * queries, inner, d, "o");
    language.Dropout(examples * queries * d, t5.dropout_rate);
  };
  // Each stack's embeddings and its final layer norm's output.
  language.Dropout(2 * (encoded + decoded) * d, t5.dropout_rate, /*blocked=*/false);
  for (int64_t i = 0; i < t5.num_layers; ++i) {
    attention(encoder_sequence, encoder_sequence);
    ffn(encoded);
    language.Layer(encoded, d, ff, t5.gated_gelu);
  }
  for (int64_t i = 0; i < t5.num_decoder_layers; ++i) {
    attention(caption, caption);
    attention(caption, encoder_sequence);
    ffn(decoded);
    language.Layer(decoded, d, ff, t5.gated_gelu);
  }
  language.UnblockedLinear(decoded, d, static_cast<double>(t5.vocab_size), "lm_head");
  return decoded * static_cast<double>(t5.vocab_size);
}

// One micro-batch's work: matmul FLOPs, element-wise bytes (the loss's aside), launches, NF4
// values dequantised, and the trainable tensors the optimizer steps over.
struct MicroBatchWork {
  double matmul = 0, memory = 0, launches = 0, nf4_values = 0, dropout_values = 0,
         trainable_tensors = 0;
  std::vector<MatmulShape> shapes;               // of matmul, the projections' by shape
  double attention = 0;                          // of matmul, attention's (SDPA's)
  std::vector<AttentionShape> attention_shapes;  // of attention, by shape
};

// The micro-batch's work over the parts in order, each with whether it learns: backward runs
// through a part that is trained or adapted, and through every part after one that is;
// checkpointing reruns the forward of those parts' blocks.
MicroBatchWork SumMicroBatchParts(std::initializer_list<std::pair<const PartCounter*, bool>> parts,
                                  bool checkpointing) {
  MicroBatchWork sum;
  bool backward = false;
  for (const auto& [counter, learns] : parts) {
    const Part& p = counter->part();
    backward = backward || learns;
    const double forward_runs = backward && checkpointing ? 2 : 1;
    sum.matmul += p.forward_flops * forward_runs + p.unblocked_flops;
    sum.memory += p.forward_bytes * forward_runs;
    sum.launches += p.launches * forward_runs;
    sum.nf4_values += p.nf4_values * (forward_runs + (backward ? 1 : 0));
    sum.dropout_values += p.dropout_values * forward_runs + p.unblocked_dropout_values;
    sum.trainable_tensors += p.trainable_tensors;
    for (const LinearShape& linear : p.linears) {
      MatmulShape shape = linear.shape;
      shape.flops = linear.forward_flops * (linear.blocked ? forward_runs : 1) +
                    (backward ? linear.backward_flops : 0);
      AddMatmulShape(sum.shapes, shape);
    }
    const double attention_runs = forward_runs + (backward ? 2 : 0);
    for (AttentionShape shape : p.attention) {
      shape.flops *= attention_runs;
      sum.attention += shape.flops;
      AddAttentionShape(sum.attention_shapes, shape);
    }
    if (!backward) continue;
    sum.matmul += p.input_grad_flops + p.weight_grad_flops;
    sum.memory += kBlip2BackwardPasses * p.forward_bytes;
    sum.launches += kBlip2BackwardPasses * p.launches;
  }
  return sum;
}

// One micro-batch's work through BLIP-2's four parts, and the language model's logits.
struct Blip2MicroBatch {
  MicroBatchWork work;
  double logits = 0;
};

// `caption_length` tokens of caption a row; `nf4` the class of QLoRA's NF4 projections.
Blip2MicroBatch CountBlip2MicroBatch(const TrialSettings& s, const Blip2Config& model,
                                     int64_t caption_length, std::optional<MatmulClass> nf4) {
  const bool full = s.peft.method == trial::PeftMethod::kNone;
  const std::vector<std::string>& frozen = s.peft.freeze;
  const std::vector<std::string> targets = full ? std::vector<std::string>{} : s.peft.targets;
  const double element = s.memory.precision == trial::Precision::k32True ? 4 : 2;
  const double examples = static_cast<double>(s.train.micro_batch_size);
  const double queries = static_cast<double>(model.num_query_tokens);
  const double caption = static_cast<double>(caption_length);
  const double patches = static_cast<double>((model.vision.image_size / model.vision.patch_size) *
                                             (model.vision.image_size / model.vision.patch_size));
  const double image_tokens = patches + 1;  // the class token
  auto trained = [&](std::string_view part) { return full && !PartListHas(frozen, part); };
  const double rank = static_cast<double>(s.peft.r);
  const bool dropout = !full && s.peft.dropout > 0;

  // The ViT over every image's class token and patches.
  PartCounter vision(element, trained("vision_model"), nullptr, rank, dropout, std::nullopt);
  CountVisionWork(model.vision, examples, image_tokens, patches, vision);
  // The Q-Former over the learned queries, cross-attending to the image.
  PartCounter qformer(element, trained("qformer"), nullptr, rank, dropout, std::nullopt);
  CountQFormerWork(model.qformer, examples, queries, image_tokens, qformer);
  PartCounter projection(element, trained("language_projection"), nullptr, rank, dropout,
                         std::nullopt);
  projection.UnblockedLinear(examples * queries, static_cast<double>(model.qformer.hidden_size),
                             static_cast<double>(model.text_hidden_size()), "language_projection");
  // The language model, adapted under LoRA/QLoRA.
  PartCounter language(element, trained("language_model"), full ? nullptr : &targets, rank, dropout,
                       nf4);
  Blip2MicroBatch micro_batch;
  micro_batch.logits = model.opt() != nullptr
                           ? CountOptWork(*model.opt(), examples, queries + caption, language)
                           : CountT5Work(*model.t5(), examples, queries, caption, language);
  micro_batch.work = SumMicroBatchParts({{&vision, trained("vision_model")},
                                         {&qformer, trained("qformer")},
                                         {&projection, trained("language_projection")},
                                         {&language, trained("language_model") || !full}},
                                        s.memory.activation_checkpointing);
  return micro_batch;
}

}  // namespace

StatusOr<StepWork> EstimateBlip2StepWork(const TrialConfig& config, const Blip2Config& model,
                                         std::optional<int64_t> caption_tokens) {
  ASSIGN_OR_RETURN(const ModelStateEstimate state, EstimateBlip2ModelState(config, model));
  StepWork w;
  w.family = ModelFamily::kBlip2;
  const TrialSettings& s = config.settings();
  const bool fp32 = s.memory.precision == trial::Precision::k32True;
  const bool qlora = s.peft.method == trial::PeftMethod::kQlora;
  const int64_t micro = s.train.micro_batch_size;
  const int64_t caption_length = caption_tokens.value_or(s.data.max_seq_length);

  w.world_size = state.world_size;
  w.nodes = std::max<int64_t>(1, s.parallel.nodes);
  const int64_t global = s.train.global_batch_size;
  w.micro_batches = std::max<int64_t>(1, global / (micro * w.world_size));
  // What llm-train counts as a micro-batch's tokens: the queries' places and the caption.
  w.tokens = micro * (model.num_query_tokens + caption_length) * w.micro_batches;
  // Attention and every matmul but QLoRA's NF4 projections run in the elements' dtype; most of
  // the step's FLOPs in the NF4 ones' where there are any, whose factor calibrates it.
  const MatmulClass dense = fp32 ? MatmulClass::kFp32 : MatmulClass::kBf16;
  const std::optional<MatmulClass> nf4 =
      !qlora ? std::nullopt
             : std::optional(s.peft.compute_dtype == trial::ComputeDtype::kBf16 ? MatmulClass::kBf16
                                                                                : dense);
  w.matmul_class = nf4.value_or(dense);
  w.attention_class = dense;

  const Blip2MicroBatch micro_batch = CountBlip2MicroBatch(s, model, caption_length, nf4);
  const MicroBatchWork& step = micro_batch.work;
  const double micro_batches = static_cast<double>(w.micro_batches);
  w.matmul_flops = step.matmul * micro_batches;
  // Each projection at its own rate (a CPU's GEMM runs far below its square rate on the narrow
  // ViT and Q-Former), and each part's attention at SDPA's rate for its own sequences and heads.
  w.matmul_shapes = step.shapes;
  for (MatmulShape& shape : w.matmul_shapes) shape.flops *= micro_batches;
  w.attention_flops = step.attention * micro_batches;
  w.attention_shapes = step.attention_shapes;
  for (AttentionShape& shape : w.attention_shapes) shape.flops *= micro_batches;
  w.memory_bytes = step.memory * micro_batches;
  AddLossLogits(config, micro_batch.logits * micro_batches, fp32 ? 4 : 2, w);
  if (qlora) AddNf4Dequant(config, step.nf4_values * micro_batches, w);
  AddDropoutDraws(config, step.dropout_values * micro_batches, w);
  w.launches = step.launches * micro_batches + OptimizerLaunches(config, step.trainable_tensors);
  AddOptimizerAndRanks(config, state, w);
  w.model_bytes = static_cast<double>(state.params_bytes);
  w.pretrained = s.model.init == trial::Init::kPretrained;
  return w;
}

}  // namespace llmctl::estimate
