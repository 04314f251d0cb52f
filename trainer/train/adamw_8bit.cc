#include "trainer/train/adamw_8bit.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "common/flat_layout.h"
#include "trainer/quant/quant.h"
#include "trainer/quant/quant_cpu.h"

namespace llmctl::trainer {
namespace {

// fsdp aligns the shards' pieces to this optimizer's state blocks (common/flat_layout.h).
static_assert(ShardAlignment("adamw_8bit") == kAdamW8bitBlocksize);

// One parameter's moments: 8-bit codes with absmax, or fp32 for small tensors.
struct Moments {
  bool eight_bit = false;
  Blockwise8bit m;  // codes uint8 (n), absmax fp32 (ceil(n / 256)); 8-bit only
  Blockwise8bit v;
  torch::Tensor exp_avg;  // fp32 (n); small tensors only
  torch::Tensor exp_avg_sq;
};

// The update's scalars in fp32, each rounded from double as ATen rounds a Scalar applied to an fp32
// tensor.
struct UpdateScalars {
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float step_size;  // -lr c2 / c1
  float eps;        // c2 eps
  bool decays;
  float decay;  // 1 - lr wd
};

// One moment's 8-bit state as raw CPU buffers.
struct EightBitBuffers {
  uint8_t* codes;
  float* absmax;
  const float* map;
  const quant_cpu::NearestCode<256>* nearest;
};

// Requantises one block of new moment values into `state` at block `b`.
void StoreBlock(const float* values, int64_t b, int64_t len, const EightBitBuffers& state) {
  uint8_t* out = state.codes + b * kAdamW8bitBlocksize;
  state.absmax[b] =
      quant_cpu::QuantizeBlock(values, len, len == kAdamW8bitBlocksize, *state.nearest,
                               [out](int64_t i, uint8_t code) { out[i] = code; });
}

// The 8-bit update of a CPU parameter in one pass, in parallel over state blocks, allocating
// nothing: per block, the old moments are dequantised, updated in fp32 in the order adamw_8bit.h
// documents, buffered on the stack (the new absmax is needed before the codes) and requantised.
// std::fma stands where ATen's AVX2 and AVX-512 kernels fuse the scaled term into the sum
// (add(alpha), addcmul); the file is built with -ffp-contract=off so the compiler fuses nothing
// else. Every operation is a correctly rounded IEEE-754 one and blocks are independent, so given
// the same fp32 scalars (from the C library's pow) the results are the same bits on every CPU and
// thread count. The ATen path's are not (its kernels differ by CPU, and its sqrt is not correctly
// rounded, up to 0.75 ulp off): the two agree within the bounds adamw_8bit_test.cc derives.
template <typename T>
void UpdateBlocksCpu(T* p, const T* g, int64_t n, const EightBitBuffers& m,
                     const EightBitBuffers& v, const UpdateScalars& s) {
  const int64_t blocks = (n + kAdamW8bitBlocksize - 1) / kAdamW8bitBlocksize;
  at::parallel_for(0, blocks, /*grain_size=*/16, [&](int64_t begin, int64_t end) {
    std::array<float, kAdamW8bitBlocksize> m_new;
    std::array<float, kAdamW8bitBlocksize> v_new;
    for (int64_t b = begin; b < end; ++b) {
      const int64_t start = b * kAdamW8bitBlocksize;
      const int64_t len = std::min(kAdamW8bitBlocksize, n - start);
      const float m_scale = m.absmax[b];
      const float v_scale = v.absmax[b];
      for (int64_t i = 0; i < len; ++i) {
        const int64_t j = start + i;
        const float m_old = m.map[m.codes[j]] * m_scale;
        const float v_old = v.map[v.codes[j]] * v_scale;
        const float grad = static_cast<float>(g[j]);
        if (!std::isfinite(grad)) {
          m_new[i] = m_old;
          v_new[i] = v_old;
          continue;
        }
        m_new[i] = std::fma(grad, s.one_minus_beta1, m_old * s.beta1);
        v_new[i] = std::fma(s.one_minus_beta2 * grad, grad, v_old * s.beta2);
        float updated =
            static_cast<float>(p[j]) + s.step_size * m_new[i] / (std::sqrt(v_new[i]) + s.eps);
        if (s.decays) updated = updated * s.decay;
        p[j] = static_cast<T>(updated);
      }
      StoreBlock(m_new.data(), b, len, m);
      StoreBlock(v_new.data(), b, len, v);
    }
  });
}

// The state of one piece of a parameter tensor: the whole parameter, or a piece of one that an fsdp
// shard holds (common/flat_layout.h).
struct Piece {
  int64_t start = 0;  // its first element in the optimizer's (flat) tensor
  int64_t length = 0;
  bool eight_bit = false;  // whether the whole parameter has 8-bit state
  Moments moments;
};

class AdamW8bit final : public Optimizer {
 public:
  AdamW8bit(const OptimizerOptions& options, std::vector<torch::Tensor> params,
            std::vector<std::vector<Piece>> pieces, AdamW8bitImpl impl, int64_t aten_chunk)
      : options_(options),
        params_(std::move(params)),
        pieces_(std::move(pieces)),
        impl_(impl),
        aten_chunk_(aten_chunk) {}

  void Step(double lr) override {
    BeginStep(lr);
    for (size_t i = 0; i < params_.size(); ++i) StepParameter(i);
  }

  void BeginStep(double lr) override {
    torch::NoGradGuard no_grad;
    Materialize();
    step_.add_(1.0);
    ++steps_taken_;
    const double t = static_cast<double>(steps_taken_);
    lr_ = lr;
    c1_ = 1.0 - std::pow(options_.beta1, t);
    c2_ = std::sqrt(1.0 - std::pow(options_.beta2, t));
  }

  void StepParameter(size_t index) override {
    torch::NoGradGuard no_grad;
    torch::Tensor& p = params_[index];
    if (!p.grad().defined()) return;
    const torch::Tensor flat = p.detach().view(-1);
    const torch::Tensor grad_flat = p.grad().reshape(-1);
    for (Piece& piece : pieces_[index]) {
      torch::Tensor values = flat.narrow(0, piece.start, piece.length);
      Update(values, grad_flat.narrow(0, piece.start, piece.length), piece, lr_, c1_, c2_);
    }
  }

  std::vector<torch::Tensor> StateTensors() const override {
    std::vector<torch::Tensor> state;
    if (!materialized_) return state;
    for (const std::vector<Piece>& pieces : pieces_) {
      for (const Piece& piece : pieces) {
        for (auto& [field, tensor] : Fields(piece)) state.push_back(tensor);
      }
    }
    state.insert(state.end(), {step_, signed_map_, unsigned_map_});
    return state;
  }

  // bitsandbytes' names: state1/absmax1 for m, state2/absmax2 for v; "<param>.<field>" for a whole
  // parameter, "<param>.<piece>.<field>" for the pieces of an fsdp shard.
  std::vector<std::pair<std::string, torch::Tensor>> NamedState() const override {
    std::vector<std::pair<std::string, torch::Tensor>> named;
    if (!materialized_) return named;
    for (size_t i = 0; i < pieces_.size(); ++i) {
      for (size_t k = 0; k < pieces_[i].size(); ++k) {
        for (auto& [field, tensor] : Fields(pieces_[i][k])) {
          named.emplace_back(PieceName(i, k) + field, tensor);
        }
      }
    }
    named.emplace_back("step", step_);
    return named;
  }

  Status LoadNamedState(const std::vector<std::pair<std::string, torch::Tensor>>& state) override {
    std::map<std::string, torch::Tensor> by_name(state.begin(), state.end());
    if (by_name.empty()) return Status::Ok();
    Materialize();
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < pieces_.size(); ++i) {
      for (size_t k = 0; k < pieces_[i].size(); ++k) {
        for (auto& [field, target] : Fields(pieces_[i][k])) {
          RETURN_IF_ERROR(CopyNamedState(by_name, PieceName(i, k) + field, target));
        }
      }
    }
    ASSIGN_OR_RETURN(steps_taken_, LoadStepCounter(by_name, step_));
    return Status::Ok();
  }

  int64_t steps_taken() const override { return steps_taken_; }

 private:
  std::string PieceName(size_t param, size_t piece) const {
    return pieces_[param].size() == 1 ? std::to_string(param)
                                      : std::to_string(param) + "." + std::to_string(piece);
  }

  // Handles to the live tensors (copy_ into one writes the state).
  static std::vector<std::pair<std::string, torch::Tensor>> Fields(const Piece& piece) {
    const Moments& s = piece.moments;
    if (piece.eight_bit) {
      return {{".state1", s.m.codes},
              {".absmax1", s.m.absmax},
              {".state2", s.v.codes},
              {".absmax2", s.v.absmax}};
    }
    return {{".state1", s.exp_avg}, {".state2", s.exp_avg_sq}};
  }

  // Zero moments, as bitsandbytes starts them: code 0 with absmax 0 dequantises to 0.
  void Materialize() {
    if (materialized_) return;
    materialized_ = true;
    const torch::Device device = params_.front().device();
    signed_map_ = DynamicMap(/*is_signed=*/true).to(device);
    unsigned_map_ = DynamicMap(/*is_signed=*/false).to(device);
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
    const auto u8 = torch::TensorOptions().dtype(torch::kUInt8).device(device);
    for (std::vector<Piece>& pieces : pieces_) {
      for (Piece& piece : pieces) {
        const int64_t n = piece.length;
        Moments& s = piece.moments;
        if (piece.eight_bit) {
          const int64_t blocks = (n + kAdamW8bitBlocksize - 1) / kAdamW8bitBlocksize;
          s.m = {torch::zeros({n}, u8), torch::zeros({blocks}, f32), kAdamW8bitBlocksize};
          s.v = {torch::zeros({n}, u8), torch::zeros({blocks}, f32), kAdamW8bitBlocksize};
        } else {
          s.exp_avg = torch::zeros({n}, f32);
          s.exp_avg_sq = torch::zeros({n}, f32);
        }
      }
    }
    step_ = torch::zeros({}, f32);
  }

  // `p` and `grad` are the piece's elements (flat views of the parameter and its gradient).
  void Update(torch::Tensor& p, const torch::Tensor& grad, Piece& piece, double lr, double c1,
              double c2) {
    Moments& s = piece.moments;
    if (impl_ == AdamW8bitImpl::kDefault && piece.eight_bit && p.is_cpu() &&
        grad.scalar_type() == p.scalar_type()) {
      UpdateCpu(p, grad.contiguous(), s, lr, c1, c2);
    } else if (piece.eight_bit) {
      // Whole state blocks at a time: slices of the parameter, gradient, codes and absmax are
      // views, so each chunk's update writes the live tensors.
      const int64_t n = p.numel();
      for (int64_t start = 0; start < n; start += aten_chunk_) {
        const int64_t end = std::min(n, start + aten_chunk_);
        const int64_t block_begin = start / kAdamW8bitBlocksize;
        const int64_t block_end = (end + kAdamW8bitBlocksize - 1) / kAdamW8bitBlocksize;
        Blockwise8bit m{s.m.codes.slice(0, start, end), s.m.absmax.slice(0, block_begin, block_end),
                        kAdamW8bitBlocksize};
        Blockwise8bit v{s.v.codes.slice(0, start, end), s.v.absmax.slice(0, block_begin, block_end),
                        kAdamW8bitBlocksize};
        UpdateAten(p.slice(0, start, end), grad.slice(0, start, end), m, v, lr, c1, c2);
      }
    } else {
      UpdateAten(p, grad, s.exp_avg, s.exp_avg_sq, lr, c1, c2);
    }
  }

  void UpdateCpu(torch::Tensor& p, const torch::Tensor& grad, Moments& s, double lr, double c1,
                 double c2) {
    const UpdateScalars scalars{
        static_cast<float>(options_.beta1), static_cast<float>(1.0 - options_.beta1),
        static_cast<float>(options_.beta2), static_cast<float>(1.0 - options_.beta2),
        static_cast<float>(-lr * c2 / c1),  static_cast<float>(c2 * options_.eps),
        options_.weight_decay > 0.0,        static_cast<float>(1.0 - lr * options_.weight_decay)};
    const EightBitBuffers m{s.m.codes.data_ptr<uint8_t>(), s.m.absmax.data_ptr<float>(),
                            signed_map_.data_ptr<float>(),
                            &quant_cpu::DynamicMapNearest(/*is_signed=*/true)};
    const EightBitBuffers v{s.v.codes.data_ptr<uint8_t>(), s.v.absmax.data_ptr<float>(),
                            unsigned_map_.data_ptr<float>(),
                            &quant_cpu::DynamicMapNearest(/*is_signed=*/false)};
    AT_DISPATCH_FLOATING_TYPES_AND2(
        torch::kBFloat16, torch::kHalf, p.scalar_type(), "AdamW8bitUpdate", [&] {
          UpdateBlocksCpu(p.data_ptr<scalar_t>(), grad.data_ptr<scalar_t>(), p.numel(), m, v,
                          scalars);
        });
  }

  // Device-generic: every tensor, whatever its device or dtype. `p` and `grad` are flat (n); the
  // moments are 8-bit state of the same n elements (an 8-bit parameter's chunk).
  void UpdateAten(torch::Tensor p, const torch::Tensor& grad, Blockwise8bit& m_state,
                  Blockwise8bit& v_state, double lr, double c1, double c2) {
    auto [m, v] = UpdateAtenMoments(p, grad, DequantizeBlockwise8bit(m_state, signed_map_),
                                    DequantizeBlockwise8bit(v_state, unsigned_map_), lr, c1, c2);
    Store(m_state, QuantizeBlockwise8bit(m, signed_map_, kAdamW8bitBlocksize));
    Store(v_state, QuantizeBlockwise8bit(v, unsigned_map_, kAdamW8bitBlocksize));
  }
  // The small tensors' fp32 moments.
  void UpdateAten(torch::Tensor p, const torch::Tensor& grad, torch::Tensor& exp_avg,
                  torch::Tensor& exp_avg_sq, double lr, double c1, double c2) {
    auto [m, v] = UpdateAtenMoments(p, grad, exp_avg, exp_avg_sq, lr, c1, c2);
    exp_avg.copy_(m);
    exp_avg_sq.copy_(v);
  }

  // Updates `p` (flat) in place and returns the new moments (fp32, flat).
  std::pair<torch::Tensor, torch::Tensor> UpdateAtenMoments(torch::Tensor p,
                                                            const torch::Tensor& grad,
                                                            const torch::Tensor& m_old,
                                                            const torch::Tensor& v_old, double lr,
                                                            double c1, double c2) {
    const torch::Tensor g = grad.to(torch::kFloat32);  // (n)
    // Elementwise skip without a host sync: non-finite elements keep their old values below.
    const torch::Tensor finite = g.isfinite();
    // The same fp32 ATen ops as bitsandbytes' CPU update, so on a CPU that gets the same ATen
    // kernels the requantised codes match it bit for bit.
    torch::Tensor m =
        torch::where(finite, m_old.mul(options_.beta1).add_(g, 1.0 - options_.beta1), m_old);
    torch::Tensor v =
        torch::where(finite, v_old.mul(options_.beta2).addcmul_(g, g, 1.0 - options_.beta2), v_old);

    const torch::Tensor p32 = p.to(torch::kFloat32);
    torch::Tensor updated = p32.addcdiv(m, v.sqrt().add_(c2 * options_.eps), -lr * c2 / c1);
    if (options_.weight_decay > 0.0) updated.mul_(1.0 - lr * options_.weight_decay);
    p.copy_(torch::where(finite, updated, p32));
    return {std::move(m), std::move(v)};
  }

  // Into the existing tensors, so state handed out by StateTensors() stays the live state.
  static void Store(Blockwise8bit& state, const Blockwise8bit& q) {
    state.codes.copy_(q.codes);
    state.absmax.copy_(q.absmax);
  }

  OptimizerOptions options_;
  std::vector<torch::Tensor> params_;
  std::vector<std::vector<Piece>> pieces_;  // per parameter, its pieces (padding left out)
  AdamW8bitImpl impl_;
  int64_t aten_chunk_;
  bool materialized_ = false;
  torch::Tensor signed_map_;
  torch::Tensor unsigned_map_;
  torch::Tensor step_;
  int64_t steps_taken_ = 0;
  // The current step's learning rate and bias corrections (1 - beta1^t, sqrt(1 - beta2^t)).
  double lr_ = 0.0;
  double c1_ = 1.0;
  double c2_ = 1.0;
};

}  // namespace

StatusOr<std::unique_ptr<Optimizer>> MakeAdamW8bit(
    const OptimizerOptions& options, std::vector<torch::Tensor> params, AdamW8bitImpl impl,
    int64_t aten_chunk, const std::vector<std::vector<ShardPiece>>& layouts) {
  if (!layouts.empty() && layouts.size() != params.size()) {
    return InternalError("adamw_8bit: " + std::to_string(layouts.size()) + " layouts for " +
                         std::to_string(params.size()) + " tensors");
  }
  std::vector<std::vector<Piece>> pieces(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].numel();
    if (layouts.empty()) {
      pieces[i].push_back(
          {.start = 0, .length = n, .eight_bit = n >= kAdamW8bitMinSize, .moments = {}});
      continue;
    }
    int64_t start = 0;
    for (const ShardPiece& shard_piece : layouts[i]) {
      const bool eight_bit = shard_piece.tensor_numel >= kAdamW8bitMinSize;
      // Blocks counted from the piece's start are the whole parameter's blocks only when the
      // piece starts on one (fsdp aligns its flats to kAdamW8bitBlocksize for this optimizer).
      if (eight_bit && shard_piece.tensor_offset % kAdamW8bitBlocksize != 0) {
        return InternalError("adamw_8bit: a shard piece starts at element " +
                             std::to_string(shard_piece.tensor_offset) +
                             " of its parameter, not on a state block");
      }
      if (shard_piece.tensor >= 0) {
        pieces[i].push_back(
            {.start = start, .length = shard_piece.length, .eight_bit = eight_bit, .moments = {}});
      }
      start += shard_piece.length;
    }
    if (start != n) {
      return InternalError("adamw_8bit: the layout covers " + std::to_string(start) + " of " +
                           std::to_string(n) + " elements");
    }
  }
  return std::unique_ptr<Optimizer>(
      new AdamW8bit(options, std::move(params), std::move(pieces), impl, aten_chunk));
}

}  // namespace llmctl::trainer
