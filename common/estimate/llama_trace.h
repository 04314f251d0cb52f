// LLaMA's forward traced op by op (internal to common/estimate; step_memory.h is the public face):
// how a trial runs its forward (Forward), and every tensor that llm-train's forward
// (trainer/model/llama.cc, projection.cc, loss.cc) keeps for backward, layer by layer and stage by
// stage, then the loss' with what it holds beyond them. step_memory.cc builds the step on it.
#ifndef LLMCTL_COMMON_ESTIMATE_LLAMA_TRACE_H_
#define LLMCTL_COMMON_ESTIMATE_LLAMA_TRACE_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/estimate/matmul_buffers.h"
#include "common/estimate/model_state.h"
#include "common/model_config.h"
#include "common/trial_config.h"

namespace llmctl::estimate::llama {

// A decoder layer's ops, in forward order. Backward runs them in reverse: each forms its weights'
// gradients while what it saved is still alive, and frees what it saved once it has run (a tensor
// several ops save, such as a norm's output that q, k and v all read, once the earliest of them
// has).
enum LayerStage : size_t {
  kNorm1,       // input_layernorm
  kQkv,         // q_proj, k_proj, v_proj
  kAttention,   // RoPE and SDPA
  kOutput,      // o_proj
  kNorm2,       // post_attention_layernorm
  kGateUp,      // gate_proj, up_proj
  kActivation,  // silu(gate) * up
  kDown,        // down_proj
  kLayerStages
};
using StageBytes = std::array<uint64_t, kLayerStages>;

inline constexpr std::array<const char*, kLayerStages> kStageNames = {
    "input norm",          "q/k/v projections",   "attention",  "o_proj",
    "post-attention norm", "gate/up projections", "activation", "down_proj"};

// How the trial runs its forward: sizes, dtypes and which weights train.
struct Forward {
  int64_t tokens = 0;     // N = B x T
  int64_t seq = 0;        // T
  int64_t hidden = 0;     // C
  int64_t inter = 0;      // I
  int64_t heads = 0;      // H
  int64_t kv_heads = 0;   // K
  int64_t head_dim = 0;   // D
  int64_t vocab = 0;      // V
  int act = 4;            // the residual stream's element: the parameters' dtype
  bool autocast = false;  // bf16-mixed / 16-mixed: linear layers and attention in 2 bytes
  bool full = true;       // every weight trains (no PEFT)
  bool qlora = false;     // the decoder projections' weights are NF4
  int compute = 2;        // QLoRA's compute dtype element
  std::vector<std::string> targets;
  int64_t rank = 0;
  bool dropout = false;
  bool cuda = false;
  bool checkpointing = false;
  bool chunked_loss = false;
  bool fused = false;  // kernels: fused (trainer/kernels/fused_ops.h)
  // What the device's GEMMs take beside each of the chunked loss' head products while it runs
  // (matmul_buffers.h; 0 where not measured).
  HeadProductBuffers head_buffers = {};
  // FusedSwiGluLinear: a plain, trained down_proj outside autocast recomputes the product its
  // weight's gradient needs instead of keeping it.
  bool swiglu_linear = false;

  // trainer/model/llama.cc: on CUDA, float32 attention with fewer key/value heads than heads
  // repeats the keys and values to every head for SDPA's memory-efficient kernel (flash attention
  // takes 2-byte inputs only). On the CPU flash attention takes float32 and grouped heads.
  bool RepeatsKeyValues() const { return cuda && !autocast && act == 4 && kv_heads != heads; }

  bool Targeted(std::string_view projection) const {
    return std::find(targets.begin(), targets.end(), projection) != targets.end();
  }
};

// Whether the trainer's autocast is on: under the mixed precisions, under fsdp too.
bool AutocastScope(const TrialSettings& s);

// How `config` runs its forward on `model` (`state` says whether fsdp shards it).
Forward DescribeForward(const TrialConfig& config, const ModelConfig& model,
                        const ModelStateEstimate& state);

// The forward's saved tensors and the loss' moments, as TraceLlamaForward finds them.
struct LlamaForwardTrace {
  uint64_t fixed = 0;                    // token ids, labels, RoPE tables
  std::vector<uint64_t> layer_saved;     // what each layer adds
  std::vector<StageBytes> layer_stages;  // what its stages hold for backward (the rerun's)
  uint64_t layer_recompute = 0;          // one checkpointed layer's saved tensors
  uint64_t layers_saved = 0;             // every layer's, the embedding's output included
  uint64_t head_saved = 0;               // the final norm's and the loss'
  uint64_t forward_transient = 0;        // the loss' forward beyond the saved tensors
  uint64_t forward_buffer = 0;  // of forward_transient, a head product's buffer (Forward's)
  uint64_t loss_backward = 0;   // the loss' gradients
  // The plain loss' head in backward: log-softmax's saved output (freed by then) and the logits'
  // gradient in their dtype, which the head's matmuls read.
  uint64_t head_log_softmax = 0;
  uint64_t logits_grad = 0;
  // The output weight's gradient (V, C), when the weight trains (a LoRA head's adapters are small).
  uint64_t head_grad = 0;
};

// The forward's saved tensors, layer by layer, then the loss'. `autocast_scope`: the trainer's
// autocast is on (AutocastScope); `sharded`: fsdp gathers the parameters; `param`: the bytes of a
// parameter's element.
LlamaForwardTrace TraceLlamaForward(const Forward& f, const ModelConfig& model, bool autocast_scope,
                                    bool sharded, uint64_t param);

}  // namespace llmctl::estimate::llama

#endif  // LLMCTL_COMMON_ESTIMATE_LLAMA_TRACE_H_
