#include "common/estimate/step_work.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "common/estimate/model_state.h"
#include "common/estimate/step_time.h"

namespace llmctl::estimate {
namespace {

using nlohmann::json;

// Element-wise passes of one decoder layer's forward, in elements read plus written per token, by
// tensor width. Counted from llm-train's forward (trainer/model/llama.cc, trainer/kernels): the
// aten composition's RMSNorm is six ops (pow, mean, add, rsqrt, mul, mul by the weight), its
// rotary embedding five (two muls, rotate_half's slice-neg-cat, an add) on q and k, its SwiGLU a
// silu and a mul; the fused kernels read their input and write their output once. Both add the
// two residuals and copy q, k, v and the attention's output between (B, T, H, D) and (B, H, T, D).
struct LayerPasses {
  double hidden;  // x hidden_size, in the residual stream's element
  double qk;      // x (heads + kv_heads) x head_dim
  double inter;   // x intermediate_size
  double layout;  // x (2 heads + 2 kv_heads) x head_dim
};
constexpr LayerPasses kAtenPasses{
    .hidden = 2 * 6 * 2 + 2 * 3, .qk = 5 * 2, .inter = 2 + 3, .layout = 2};
constexpr LayerPasses kFusedPasses{.hidden = 2 * 2 + 2 * 3, .qk = 2, .inter = 3, .layout = 2};
// A backward pass touches about twice what its forward did (the input, the output's gradient,
// the input's gradient, and for the norms the weight's).
constexpr double kBackwardPasses = 2;

// Bytes per logit of the loss besides writing the logits: the aten path copies them to fp32,
// takes log-softmax (max and sum passes, then the output), and in backward forms the softmax
// gradient and casts it back; the chunked loss takes the softmax in place and forms the gradient
// in forward (trainer/model/loss.cc).
constexpr double kCeBytesPerLogit = 36;
constexpr double kChunkedBytesPerLogit = 20;

// QLoRA's dequantisation of one NF4 value for a matmul: on CUDA trainer/quant widens the packed
// byte to int32 (0.5 B read, 2 B written per value), looks the pair up (2 B read, 4 B written),
// scales it by its block (4 + 4) and casts it to the compute dtype (4 + 2): 22.5 B. On the CPU one
// kernel does it all a value at a time: counted as values (StepWork::nf4_dequant_values).
constexpr double kNf4CudaBytesPerValue = 22.5;

// Kernel launches (CPU: ATen ops) of one layer's forward; backward about twice as many.
constexpr double kAtenLayerLaunches = 45;
constexpr double kFusedLayerLaunches = 30;
// Of those, the element-wise ops LayerPasses counts: under aten each norm's six and each RoPE's
// five, the layout copy, the two adds, silu and its product; fused kernels one a norm, a RoPE and
// the SwiGLU, with the same copy and adds.
constexpr double kAtenLayerElementwiseLaunches = 2 * 6 + 2 * 5 + 1 + 2 + 2;
constexpr double kFusedLayerElementwiseLaunches = 2 + 2 + 1 + 2 + 1;
constexpr double kLossLaunches = 20;
constexpr double kChunkLaunches = 12;
// Optimizer launches per trainable tensor: CUDA's foreach kernels take many tensors at once;
// the CPU runs the update tensor by tensor.
constexpr double kCudaOptimizerLaunches = 0.2;
constexpr double kCpuOptimizerLaunches = 12;

bool Contains(const std::vector<std::string>& list, std::string_view item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

// Bytes a LoRA adapter on a projection (in -> out) reads and writes per token in forward: the
// dropout on its input (read, write, and a byte of mask), reading its input, writing its output,
// scaling it and adding it to the base projection's output (PEFT's lora.Linear).
double AdapterTouch(double in, double out, double element, bool dropout) {
  return (dropout ? (2 * element + 1) * in : 0) + in * element + (1 + 2 + 3) * out * element;
}

// A ring collective sends (N - 1) / N of its bytes from every rank.
double RingShare(int64_t world) {
  return world > 1 ? static_cast<double>(world - 1) / static_cast<double>(world) : 0.0;
}

}  // namespace

std::string_view MatmulClassName(MatmulClass c) {
  return c == MatmulClass::kBf16 ? "bf16" : "fp32";
}

MatmulClass MatmulClassNamed(std::string_view name) {
  return name == "bf16" ? MatmulClass::kBf16 : MatmulClass::kFp32;
}

std::string_view ModelFamilyName(ModelFamily f) {
  return f == ModelFamily::kBlip2 ? "blip2" : "llama";
}

void AddMatmulShape(std::vector<MatmulShape>& shapes, const MatmulShape& shape) {
  for (MatmulShape& known : shapes) {
    if (known.rows == shape.rows && known.in == shape.in && known.out == shape.out &&
        known.matmul_class == shape.matmul_class) {
      known.flops += shape.flops;
      known.frozen = known.frozen && shape.frozen;
      return;
    }
  }
  shapes.push_back(shape);
}

void AddAttentionShape(std::vector<AttentionShape>& shapes, const AttentionShape& shape) {
  for (AttentionShape& known : shapes) {
    if (known.queries == shape.queries && known.keys == shape.keys &&
        known.head_width == shape.head_width) {
      known.flops += shape.flops;
      return;
    }
  }
  shapes.push_back(shape);
}

MatmulClass ShapeClass(const StepWork& w, const MatmulShape& shape) {
  return shape.matmul_class.value_or(w.matmul_class);
}

MatmulClass AttentionClass(const StepWork& w) { return w.attention_class.value_or(w.matmul_class); }

std::vector<WeightShape> WeightShapes(const StepWork& w, MatmulClass c) {
  // (in, out): every matmul through it frozen, and their most rows
  std::map<std::pair<int64_t, int64_t>, std::pair<bool, int64_t>> weights;
  for (const MatmulShape& s : w.matmul_shapes) {
    if (ShapeClass(w, s) != c) continue;
    const auto [at, added] = weights.try_emplace({s.in, s.out}, s.frozen, s.rows);
    if (!added) at->second = {at->second.first && s.frozen, std::max(at->second.second, s.rows)};
  }
  std::vector<WeightShape> shapes;
  for (const auto& [in_out, frozen_rows] : weights) {
    shapes.push_back({in_out.first, in_out.second, frozen_rows.first, frozen_rows.second});
  }
  return shapes;
}

namespace {

// What a LLaMA-family micro-batch's work depends on, read once from the trial and the model.
struct LlamaStepShape {
  Kernels kernels = Kernels::kAten;
  bool checkpointing = false, full = false, qlora = false, mixed = false, adapter_dropout = false;
  std::vector<std::string> targets;  // adapted projections; none for a full fine-tune
  double t = 0;                      // tokens per micro-batch
  double seq = 0, r = 0;
  // Element sizes: parameters (fp32 master weights under mixed), the residual stream (fp32 under
  // autocast, whose norms and adds stay in fp32; fsdp's mixed forward is a bf16 one), and the
  // projections' outputs (bf16 under autocast).
  double param = 0, stream = 0, projected = 0;
  double h = 0, inter = 0, q = 0, kv = 0, vocab = 0, layers = 0;
  // The dtype of the activations, which attention, the adapters and the head run in, and of the
  // base projections: QLoRA's NF4 weights dequantise to its compute dtype.
  MatmulClass activation_class = MatmulClass::kFp32, base_class = MatmulClass::kFp32;
};

// The shape of `config`'s step on `model`; fills w's batch counts and matmul class on the way.
LlamaStepShape DescribeLlamaStep(const TrialConfig& config, const ModelConfig& model,
                                 const ModelStateEstimate& state, StepWork& w) {
  const TrialSettings& s = config.settings();
  const trial::Precision precision = s.memory.precision;
  LlamaStepShape x;
  x.kernels = s.memory.kernels == trial::Kernels::kFused ? Kernels::kFused : Kernels::kAten;
  x.checkpointing = s.memory.activation_checkpointing;
  x.full = s.peft.method == trial::PeftMethod::kNone;
  x.qlora = s.peft.method == trial::PeftMethod::kQlora;
  const bool sharded = state.fsdp_root_values > 0;
  x.mixed = precision == trial::Precision::kBf16Mixed || precision == trial::Precision::k16Mixed;
  if (!x.full) x.targets = s.peft.targets;

  const int64_t micro = s.train.micro_batch_size;
  const int64_t seq = s.data.max_seq_length;
  w.world_size = state.world_size;
  w.nodes = std::max<int64_t>(1, s.parallel.nodes);
  const int64_t global = s.train.global_batch_size;
  w.micro_batches = std::max<int64_t>(1, global / (micro * w.world_size));
  x.t = static_cast<double>(micro * seq);
  x.seq = static_cast<double>(seq);
  w.tokens = micro * seq * w.micro_batches;
  x.activation_class =
      precision != trial::Precision::k32True ? MatmulClass::kBf16 : MatmulClass::kFp32;
  // QLoRA's projections run in its compute dtype, and under autocast in autocast's (its linear
  // casts them again).
  if (x.qlora) {
    x.base_class = s.peft.compute_dtype == trial::ComputeDtype::kBf16 || x.mixed
                       ? MatmulClass::kBf16
                       : MatmulClass::kFp32;
  } else {
    x.base_class = x.activation_class;
  }
  // The class most of the step's FLOPs run in, whose factor calibrates it.
  w.matmul_class = x.base_class;
  w.attention_class = x.activation_class;

  x.param = precision == trial::Precision::kBf16True ? 2 : 4;
  x.stream = precision == trial::Precision::kBf16True || (x.mixed && sharded) ? 2 : 4;
  x.projected = precision == trial::Precision::k32True ? 4 : 2;
  x.h = static_cast<double>(model.hidden_size);
  x.inter = static_cast<double>(model.intermediate_size);
  x.q = static_cast<double>(model.num_attention_heads * model.head_dim);
  x.kv = static_cast<double>(model.num_key_value_heads * model.head_dim);
  x.vocab = static_cast<double>(model.vocab_size);
  x.layers = static_cast<double>(model.num_hidden_layers);
  x.r = static_cast<double>(s.peft.r);
  x.adapter_dropout = !x.full && s.peft.dropout > 0;
  return x;
}

// One micro-batch's matmuls, and what the element-wise count needs from the same walk.
struct LlamaMatmuls {
  double flops = 0;
  std::vector<MatmulShape> shapes;  // of flops, by shape
  double attention_flops = 0;       // of flops
  double nf4_values = 0;            // per layer
  double nf4_in_out = 0;            // per layer: the NF4 projections' inputs and outputs a token
  double stream_readers = 0;        // per layer: projections and adapters whose input is the stream
  double trained_weight_values = 0;  // the dense weights a full fine-tune trains
  double adapter_touch = 0;          // bytes per token of one layer's adapters, forward
  double adapter_dropout = 0;        // values per token one layer's adapters' masks draw, forward
  double head_dropout = 0;           // the output head adapter's, per token
  double head_memory = 0;            // the output head adapter's element-wise bytes
};

LlamaMatmuls CountLlamaMatmuls(const LlamaStepShape& x, const ModelConfig& model) {
  struct Projection {
    const char* name;
    double in, out;
    bool reads_stream;  // its input is the (normed) residual stream, not another op's output
  };
  const Projection projections[] = {
      {"q_proj", x.h, x.q, true},        {"k_proj", x.h, x.kv, true},
      {"v_proj", x.h, x.kv, true},       {"o_proj", x.q, x.h, false},
      {"gate_proj", x.h, x.inter, true}, {"up_proj", x.h, x.inter, true},
      {"down_proj", x.inter, x.h, false}};
  LlamaMatmuls m;
  const double forward_runs = x.checkpointing ? 2 : 1;
  // `runs` passes of a (t x in) x (in x out) matmul in `dtype`, `layers` times, through a weight
  // trained or `frozen`.
  auto add = [&](double in, double out, double runs, double layers, MatmulClass dtype,
                 bool frozen = false) {
    AddMatmulShape(m.shapes, {.rows = static_cast<int64_t>(x.t),
                              .in = static_cast<int64_t>(in),
                              .out = static_cast<int64_t>(out),
                              .flops = layers * runs * 2 * x.t * in * out,
                              .matmul_class = dtype,
                              .frozen = frozen});
  };
  const MatmulClass adapter = x.activation_class;
  for (const Projection& p : projections) {
    // Forward, the input's gradient, and a trained weight's gradient.
    add(p.in, p.out, forward_runs + (x.full ? 2 : 1), x.layers, x.base_class, !x.full);
    if (x.full) m.trained_weight_values += p.in * p.out;
    if (p.reads_stream) ++m.stream_readers;
    if (x.qlora) {
      m.nf4_values += p.in * p.out;
      m.nf4_in_out += p.in + p.out;
    }
    if (!x.full && Contains(x.targets, p.name)) {
      if (p.reads_stream) ++m.stream_readers;
      // The adapter: x A^T then (.) B^T, forward; both gradients in backward.
      add(p.in, x.r, forward_runs + 2, x.layers, adapter);
      add(x.r, p.out, forward_runs + 2, x.layers, adapter);
      m.adapter_touch += AdapterTouch(p.in, p.out, x.projected, x.adapter_dropout);
      if (x.adapter_dropout) m.adapter_dropout += p.in;  // each adapter its own mask
    }
  }
  // Attention's own matmuls: scores (B, H, T, T) and their weighted sum of the values; backward
  // twice the forward.
  m.attention_flops = x.layers * 4 * x.t * x.seq * x.q * (forward_runs + 2);
  // The head runs once (outside the checkpointed layers).
  const bool head_trained =
      x.full || (!model.tie_word_embeddings && Contains(x.targets, "lm_head"));
  // The head is never quantised: it runs in the activations' dtype.
  add(x.h, x.vocab, head_trained ? 3 : 2, 1, x.activation_class, !head_trained);
  if (!x.full && Contains(x.targets, "lm_head")) {
    add(x.h, x.r, 3, 1, adapter);
    add(x.r, x.vocab, 3, 1, adapter);
    m.head_memory = x.t * AdapterTouch(x.h, x.vocab, x.projected, x.adapter_dropout) * 3;
    if (x.adapter_dropout) m.head_dropout = x.h;
  }
  if (x.full) m.trained_weight_values += x.h * x.vocab;
  m.flops = m.attention_flops;
  for (const MatmulShape& shape : m.shapes) m.flops += shape.flops;
  return m;
}

// One micro-batch's memory traffic: all of it, and of it the part over the model's state
// (StepWork::state_memory_bytes).
struct MicroMemory {
  double bytes = 0;
  double state_bytes = 0;
  double cast_bytes = 0;    // of bytes: activations converted between dtypes
  double layers_bytes = 0;  // of bytes: the layers' own element-wise ops (LayerElementwiseBytes)
};

MicroMemory CountLlamaMicroMemory(const TrialConfig& config, const ModelConfig& model,
                                  const LlamaStepShape& x, const LlamaMatmuls& m) {
  const double forward_runs = x.checkpointing ? 2 : 1;
  const double layers_bytes =
      x.t * x.layers *
      LayerElementwiseBytes({.hidden = x.h, .q = x.q, .kv = x.kv, .inter = x.inter}, x.stream,
                            x.projected, x.kernels, forward_runs);
  double micro_memory =
      layers_bytes + x.t * x.layers * m.adapter_touch * (forward_runs + kBackwardPasses);
  double cast_bytes = 0;
  if (x.qlora && !x.mixed && x.base_class != x.activation_class) {
    // An NF4 projection computes in QLoRA's compute dtype, not the activations' (32-true's bf16
    // compute by default): each forward converts its input to it and its output back, and
    // backward its output's gradient to it and its input's gradient back
    // (trainer/quant/nf4_linear.cc, trainer/model/projection.cc), reading one dtype's 4 or 2
    // bytes a value and writing the other's. 12-06, the Xeon with AMX: cpu-lab-small's 32-true
    // QLoRA step at 16 x 104 tokens spent 31 ms in these copies, about 0.6 GB of them.
    cast_bytes += x.t * x.layers * 6 * m.nf4_in_out * (forward_runs + 1);
  }
  if (x.mixed && x.stream == 4) {
    // Autocast's casts of the fp32 residual stream, each t x h values read in one dtype and written
    // in the other (6 B a value): to bf16 for every projection and adapter that reads the stream
    // (q, k, v, gate and up), and back for the two residual adds of a projection's bf16 output;
    // backward casts each one's gradient the other way. The head's input once, outside the layers.
    // 12-06, the Xeon with AMX: cpu-lab-small's bf16-mixed LoRA (q, v) at 16 x 104 tokens cast 67
    // such tensors a step, 10 ms of its 0.19 s, which bf16-true LoRA does not.
    const double casts = x.layers * (m.stream_readers + 2) * (forward_runs + 1) + 2;
    cast_bytes += x.t * x.h * 6 * casts;
  }
  micro_memory += cast_bytes;
  if (UsesSwiGluLinear(config, model)) {
    // FusedSwiGluLinear recomputes the product in backward for down_proj's weight gradient: it
    // reads gate and up and writes the product once more.
    micro_memory += x.t * x.layers * 3 * x.inter * x.projected;
  }
  micro_memory += m.head_memory;
  // The embedding's gather, and with a trained embedding its dense gradient, zeroed and scattered.
  micro_memory += 2 * x.t * x.h * x.stream;
  double state = 0;
  if (x.full) {
    state += x.vocab * x.h * x.param;
    micro_memory += 2 * x.t * x.h * x.stream;
  }
  if (x.mixed) {
    // Autocast casts every fp32 weight to bf16 for its forward (read 4 B, write 2 B), and each
    // trained weight's bf16 gradient back to fp32 (read 2 B, write 4 B).
    const double weights =
        x.layers * (2 * x.h * x.q + 2 * x.h * x.kv + 3 * x.h * x.inter) + x.h * x.vocab;
    state += 6 * weights + 6 * m.trained_weight_values;
  }
  return {.bytes = micro_memory + state,
          .state_bytes = state,
          .cast_bytes = cast_bytes,
          .layers_bytes = layers_bytes};
}

// The step's kernel launches: every micro-batch's, and the optimizer's.
double CountLlamaLaunches(const TrialConfig& config, const ModelConfig& model,
                          const LlamaStepShape& x, int64_t micro_batches) {
  const double forward_runs = x.checkpointing ? 2 : 1;
  const double per_layer = x.kernels == Kernels::kFused ? kFusedLayerLaunches : kAtenLayerLaunches;
  double micro_launches = x.layers * per_layer * (forward_runs + kBackwardPasses);
  micro_launches += UsesChunkedLoss(config)
                        ? kChunkLaunches * std::ceil(x.t / static_cast<double>(kLossChunkTokens))
                        : kLossLaunches;
  const double trainable_tensors = x.full ? x.layers * 9 + (model.tie_word_embeddings ? 2 : 3)
                                          : 2 * x.layers * static_cast<double>(x.targets.size());
  return micro_launches * static_cast<double>(micro_batches) +
         OptimizerLaunches(config, trainable_tensors);
}

}  // namespace

StatusOr<StepWork> EstimateStepWork(const TrialConfig& config, const ModelConfig& model) {
  ASSIGN_OR_RETURN(const ModelStateEstimate state, EstimateModelState(config, model));
  StepWork w;
  const LlamaStepShape shape = DescribeLlamaStep(config, model, state, w);
  const LlamaMatmuls matmuls = CountLlamaMatmuls(shape, model);
  const double micro_batches = static_cast<double>(w.micro_batches);
  w.matmul_flops = matmuls.flops * micro_batches;
  w.attention_flops = matmuls.attention_flops * micro_batches;
  if (w.attention_flops > 0) {
    w.attention_shapes = {{.queries = shape.seq,
                           .keys = shape.seq,
                           .head_width = static_cast<double>(model.head_dim),
                           .flops = w.attention_flops}};
  }
  w.matmul_shapes = matmuls.shapes;
  for (MatmulShape& shape : w.matmul_shapes) shape.flops *= micro_batches;
  const MicroMemory micro_memory = CountLlamaMicroMemory(config, model, shape, matmuls);
  w.memory_bytes = micro_memory.bytes * micro_batches;
  w.state_memory_bytes = micro_memory.state_bytes * micro_batches;
  w.cast_memory_bytes = micro_memory.cast_bytes * micro_batches;
  w.layer_memory_bytes = micro_memory.layers_bytes * micro_batches;
  w.layer_projected_class = shape.projected == 2 ? MatmulClass::kBf16 : MatmulClass::kFp32;
  w.layer_kernels = shape.kernels;
  w.elementwise_tensor_bytes = shape.t * shape.h * shape.stream;  // (B, T, C)
  w.elementwise_class = shape.stream == 2 ? MatmulClass::kBf16 : MatmulClass::kFp32;
  AddLossLogits(config, shape.t * shape.vocab * micro_batches, shape.projected, w);
  if (shape.qlora) {
    // Every NF4 weight for its forward (again under checkpointing) and for its input's gradient.
    const double forward_runs = shape.checkpointing ? 2 : 1;
    AddNf4Dequant(config, shape.layers * matmuls.nf4_values * (forward_runs + 1) * micro_batches,
                  w);
  }
  // The layers' masks each forward (checkpointing's rerun draws them again), the head's once.
  AddDropoutDraws(config,
                  shape.t *
                      (shape.layers * matmuls.adapter_dropout * (shape.checkpointing ? 2 : 1) +
                       matmuls.head_dropout) *
                      micro_batches,
                  w);
  AddOptimizerAndRanks(config, state, w);
  w.launches = CountLlamaLaunches(config, model, shape, w.micro_batches);
  w.model_bytes = static_cast<double>(state.params_bytes);
  w.pretrained = config.settings().model.init == trial::Init::kPretrained;
  return w;
}

void AddOptimizerAndRanks(const TrialConfig& config, const ModelStateEstimate& state, StepWork& w) {
  const TrialSettings& s = config.settings();
  const trial::Precision precision = s.memory.precision;
  const trial::Optimizer optimizer = s.train.optimizer;
  const trial::Offload offload = s.memory.offload;
  const bool cuda = s.device.kind == trial::Device::kCuda;
  const bool sharded = state.fsdp_root_values > 0;
  const bool mixed =
      precision == trial::Precision::kBf16Mixed || precision == trial::Precision::k16Mixed;
  const double param = precision == trial::Precision::kBf16True ? 2 : 4;
  // Gradients, accumulation and the optimizer step, over the trainable values this rank holds.
  const double trainable = static_cast<double>(state.parameters_trainable) /
                           static_cast<double>(sharded ? state.world_size : 1);
  const double grad = param;
  // Every byte this adds to memory_bytes is over the model's state.
  const double before = w.memory_bytes;
  const double later_micro_batches = static_cast<double>(w.micro_batches - 1);
  if (offload == trial::Offload::kOptimizer) {
    // No gradient accumulates on the device: each micro-batch's moves into its fp32 host buffer
    // as backward makes it (trainer/train/offload.cc).
    if (!cuda) {
      // A CPU's host is its device, and this traffic its memory's: the first micro-batch's
      // gradient widened into the buffer (read it, write 4 B), each later one's added (read it
      // and the buffer, write the buffer), then the updated fp32 master weights narrowed back
      // into the parameters. 12-05, Xeon, cpu-lab-large's 31.5 M bf16 values in two
      // micro-batches: 22 B a value, where an on-device accumulation's 3 reads and writes of a
      // gradient had counted 6.
      w.memory_bytes += trainable * ((grad + 4) + later_micro_batches * (grad + 8) + (4 + param));
    }
  } else {
    w.memory_bytes += trainable * 3 * grad * later_micro_batches;
  }
  if (s.train.grad_clip > 0) w.memory_bytes += trainable * 3 * grad;
  const bool host_step = offload != trial::Offload::kNone;
  if (host_step) {
    w.host_optimizer_values = trainable;
    // Gradients to the host, updated weights back (the whole shards with full offload, below).
    if (offload == trial::Offload::kOptimizer) w.host_link_bytes += trainable * (grad + param);
  } else if (optimizer == trial::Optimizer::kAdamw) {
    w.memory_bytes += trainable * 7 * param;  // read p, g, m, v; write p, m, v
  } else if (optimizer == trial::Optimizer::kAdamw8bit) {
    // On CUDA: p, g, and the two 1-byte moments read and written. On the CPU the update is
    // bound by its two nearest-code searches per value, not by memory: its own rate.
    if (cuda) {
      w.memory_bytes += trainable * (3 * param + 4);
    } else {
      w.adamw_8bit_values = trainable;
    }
  } else if (optimizer == trial::Optimizer::kSgd) {
    w.memory_bytes += trainable * (s.train.momentum > 0 ? 5 : 3) * param;
  }

  // --- Between ranks.
  const double share = RingShare(w.world_size);
  double sent = 0;
  if (s.parallel.strategy == trial::Strategy::kDdp) {
    sent = 2 * share * trainable * grad;     // the ring all-reduce of every gradient, once a step
    w.memory_bytes += 2 * trainable * grad;  // copied into the buckets and back
  } else if (sharded) {
    // Each micro-batch gathers every unit for its forward and, resharded, again for its
    // backward, in the forward's dtype; and reduce-scatters the gradients.
    const double unit_values =
        static_cast<double>(state.parameters_total);  // the whole model, every micro-batch
    const double gathered = s.parallel.fsdp_reshard_after_forward ? 2 : 1;
    const double wire = mixed ? 2 : param;
    sent = static_cast<double>(w.micro_batches) * share *
           (gathered * unit_values * wire + static_cast<double>(state.parameters_trainable) * grad);
    if (offload == trial::Offload::kFull) {
      w.host_link_bytes += static_cast<double>(w.micro_batches) *
                           (gathered * unit_values * param + trainable * grad) /
                           static_cast<double>(state.world_size);
    }
  }
  (w.nodes > 1 ? w.network_bytes : w.interconnect_bytes) = sent;
  w.state_memory_bytes += w.memory_bytes - before;
}

double LayerElementwiseBytes(const LayerWidths& widths, double stream, double projected,
                             Kernels kernels, double forward_runs) {
  const LayerPasses& passes = kernels == Kernels::kFused ? kFusedPasses : kAtenPasses;
  const auto& [h, q, kv, inter] = widths;
  double touch = passes.hidden * h * stream + passes.qk * (q + kv) * projected +
                 passes.inter * inter * projected + passes.layout * (2 * q + 2 * kv) * projected;
  if (kv < q) touch += 2 * 2 * q * projected;  // repeat_kv's copies of k and v to every head
  return touch * (forward_runs + kBackwardPasses);
}

double LayerElementwiseLaunches(Kernels kernels, double forward_runs) {
  return (kernels == Kernels::kFused ? kFusedLayerElementwiseLaunches
                                     : kAtenLayerElementwiseLaunches) *
         (forward_runs + kBackwardPasses);
}

std::string_view KernelsName(Kernels k) { return k == Kernels::kFused ? "fused" : "aten"; }

Kernels KernelsNamed(std::string_view name) {
  return name == "fused" ? Kernels::kFused : Kernels::kAten;
}

Kernels LossKernelsOf(const TrialConfig& config) {
  return UsesChunkedLoss(config) && config.settings().memory.kernels == trial::Kernels::kFused
             ? Kernels::kFused
             : Kernels::kAten;
}

double LossBytesPerLogit(bool chunked, double logit_element) {
  return chunked ? kChunkedBytesPerLogit : logit_element + kCeBytesPerLogit;
}

void AddLossLogits(const TrialConfig& config, double logits, double logit_element, StepWork& w) {
  const Kernels kernels = LossKernelsOf(config);
  if (config.settings().device.kind == trial::Device::kCuda) {
    w.memory_bytes += logits * LossBytesPerLogit(UsesChunkedLoss(config), logit_element);
    return;
  }
  w.loss_logits += logits;
  w.loss_kernels = kernels;
  w.loss_class = logit_element == 4 ? MatmulClass::kFp32 : MatmulClass::kBf16;
}

double AdapterBytesPerToken(double in, double out, double element, bool dropout) {
  return AdapterTouch(in, out, element, dropout);
}

void AddNf4Dequant(const TrialConfig& config, double values, StepWork& w) {
  if (config.settings().device.kind == trial::Device::kCuda) {
    w.memory_bytes += values * kNf4CudaBytesPerValue;
  } else {
    w.nf4_dequant_values += values;
  }
}

void AddDropoutDraws(const TrialConfig& config, double values, StepWork& w) {
  if (config.settings().device.kind != trial::Device::kCuda) w.dropout_values += values;
}

double OptimizerLaunches(const TrialConfig& config, double trainable_tensors) {
  return trainable_tensors * (config.settings().device.kind == trial::Device::kCuda
                                  ? kCudaOptimizerLaunches
                                  : kCpuOptimizerLaunches);
}

void SpreadAttentionOverLengths(const std::map<int64_t, int64_t>& micro_batches_by_length,
                                StepWork& w) {
  if (w.attention_shapes.size() != 1 || micro_batches_by_length.empty()) return;
  const AttentionShape counted = w.attention_shapes.front();
  if (counted.queries != counted.keys || !(counted.queries > 0)) return;
  // The lengths by the query block each pads to (PaddedQueries), shortest first: micro-batches and
  // the sum of their squared lengths. At a group's root-mean-square length its attention FLOPs and
  // its padding to the block are exact; only the rate between lengths of one block is not.
  struct LengthGroup {
    double micro_batches = 0;
    double squares = 0;
  };
  std::vector<LengthGroup> groups;
  double micro_batches = 0;
  double block = 0;
  for (const auto& [length, count] : micro_batches_by_length) {
    const double tokens = static_cast<double>(length);
    const double padded = PaddedQueries(tokens);
    if (groups.empty() || padded != block) groups.emplace_back();
    block = padded;
    groups.back().micro_batches += static_cast<double>(count);
    groups.back().squares += static_cast<double>(count) * tokens * tokens;
    micro_batches += static_cast<double>(count);
  }
  // Neighbours pairwise until kMaxSpreadAttentionShapes: their FLOPs stay exact, their padding
  // the merged length's.
  while (groups.size() > kMaxSpreadAttentionShapes) {
    std::vector<LengthGroup> merged;
    for (size_t i = 0; i < groups.size(); i += 2) {
      merged.push_back(groups[i]);
      if (i + 1 == groups.size()) continue;
      merged.back().micro_batches += groups[i + 1].micro_batches;
      merged.back().squares += groups[i + 1].squares;
    }
    groups = std::move(merged);
  }
  w.attention_shapes.clear();
  w.attention_flops = 0;
  for (const LengthGroup& group : groups) {
    const double tokens = std::sqrt(group.squares / group.micro_batches);
    const double flops =
        counted.flops * group.squares / (counted.queries * counted.queries * micro_batches);
    AddAttentionShape(
        w.attention_shapes,
        {.queries = tokens, .keys = tokens, .head_width = counted.head_width, .flops = flops});
    w.attention_flops += flops;
  }
  w.matmul_flops += w.attention_flops - counted.flops;  // attention's are part of them
}

}  // namespace llmctl::estimate
