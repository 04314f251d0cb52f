#include "trainer/train/adamw_8bit.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/flat_layout.h"
#include "trainer/memory/counting_allocator.h"
#include "trainer/model/weights.h"
#include "trainer/quant/quant.h"
#include "trainer/quant/quant_cpu.h"
#include "common/safetensors/safetensors.h"
#include "trainer/testing/trial_runner.h"
#include "trainer/train/optimizer.h"

namespace llmctl::trainer {
namespace {

// tests/fixtures/quant/<name>, written by scripts/fixtures/make_bnb_fixtures.py from bitsandbytes
// 0.50.2.
std::map<std::string, torch::Tensor> LoadFixture(const std::string& name) {
  return testing::LoadTensorFixture("quant/" + name);
}

std::unique_ptr<Optimizer> Make(OptimizerOptions options, std::vector<torch::Tensor> params) {
  options.name = "adamw_8bit";
  auto optimizer = MakeOptimizer(options, std::move(params));
  EXPECT_TRUE(optimizer.ok()) << optimizer.status().ToString();
  return std::move(*optimizer);
}

std::map<std::string, torch::Tensor> StateByName(const Optimizer& optimizer) {
  auto named = optimizer.NamedState();
  return {named.begin(), named.end()};
}

// fp32's unit roundoff: the largest relative error of one correctly rounded operation.
constexpr double kUnitRoundoff = 0x1p-24;

// Elements whose bits differ (so -0 differs from 0) between two tensors of one dtype and numel.
int64_t BitsDiffer(const torch::Tensor& a, const torch::Tensor& b) {
  const auto bits = [](const torch::Tensor& t) {
    const torch::Tensor flat = t.reshape(-1).contiguous();
    switch (t.element_size()) {
      case 4:
        return flat.view(torch::kInt32);
      case 2:
        return flat.view(torch::kInt16);
      default:
        return flat;
    }
  };
  return bits(a).ne(bits(b)).sum().item<int64_t>();
}

// fsdp's shards (common/flat_layout.h, aligned to the state blocks): each rank's optimizer keeps
// state for its pieces of the parameters, by each whole parameter's size, and the parameters come
// out bit for bit as one optimizer over the whole parameters leaves them (the fused CPU update is
// per element and per block). The parameters' sizes are not multiples of a block, and the 300-value
// one keeps fp32 state though its pieces are all small.
TEST(AdamW8bitTest, StateOverShardPiecesIsTheWholeParametersCutAtBlocks) {
  const std::vector<int64_t> numels = {7000, 300, 5000};
  constexpr int64_t kRanks = 2;
  const FlatLayout layout = LayOutFlat(numels, kRanks, ShardAlignment("adamw_8bit"));
  torch::manual_seed(11);
  std::vector<torch::Tensor> whole;
  torch::Tensor flat = torch::zeros({layout.padded});
  for (size_t i = 0; i < numels.size(); ++i) {
    whole.push_back(torch::randn({numels[i]}).requires_grad_(true));
    flat.narrow(0, layout.offsets[i], numels[i]).copy_(whole.back().detach());
  }
  std::vector<torch::Tensor> shards;
  std::vector<std::unique_ptr<Optimizer>> rank_optimizers;
  OptimizerOptions options;
  options.name = "adamw_8bit";
  options.weight_decay = 0.01;
  for (int64_t r = 0; r < kRanks; ++r) {
    shards.push_back(
        flat.narrow(0, r * layout.shard(), layout.shard()).clone().requires_grad_(true));
    auto optimizer = MakeOptimizer(options, {shards.back()}, {ShardPieces(layout, numels, r)});
    ASSERT_TRUE(optimizer.ok()) << optimizer.status().ToString();
    rank_optimizers.push_back(std::move(*optimizer));
  }
  auto one = MakeOptimizer(options, whole);
  ASSERT_TRUE(one.ok());
  for (int step = 0; step < 3; ++step) {
    torch::Tensor flat_grad = torch::zeros({layout.padded});
    for (size_t i = 0; i < numels.size(); ++i) {
      whole[i].mutable_grad() = torch::randn({numels[i]});
      flat_grad.narrow(0, layout.offsets[i], numels[i]).copy_(whole[i].grad());
    }
    (*one)->Step(1e-2);
    for (int64_t r = 0; r < kRanks; ++r) {
      shards[r].mutable_grad() = flat_grad.narrow(0, r * layout.shard(), layout.shard()).clone();
      rank_optimizers[r]->Step(1e-2);
    }
  }
  const torch::Tensor stepped = torch::cat({shards[0].detach(), shards[1].detach()});
  for (size_t i = 0; i < numels.size(); ++i) {
    EXPECT_EQ(BitsDiffer(stepped.narrow(0, layout.offsets[i], numels[i]), whole[i].detach()), 0)
        << "parameter " << i;
  }
  // The 8-bit state the ranks hold is the whole parameters': codes for 2 × 12,000 values, 2 fp32
  // absmax per block of each piece (the pieces are whole blocks but for each parameter's last),
  // and fp32 moments for the small one.
  int64_t codes = 0;
  int64_t fp32_moments = 0;
  for (const auto& optimizer : rank_optimizers) {
    for (const auto& [name, tensor] : optimizer->NamedState()) {
      if (tensor.scalar_type() == torch::kUInt8) codes += tensor.numel();
      if (name.ends_with(".state1") && tensor.scalar_type() == torch::kFloat32) {
        fp32_moments += tensor.numel();
      }
    }
  }
  EXPECT_EQ(codes, 2 * (7000 + 5000));
  EXPECT_EQ(fp32_moments, 300);
}

// A piece of an 8-bit parameter that does not start on one of its blocks would quantise blocks the
// whole parameter does not have: refused.
TEST(AdamW8bitTest, APieceOffTheParametersBlocksIsRefused) {
  const std::vector<int64_t> numels = {7000, 300, 5000};
  const FlatLayout layout = LayOutFlat(numels, /*world_size=*/2, /*alignment=*/1);
  torch::Tensor shard = torch::zeros({layout.shard()}).requires_grad_(true);
  OptimizerOptions options;
  options.name = "adamw_8bit";
  auto optimizer = MakeOptimizer(options, {shard}, {ShardPieces(layout, numels, 1)});
  ASSERT_FALSE(optimizer.ok());
  EXPECT_NE(optimizer.status().message().find("not on a state block"), std::string::npos)
      << optimizer.status().ToString();
}

// bnb.optim.AdamW8bit ran on CPU (scripts/fixtures/make_bnb_fixtures.py) for three steps of a fixed
// gradient sequence: the 8-bit codes and absmax must be identical (the fused kernel's bits do not
// depend on the CPU). The small tensor's fp32 moments take ATen's add(alpha) and addcmul, which
// fuse their product into an FMA or not depending on the kernels ATen picks (AVX2 and AVX-512:
// fused, as where the fixture was written; ATEN_CPU_CAPABILITY=default: not): with u = 2^-24, if
// ours and the fixture's m start a step E apart, x = fl(beta1 m) differs by beta1 E plus a rounding
// of each, and each side rounds x + (1 - beta1) g at most twice, so they end at most
// beta1 (1 + 4u) E + 7u (beta1 |m| + (1 - beta1) |g|) apart (6u + O(u^2), rounded up); v likewise,
// with three roundings a side: beta2 (1 + 4u) E + 10u (beta2 v + (1 - beta2) g^2). Parameters
// differ only in where weight decay goes: bitsandbytes' CPU path decays before the step, its CUDA
// kernel (which we follow) after, a difference of |update| * lr * wd per step.
TEST(AdamW8bitTest, MatchesBitsandbytesOnCpu) {
  auto fixture = LoadFixture("adamw8bit.safetensors");
  ASSERT_FALSE(fixture.empty());
  const torch::Tensor h = fixture["hparams"];
  OptimizerOptions options;
  options.lr = h[0].item<double>();
  options.beta1 = h[1].item<double>();
  options.beta2 = h[2].item<double>();
  options.eps = h[3].item<double>();
  options.weight_decay = h[4].item<double>();
  torch::Tensor big =
      fixture["big.initial"].clone().requires_grad_(true);  // (41, 100): 8-bit state
  torch::Tensor small = fixture["small.initial"].clone().requires_grad_(true);  // (30): fp32 state
  auto optimizer = Make(options, {big, small});
  const double decay_gap = options.lr * options.lr * options.weight_decay;
  const double u = kUnitRoundoff;
  // The small tensor's moments before the step, and the bounds on their distance to the fixture's.
  torch::Tensor m = torch::zeros({30}, torch::kFloat64), v = torch::zeros({30}, torch::kFloat64);
  torch::Tensor m_error = torch::zeros({30}, torch::kFloat64), v_error = m_error.clone();
  for (int step = 0; step < 3; ++step) {
    const std::string s = std::to_string(step);
    big.mutable_grad() = fixture["big.grad." + s];
    small.mutable_grad() = fixture["small.grad." + s];
    const torch::Tensor g = small.grad().to(torch::kFloat64);
    m_error = options.beta1 * (1 + 4 * u) * m_error +
              7 * u * (options.beta1 * m.abs() + (1 - options.beta1) * g.abs());
    v_error = options.beta2 * (1 + 4 * u) * v_error +
              10 * u * (options.beta2 * v + (1 - options.beta2) * g * g);
    optimizer->Step(options.lr);
    auto state = StateByName(*optimizer);
    for (const std::string field : {"state1", "absmax1", "state2", "absmax2"}) {
      const torch::Tensor expected = fixture["big." + field + "." + s];
      EXPECT_TRUE(torch::equal(state["0." + field], expected.reshape(-1)))
          << "step " << step << " " << field << ": "
          << state["0." + field].ne(expected.reshape(-1)).sum().item<int64_t>() << " differ";
    }
    m = state["1.state1"].to(torch::kFloat64);
    v = state["1.state2"].to(torch::kFloat64);
    for (const auto& [field, ours, error] :
         {std::tuple{"state1", m, m_error}, std::tuple{"state2", v, v_error}}) {
      const torch::Tensor theirs = fixture["small." + std::string(field) + "." + s];
      EXPECT_TRUE((ours - theirs.to(torch::kFloat64)).abs().le(error).all().item<bool>())
          << "step " << step << " small " << field << ": "
          << BitsDiffer(state["1." + std::string(field)], theirs) << " differ";
    }
    const double tolerance = (step + 1) * 1.5 * decay_gap + 1e-6;
    EXPECT_LE((big.detach() - fixture["big.param." + s]).abs().max().item<double>(), tolerance)
        << step;
    EXPECT_LE((small.detach() - fixture["small.param." + s]).abs().max().item<double>(), tolerance)
        << step;
  }
}

// The update against a plain fp32 re-implementation of the formula, with the moments taken from the
// optimizer's own dequantised state before the step.
TEST(AdamW8bitTest, ParameterUpdateIsTheCudaKernelsFormula) {
  torch::manual_seed(4);
  OptimizerOptions options;
  options.lr = 3e-3;
  options.weight_decay = 0.05;
  torch::Tensor p = (torch::randn({8192}) * 0.1).requires_grad_(true);
  auto optimizer = Make(options, {p});
  const torch::Tensor signed_map = DynamicMap(true), unsigned_map = DynamicMap(false);
  for (int t = 1; t <= 4; ++t) {
    p.mutable_grad() = torch::randn({8192}) * 0.01;
    auto state = StateByName(*optimizer);
    torch::Tensor m =
        t == 1 ? torch::zeros({8192})
               : DequantizeBlockwise8bit({state["0.state1"], state["0.absmax1"], 256}, signed_map);
    torch::Tensor v = t == 1 ? torch::zeros({8192})
                             : DequantizeBlockwise8bit({state["0.state2"], state["0.absmax2"], 256},
                                                       unsigned_map);
    const torch::Tensor g = p.grad().to(torch::kFloat64);
    m = options.beta1 * m.to(torch::kFloat64) + (1 - options.beta1) * g;
    v = options.beta2 * v.to(torch::kFloat64) + (1 - options.beta2) * g * g;
    const double c1 = 1 - std::pow(options.beta1, t),
                 c2 = std::sqrt(1 - std::pow(options.beta2, t));
    const torch::Tensor expected = (p.detach().to(torch::kFloat64) -
                                    options.lr * c2 / c1 * m / (v.sqrt() + c2 * options.eps)) *
                                   (1 - options.lr * options.weight_decay);
    optimizer->Step(options.lr);
    EXPECT_LE((p.detach().to(torch::kFloat64) - expected).abs().max().item<double>(), 1e-7) << t;
  }
}

// 2 bytes per parameter plus an fp32 absmax per 256 for 8-bit tensors, fp32 m and v for small ones,
// and the shared step count and two code maps.
TEST(AdamW8bitTest, StateBytesFollowTheFormula) {
  std::vector<torch::Tensor> params = {
      torch::zeros({64, 128}).requires_grad_(true),  // 8192: 32 blocks
      torch::zeros({4100}).requires_grad_(true),     // 4100: 16 blocks + tail
      torch::zeros({100}).requires_grad_(true)};     // fp32 state
  auto optimizer = Make({}, params);
  for (auto& p : params) p.mutable_grad() = torch::ones_like(p);
  optimizer->Step(1e-3);
  int64_t bytes = 0;
  for (const torch::Tensor& t : optimizer->StateTensors()) bytes += t.nbytes();
  const int64_t expected = (2 * 8192 + 8 * 32) + (2 * 4100 + 8 * 17) + 8 * 100 + 4 + 2 * 256 * 4;
  EXPECT_EQ(bytes, expected);
  // A large tensor alone: 2 + 8/256 bytes per parameter.
  const int64_t n = 4096 * 4096;
  const double per_param = (2.0 * n + 8.0 * (n / 256)) / n;
  EXPECT_DOUBLE_EQ(per_param, 2.03125);
  std::printf("8-bit AdamW state: %.5f bytes/param for large tensors (AdamW: 8)\n", per_param);
}

TEST(AdamW8bitTest, SmallTensorsKeepFp32State) {
  std::vector<torch::Tensor> params = {torch::zeros({4095}).requires_grad_(true),
                                       torch::zeros({4096}).requires_grad_(true)};
  auto optimizer = Make({}, params);
  for (auto& p : params) p.mutable_grad() = torch::ones_like(p);
  optimizer->Step(1e-3);
  auto state = StateByName(*optimizer);
  EXPECT_EQ(state["0.state1"].scalar_type(), torch::kFloat32);
  EXPECT_EQ(state["0.state2"].scalar_type(), torch::kFloat32);
  EXPECT_EQ(state.count("0.absmax1"), 0u);
  EXPECT_EQ(state["1.state1"].scalar_type(), torch::kUInt8);
  EXPECT_EQ(state["1.absmax1"].numel(), 16);
}

TEST(AdamW8bitTest, NonFiniteGradientElementsAreSkipped) {
  torch::Tensor p = torch::ones({8192}).requires_grad_(true);
  auto optimizer = Make({}, {p});
  torch::Tensor g = torch::full({8192}, 0.5);
  g[3] = std::nan("");
  g[4000] = INFINITY;
  p.mutable_grad() = g;
  optimizer->Step(1e-2);
  EXPECT_EQ(p[3].item<float>(), 1.0f);
  EXPECT_EQ(p[4000].item<float>(), 1.0f);
  EXPECT_LT(p[0].item<float>(), 1.0f);
  for (const auto& [name, tensor] : optimizer->NamedState()) {
    EXPECT_TRUE(tensor.to(torch::kFloat32).isfinite().all().item<bool>()) << name;
  }
}

// A fixed regression task: the loss after 200 steps stays within 5% of fp32 AdamW's.
TEST(AdamW8bitTest, TrainsAsWellAsFp32AdamW) {
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({512, 128});
  const torch::Tensor target_w = torch::randn({64, 128}) * 0.1;
  const torch::Tensor y = torch::matmul(x, target_w.t()) + 0.01 * torch::randn({512, 64});
  const torch::Tensor init = torch::randn({64, 128}) * 0.02;
  std::map<std::string, double> final_loss;
  for (const std::string name : {"adamw", "adamw_8bit"}) {
    torch::Tensor w = init.clone().requires_grad_(true);  // 8192 elements: 8-bit state
    OptimizerOptions options;
    options.name = name;
    options.weight_decay = 0.01;
    auto optimizer = std::move(*MakeOptimizer(options, {w}));
    for (int step = 0; step < 200; ++step) {
      w.mutable_grad() = torch::Tensor();
      torch::Tensor loss = (torch::matmul(x, w.t()) - y).pow(2).mean();
      loss.backward();
      optimizer->Step(1e-2);
    }
    torch::NoGradGuard no_grad;
    final_loss[name] = (torch::matmul(x, w.t()) - y).pow(2).mean().item<double>();
  }
  const double initial = y.pow(2).mean().item<double>();
  std::printf("regression loss: initial %.5f, adamw %.6f, adamw_8bit %.6f\n", initial,
              final_loss["adamw"], final_loss["adamw_8bit"]);
  EXPECT_LT(final_loss["adamw"], 0.1 * initial);
  EXPECT_NEAR(final_loss["adamw_8bit"], final_loss["adamw"], 0.05 * final_loss["adamw"]);
}

TEST(AdamW8bitTest, NamedStateRoundTripsThroughACheckpoint) {
  torch::manual_seed(6);
  std::vector<torch::Tensor> a = {(torch::randn({64, 80}) * 0.1).requires_grad_(true),
                                  (torch::randn({10}) * 0.1).requires_grad_(true)};
  OptimizerOptions options;
  options.weight_decay = 0.1;
  auto first = Make(options, a);
  std::vector<torch::Tensor> grads;
  for (int i = 0; i < 5; ++i) {
    for (const auto& p : a) grads.push_back(torch::randn_like(p));
  }
  auto step = [&](Optimizer& optimizer, std::vector<torch::Tensor>& params, int i) {
    for (size_t j = 0; j < params.size(); ++j)
      params[j].mutable_grad() = grads[i * params.size() + j];
    optimizer.Step(1e-2);
  };
  for (int i = 0; i < 3; ++i) step(*first, a, i);

  std::vector<std::pair<std::string, torch::Tensor>> saved;
  for (const auto& [name, tensor] : first->NamedState()) saved.emplace_back(name, tensor.clone());
  std::vector<torch::Tensor> b;
  for (const auto& p : a) b.push_back(p.detach().clone().requires_grad_(true));
  auto second = Make(options, b);
  ASSERT_TRUE(second->LoadNamedState(saved).ok());
  EXPECT_EQ(second->steps_taken(), 3);

  for (int i = 3; i < 5; ++i) {
    step(*first, a, i);
    step(*second, b, i);
  }
  for (size_t j = 0; j < a.size(); ++j) EXPECT_TRUE(torch::equal(a[j], b[j])) << j;
  auto sa = StateByName(*first), sb = StateByName(*second);
  for (const auto& [name, tensor] : sa) EXPECT_TRUE(torch::equal(tensor, sb[name])) << name;

  saved.erase(saved.begin());
  auto third = Make(options, b);
  EXPECT_FALSE(third->LoadNamedState(saved).ok());
}

// The parameters the fused kernel's tests update: fp32, bf16 and fp16 with tail blocks, one of
// exactly 16 blocks, and a small one with fp32 state (which the fused kernel leaves to ATen).
std::vector<torch::Tensor> KernelTestParams() {
  return {torch::randn({5000}) * 0.1,                            // fp32: 19 blocks + 136
          (torch::randn({64, 130}) * 0.1).to(torch::kBFloat16),  // 32 blocks + 128
          (torch::randn({4100}) * 0.1).to(torch::kHalf),         // 16 blocks + 4
          torch::randn({4096}) * 0.1,                            // exactly 16 blocks
          torch::randn({30}) * 0.1};                             // fp32 state
}

// Step `step`'s gradient: small and large in turn, so m changes sign and v is dominated now by its
// history, now by g^2; at step 2 a NaN and a -inf element.
torch::Tensor KernelTestGradient(const torch::Tensor& param, int step) {
  torch::Tensor g = torch::randn(param.sizes()) * (step % 2 == 0 ? 1e-2 : 3.0);
  if (step == 2) {
    g.view(-1)[7] = std::nan("");
    g.view(-1)[-1] = -INFINITY;
  }
  return g.to(param.scalar_type());
}

// The 8-bit state of parameter `index` before a step: zero codes and absmax (which dequantise to
// 0, as the state starts) before the first.
std::pair<Blockwise8bit, Blockwise8bit> StateBefore(const Optimizer& optimizer, size_t index,
                                                    int64_t numel) {
  auto state = StateByName(optimizer);
  const std::string prefix = std::to_string(index) + ".";
  if (state.count(prefix + "state1") == 0) {
    const int64_t blocks = (numel + kAdamW8bitBlocksize - 1) / kAdamW8bitBlocksize;
    const Blockwise8bit zero{torch::zeros({numel}, torch::kUInt8), torch::zeros({blocks}),
                             kAdamW8bitBlocksize};
    return {zero, zero};
  }
  return {
      {state[prefix + "state1"].clone(), state[prefix + "absmax1"].clone(), kAdamW8bitBlocksize},
      {state[prefix + "state2"].clone(), state[prefix + "absmax2"].clone(), kAdamW8bitBlocksize}};
}

// One moment after ReferenceUpdate's step, with what the ATen path may store instead (the bounds
// are derived in FusedCpuKernelMatchesTheAtenPath's comment).
struct ReferenceMoment {
  std::vector<float> values;                 // fp32 before requantisation (n)
  Blockwise8bit state;                       // requantised
  std::vector<double> error;                 // bound on |ATen's fp32 value - values[i]| (n)
  std::vector<double> absmax_error;          // bound on |ATen's absmax - state.absmax[b]| (blocks)
  std::vector<uint8_t> low_code, high_code;  // ATen's code lies in [low_code[i], high_code[i]] (n)
};

struct ReferenceStep {
  torch::Tensor param;  // the new parameter, flat, in its dtype (n)
  ReferenceMoment m, v;
  std::vector<double> param_error;  // bound on |ATen's fp32 parameter - ours| before the dtype's
                                    // rounding (n)
};

// Fills `moment`'s absmax_error, low_code and high_code. ATen's fp32 values x'_i are within
// error[i] of values[i], so its block absmax A' (max |x'_i|) is within max_i error[i] of ours, A.
// It quantises clamp(fl(x' * fl(1 / max(A', 1e-38))), -1, 1) in a full block, fl(x' / max(A',
// 1e-38)) in a tail block: x' / A' over those intervals, widened by two roundings (3u to cover the
// double arithmetic here; 2^-148 below the normal range), bounds the scaled value, and the nearest
// code is monotone in it.
void BoundAtenState(ReferenceMoment& moment, bool is_signed) {
  const quant_cpu::NearestCode<256>& nearest = quant_cpu::DynamicMapNearest(is_signed);
  const int64_t n = static_cast<int64_t>(moment.values.size());
  const double floor = static_cast<float>(1e-38);  // the absmax clamp's fp32 value
  moment.low_code.resize(n);
  moment.high_code.resize(n);
  for (int64_t start = 0; start < n; start += kAdamW8bitBlocksize) {
    const int64_t end = std::min(n, start + kAdamW8bitBlocksize);
    double absmax = 0.0, delta = 0.0;
    for (int64_t i = start; i < end; ++i) {
      absmax = std::max(absmax, std::abs(static_cast<double>(moment.values[i])));
      delta = std::max(delta, moment.error[i]);
    }
    moment.absmax_error.push_back(delta);
    const double a_low = std::max(absmax - delta, floor), a_high = std::max(absmax + delta, floor);
    for (int64_t i = start; i < end; ++i) {
      const double x_low = moment.values[i] - moment.error[i];
      const double x_high = moment.values[i] + moment.error[i];
      double low = std::min(x_low / a_low, x_low / a_high);
      double high = std::max(x_high / a_low, x_high / a_high);
      low = std::clamp(low - 3 * kUnitRoundoff * std::abs(low) - 0x1p-148, -1.0, 1.0);
      high = std::clamp(high + 3 * kUnitRoundoff * std::abs(high) + 0x1p-148, -1.0, 1.0);
      // Outward to fp32, where the nearest-code search works.
      float low32 = static_cast<float>(low), high32 = static_cast<float>(high);
      if (low32 > low) low32 = std::nextafter(low32, -2.0f);
      if (high32 < high) high32 = std::nextafter(high32, 2.0f);
      moment.low_code[i] = nearest(low32);
      moment.high_code[i] = nearest(high32);
    }
  }
}

// The update adamw_8bit.h documents, written out element by element in fp32 from the state before
// step t: the scalars rounded from double, then
//   m = fma(g, 1 - beta1, m_old * beta1)
//   v = fma((1 - beta2) * g, g, v_old * beta2)
//   p = (p + (step_size * m) / (sqrt(v) + eps)) * decay
// (skipped where g is not finite), the moments requantised with QuantizeBlockwise8bit. No fp32
// product below feeds a sum (the sums take a quotient, a sqrt or std::fma's result), so a compiler
// allowed to contract a * b + c into an FMA finds nothing to: each operation rounds once, and the
// explicit std::fma are the only fused ones. Keep it so when editing.
ReferenceStep ReferenceUpdate(const torch::Tensor& param, const torch::Tensor& grad,
                              const Blockwise8bit& m_old, const Blockwise8bit& v_old,
                              const OptimizerOptions& options, double lr, int64_t t) {
  const double c1 = 1.0 - std::pow(options.beta1, static_cast<double>(t));
  const double c2 = std::sqrt(1.0 - std::pow(options.beta2, static_cast<double>(t)));
  const float beta1 = static_cast<float>(options.beta1);
  const float one_minus_beta1 = static_cast<float>(1.0 - options.beta1);
  const float beta2 = static_cast<float>(options.beta2);
  const float one_minus_beta2 = static_cast<float>(1.0 - options.beta2);
  const float step_size = static_cast<float>(-lr * c2 / c1);
  const float eps = static_cast<float>(c2 * options.eps);
  const float decay = static_cast<float>(1.0 - lr * options.weight_decay);  // 1 without decay

  const torch::Tensor p = param.detach().reshape(-1).to(torch::kFloat32).contiguous();  // (n)
  const torch::Tensor g = grad.reshape(-1).to(torch::kFloat32).contiguous();            // (n)
  const torch::Tensor signed_map = DynamicMap(/*is_signed=*/true);
  const torch::Tensor unsigned_map = DynamicMap(/*is_signed=*/false);
  const int64_t n = p.numel();
  const float* p_in = p.data_ptr<float>();
  const float* g_in = g.data_ptr<float>();
  const uint8_t* m_codes = m_old.codes.data_ptr<uint8_t>();
  const uint8_t* v_codes = v_old.codes.data_ptr<uint8_t>();
  const float* m_absmax = m_old.absmax.data_ptr<float>();
  const float* v_absmax = v_old.absmax.data_ptr<float>();
  const float* signed_codes = signed_map.data_ptr<float>();
  const float* unsigned_codes = unsigned_map.data_ptr<float>();

  ReferenceStep out;
  out.m.values.resize(n);
  out.v.values.resize(n);
  out.m.error.assign(n, 0.0);
  out.v.error.assign(n, 0.0);
  out.param_error.assign(n, 0.0);
  torch::Tensor updated = p.clone();  // fp32 (n)
  float* p_out = updated.data_ptr<float>();
  const double u = kUnitRoundoff;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t b = j / kAdamW8bitBlocksize;
    const float m_prev = signed_codes[m_codes[j]] * m_absmax[b];
    const float v_prev = unsigned_codes[v_codes[j]] * v_absmax[b];
    const float gj = g_in[j];
    if (!std::isfinite(gj)) {
      out.m.values[j] = m_prev;
      out.v.values[j] = v_prev;
      continue;
    }
    const float m_decayed = m_prev * beta1;
    const float v_decayed = v_prev * beta2;
    const float m = std::fma(gj, one_minus_beta1, m_decayed);
    const float v = std::fma(one_minus_beta2 * gj, gj, v_decayed);
    const float denominator = std::sqrt(v) + eps;
    const float stepped = p_in[j] + step_size * m / denominator;
    p_out[j] = stepped * decay;
    out.m.values[j] = m;
    out.v.values[j] = v;
    // Products of two floats are exact in double.
    const double m_terms = std::abs(static_cast<double>(m_decayed)) +
                           std::abs(static_cast<double>(one_minus_beta1) * gj);
    const double v_terms = static_cast<double>(v_decayed) +
                           static_cast<double>(one_minus_beta2) * gj * static_cast<double>(gj);
    out.m.error[j] = 4 * u * m_terms;
    out.v.error[j] = 6 * u * v_terms;
    out.param_error[j] =
        16 * u *
            (std::abs(static_cast<double>(p_in[j])) + std::abs(static_cast<double>(p_out[j]))) +
        std::abs(static_cast<double>(step_size)) * out.m.error[j] / (denominator * (1 - 8 * u));
  }
  // Rounded to the parameter's dtype to nearest even, as the kernel's static_cast<T>(float).
  out.param = updated.to(param.scalar_type());
  const auto quantize = [n](ReferenceMoment& moment, const torch::Tensor& map, bool is_signed) {
    moment.state = QuantizeBlockwise8bit(torch::from_blob(moment.values.data(), {n}).clone(), map,
                                         kAdamW8bitBlocksize);
    BoundAtenState(moment, is_signed);
  };
  quantize(out.m, signed_map, /*is_signed=*/true);
  quantize(out.v, unsigned_map, /*is_signed=*/false);
  return out;
}

// The fused CPU kernel (kDefault's path for CPU parameters) is the documented formula evaluated as
// written: parameters, codes and absmax bit for bit equal to ReferenceUpdate's, over several steps,
// for fp32, bf16 and fp16 parameters with tail blocks, non-finite gradient elements, with and
// without weight decay. Its operations are correctly rounded IEEE-754 ones (*, +, /, sqrt, fma) in
// a fixed order on independent blocks, so these bits do not depend on the CPU's vector unit or the
// thread count, which is what lets a single-machine check speak for every machine.
TEST(AdamW8bitTest, FusedCpuKernelIsTheDocumentedFormula) {
  torch::manual_seed(9);
  constexpr double kLr = 1e-2;
  for (const double weight_decay : {0.0, 0.05}) {
    std::vector<torch::Tensor> params;
    for (const torch::Tensor& p : KernelTestParams()) params.push_back(p.requires_grad_(true));
    OptimizerOptions options;
    options.weight_decay = weight_decay;
    auto fused = MakeAdamW8bit(options, params).value();
    int64_t compared = 0;
    for (int step = 0; step < 5; ++step) {
      std::map<size_t, ReferenceStep> expected;
      for (size_t i = 0; i < params.size(); ++i) {
        params[i].mutable_grad() = KernelTestGradient(params[i], step);
        if (params[i].numel() < kAdamW8bitMinSize) continue;  // fp32 state: the ATen path
        auto [m_old, v_old] = StateBefore(*fused, i, params[i].numel());
        expected.emplace(
            i, ReferenceUpdate(params[i], params[i].grad(), m_old, v_old, options, kLr, step + 1));
      }
      fused->Step(kLr);
      auto state = StateByName(*fused);
      for (const auto& [i, want] : expected) {
        const std::string what = "wd " + std::to_string(weight_decay) + " step " +
                                 std::to_string(step) + " param " + std::to_string(i) + " " +
                                 torch::toString(params[i].scalar_type());
        const std::string prefix = std::to_string(i) + ".";
        EXPECT_EQ(BitsDiffer(params[i].detach(), want.param), 0) << what << " parameter";
        EXPECT_EQ(BitsDiffer(state[prefix + "state1"], want.m.state.codes), 0)
            << what << " m codes";
        EXPECT_EQ(BitsDiffer(state[prefix + "absmax1"], want.m.state.absmax), 0)
            << what << " m absmax";
        EXPECT_EQ(BitsDiffer(state[prefix + "state2"], want.v.state.codes), 0)
            << what << " v codes";
        EXPECT_EQ(BitsDiffer(state[prefix + "absmax2"], want.v.state.absmax), 0)
            << what << " v absmax";
        compared += params[i].numel();
      }
    }
    std::printf("weight decay %g: %lld parameter elements equal to the documented formula's\n",
                weight_decay, static_cast<long long>(compared));
  }
}

// The spacing of `dtype`'s values at magnitude |y|: 2^(e - mantissa bits) for |y| in [2^e,
// 2^(e+1)), the subnormals' below the normal range.
double Spacing(double y, torch::ScalarType dtype) {
  const int mantissa_bits = dtype == torch::kBFloat16 ? 7 : dtype == torch::kHalf ? 10 : 23;
  const int min_exponent = dtype == torch::kHalf ? -14 : -126;
  int exponent = min_exponent + 1;
  if (y != 0.0) std::frexp(y, &exponent);  // |y| in [2^(exponent - 1), 2^exponent)
  return std::ldexp(1.0, std::max(exponent - 1, min_exponent) - mantissa_bits);
}

// The fused CPU kernel against the ATen path (AdamW8bitImpl::kAten, which non-CPU parameters take)
// over several steps of the parameters and gradients above. Both start each step from the same
// parameters and state. The ATen path's results depend on the CPU: which kernels ATen dispatches
// to (default, AVX2, AVX-512), whether those fuse the products of add(alpha) and addcmul into an
// FMA, the order of addcmul's and addcdiv's products, and its sqrt, which is not correctly rounded
// (measured: 16% of inputs, up to 0.75 ulp; 1 ulp, 2u, is allowed below). So it is held to bounds
// derived from the operations, with u = 2^-24 (fp32's unit roundoff; one correctly rounded
// operation is off by a factor (1 + e), |e| <= u), a1 = 1 - beta1 and first-order terms, rounded
// up:
//   m: both compute x = fl(m_old * beta1) the same way; ours is (x + a1 g)(1 + e), ATen's at worst
//     (x + a1 g (1 + e'))(1 + e''): they differ by at most (3u + u^2)(|x| + |a1 g|) <= 4u (|x| +
//     |a1 g|) =: dm. This is absolute, not relative to m, which cancels when g flips sign.
//   v: all terms >= 0; ours rounds twice, ATen's at most three times: 5u + O(u^2) <= 6u of the
//     terms' sum.
//   the denominator sqrt(v) + eps: ours, D, is within 2u of the exact value from our v; ATen's
//     within 2.5u (its v, through the sqrt) + 2u (its sqrt) + u, so D_aten >= D (1 - 8u).
//   the parameter P = (p + w) decay, w = step_size m / D (two roundings in either order), one more
//     for the sum (or none, fused) and one for the decay: ours is within 4u decay|w| + 2u|P| of the
//     exact P from our m, v; ATen's within 7.5u decay|w| + 2u|P| + |step_size| dm / D_aten. With
//     decay |w| <= |p| + |P| (decay <= 1) the two differ by 11.5u |p| + 15.5u |P| + the dm term
//     and second-order terms, at most
//       16u (|p_before| + |P|) + |step_size| dm / (D (1 - 8u)).
//     The sum of both magnitudes is needed: the update can exceed both |p| values (it crosses
//     zero), so a bound in ulps of the larger of them fails. For bf16 and fp16 parameters both
//     results are then rounded to the dtype, which can land on neighbours: plus one spacing of the
//     dtype at the larger result.
//   state: ATen's absmax is within max dm (or dv) over the block of ours, and its codes lie between
//     the nearest codes of the extremes of its scaled values (BoundAtenState).
// The small tensor's fp32 state takes the ATen path in both, so it is bit for bit the same.
// Measured on an AMD EPYC with ATen's AVX2 kernels: 1.3% of the parameter elements differ, the
// largest by 0.16 of its bound, codes and absmax not at all; with ATEN_CPU_CAPABILITY=default, 2%,
// 0.26 of the bound, 1 code (by one) and 135 of 1720 absmax.
TEST(AdamW8bitTest, FusedCpuKernelMatchesTheAtenPath) {
  torch::manual_seed(9);
  constexpr double kLr = 1e-2;
  for (const double weight_decay : {0.0, 0.05}) {
    std::vector<torch::Tensor> fused_params, aten_params;
    for (const torch::Tensor& p : KernelTestParams()) {
      fused_params.push_back(p.clone().requires_grad_(true));
      aten_params.push_back(p.clone().requires_grad_(true));
    }
    OptimizerOptions options;
    options.weight_decay = weight_decay;
    auto fused = MakeAdamW8bit(options, fused_params).value();
    auto aten = MakeAdamW8bit(options, aten_params, AdamW8bitImpl::kAten).value();
    int64_t params_compared = 0, params_differ = 0, codes_compared = 0, codes_differ = 0;
    int64_t absmax_compared = 0, absmax_differ = 0;
    int max_code_distance = 0;
    double max_param_ratio = 0.0;  // the largest parameter difference over its bound
    for (int step = 0; step < 5; ++step) {
      // The same state and parameters before each step, so differences do not accumulate.
      if (step > 0) {
        std::vector<std::pair<std::string, torch::Tensor>> state;
        for (const auto& [name, tensor] : fused->NamedState())
          state.emplace_back(name, tensor.clone());
        ASSERT_TRUE(aten->LoadNamedState(state).ok());
      }
      std::map<size_t, ReferenceStep> expected;
      for (size_t i = 0; i < fused_params.size(); ++i) {
        const torch::Tensor g = KernelTestGradient(fused_params[i], step);
        fused_params[i].mutable_grad() = g;
        aten_params[i].mutable_grad() = g.clone();
        aten_params[i].detach().copy_(fused_params[i].detach());
        if (fused_params[i].numel() < kAdamW8bitMinSize) continue;
        auto [m_old, v_old] = StateBefore(*fused, i, fused_params[i].numel());
        expected.emplace(i,
                         ReferenceUpdate(fused_params[i], g, m_old, v_old, options, kLr, step + 1));
      }
      fused->Step(kLr);
      aten->Step(kLr);
      auto fused_state = StateByName(*fused), aten_state = StateByName(*aten);
      for (size_t i = 0; i < fused_params.size(); ++i) {
        const torch::ScalarType dtype = fused_params[i].scalar_type();
        const std::string what = "wd " + std::to_string(weight_decay) + " step " +
                                 std::to_string(step) + " param " + std::to_string(i) + " " +
                                 torch::toString(dtype);
        const std::string prefix = std::to_string(i) + ".";
        if (fused_params[i].numel() < kAdamW8bitMinSize) {
          EXPECT_EQ(BitsDiffer(fused_params[i].detach(), aten_params[i].detach()), 0) << what;
          EXPECT_EQ(BitsDiffer(fused_state[prefix + "state1"], aten_state[prefix + "state1"]), 0)
              << what;
          EXPECT_EQ(BitsDiffer(fused_state[prefix + "state2"], aten_state[prefix + "state2"]), 0)
              << what;
          continue;
        }
        const ReferenceStep& want = expected.at(i);
        // The bounds are ReferenceUpdate's, which the fused kernel is bit for bit (the test above).
        ASSERT_EQ(BitsDiffer(fused_params[i].detach(), want.param), 0) << what;
        const torch::Tensor ours = fused_params[i].detach().reshape(-1).to(torch::kFloat64);
        const torch::Tensor theirs = aten_params[i].detach().reshape(-1).to(torch::kFloat64);
        const double* a = ours.data_ptr<double>();
        const double* b = theirs.data_ptr<double>();
        int64_t outside = 0;
        for (int64_t j = 0; j < ours.numel(); ++j) {
          double bound = want.param_error[j];
          if (dtype != torch::kFloat32)
            bound += Spacing(std::max(std::abs(a[j]), std::abs(b[j])), dtype);
          const double difference = std::abs(a[j] - b[j]);
          if (!(difference <= bound)) ++outside;
          if (difference > 0) {
            ++params_differ;
            max_param_ratio = std::max(max_param_ratio, difference / bound);
          }
        }
        EXPECT_EQ(outside, 0) << what << ": parameter elements outside their bound";
        params_compared += ours.numel();

        for (const auto& [field, moment] : {std::pair{"1", &want.m}, std::pair{"2", &want.v}}) {
          const torch::Tensor codes = aten_state[prefix + "state" + field].contiguous();
          const torch::Tensor absmax = aten_state[prefix + "absmax" + field].contiguous();
          EXPECT_EQ(BitsDiffer(fused_state[prefix + "state" + field], moment->state.codes), 0)
              << what;
          const uint8_t* code = codes.data_ptr<uint8_t>();
          const uint8_t* our_code = moment->state.codes.data_ptr<uint8_t>();
          int64_t codes_outside = 0, absmax_outside = 0;
          for (int64_t j = 0; j < codes.numel(); ++j) {
            if (code[j] < moment->low_code[j] || code[j] > moment->high_code[j]) ++codes_outside;
            const int distance = std::abs(static_cast<int>(code[j]) - our_code[j]);
            codes_differ += distance != 0 ? 1 : 0;
            max_code_distance = std::max(max_code_distance, distance);
          }
          const float* scale = absmax.data_ptr<float>();
          const float* our_scale = moment->state.absmax.data_ptr<float>();
          for (int64_t b = 0; b < absmax.numel(); ++b) {
            const double difference = std::abs(static_cast<double>(scale[b]) - our_scale[b]);
            if (!(difference <= moment->absmax_error[b])) ++absmax_outside;
            absmax_differ += difference != 0 ? 1 : 0;
          }
          EXPECT_EQ(codes_outside, 0) << what << " state" << field << ": codes outside their range";
          EXPECT_EQ(absmax_outside, 0) << what << " absmax" << field << ": outside its bound";
          codes_compared += codes.numel();
          absmax_compared += absmax.numel();
        }
      }
    }
    std::printf(
        "weight decay %g, against the ATen path: %lld of %lld parameter elements differ (the "
        "largest difference %.3f of its bound), %lld of %lld codes (at most %d apart), %lld of "
        "%lld absmax\n",
        weight_decay, static_cast<long long>(params_differ),
        static_cast<long long>(params_compared), max_param_ratio,
        static_cast<long long>(codes_differ), static_cast<long long>(codes_compared),
        max_code_distance, static_cast<long long>(absmax_differ),
        static_cast<long long>(absmax_compared));
  }
}

// The fused step allocates no temporaries the size of a parameter, where the ATen path's are ~10
// fp32 or int64 tensors. Measured for a 1M-element parameter: 12 bytes fused (fp32 and bf16), 25
// MiB (fp32) and 33 MiB (bf16) on the ATen path.
TEST(AdamW8bitTest, CpuStepHasNoLargeTransientMemory) {
  CountingCpuAllocator& allocator = CountingCpuAllocator::Install();
  constexpr int64_t kNumel = 1 << 20;
  for (const torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const AdamW8bitImpl impl : {AdamW8bitImpl::kDefault, AdamW8bitImpl::kAten}) {
      torch::Tensor p = torch::randn({kNumel}).to(dtype).requires_grad_(true);
      p.mutable_grad() = (torch::randn({kNumel}) * 1e-2).to(dtype);
      auto optimizer = MakeAdamW8bit({}, {p}, impl).value();
      optimizer->Step(1e-3);  // creates the state
      const uint64_t before = allocator.device().allocated_bytes;
      allocator.ResetPeaks();
      optimizer->Step(1e-3);
      const uint64_t transient = allocator.device().peak_bytes - before;
      std::printf("8-bit AdamW step, 1M %s parameter, %s: transient %llu bytes\n",
                  torch::toString(dtype), impl == AdamW8bitImpl::kAten ? "ATen" : "fused",
                  static_cast<unsigned long long>(transient));
      if (impl == AdamW8bitImpl::kDefault) {
        EXPECT_LT(transient, kNumel * sizeof(float) / 8);
      }
    }
  }
}

// The ATen path (CUDA's) updates an 8-bit parameter in chunks of whole state blocks: every operation
// is elementwise or per block, so chunks of 1,024 elements give the bits of one chunk (parameters,
// codes, absmax, over steps with non-finite gradient elements), and the step's temporaries are
// those of a chunk, not of the parameter.
TEST(AdamW8bitTest, AtenPathInChunksIsTheWholeTensorUpdate) {
  torch::manual_seed(11);
  constexpr int64_t kChunk = 1024;
  for (const torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    // 10 chunks and a short one whose last state block is short too (10,340 = 40 blocks + 100).
    const torch::Tensor init = (torch::randn({10340}) * 0.1).to(dtype);
    torch::Tensor whole = init.clone().requires_grad_(true);
    torch::Tensor chunked = init.clone().requires_grad_(true);
    OptimizerOptions options;
    options.weight_decay = 0.05;
    auto one =
        MakeAdamW8bit(options, {whole}, AdamW8bitImpl::kAten, /*aten_chunk=*/1 << 20).value();
    auto many = MakeAdamW8bit(options, {chunked}, AdamW8bitImpl::kAten, kChunk).value();
    for (int step = 0; step < 4; ++step) {
      const torch::Tensor g = KernelTestGradient(init, step);
      whole.mutable_grad() = g.clone();
      chunked.mutable_grad() = g.clone();
      one->Step(1e-2);
      many->Step(1e-2);
      EXPECT_EQ(BitsDiffer(whole, chunked), 0) << torch::toString(dtype) << ", step " << step;
      const auto a = StateByName(*one);
      const auto b = StateByName(*many);
      for (const char* field : {"0.state1", "0.absmax1", "0.state2", "0.absmax2"}) {
        EXPECT_EQ(BitsDiffer(a.at(field), b.at(field)), 0)
            << torch::toString(dtype) << ", step " << step << ", " << field;
      }
    }
  }

  CountingCpuAllocator& allocator = CountingCpuAllocator::Install();
  constexpr int64_t kNumel = 1 << 20;
  torch::Tensor p = torch::randn({kNumel}).to(torch::kBFloat16).requires_grad_(true);
  p.mutable_grad() = (torch::randn({kNumel}) * 1e-2).to(torch::kBFloat16);
  auto optimizer = MakeAdamW8bit({}, {p}, AdamW8bitImpl::kAten, /*aten_chunk=*/1 << 12).value();
  optimizer->Step(1e-3);
  const uint64_t before = allocator.device().allocated_bytes;
  allocator.ResetPeaks();
  optimizer->Step(1e-3);
  const uint64_t transient = allocator.device().peak_bytes - before;
  std::printf("8-bit AdamW step, ATen path in chunks of 4,096: transient %llu bytes\n",
              static_cast<unsigned long long>(transient));
  // The whole-tensor update's was 33 MiB (CpuStepHasNoLargeTransientMemory): ~33 bytes an element.
  EXPECT_LT(transient, uint64_t{64} * (1 << 12));
}

}  // namespace
}  // namespace llmctl::trainer
