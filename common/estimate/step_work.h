// The work of one optimizer step of a trial, counted from its config and the model's shapes alone
// (no LibTorch): what step_time.h divides by a device's rates.
//
// What one optimizer step costs, per rank:
//   matmul FLOPs: every projection and the head, 2 x tokens x in x out forward; backward the
//     input's gradient (2x) and, for a trained weight, the weight's (2x); attention's scores and
//     weighted sum (4 x tokens x T x heads x head_dim forward, twice that in backward, causal
//     masks not discounted); checkpointing reruns each layer's forward; LoRA adds its adapters'.
//   memory traffic (bytes read and written by the element-wise kernels): the norms, rotary
//     embedding, activation, residual adds and layout copies of each layer (the aten composition
//     makes several passes where a fused kernel makes one), on a GPU the loss over B x T x V
//     logits (on a CPU counted as logits, below), autocast's weight casts, QLoRA's dequantisation
//     of every NF4 weight in forward and backward, gradient accumulation, and the optimizer step's
//     reads and writes of weights, gradients and state.
//   host: offloaded optimizer steps (values updated on the host) and the PCIe copies to and from
//     it; ranks: ddp's all-reduce and fsdp's all-gathers and reduce-scatters (ring volumes).
//   launches: a fixed cost per kernel (per ATen op on the CPU), which is what a small model's step
//     is mostly made of; on a GPU only what issuing takes beyond the kernels' own time.
#ifndef LLMCTL_COMMON_ESTIMATE_STEP_WORK_H_
#define LLMCTL_COMMON_ESTIMATE_STEP_WORK_H_

#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <vector>

#include "common/estimate/model_state.h"
#include "common/model_config.h"
#include "common/status.h"
#include "common/trial_config.h"

namespace llmctl::estimate {

// The class of a step's matmuls, which sets its rate: bf16/fp16 (tensor cores on a GPU) or fp32.
enum class MatmulClass { kBf16, kFp32 };
std::string_view MatmulClassName(MatmulClass c);  // "bf16", "fp32"
// The class MatmulClassName names: "bf16", else fp32 (a name checked at the edge already).
MatmulClass MatmulClassNamed(std::string_view name);

// The kernels that run a step's element-wise work, the trial's `kernels`: ATen's compositions, or
// the trainer's fused kernels (trainer/kernels/fused_ops.h). For the loss over its logits:
// CausalLmLoss's cross-entropy, or the chunked loss' AtenCrossEntropyGrad under `kernels: aten`,
// against the chunked loss' fused kernel under `kernels: fused`.
enum class Kernels { kAten, kFused };
std::string_view KernelsName(Kernels k);  // "aten", "fused"
// The kernels KernelsName names: "fused", else aten (a name checked at the edge already).
Kernels KernelsNamed(std::string_view name);

// The model's family: its step's structure, which a calibration from measured runs is kept to.
enum class ModelFamily { kLlama, kBlip2 };
std::string_view ModelFamilyName(ModelFamily f);  // "llama", "blip2"

// One shape of a step's matmuls, a projection's: `rows` token rows through an `in` x `out` weight,
// and the FLOPs the step spends at that shape (forward, backward and any rerun, every layer and
// micro-batch). A CPU's GEMM runs far below its square rate with few rows or a narrow weight, so
// the time takes each shape at its own probed rate (step_time.h).
struct MatmulShape {
  int64_t rows = 0;
  int64_t in = 0;
  int64_t out = 0;
  double flops = 0;
  // The dtype it runs in where it differs from others of the step: a 32-true QLoRA step runs its
  // NF4 projections in the compute dtype (bf16) and its adapters and head in fp32. Unset: the
  // work's matmul_class (and every shape of a work stored before 11-30's eighteenth stop).
  std::optional<MatmulClass> matmul_class;
  // A frozen weight (LoRA's and QLoRA's base projections, an untrained head): backward computes
  // the input's gradient alone, two of a trained projection's three GEMMs (its FLOPs count the
  // same). A work stored before 12-05 says nothing: trained.
  bool frozen = false;
};

// Adds `shape` to `shapes`: its FLOPs to a shape already there (the same rows, weight and class),
// else as a new one.
void AddMatmulShape(std::vector<MatmulShape>& shapes, const MatmulShape& shape);

// One shape of a step's attention (SDPA's scores and weighted sum): sequences of `queries` queries,
// each attending to `keys` keys (the same for self-attention; a micro-batch's padded length), on
// heads `head_width` wide, and the FLOPs the step spends at that shape (forward, backward and any
// rerun, every layer and micro-batch). A CPU's attention runs at a third of its 512-token rate at
// 82 tokens and at half its 64-wide rate on 24-wide heads, so each shape takes its own rate.
struct AttentionShape {
  double queries = 0;
  double keys = 0;
  double head_width = 0;
  double flops = 0;
};

// The longest sequence and widest head an attention shape, or a probe's attention row
// (rate_probe.h), may have: beyond them the padding's and the rate's arithmetic would overflow.
inline constexpr int64_t kMaxAttentionTokens = 1 << 20;
inline constexpr int64_t kMaxAttentionHeadWidth = 1 << 16;

// Adds `shape` to `shapes`: its FLOPs to a shape already there, else as a new one.
void AddAttentionShape(std::vector<AttentionShape>& shapes, const AttentionShape& shape);

// One optimizer step's work on one rank.
struct StepWork {
  ModelFamily family = ModelFamily::kLlama;
  MatmulClass matmul_class = MatmulClass::kFp32;
  int64_t tokens = 0;         // per rank per optimizer step: micro-batches x micro-batch tokens
  int64_t micro_batches = 0;  // the accumulation
  int64_t world_size = 1;
  int64_t nodes = 1;
  double matmul_flops = 0;
  // Of matmul_flops: the projections' by shape (empty: not counted by shape, every FLOP at one
  // rate) and attention's scores and weighted sum (SDPA's); the rest at the micro-batch's rate.
  std::vector<MatmulShape> matmul_shapes;
  double attention_flops = 0;
  // Of attention_flops, by shape: a LLaMA's one, a BLIP-2's each part's (the ViT's, the Q-Former's
  // self- and cross-attention, the language model's). A work stored before 12-01 had one sequence
  // length and head width for all of it (`attention_seq`, `attention_head_width`), read as one
  // shape; one stored before 11-30 had neither, read as kProbeAttentionTokens on
  // kProbeAttentionHeadWidth-wide heads.
  std::vector<AttentionShape> attention_shapes;
  // The dtype attention runs in, the activations' (a 32-true QLoRA step's is fp32 whatever its
  // projections' compute dtype): unset, the matmul_class (a work stored before it).
  std::optional<MatmulClass> attention_class;
  // The micro-batches a step runs at a padded length no earlier step had, each of whose matmul
  // shapes is then new to the process (a CPU's 16-bit GEMMs build their kernels for each): 0 when
  // not known (a work stored before 11-30, or one at full sequences, which repeat).
  double new_length_micro_batches = 0;
  double memory_bytes = 0;
  // The tensor a step's element-wise op typically runs over: one micro-batch's residual stream
  // (its tokens x the hidden width, in the stream's dtype), in bytes, and that dtype (bf16 under
  // bf16-true; fp32 under 32-true and autocast, whose norms and adds stay in fp32). A CPU runs
  // such ops from its caches at a small model's sizes, several times a copy's rate through memory,
  // so memory_bytes beyond state_memory_bytes take a probe's element-wise rate at this size
  // (step_time.h's ElementwiseRateAt). 0: a work stored before 12-05, or a BLIP-2's, whose parts'
  // streams differ: the device's one memory rate.
  double elementwise_tensor_bytes = 0;
  MatmulClass elementwise_class = MatmulClass::kFp32;
  // Of memory_bytes, the traffic over the model's state (autocast's weight casts, the embedding's
  // dense gradient, gradient accumulation and clipping, the optimizer step, ddp's bucket copies):
  // it streams through every weight, gradient and moment, which a CPU's caches do not hold, so
  // where the rest takes the element-wise rate this takes the memory copy's (12-05, Xeon, the CPU
  // lab's aten steps: a 1.5 MiB fp32 gradient's accumulation at 52 GB/s, the fused AdamW step over
  // 8.65 M bf16 weights at 20 GB/s, where an element-wise product in the caches ran at 150 and 50).
  double state_memory_bytes = 0;
  // Of memory_bytes beyond state_memory_bytes, the activations converted between dtypes: autocast's
  // casts of the fp32 residual stream and QLoRA's conversions to and from its compute dtype. Timed
  // as the rest; `--explain` names it (12-06: 10 ms of a bf16-mixed LoRA step, 31 ms of a 32-true
  // QLoRA one, on the Xeon). 0: a work stored before 12-06, or one that converts nothing.
  double cast_memory_bytes = 0;
  // Of memory_bytes beyond state_memory_bytes, the decoder layers' own element-wise ops: their
  // norms, RoPE, the MLP's activation, the residual adds and the layout copies
  // (LayerElementwiseBytes), with the dtype of the projections' outputs they run over and the
  // kernels that run them. A CPU's probe times one layer's such ops as the trainer runs them
  // (rate_probe.h's ProbedLayerElementwise), whose rate they take where it measured their dtypes
  // and kernels, uncalibrated (step_time.h's "layer ops"): many small ops and their backward
  // nodes, which run at 30-46 GB/s of these bytes in fp32 on the Xeon, where the contiguous
  // product runs at 122-145 (12-06). 0: a work stored before 12-06, or a BLIP-2's: the
  // element-wise rate, as the rest.
  double layer_memory_bytes = 0;
  MatmulClass layer_projected_class = MatmulClass::kFp32;
  Kernels layer_kernels = Kernels::kAten;
  double launches = 0;
  double host_optimizer_values = 0;  // values an offloaded optimizer updates on the host
  // Values the CPU's 8-bit AdamW updates (trainer/train/adamw_8bit.cc): bound by its nearest-code
  // searches, not by memory, so timed at its own rate. CUDA's 8-bit step is in memory_bytes.
  double adamw_8bit_values = 0;
  // NF4 values QLoRA dequantises for its matmuls on the CPU (trainer/quant): a lookup, a scale and
  // a conversion a value, bound by that work rather than by memory (11-30, Zen 4: 0.8 G values/s
  // where the copy moves 30 GB/s), so timed at its own rate. CUDA's is in memory_bytes.
  double nf4_dequant_values = 0;
  // Values a CPU step's dropout masks draw (LoRA's adapter dropout: every adapted projection's
  // input, each forward and checkpointing's rerun): ATen's Bernoulli draws run a value at a time,
  // far below memory's rate (11-30, Zen 4: 0.2 G values/s where a copy moves 30 GB/s), so timed at
  // their own rate. CUDA's are in memory_bytes, as the mask's bytes are here.
  double dropout_values = 0;
  // Logits a CPU step's loss runs over, forward and backward (every micro-batch's), by the kernels
  // that run it, and the logits' dtype (fp32, or bf16 for 16-bit logits): an exp a logit or two
  // bounds it rather than its bytes (12-02, Zen 4, 2 threads: ATen's 3-6 ns a fp32 logit where
  // copying one takes 0.1-0.3), so timed at the probe's rate for those kernels and that dtype.
  // CUDA's are in memory_bytes (LossBytesPerLogit), as are those of a work stored before 12-02.
  double loss_logits = 0;
  Kernels loss_kernels = Kernels::kAten;
  MatmulClass loss_class = MatmulClass::kFp32;
  // Source pixels of the images a captioning step decodes, resizes and normalises on the host, one
  // thread, by format (their cost per pixel differs by format): 0 for a text model, and where the
  // images are not on the estimating machine (estimate_trial.cc reads their headers).
  double jpeg_pixels = 0;
  double png_pixels = 0;
  double host_link_bytes = 0;     // copies between host and device memory
  double interconnect_bytes = 0;  // sent by this rank to ranks on its node
  double network_bytes = 0;       // sent by this rank to other nodes
  // What happens before the first step: the model's bytes built or loaded.
  double model_bytes = 0;
  bool pretrained = false;

  nlohmann::json ToJson() const;
  static StatusOr<StepWork> FromJson(const nlohmann::json& json);
};

// The class `shape` runs in: its own, else the work's.
MatmulClass ShapeClass(const StepWork& w, const MatmulShape& shape);

// The class `w`'s attention runs in: its own, else the work's.
MatmulClass AttentionClass(const StepWork& w);

// A projection's weight, `in` x `out`, whatever the rows through it, and whether every matmul
// through it is frozen (MatmulShape::frozen).
struct WeightShape {
  int64_t in = 0;
  int64_t out = 0;
  bool frozen = false;
  // The token rows its GEMMs run at in a micro-batch (the most of its matmul shapes'); 0: not
  // known. A new length's kernels cost more at more rows (NewLengthCost).
  int64_t rows = 0;
  double values() const { return static_cast<double>(in) * static_cast<double>(out); }
  auto operator<=>(const WeightShape&) const = default;
};

// The distinct weight shapes (in x out) among `w`'s matmul_shapes whose matmuls run in `c`
// (ShapeClass), in order, each frozen if all its matmuls are, at the most rows of its matmuls: the
// GEMM kernels a micro-batch of a new length builds anew are per shape, whatever the layers that
// share it.
std::vector<WeightShape> WeightShapes(const StepWork& w, MatmulClass c);

// The widths of a LLaMA decoder layer that its element-wise ops run over.
struct LayerWidths {
  double hidden = 0;
  double q = 0;   // heads x head_dim
  double kv = 0;  // key-value heads x head_dim
  double inter = 0;
};

// Bytes one LLaMA decoder layer's element-wise ops (LayerPasses': its two norms, RoPE on q and k,
// the MLP's activation, the two residual adds, the layout copies, and repeat_kv's where kv < q)
// read and write for one token through `forward_runs` forwards and one backward, its residual
// stream's values `stream` bytes each and the projections' outputs `projected`, run by `kernels`.
double LayerElementwiseBytes(const LayerWidths& widths, double stream, double projected,
                             Kernels kernels, double forward_runs = 1);

// Of a layer's launches (StepWork::launches), those of the element-wise ops LayerElementwiseBytes
// counts, through `forward_runs` forwards and one backward: a probe's cell of those ops spends
// them as well as its bytes, and the step counts them at the launch rate.
double LayerElementwiseLaunches(Kernels kernels, double forward_runs = 1);

// The work of one optimizer step of `config` on `model` (the preconditions of
// EstimateModelState). Sequences are full (micro_batch_size x data.max_seq_length tokens), as for
// the memory estimate.
StatusOr<StepWork> EstimateStepWork(const TrialConfig& config, const ModelConfig& model);

// `w`'s attention, counted at one self-attention length, spread over the padded lengths a run
// draws (`micro_batches_by_length`: length -> micro-batches, none empty), each length its share of
// the micro-batches at its own FLOPs. A sequence's attention grows as the square of its length, and
// a CPU's in whole query blocks, so the mean length's undercounts a run whose lengths spread
// (12-07, Xeon with AMX: cpu-lab's larger-model, micro-batches padded to 80-106 tokens, spent 54
// ms a step in SDPA where the mean length's 90 priced 37). Its FLOPs (and matmul_flops, which hold
// them) become those lengths' mean.
// Lengths that pad to one query block (step_time.h's PaddedQueries) make one shape, at their
// root-mean-square length, and past kMaxSpreadAttentionShapes such groups neighbours merge: a
// stored prediction must fit controller/submission.h's 16 KiB, and a real dataset's run draws
// hundreds of lengths. A work whose attention is not one self-attention shape (a BLIP-2 step's) is
// left as it is.
inline constexpr size_t kMaxSpreadAttentionShapes = 32;
void SpreadAttentionOverLengths(const std::map<int64_t, int64_t>& micro_batches_by_length,
                                StepWork& w);

// The parts every model family's step shares, added to `work` (its tokens, micro-batches, ranks
// and element-wise traffic already counted): gradient accumulation and clipping, the optimizer
// step (on the device, or offloaded with its host traffic) and the traffic between ranks (ddp's
// all-reduce; fsdp's gathers and reduce-scatters), over the trainable values `state` says this rank
// holds.
void AddOptimizerAndRanks(const TrialConfig& config, const ModelStateEstimate& state,
                          StepWork& work);

// The optimizer step's launches for `trainable_tensors` tensors on the trial's device.
double OptimizerLaunches(const TrialConfig& config, double trainable_tensors);

// The kernels that run `config`'s loss.
Kernels LossKernelsOf(const TrialConfig& config);

// Bytes the loss reads and writes per logit besides the head's matmul, the chunked loss' or the
// full logits', by the logits' element size: a GPU's loss is bound by them.
double LossBytesPerLogit(bool chunked, double logit_element);

// The loss over `logits` logits of `logit_element` bytes in a step, added to `w`: memory traffic
// on CUDA (LossBytesPerLogit), the CPU's loss_logits there.
void AddLossLogits(const TrialConfig& config, double logits, double logit_element, StepWork& w);

// Bytes a LoRA adapter on a projection (in -> out) reads and writes per token in forward.
double AdapterBytesPerToken(double in, double out, double element, bool dropout);

// QLoRA's dequantisation of `values` NF4 values in a step, added to `w`: memory traffic on CUDA
// (22.5 B a value), the CPU's nf4_dequant_values there.
void AddNf4Dequant(const TrialConfig& config, double values, StepWork& w);

// A step's dropout masks over `values` values, added to `w`: the CPU's dropout_values (CUDA's draws
// are in the masks' memory traffic, counted with the adapters').
void AddDropoutDraws(const TrialConfig& config, double values, StepWork& w);

}  // namespace llmctl::estimate

#endif  // LLMCTL_COMMON_ESTIMATE_STEP_WORK_H_
