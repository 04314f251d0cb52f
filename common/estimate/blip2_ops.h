// The ops of blip2_trace.cc's traced forward (internal to common/estimate): each op of llm-train's
// BLIP-2 over symbolic tensors, keeping what PyTorch's autograd keeps for backward (as measured on
// llm-train's allocator history on the CPU) and recording what is alive beside the saved tensors
// while it runs.
#ifndef LLMCTL_COMMON_ESTIMATE_BLIP2_OPS_H_
#define LLMCTL_COMMON_ESTIMATE_BLIP2_OPS_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/estimate/matmul_buffers.h"
#include "common/estimate/trace.h"

namespace llmctl::estimate::blip2 {

using Tensor = TracedTensor;

inline constexpr int kFp32 = 4;
inline constexpr int kBf16 = 2;
inline constexpr uint64_t kInt64 = 8;

// How the trial runs its forward.
struct Blip2Run {
  int act = kFp32;  // the parameters' element, and the residual streams' (fp32 under autocast)
  bool autocast = false;  // bf16-mixed, 16-mixed: linears, convolutions and SDPA in 2 bytes
  // Which parts' weights train (full fine-tuning of a part that is not frozen).
  bool vision = false;
  bool qformer = false;
  bool projection = false;
  bool language = false;
  bool qlora = false;
  int compute = kBf16;  // QLoRA's compute dtype
  std::vector<std::string> targets;
  int64_t rank = 0;
  double lora_dropout = 0.0;
  bool cuda = false;
  bool checkpointing = false;
  bool fused = false;  // T5's norms and gated-GELU (kernels: fused)
  bool chunked_loss = false;
  // What the device's GEMMs take beside each of the chunked loss' head products while it runs
  // (matmul_buffers.h; 0 where not measured).
  HeadProductBuffers head_buffers = {};

  bool Targeted(std::string_view name) const {
    return !name.empty() && std::find(targets.begin(), targets.end(), name) != targets.end();
  }
};

inline int Wider(const Tensor& a, const Tensor& b) { return std::max(a.element, b.element); }

// The ops of the forward over symbolic tensors: each keeps what autograd keeps and records what is
// alive beside the saved tensors while it runs.
class Ops {
 public:
  explicit Ops(const Blip2Run& run) : r_(run) {}

  Tensor New(int64_t elements, int element, bool requires_grad) {
    return set_.New(elements, element, requires_grad);
  }
  // A view of a parameter: its storage is the model state's.
  static Tensor Param(int element, bool trains) { return {-1, 0, element, trains}; }
  void Save(const Tensor& t) {
    if (t.bytes > 0) set_.Save(t);
  }
  uint64_t saved() const { return set_.saved(); }
  uint64_t Unsaved(const Tensor& t) const { return set_.IsSaved(t) ? 0 : t.bytes; }
  bool IsSaved(const Tensor& t) const { return set_.IsSaved(t); }
  // The bytes alive now: the saved ones, the locals held across blocks, and `extra`.
  void Alive(uint64_t extra) { peak_ = std::max(peak_, set_.saved() + locals + extra); }
  uint64_t peak() const { return peak_; }

  uint64_t locals = 0;  // tensors Loss holds across blocks that no op saved (its embeddings, ...)

  // The values of the largest weight gradient a Linear traced since the last call makes (a
  // trained weight's, or a targeted adapter's rank x the wider side), and starts again.
  int64_t TakeLargestWeightGradient() { return std::exchange(largest_weight_gradient_, 0); }

  // x (rows, in) -> (rows, out): nn::Linear or the language model's Projection named `name`
  // (trainer/model/projection.cc): a dense base (NF4 under QLoRA when `nf4`) plus a LoRA adapter
  // when targeted, as TraceLinear (trace.h) keeps them for the LLaMA family too.
  Tensor Linear(const Tensor& x, int64_t rows, int64_t in, int64_t out, bool trains,
                std::string_view name = {}, bool nf4 = false);

  // ATen's layer_norm (in fp32 under autocast): the input, mean and rstd (rows, in the input's
  // dtype) kept for either gradient.
  Tensor LayerNorm(const Tensor& x, int64_t rows, int64_t width, bool trains);

  // T5's RMS norm (llama.cc's AtenRmsNorm: float32 statistics, cast back, times the weight), or
  // the fused op, which keeps its input and each row's fp32 rstd.
  Tensor RmsNorm(const Tensor& x, int64_t rows, int64_t width, bool trains);

  // F::dropout in training (p > 0): CPU's x * (bernoulli mask / (1 - p)), the mask in x's dtype
  // and kept for x's gradient; CUDA's fused kernel keeps a bool mask.
  Tensor Dropout(const Tensor& x, int64_t elements, double p);

  // The residual stream's sum a + b (no tensor kept), in the wider dtype.
  Tensor Add(const Tensor& a, const Tensor& b, int64_t elements);

  // erf GELU: keeps its input.
  Tensor Gelu(const Tensor& x, int64_t elements) {
    if (x.requires_grad) Save(x);
    const Tensor y = New(elements, x.element, x.requires_grad);
    Alive(Unsaved(x) + y.bytes);
    return y;
  }

  // Keeps its result.
  Tensor Relu(const Tensor& x, int64_t elements) {
    const Tensor y = New(elements, x.element, x.requires_grad);
    if (x.requires_grad) Save(y);
    Alive(Unsaved(x) + y.bytes);
    return y;
  }

  // T5's gated-GELU, gelu_new(gate) * up: ATen's composition 0.5 x (1 + tanh(c (x + 0.044715
  // x^3))) keeps x (pow's), tanh's result, both factors of the last product and, for the product
  // with up, the GELU and up; the fused op keeps gate and up.
  Tensor GatedGelu(const Tensor& gate, const Tensor& up, int64_t elements);

  // SDPA without dropout or mask: CPU's flash attention keeps q, k, v (their storages), its output
  // (laid out (B, T, H, D), so the caller's reshape is a view) and the fp32 log-sum-exp (B, H, Tq).
  // q (B·Tq, H·D).
  Tensor Flash(const Tensor& q, const Tensor& k, const Tensor& v, int64_t rows_q, int64_t heads,
               int64_t width);

  // SDPA's math path (dropout or a mask): q and k scaled and copied for the batched product, the
  // softmax, dropout's mask and output, v copied for the second product, each kept for the other
  // operand's gradient; then the output transposed back, a copy (B·Tq, H·D). The CPU computes
  // 2-byte inputs in fp32; CUDA takes the memory-efficient kernel instead. `mask_grad`: the
  // additive mask (T5's position bias) trains.
  Tensor Math(const Tensor& q, const Tensor& k, const Tensor& v, int64_t batch, int64_t heads,
              int64_t tq, int64_t tk, int64_t head_dim, double p, bool mask_grad);

 private:
  const Blip2Run& r_;
  SavedTensors set_;
  uint64_t peak_ = 0;
  int64_t largest_weight_gradient_ = 0;
};

}  // namespace llmctl::estimate::blip2

#endif  // LLMCTL_COMMON_ESTIMATE_BLIP2_OPS_H_
