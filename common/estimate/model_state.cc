#include "common/estimate/model_state.h"

#include <algorithm>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/estimate/weight_tensors.h"
#include "common/flat_layout.h"

namespace llmctl::estimate {
namespace {

// Constants of the trainer's layouts; the header says where each comes from.
constexpr uint64_t kFp32Bytes = 4;
constexpr uint64_t kStepCounterBytes = 4;     // the fp32 step count AdamW's kernels read
constexpr uint64_t kRankSumsBytes = 16;       // dist::RankSums: two float64 slots
constexpr int64_t kNf4Blocksize = 64;         // trainer/quant: absmax per 64 weights
constexpr int64_t kNf4NestedBlocksize = 256;  // double quantisation's absmax blocks
constexpr int64_t kAdamW8bitMinSize = 4096;   // smaller tensors keep fp32 moments
constexpr int64_t kAdamW8bitBlocksize = 256;
constexpr uint64_t kAdamW8bitCodeMapBytes = 2 * 256 * kFp32Bytes;  // signed and unsigned maps
// Far beyond any real model, and small enough that no byte count below can overflow 64 bits.
constexpr uint64_t kMaxParameters = uint64_t{1} << 50;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// "model.layers.<i>.…" -> i; -1 for the root's tensors (fsdp.cc's rule).
int64_t LayerOf(std::string_view name) {
  constexpr std::string_view kPrefix = "model.layers.";
  if (!name.starts_with(kPrefix)) return -1;
  name.remove_prefix(kPrefix.size());
  return std::stoll(std::string(name.substr(0, name.find('.'))));
}

// The projection a weight belongs to ("q_proj" for "model.layers.0.self_attn.q_proj.weight"), or ""
// for weights that are not projections (embeddings, norms, biases).
std::string_view ProjectionOf(std::string_view name) {
  if (!name.ends_with(".weight")) return {};
  name.remove_suffix(std::string_view(".weight").size());
  const std::string_view last = name.substr(name.rfind('.') + 1);
  return std::find(kLoraTargets.begin(), kLoraTargets.end(), last) != kLoraTargets.end()
             ? last
             : std::string_view();
}

// The model's weights and adapters as the trainer builds them (BuildModel, then ApplyLora).
std::vector<WeightTensor> WeightTensors(const TrialConfig& config, const ModelConfig& model) {
  const PeftSettings& peft = config.settings().peft;
  const bool adapters = peft.method != trial::PeftMethod::kNone;
  const std::vector<std::string> targets = adapters ? peft.targets : std::vector<std::string>{};
  const int64_t r = peft.r;
  auto targeted = [&](std::string_view projection) {
    return std::find(targets.begin(), targets.end(), projection) != targets.end();
  };
  std::vector<WeightTensor> tensors;
  auto add_adapter = [&](const std::vector<int64_t>& shape, int64_t unit) {
    // lora_A (r, in) and lora_B (out, r) of a weight (out, in).
    tensors.push_back({r * shape[1], unit, true, false});
    tensors.push_back({shape[0] * r, unit, true, false});
  };
  for (const CheckpointTensor& t : CheckpointTensors(model)) {
    const int64_t unit = LayerOf(t.name);
    const std::string_view projection = ProjectionOf(t.name);
    // QLoRA quantises the decoder layers' projections, not the output head.
    const bool nf4 = peft.method == trial::PeftMethod::kQlora && unit >= 0 && !projection.empty();
    tensors.push_back({Numel(t.shape), unit, !adapters, nf4});
    if (!projection.empty() && targeted(projection)) add_adapter(t.shape, unit);
  }
  // A tied output head is the embedding matrix, which CheckpointTensors lists once; an lm_head
  // adapter still gets its own A and B.
  if (model.tie_word_embeddings && targeted("lm_head")) {
    add_adapter({model.vocab_size, model.hidden_size}, -1);
  }
  return tensors;
}

// The optimizer's state for the trainable tensors made of `pieces` (a whole parameter each, or an
// fsdp shard's pieces of parameters), in `element` bytes.
void AddOptimizerState(const TrialConfig& config, const std::vector<ShardPiece>& pieces,
                       uint64_t element, ModelStateEstimate& estimate) {
  // The elementwise optimizers keep state for every element of their tensors, padding included.
  uint64_t values = 0;
  for (const ShardPiece& piece : pieces) values += static_cast<uint64_t>(piece.length);
  const TrialSettings& s = config.settings();
  const trial::Optimizer optimizer = s.train.optimizer;
  if (s.memory.offload == trial::Offload::kOptimizer) {
    // fp32 master weights, exp_avg, exp_avg_sq and gradient buffer, all on the host.
    estimate.optim_host_bytes = 4 * kFp32Bytes * values + kStepCounterBytes;
  } else if (optimizer == trial::Optimizer::kAdamw) {
    estimate.optim_device_bytes = 2 * element * values + kStepCounterBytes;
  } else if (optimizer == trial::Optimizer::kSgd) {
    if (s.train.momentum != 0.0) estimate.optim_device_bytes = element * values;
  } else if (optimizer == trial::Optimizer::kAdamw8bit) {
    // Per piece, by its whole parameter's size (padding has no state).
    uint64_t bytes = kStepCounterBytes + kAdamW8bitCodeMapBytes;
    for (const ShardPiece& piece : pieces) {
      if (piece.tensor < 0) continue;
      const uint64_t count = static_cast<uint64_t>(piece.length);
      bytes +=
          piece.tensor_numel >= kAdamW8bitMinSize
              ? 2 * count + 2 * kFp32Bytes *
                                static_cast<uint64_t>(CeilDiv(piece.length, kAdamW8bitBlocksize))
              : 2 * kFp32Bytes * count;
    }
    estimate.optim_device_bytes = bytes;
  }
}

// Gradients held after the optimizer step: none when each is consumed as backward produces it.
bool HoldsGradients(const TrialConfig& config) {
  const MemorySettings& memory = config.settings().memory;
  return !memory.optimizer_in_backward && memory.offload != trial::Offload::kOptimizer;
}

// What a unit's flat parameter holds: its trainable parameters (aligned to the optimizer's state
// blocks), its frozen ones (LoRA's base weights), and its buffers one per dtype (QLoRA's NF4 codes
// with the quantised block scales in uint8; the nested scales and the offset, or the plain
// scales, in fp32).
enum FlatKind { kFrozen, kTrainable, kBytes, kFloats };
// The numels of each unit's flats (the root, -1, first), in order.
using FlatTensors = std::map<std::pair<int64_t, FlatKind>, std::vector<int64_t>>;

// The flat parameters as fsdp.cc lays them out.
FlatTensors GroupFlatTensors(const std::vector<WeightTensor>& tensors, bool double_quant) {
  FlatTensors flat_tensors;
  for (const WeightTensor& t : tensors) {
    if (!t.nf4) {
      flat_tensors[{t.unit, t.trainable ? kTrainable : kFrozen}].push_back(t.numel);
      continue;
    }
    const int64_t blocks = CeilDiv(t.numel, kNf4Blocksize);
    flat_tensors[{t.unit, kBytes}].push_back(CeilDiv(t.numel, 2) + (double_quant ? blocks : 0));
    flat_tensors[{t.unit, kFloats}].push_back(
        double_quant ? CeilDiv(blocks, kNf4NestedBlocksize) + 1 : blocks);
  }
  return flat_tensors;
}

// What the ranks gather: the root's values and buffers, and the largest layer's.
void AddGatheredUnits(const std::map<int64_t, int64_t>& unit_values,
                      const std::map<int64_t, int64_t>& unit_buffer_bytes,
                      ModelStateEstimate& estimate) {
  for (const auto& [unit, values] : unit_values) {
    const auto buffers = unit_buffer_bytes.find(unit);
    const int64_t buffer_bytes = buffers == unit_buffer_bytes.end() ? 0 : buffers->second;
    if (unit < 0) {
      estimate.fsdp_root_values = values;
      estimate.fsdp_root_buffer_bytes = buffer_bytes;
    } else if (values > estimate.fsdp_layer_values) {
      estimate.fsdp_layer_values = values;
      estimate.fsdp_layer_buffer_bytes = buffer_bytes;
    }
  }
}

void EstimateSharded(const TrialConfig& config, const std::vector<WeightTensor>& tensors,
                     uint64_t element, int64_t rank, ModelStateEstimate& estimate) {
  const TrialSettings& s = config.settings();
  const FlatTensors flat_tensors = GroupFlatTensors(tensors, s.peft.double_quant);
  const int64_t n = estimate.world_size;
  const int64_t alignment = ShardAlignment(Name(s.train.optimizer));
  std::map<int64_t, int64_t> unit_values;  // the parameters a unit gathers (in the compute dtype)
  std::map<int64_t, int64_t> unit_buffer_bytes;  // the buffers it gathers (in their own)
  int64_t max_padded = 0;                        // the longest trainable flat: the gradient buffer
  // The optimizer's tensors, the trainable flats' shards, as the pieces of parameters each rank's
  // holds (the ranks' differ only in which pieces, where a piece's state depends on its parameter).
  std::vector<std::vector<ShardPiece>> rank_pieces(static_cast<size_t>(n));
  for (const auto& [flat, numels] : flat_tensors) {
    const auto [unit, kind] = flat;
    const FlatLayout layout = LayOutFlat(numels, n, kind == kTrainable ? alignment : 1);
    const uint64_t size = kind == kBytes ? 1 : kind == kFloats ? kFp32Bytes : element;
    estimate.params_bytes += size * static_cast<uint64_t>(layout.shard());
    if (kind == kBytes || kind == kFloats) {
      unit_buffer_bytes[unit] += static_cast<int64_t>(size) * layout.padded;
      continue;
    }
    unit_values[unit] += layout.padded;
    if (kind != kTrainable) continue;
    max_padded = std::max(max_padded, layout.padded);
    for (int64_t r = 0; r < n; ++r) {
      const std::vector<ShardPiece> pieces = ShardPieces(layout, numels, r);
      rank_pieces[static_cast<size_t>(r)].insert(rank_pieces[static_cast<size_t>(r)].end(),
                                                 pieces.begin(), pieces.end());
    }
    estimate.grads_bytes += element * static_cast<uint64_t>(layout.shard());
  }
  AddGatheredUnits(unit_values, unit_buffer_bytes, estimate);
  // `rank`'s state, or the largest any rank holds.
  for (int64_t r = 0; r < n; ++r) {
    if (rank >= 0 && r != rank) continue;
    ModelStateEstimate state;
    AddOptimizerState(config, rank_pieces[static_cast<size_t>(r)], element, state);
    estimate.optim_device_bytes = std::max(estimate.optim_device_bytes, state.optim_device_bytes);
  }
  if (s.memory.offload == trial::Offload::kFull) {
    // ZeRO-3 offload: the shards, their gradients and the optimizer's state live on the host.
    estimate.optim_host_bytes =
        estimate.params_bytes + estimate.grads_bytes + estimate.optim_device_bytes;
    estimate.params_bytes = 0;
    estimate.grads_bytes = 0;
    estimate.optim_device_bytes = 0;
  }
  estimate.comm_bytes = element * static_cast<uint64_t>(max_padded) + kRankSumsBytes;
  // NCCL's reduce-scatter writes into its own shard-size buffer; Gloo's path reduces in place.
  if (s.device.kind == trial::Device::kCuda) {
    estimate.comm_bytes += element * static_cast<uint64_t>(max_padded / n);
  }
}

}  // namespace

uint64_t Nf4Bytes(int64_t n, bool double_quant) {
  const int64_t blocks = CeilDiv(n, kNf4Blocksize);
  const uint64_t packed = static_cast<uint64_t>(CeilDiv(n, 2));
  if (!double_quant) return packed + kFp32Bytes * static_cast<uint64_t>(blocks);
  return packed + static_cast<uint64_t>(blocks) +
         kFp32Bytes * static_cast<uint64_t>(CeilDiv(blocks, kNf4NestedBlocksize)) + kFp32Bytes;
}

uint64_t ParamBytes(trial::Precision precision) {
  return precision == trial::Precision::kBf16True
             ? 2
             : kFp32Bytes;  // the mixed modes keep fp32 parameters
}

ModelStateEstimate EstimateStateOfTensors(const TrialConfig& config,
                                          const std::vector<WeightTensor>& tensors, int64_t rank) {
  ModelStateEstimate estimate;
  const TrialSettings& s = config.settings();
  const trial::Strategy strategy = s.parallel.strategy;
  estimate.world_size = DataParallelRanks(config);
  const uint64_t element = ParamBytes(s.memory.precision);
  for (const WeightTensor& t : tensors) {
    estimate.parameters_total += t.numel;
    if (t.trainable) estimate.parameters_trainable += t.numel;
  }

  // A single rank of fsdp is one process holding the whole model, as llm-train runs it.
  if (strategy == trial::Strategy::kFsdp && estimate.world_size > 1) {
    EstimateSharded(config, tensors, element, rank, estimate);
    return estimate;
  }
  const bool double_quant = s.peft.double_quant;
  std::vector<ShardPiece> trainable;  // each a whole parameter
  for (const WeightTensor& t : tensors) {
    estimate.params_bytes +=
        t.nf4 ? Nf4Bytes(t.numel, double_quant) : element * static_cast<uint64_t>(t.numel);
    if (t.trainable) {
      trainable.push_back({.length = t.numel,
                           .tensor = static_cast<int64_t>(trainable.size()),
                           .tensor_numel = t.numel,
                           .tensor_offset = 0});
    }
  }
  const uint64_t trainable_bytes = element * static_cast<uint64_t>(estimate.parameters_trainable);
  if (HoldsGradients(config)) estimate.grads_bytes = trainable_bytes;
  AddOptimizerState(config, trainable, element, estimate);
  if (strategy == trial::Strategy::kDdp && estimate.world_size > 1) {
    estimate.comm_bytes = trainable_bytes + kRankSumsBytes;
  }
  return estimate;
}

StatusOr<ModelStateEstimate> EstimateModelState(const TrialConfig& config, const ModelConfig& model,
                                                int64_t rank) {
  RETURN_IF_ERROR(ValidateModelConfig(model));
  if (ParameterCount(model) > kMaxParameters) {
    return InvalidArgumentError("model: " + std::to_string(ParameterCount(model)) +
                                " parameters is too many to estimate");
  }
  RETURN_IF_ERROR(ValidateTrialConfig(config, &model));
  return EstimateStateOfTensors(config, WeightTensors(config, model), rank);
}

}  // namespace llmctl::estimate
