#include "common/estimate/blip2_trace.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <string_view>
#include <utility>

#include "common/estimate/blip2_ops.h"
#include "common/estimate/chunked_loss.h"

namespace llmctl::estimate {
namespace {

using blip2::Blip2Run;
using blip2::kBf16;
using blip2::kFp32;
using blip2::kInt64;
using blip2::Ops;
using blip2::Tensor;

// Walks the model, block by block.
class Blip2Walk {
 public:
  Blip2Walk(const Blip2Run& run, const Blip2Config& model, int64_t batch, int64_t tokens)
      : r_(run), m_(model), ops_(run), batch_(batch), tokens_(tokens) {}

  Blip2ForwardTrace Run();

 private:
  using Body = std::function<Tensor(Ops&, const Tensor&)>;

  // A block whose saved tensors are what `body` saves; with checkpointing (`checkpointed`), only
  // its `kept` inputs, and `body` again on a fresh trace for its rerun in backward. Its backward's
  // worst gradients and temporaries are `backward_transient`, and those beside a weight gradient
  // formed apart `beside_weight` (when unset, the same).
  Tensor Block(const std::string& name, int64_t unit, const Tensor& x, const Body& body,
               bool checkpointed = false, const std::vector<Tensor>& kept = {},
               uint64_t backward_transient = 0,
               std::optional<uint64_t> beside_weight = std::nullopt) {
    Blip2BlockTrace block{.name = name,
                          .unit = unit,
                          .backward_transient = backward_transient,
                          .transient_beside_weight = beside_weight.value_or(backward_transient)};
    const uint64_t before = ops_.saved();
    (void)ops_.TakeLargestWeightGradient();
    Tensor y;
    bool input_grad = x.requires_grad;
    for (const Tensor& t : kept) input_grad = input_grad || t.requires_grad;
    if (checkpointed && r_.checkpointing && !input_grad) {
      // CheckpointedForward records nothing when no input needs a gradient: the block runs
      // without keeping a tensor, and its output needs none.
      Ops unrecorded(r_);
      const Tensor out = body(unrecorded, x);
      y = ops_.New(static_cast<int64_t>(out.bytes / static_cast<uint64_t>(out.element)),
                   out.element, false);
    } else if (checkpointed && r_.checkpointing) {
      ops_.Save(x);
      for (const Tensor& t : kept) ops_.Save(t);
      Ops rerun(r_);
      Tensor input = x;
      input.requires_grad = true;
      const Tensor out = body(rerun, input);
      block.largest_weight_gradient = rerun.TakeLargestWeightGradient();
      // The kept inputs are the checkpoint's, counted above, not the rerun's.
      block.recompute = rerun.saved();
      for (const Tensor& t : kept) {
        if (rerun.IsSaved(t)) block.recompute -= t.bytes;
      }
      // The rerun's forward peak happens in backward, beside what is left; block.recompute and
      // backward_transient stand for it.
      y = ops_.New(static_cast<int64_t>(out.bytes / static_cast<uint64_t>(out.element)),
                   out.element, true);
      ops_.Alive(y.bytes);
    } else {
      y = body(ops_, x);
      block.largest_weight_gradient = ops_.TakeLargestWeightGradient();
    }
    block.saved = ops_.saved() - before;
    trace_.blocks.push_back(block);
    return y;
  }

  Tensor Vision();
  Tensor QFormer(const Tensor& image);
  Tensor Language(const Tensor& features);
  Tensor Opt(const OptConfig& o, const Tensor& embeds);
  void T5(const T5Config& t, const Tensor& embeds);
  // T5's self- or cross-attention sublayer: x (rows, C) over `context` (context_rows, C).
  Tensor T5Attention(Ops& ops, const T5Config& t, const Tensor& x, const Tensor& context,
                     int64_t rows, int64_t tq, int64_t context_rows, int64_t tk, bool mask_grad);
  Tensor T5FeedForward(Ops& ops, const T5Config& t, const Tensor& x, int64_t rows);
  // The chunked cross-entropy over `hidden` (rows, C) (chunked_loss.h): the hidden states'
  // gradient kept, the chunks' moment beside the hidden states; backward only scales the gradients
  // it formed (the head's, when it trains).
  Tensor ChunkedLoss(Ops& ops, const Tensor& hidden, int64_t rows, int64_t width, int64_t vocab,
                     bool head_adapter);

  const Blip2Run& r_;
  const Blip2Config& m_;
  Ops ops_;
  int64_t batch_;
  int64_t tokens_;         // T
  int64_t next_unit_ = 0;  // the fsdp unit of the next block of a stack
  Blip2ForwardTrace trace_;
};

Tensor Blip2Walk::Vision() {
  const Blip2VisionConfig& v = m_.vision;
  const int64_t c = v.hidden_size;
  const int64_t side = v.image_size / v.patch_size;
  const int64_t rows = batch_ * (side * side + 1);  // B·P
  const bool trains = r_.vision;
  const int stream = r_.autocast ? kFp32 : r_.act;
  // The patch embedding is one GEMM over the images' patches (trainer/model/blip2.cc's
  // EmbedPatches): the pixels in the weight's dtype (a cast first where that is bf16), copied into
  // patch rows (B·P', 3·p·p), which the GEMM keeps for the weight's gradient; under autocast the
  // rows are fp32 and the GEMM casts them, and the weight, to bf16.
  const int64_t pixels = batch_ * 3 * v.image_size * v.image_size;
  const int64_t patch_outputs = batch_ * side * side * c;  // (B·P', C)
  const int gemm = r_.autocast ? kBf16 : r_.act;           // the GEMM's operands and output
  const uint64_t weight_values = static_cast<uint64_t>(3 * v.patch_size * v.patch_size * c);
  // Its backward, where the weight trains: a copy of the patch rows the size of the kept ones, for
  // the weight's gradient (measured 12-05 on the 2-core Xeon, the 64-wide ViT of 32-pixel patches
  // at one image: its peak 12 B from the estimate with it, 602,112 B under without).
  const uint64_t embedding_transient =
      trains ? static_cast<uint64_t>(pixels) * static_cast<uint64_t>(gemm) : 0;
  const Tensor embedded = Block(
      "vision embeddings", -1, Tensor{},
      [&](Ops& ops, const Tensor&) {
        const Tensor rows_of_patches = ops.New(pixels, r_.autocast ? kFp32 : r_.act, false);
        if (r_.autocast) {
          // The rows cast to bf16, kept where the weight trains; the weight's cast for the call.
          const Tensor cast = ops.New(pixels, kBf16, false);
          if (trains) ops.Save(cast);
          ops.Alive(rows_of_patches.bytes + ops.Unsaved(cast) + weight_values * kBf16 +
                    static_cast<uint64_t>(patch_outputs) * kBf16);
        } else {
          if (trains) ops.Save(rows_of_patches);
          // The pixels' bf16 cast, freed once copied into rows.
          if (r_.act != kFp32) {
            ops.Alive(static_cast<uint64_t>(pixels) * kBf16 + ops.Unsaved(rows_of_patches));
          }
          ops.Alive(ops.Unsaved(rows_of_patches) + static_cast<uint64_t>(patch_outputs) * gemm);
        }
        // The patches (B, P', C), the concatenation with the class token and the sum with the
        // positions.
        ops.Alive(static_cast<uint64_t>(patch_outputs) * gemm +
                  static_cast<uint64_t>(rows * c) * stream * 2);
        return ops.New(rows * c, stream, trains);
      },
      /*checkpointed=*/false, {}, embedding_transient);
  Tensor x = embedded;
  const double attention_dropout = v.attention_dropout;
  for (int64_t i = 0; i < v.num_hidden_layers; ++i) {
    // Its backward at the MLP: the stream's and the branch's gradients (B·P, C), and GELU's and
    // fc1's (B·P, I).
    const uint64_t transient = static_cast<uint64_t>(rows) * r_.act *
                               static_cast<uint64_t>(2 * c + 2 * v.intermediate_size);
    x = Block(
        "vision layer " + std::to_string(i), next_unit_++, x,
        [&](Ops& ops, const Tensor& in) {
          const Tensor ln1 = ops.LayerNorm(in, rows, c, trains);
          const Tensor qkv = ops.Linear(ln1, rows, c, 3 * c, trains);
          const Tensor attention =
              attention_dropout > 0.0
                  ? ops.Math(qkv, qkv, qkv, batch_, v.num_attention_heads, rows / batch_,
                             rows / batch_, c / v.num_attention_heads, attention_dropout, false)
                  : ops.Flash(qkv, qkv, qkv, rows, v.num_attention_heads, c);
          const Tensor h = ops.Add(in, ops.Linear(attention, rows, c, c, trains), rows * c);
          const Tensor fc1 =
              ops.Linear(ops.LayerNorm(h, rows, c, trains), rows, c, v.intermediate_size, trains);
          const Tensor fc2 = ops.Linear(ops.Gelu(fc1, rows * v.intermediate_size), rows,
                                        v.intermediate_size, c, trains);
          return ops.Add(h, fc2, rows * c);
        },
        /*checkpointed=*/true, {}, transient);
  }
  return Block("vision post-norm", -1, x,
               [&](Ops& ops, const Tensor& in) { return ops.LayerNorm(in, rows, c, trains); });
}

Tensor Blip2Walk::QFormer(const Tensor& image) {
  const Blip2QFormerConfig& q = m_.qformer;
  const int64_t cq = q.hidden_size;
  const int64_t queries = m_.num_query_tokens;
  const int64_t rows = batch_ * queries;
  const int64_t image_rows =
      static_cast<int64_t>(image.bytes / static_cast<uint64_t>(image.element)) /
      m_.vision.hidden_size;
  const int64_t patches = image_rows / batch_;
  const bool trains = r_.qformer;
  const int64_t heads = q.num_attention_heads;
  // BERT's attention block: LayerNorm(x + dropout(dense(attention(x, context)))).
  auto attention = [&](Ops& ops, const Tensor& x, const Tensor& context, int64_t context_rows,
                       int64_t context_width, int64_t keys) {
    const Tensor query = ops.Linear(x, rows, cq, cq, trains);
    const Tensor key = ops.Linear(context, context_rows, context_width, cq, trains);
    const Tensor value = ops.Linear(context, context_rows, context_width, cq, trains);
    const double p = q.attention_probs_dropout_prob;
    const Tensor y =
        p > 0.0 ? ops.Math(query, key, value, batch_, heads, queries, keys, cq / heads, p, false)
                : ops.Flash(query, key, value, rows, heads, cq);
    const Tensor dense = ops.Linear(y, rows, cq, cq, trains);
    const Tensor sum = ops.Add(ops.Dropout(dense, rows * cq, q.hidden_dropout_prob), x, rows * cq);
    return ops.LayerNorm(sum, rows, cq, trains);
  };
  Tensor h = Block("qformer embeddings", -1, Tensor{}, [&](Ops& ops, const Tensor&) {
    const Tensor normed = ops.LayerNorm(Ops::Param(r_.act, trains), rows, cq, trains);
    return ops.Dropout(normed, rows * cq, q.hidden_dropout_prob);
  });
  for (int64_t i = 0; i < q.num_hidden_layers; ++i) {
    const bool cross = i % q.cross_attention_frequency == 0;
    // Its backward: as a ViT block's, and with cross-attention the image's two gradients through
    // key and value, (B·P, Cq) and (B·P, C) each.
    const uint64_t transient =
        static_cast<uint64_t>(rows) * r_.act *
            static_cast<uint64_t>(2 * cq + 2 * q.intermediate_size) +
        (cross && image.requires_grad ? 2 * static_cast<uint64_t>(image_rows) * r_.act *
                                            static_cast<uint64_t>(cq + m_.vision.hidden_size)
                                      : 0);
    h = Block(
        "qformer layer " + std::to_string(i), next_unit_++, h,
        [&](Ops& ops, const Tensor& in) {
          Tensor a = attention(ops, in, in, rows, cq, queries);
          if (cross) a = attention(ops, a, image, image_rows, m_.vision.hidden_size, patches);
          const Tensor inner = ops.Linear(a, rows, cq, q.intermediate_size, trains);
          const Tensor out = ops.Linear(ops.Gelu(inner, rows * q.intermediate_size), rows,
                                        q.intermediate_size, cq, trains);
          const Tensor sum =
              ops.Add(ops.Dropout(out, rows * cq, q.hidden_dropout_prob), a, rows * cq);
          return ops.LayerNorm(sum, rows, cq, trains);
        },
        /*checkpointed=*/true, {image}, transient);
  }
  return h;
}

Tensor Blip2Walk::Language(const Tensor& queries) {
  const int64_t ct = m_.text_hidden_size();
  const int64_t q_rows = batch_ * m_.num_query_tokens;
  const int64_t n = batch_ * tokens_;
  // The projection, the token embeddings and the features in the placeholders' places.
  const Tensor embeds =
      Block("projection, embeddings", -1, queries, [&](Ops& ops, const Tensor& in) {
        const Tensor features = ops.Linear(in, q_rows, m_.qformer.hidden_size, ct, r_.projection);
        const Tensor tokens = ops.New(n * ct, r_.autocast ? kFp32 : r_.act, r_.language);
        const bool grad = tokens.requires_grad || features.requires_grad;
        const Tensor placeholders = ops.New(n, 1, false);  // (B, T, 1) bool
        if (grad) ops.Save(placeholders);
        const Tensor scattered = ops.New(n * ct, tokens.element, grad);
        ops.Alive(features.bytes +
                  (features.element != tokens.element
                       ? static_cast<uint64_t>(q_rows * ct) * tokens.element
                       : 0) +
                  tokens.bytes + placeholders.bytes + scattered.bytes);
        return scattered;
      });
  // Loss holds the embeddings until it returns.
  ops_.locals += embeds.bytes;
  if (const T5Config* t5 = m_.t5()) {
    T5(*t5, embeds);
  } else {
    Opt(*m_.opt(), embeds);
  }
  return embeds;
}

Tensor Blip2Walk::Opt(const OptConfig& o, const Tensor& embeds) {
  const int64_t c = o.hidden_size;
  const int64_t n = batch_ * tokens_;
  const bool trains = r_.language;
  const int64_t heads = o.num_attention_heads;
  Tensor h = ops_.Add(embeds, Ops::Param(r_.act, trains), n * c);  // + the positions
  // enable_input_require_grads: a checkpointed layer's input must need a gradient.
  if (r_.checkpointing) h.requires_grad = true;
  // A layer's backward at its FFN: the stream's and the branch's gradients (N, C), and ReLU's and
  // fc1's (N, F), as the cpu-lab rows' allocator history shows at their peak. A weight's gradient
  // formed apart under accumulation comes beside one (N, F) only (the grad-accumulation row's
  // history: fc1's (F, C) beside fc1's output gradient).
  const uint64_t transient =
      static_cast<uint64_t>(n) * r_.act * static_cast<uint64_t>(2 * c + 2 * o.ffn_dim);
  const uint64_t beside_weight =
      static_cast<uint64_t>(n) * r_.act * static_cast<uint64_t>(2 * c + o.ffn_dim);
  for (int64_t i = 0; i < o.num_hidden_layers; ++i) {
    h = Block(
        "opt layer " + std::to_string(i), next_unit_++, h,
        [&](Ops& ops, const Tensor& x) {
          const Tensor normed = ops.LayerNorm(x, n, c, trains);
          const Tensor q = ops.Linear(normed, n, c, c, trains, "q_proj", true);
          const Tensor scaled = ops.New(n * c, q.element, q.requires_grad);  // q / sqrt(D)
          ops.Alive(ops.Unsaved(q) + scaled.bytes);
          const Tensor k = ops.Linear(normed, n, c, c, trains, "k_proj", true);
          const Tensor v = ops.Linear(normed, n, c, c, trains, "v_proj", true);
          const Tensor y = o.attention_dropout > 0.0
                               ? ops.Math(scaled, k, v, batch_, heads, tokens_, tokens_, c / heads,
                                          o.attention_dropout, false)
                               : ops.Flash(scaled, k, v, n, heads, c);
          const Tensor out = ops.Linear(y, n, c, c, trains, "out_proj", true);
          const Tensor h2 = ops.Add(x, ops.Dropout(out, n * c, o.dropout), n * c);
          const Tensor fc1 =
              ops.Linear(ops.LayerNorm(h2, n, c, trains), n, c, o.ffn_dim, trains, "fc1", true);
          const Tensor fc2 =
              ops.Linear(ops.Relu(fc1, n * o.ffn_dim), n, o.ffn_dim, c, trains, "fc2", true);
          return ops.Add(h2, ops.Dropout(fc2, n * c, o.dropout), n * c);
        },
        /*checkpointed=*/true, {}, transient, beside_weight);
  }
  // The final norm, the tied head and the loss (llama.cc's CausalLmLoss: float32 log-softmax over
  // every position, the shifted labels kept by nll_loss).
  Block("head and loss", -1, h, [&](Ops& ops, const Tensor& x) {
    const Tensor hidden = ops.LayerNorm(x, n, c, trains);
    if (r_.chunked_loss) return ChunkedLoss(ops, hidden, n, c, o.vocab_size, false);
    const Tensor logits = ops.Linear(hidden, n, c, o.vocab_size, trains);
    const uint64_t nv = static_cast<uint64_t>(n * o.vocab_size);
    const Tensor log_probs = ops.New(n * o.vocab_size, kFp32, logits.requires_grad);
    if (logits.requires_grad) {
      ops.Save(log_probs);
      ops.Save(ops.New(n, kInt64, false));
      ops.Save(ops.New(2, kFp32, false));  // the loss and nll_loss's total weight
    }
    ops.Alive(ops.Unsaved(hidden) + logits.bytes + (logits.element != kFp32 ? kFp32 * nv : 0));
    trace_.loss_backward = 2 * kFp32 * nv;
    return log_probs;
  });
  return h;
}

Tensor Blip2Walk::ChunkedLoss(Ops& ops, const Tensor& hidden, int64_t rows, int64_t width,
                              int64_t vocab, bool head_adapter) {
  const Tensor gradient = ops.New(rows * width, hidden.element, false);
  const bool grad = hidden.requires_grad || r_.language;
  if (grad) ops.Save(gradient);
  // The head's summed gradient (V, C), formed in forward and kept for backward, which scales it
  // into a new tensor.
  const uint64_t head_gradient =
      r_.language ? static_cast<uint64_t>(vocab * width) * static_cast<uint64_t>(r_.act) : 0;
  if (head_gradient > 0) ops.Save(ops.New(vocab * width, r_.act, false));
  // The shifted labels (int64), beside the chunks.
  ops.Alive(ops.Unsaved(hidden) + static_cast<uint64_t>(rows) * kInt64 +
            ChunkedLossMoment({.tokens = rows,
                               .hidden = width,
                               .vocab = vocab,
                               .act = hidden.element,
                               .autocast = r_.autocast,
                               .weight_element = static_cast<uint64_t>(r_.act),
                               .head_trains = r_.language,
                               .head_adapter = head_adapter,
                               .buffers = r_.head_buffers}));
  trace_.loss_backward = head_gradient;
  return gradient;
}

Tensor Blip2Walk::T5Attention(Ops& ops, const T5Config& t, const Tensor& x, const Tensor& context,
                              int64_t rows, int64_t tq, int64_t context_rows, int64_t tk,
                              bool mask_grad) {
  const bool trains = r_.language;
  const int64_t c = t.d_model;
  const int64_t inner = t.inner_dim();
  const Tensor q = ops.Linear(x, rows, c, inner, trains, "q", true);
  const Tensor k = ops.Linear(context, context_rows, c, inner, trains, "k", true);
  const Tensor v = ops.Linear(context, context_rows, c, inner, trains, "v", true);
  const Tensor y =
      ops.Math(q, k, v, batch_, t.num_heads, tq, tk, t.d_kv, t.dropout_rate, mask_grad);
  return ops.Linear(y, rows, inner, c, trains, "o", true);
}

Tensor Blip2Walk::T5FeedForward(Ops& ops, const T5Config& t, const Tensor& x, int64_t rows) {
  const bool trains = r_.language;
  const int64_t c = t.d_model;
  const Tensor normed = ops.RmsNorm(x, rows, c, trains);
  Tensor inner;
  if (t.gated_gelu) {
    const Tensor gate = ops.Linear(normed, rows, c, t.d_ff, trains, "wi_0", true);
    const Tensor up = ops.Linear(normed, rows, c, t.d_ff, trains, "wi_1", true);
    inner = ops.GatedGelu(gate, up, rows * t.d_ff);
  } else {
    inner = ops.Relu(ops.Linear(normed, rows, c, t.d_ff, trains, "wi", true), rows * t.d_ff);
  }
  // wo stays dense under QLoRA.
  const Tensor out = ops.Linear(ops.Dropout(inner, rows * t.d_ff, t.dropout_rate), rows, t.d_ff, c,
                                trains, "wo", false);
  return ops.Add(x, ops.Dropout(out, rows * c, t.dropout_rate), rows * c);
}

void Blip2Walk::T5(const T5Config& t, const Tensor& embeds) {
  const int64_t c = t.d_model;
  const bool trains = r_.language;
  const int64_t n = batch_ * tokens_;
  const int64_t caption = tokens_ - m_.num_query_tokens;  // the decoder's positions, S
  const int64_t dn = batch_ * caption;
  const int bias_element = r_.autocast ? kFp32 : r_.act;  // the embedding's dtype
  // A block's backward at its FFN: the stream's and the branch's gradients (rows, C), and the
  // gated GELU's three (rows, F).
  const uint64_t transient =
      static_cast<uint64_t>(std::max(n, dn)) * r_.act * static_cast<uint64_t>(2 * c + 3 * t.d_ff);
  // A stack's position bias (B, H, T, T), which every block adds and a checkpointed block keeps.
  auto stack = [&](const std::string& name, const Tensor& input, int64_t rows, int64_t length,
                   int64_t blocks, const Tensor* encoder) {
    const Tensor bias = ops_.New(batch_ * t.num_heads * length * length, bias_element, trains);
    ops_.locals += bias.bytes;
    if (trains) {
      // The embedding of the buckets keeps them (T, T) int64; the decoder's causal mask, where's
      // condition (T, T), is kept too.
      ops_.Save(ops_.New(length * length, kInt64, false));
      if (encoder != nullptr) ops_.Save(ops_.New(length * length, 1, false));
    }
    Tensor h = ops_.Dropout(input, rows * c, t.dropout_rate);
    if (r_.checkpointing) h.requires_grad = true;
    for (int64_t i = 0; i < blocks; ++i) {
      std::vector<Tensor> kept = {bias};
      if (encoder != nullptr) kept.push_back(*encoder);
      h = Block(
          name + " block " + std::to_string(i), next_unit_++, h,
          [&](Ops& ops, const Tensor& x) {
            const Tensor normed = ops.RmsNorm(x, rows, c, trains);
            Tensor y = ops.Add(
                x,
                ops.Dropout(T5Attention(ops, t, normed, normed, rows, length, rows, length, trains),
                            rows * c, t.dropout_rate),
                rows * c);
            if (encoder != nullptr) {
              const Tensor cross = T5Attention(ops, t, ops.RmsNorm(y, rows, c, trains), *encoder,
                                               rows, length, n, tokens_, false);
              y = ops.Add(y, ops.Dropout(cross, rows * c, t.dropout_rate), rows * c);
            }
            return T5FeedForward(ops, t, y, rows);
          },
          /*checkpointed=*/true, kept, transient);
    }
    ops_.locals -= bias.bytes;
    const Tensor out = ops_.Dropout(ops_.RmsNorm(h, rows, c, trains), rows * c, t.dropout_rate);
    return out;
  };
  const Tensor encoder = stack("t5 encoder", embeds, n, tokens_, t.num_layers, nullptr);
  // Loss holds the encoder's states through the decoder, where the cross-attention's k and v keep
  // them when they train.
  const bool encoder_kept =
      trains || ((r_.Targeted("k") || r_.Targeted("v")) && r_.lora_dropout <= 0.0);
  if (!encoder_kept) ops_.locals += encoder.bytes;
  // The decoder reads the caption's labels shifted right, embedded by the shared matrix.
  const Tensor decoder_embeds = ops_.New(dn * c, bias_element, trains);
  if (trains) ops_.Save(ops_.New(dn, kInt64, false));  // the shifted ids, for the embedding
  ops_.Alive(decoder_embeds.bytes + static_cast<uint64_t>(dn) * kInt64 * 2);
  const Tensor hidden =
      stack("t5 decoder", decoder_embeds, dn, caption, t.num_decoder_layers, &encoder);
  // The head and T5's loss: the cross-entropy in the logits' dtype, the caption's labels copied
  // (B·S) for nll_loss.
  Block("head and loss", -1, hidden, [&](Ops& ops, const Tensor& x) {
    if (r_.chunked_loss) return ChunkedLoss(ops, x, dn, c, t.vocab_size, r_.Targeted("lm_head"));
    const Tensor logits = ops.Linear(x, dn, c, t.vocab_size, trains, "lm_head", false);
    const Tensor log_probs = ops.New(dn * t.vocab_size, logits.element, logits.requires_grad);
    if (logits.requires_grad) {
      ops.Save(log_probs);
      ops.Save(ops.New(dn, kInt64, false));
      ops.Save(ops.New(2, kFp32, false));  // the loss and nll_loss's total weight
    }
    ops.Alive(ops.Unsaved(x) + logits.bytes);
    trace_.loss_backward =
        2 * static_cast<uint64_t>(logits.element) * static_cast<uint64_t>(dn * t.vocab_size);
    return log_probs;
  });
}

Blip2ForwardTrace Blip2Walk::Run() {
  const Blip2VisionConfig& v = m_.vision;
  trace_.text_tokens = tokens_;
  // Pixels (B, 3, S, S) fp32; ids and labels int64 and the attention mask bool (B, T).
  trace_.fixed = static_cast<uint64_t>(batch_ * 3 * v.image_size * v.image_size) * kFp32 +
                 static_cast<uint64_t>(batch_ * tokens_) * (2 * kInt64 + 1);
  const Tensor image = Vision();
  Language(QFormer(image));
  trace_.saved = ops_.saved();
  trace_.forward_peak = ops_.peak();
  return trace_;
}

}  // namespace

Blip2ForwardTrace TraceBlip2Forward(const TrialConfig& config, const Blip2Config& model,
                                    int64_t caption_tokens, bool sharded,
                                    const MatmulBuffers& buffers) {
  Blip2Run run;
  const TrialSettings& s = config.settings();
  const trial::Precision precision = s.memory.precision;
  run.act = precision == trial::Precision::kBf16True ? kBf16 : kFp32;
  run.autocast =
      precision == trial::Precision::kBf16Mixed || precision == trial::Precision::k16Mixed;
  if (sharded && run.autocast) {
    // fsdp gathers bf16 parameters: the forward is a bf16-true one.
    run.act = kBf16;
    run.autocast = false;
  }
  const bool adapters = s.peft.method != trial::PeftMethod::kNone;
  const std::vector<std::string>& frozen = s.peft.freeze;
  auto part_trains = [&](std::string_view part) {
    return !adapters && std::find(frozen.begin(), frozen.end(), part) == frozen.end();
  };
  run.vision = part_trains("vision_model");
  run.qformer = part_trains("qformer");
  run.projection = part_trains("language_projection");
  run.language = part_trains("language_model");
  run.qlora = s.peft.method == trial::PeftMethod::kQlora;
  run.compute = s.peft.compute_dtype == trial::ComputeDtype::kFp32 ? kFp32 : kBf16;
  if (adapters) run.targets = s.peft.targets;
  run.rank = s.peft.r;
  run.lora_dropout = adapters ? s.peft.dropout : 0.0;
  run.cuda = s.device.kind == trial::Device::kCuda;
  run.checkpointing = s.memory.activation_checkpointing;
  run.fused = s.memory.kernels == trial::Kernels::kFused;
  run.chunked_loss = UsesChunkedLoss(config);
  // The head's products run in autocast's dtype, else the parameters' (fsdp's gathered bf16).
  if (run.chunked_loss) {
    run.head_buffers = ChunkedLossBuffers(buffers, precision, run.autocast || run.act == kBf16,
                                          model.text_vocab_size());
  }
  Blip2Walk walk(run, model, s.train.micro_batch_size, model.num_query_tokens + caption_tokens);
  return walk.Run();
}

}  // namespace llmctl::estimate
