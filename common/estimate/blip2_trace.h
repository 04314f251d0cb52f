// BLIP-2's forward traced op by op (internal to common/estimate; blip2_memory.h is the public
// face): what llm-train's Blip2ForConditionalGeneration (trainer/model/blip2.cc, opt.cc, t5.cc,
// projection.cc, llama.cc's loss) keeps for backward block by block, what is alive beside it while
// the forward runs, and what each block's backward adds, from the trial's config and the model's
// shapes. The tensors saved follow PyTorch's autograd rules as llama_trace.cc's LLaMA trace does,
// with the CPU's kernel choices measured on llm-train's allocator history: flash attention where
// there is no dropout and no mask (the ViT, OPT), the math path otherwise (the Q-Former's and T5's
// attention, which keeps its float32 work in float32 for 2-byte inputs), dropout as a mask in the
// input's dtype times the input.
#ifndef LLMCTL_COMMON_ESTIMATE_BLIP2_TRACE_H_
#define LLMCTL_COMMON_ESTIMATE_BLIP2_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/blip2_config.h"
#include "common/estimate/matmul_buffers.h"
#include "common/trial_config.h"

namespace llmctl::estimate {

// One block of the forward, in forward order: the vision embeddings, each ViT block, the ViT's
// final norm, the Q-Former's embeddings and blocks, the projection and the language model's
// embeddings, each OPT (or T5 encoder, then decoder) block, the head and the loss.
struct Blip2BlockTrace {
  std::string name;
  int64_t unit = -1;  // the block's fsdp unit (its gradients'); -1: the root's
  // Kept for backward from the forward until this block's backward frees it (with activation
  // checkpointing, a checkpointed block's kept inputs only).
  uint64_t saved = 0;
  // A checkpointed block's saved tensors while backward reruns it; 0 otherwise.
  uint64_t recompute = 0;
  // The block's backward at its worst: the incoming and outgoing gradients and its temporaries,
  // beyond its saved tensors and the parameters' gradients.
  uint64_t backward_transient = 0;
  // The values of the largest weight gradient its backward makes: one formed apart from the
  // gradient held since an earlier micro-batch, then added to it.
  int64_t largest_weight_gradient = 0;
  // The gradients and temporaries beside that formed-apart weight gradient, which may be fewer than
  // backward_transient's (OPT's: one of its two (N, F) gradients freed by then).
  uint64_t transient_beside_weight = 0;
};

struct Blip2ForwardTrace {
  int64_t text_tokens = 0;  // T, the language model's positions: the queries and the caption
  uint64_t fixed = 0;       // the batch's tensors: pixels, ids, labels, mask
  std::vector<Blip2BlockTrace> blocks;
  // Every tensor the forward keeps for backward: the blocks' and the few between them (T5's
  // position buckets and decoder ids).
  uint64_t saved = 0;
  // The forward's highest bytes beyond the model state and the batch: saved so far + the tensors
  // alive then (Loss's locals, an op's inputs, outputs and temporaries); the loss included.
  uint64_t forward_peak = 0;
  // At the start of backward, beyond every saved tensor and the batch: the loss' gradients.
  uint64_t loss_backward = 0;
};

// The trace of `config` on `model` (validated by the caller), with captions of `caption_tokens`
// tokens (their framing included, at most data.max_seq_length). `sharded`: fsdp gathers the
// parameters in the compute dtype (bf16 under bf16-mixed), so no autocast copies are made.
// `buffers`: what the device's GEMMs take beside the chunked loss' head products.
Blip2ForwardTrace TraceBlip2Forward(const TrialConfig& config, const Blip2Config& model,
                                    int64_t caption_tokens, bool sharded,
                                    const MatmulBuffers& buffers);

// Each fsdp unit's tensors of `model` under `config` (blip2_state.cc's): index unit + 1, the
// root's first.
struct Blip2UnitSize {
  int64_t trainable = 0;   // values that train
  int64_t dense = 0;       // values in the parameters' dtype, which fsdp gathers in the compute one
  uint64_t nf4_bytes = 0;  // QLoRA's NF4 buffers, gathered in their own dtypes
};
std::vector<Blip2UnitSize> Blip2UnitSizes(const TrialConfig& config, const Blip2Config& model);

}  // namespace llmctl::estimate

#endif  // LLMCTL_COMMON_ESTIMATE_BLIP2_TRACE_H_
