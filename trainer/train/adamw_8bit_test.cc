#include "trainer/train/adamw_8bit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "trainer/memory/counting_allocator.h"
#include "trainer/model/weights.h"
#include "trainer/quant/quant.h"
#include "trainer/safetensors/safetensors.h"
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

// bnb.optim.AdamW8bit ran on CPU (scripts/fixtures/make_bnb_fixtures.py) for three steps of a fixed
// gradient sequence: the 8-bit codes and absmax must be identical; so must the small tensor's fp32
// moments. Parameters differ only in where weight decay goes: bitsandbytes' CPU path decays before
// the step, its CUDA kernel (which we follow) after, a difference of |update| * lr * wd per step.
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
  for (int step = 0; step < 3; ++step) {
    const std::string s = std::to_string(step);
    big.mutable_grad() = fixture["big.grad." + s];
    small.mutable_grad() = fixture["small.grad." + s];
    optimizer->Step(options.lr);
    auto state = StateByName(*optimizer);
    for (const std::string field : {"state1", "absmax1", "state2", "absmax2"}) {
      const torch::Tensor expected = fixture["big." + field + "." + s];
      EXPECT_TRUE(torch::equal(state["0." + field], expected.reshape(-1)))
          << "step " << step << " " << field << ": "
          << state["0." + field].ne(expected.reshape(-1)).sum().item<int64_t>() << " differ";
    }
    for (const std::string field : {"state1", "state2"}) {
      EXPECT_TRUE(torch::equal(state["1." + field], fixture["small." + field + "." + s]))
          << step << field;
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

// The fused CPU kernel against the ATen path (AdamW8bitImpl::kAten) over several steps, for fp32,
// bf16 and fp16 parameters with tail blocks, non-finite gradient elements, with and without weight
// decay, beside a small tensor with fp32 state. The state (codes, absmax) is bit-identical. The
// parameters may differ by a rounding step: the kernel's sqrt is correctly rounded (as CUDA's, and
// bitsandbytes' kernel's), ATen's CPU sqrt is MKL's vsSqrt, 1 ulp off for ~1% of inputs; through
// the step and the final rounding that is within 2 ulp of the larger of the old and new value.
TEST(AdamW8bitTest, FusedCpuKernelMatchesTheAtenPath) {
  torch::manual_seed(9);
  for (const double weight_decay : {0.0, 0.05}) {
    std::vector<torch::Tensor> initial = {
        torch::randn({5000}) * 0.1,                            // fp32: 19 blocks + 136
        (torch::randn({64, 130}) * 0.1).to(torch::kBFloat16),  // 32 blocks + 128
        (torch::randn({4100}) * 0.1).to(torch::kHalf),         // 16 blocks + 4
        torch::randn({4096}) * 0.1,                            // exactly 16 blocks
        torch::randn({30}) * 0.1};                             // fp32 state
    std::vector<torch::Tensor> fused_params, aten_params;
    for (const torch::Tensor& p : initial) {
      fused_params.push_back(p.clone().requires_grad_(true));
      aten_params.push_back(p.clone().requires_grad_(true));
    }
    OptimizerOptions options;
    options.weight_decay = weight_decay;
    auto fused = MakeAdamW8bit(options, fused_params);
    auto aten = MakeAdamW8bit(options, aten_params, AdamW8bitImpl::kAten);
    int64_t differing = 0, compared = 0;
    for (int step = 0; step < 5; ++step) {
      std::vector<torch::Tensor> before;
      for (size_t i = 0; i < initial.size(); ++i) {
        torch::Tensor g = torch::randn(initial[i].sizes()) * (step % 2 == 0 ? 1e-2 : 3.0);
        if (step == 2) {
          g.view(-1)[7] = std::nan("");
          g.view(-1)[-1] = -INFINITY;
        }
        fused_params[i].mutable_grad() = g.to(initial[i].scalar_type());
        aten_params[i].mutable_grad() = g.to(initial[i].scalar_type());
        // Each step from the same parameters, so that 1-ulp differences do not accumulate.
        aten_params[i].detach().copy_(fused_params[i].detach());
        before.push_back(fused_params[i].detach().to(torch::kFloat64));
      }
      fused->Step(1e-2);
      aten->Step(1e-2);
      for (size_t i = 0; i < initial.size(); ++i) {
        // One ulp of the parameter's dtype, relative to the value.
        const double ulp = initial[i].scalar_type() == torch::kFloat32    ? std::ldexp(1.0, -23)
                           : initial[i].scalar_type() == torch::kBFloat16 ? std::ldexp(1.0, -7)
                                                                          : std::ldexp(1.0, -10);
        const torch::Tensor fused64 = fused_params[i].detach().to(torch::kFloat64);
        const torch::Tensor aten64 = aten_params[i].detach().to(torch::kFloat64);
        const torch::Tensor scale = torch::maximum(aten64.abs(), before[i].abs());
        EXPECT_TRUE((fused64 - aten64).abs().le(scale * 2 * ulp).all().item<bool>())
            << "wd " << weight_decay << " step " << step << " param " << i;
        differing += fused64.ne(aten64).sum().item<int64_t>();
        compared += fused64.numel();
      }
      auto fused_state = StateByName(*fused), aten_state = StateByName(*aten);
      for (const auto& [name, tensor] : aten_state) {
        EXPECT_TRUE(torch::equal(fused_state[name], tensor))
            << "wd " << weight_decay << " step " << step << " " << name;
      }
    }
    std::printf("weight decay %g: %lld of %lld parameter elements differ from the ATen path\n",
                weight_decay, static_cast<long long>(differing), static_cast<long long>(compared));
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
      auto optimizer = MakeAdamW8bit({}, {p}, impl);
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

}  // namespace
}  // namespace llmctl::trainer
