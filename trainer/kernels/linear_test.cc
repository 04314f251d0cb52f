#include "trainer/kernels/linear.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>

#include "common/matmul_layout.h"
#include "trainer/memory/counting_allocator.h"

namespace llmctl::trainer {
namespace {

using LinearFn =
    std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)>;

torch::Tensor AtenLinear(const torch::Tensor& x, const torch::Tensor& weight,
                         const torch::Tensor& bias) {
  return torch::linear(x, weight, bias);
}

// The largest distance of `got` from dy @ weight computed exactly (in fp64), over what the
// arithmetic allows a bf16 GEMM that accumulates in fp32 and rounds once: each product of two
// bf16 values is exact in fp32; O of them summed in fp32 are off by at most O u32 sum|terms|
// (u32 = 2^-24), and the rounding to bf16 adds at most u16 |result| (u16 = 2^-8). Below 1 passes.
double WorstOverBound(const torch::Tensor& got, const torch::Tensor& dy,
                      const torch::Tensor& weight) {
  const torch::Tensor dy64 = dy.reshape({-1, weight.size(0)}).to(torch::kFloat64);  // (N, O)
  const torch::Tensor w64 = weight.to(torch::kFloat64);                             // (O, I)
  const torch::Tensor exact = dy64.mm(w64);
  const torch::Tensor magnitude = dy64.abs().mm(w64.abs());
  const double terms = static_cast<double>(weight.size(0));
  const torch::Tensor bound = std::ldexp(1.0, -8) * exact.abs() +
                              1.01 * terms * std::ldexp(1.0, -24) * magnitude * (1 + 0x1p-8) +
                              1e-30;
  const torch::Tensor distance = (got.reshape(exact.sizes()).to(torch::kFloat64) - exact).abs();
  return (distance / bound).max().item<double>();
}

// On the CPU in bf16, the forward and the weight's and bias' gradients are ATen's linear layer's;
// x's gradient is the same product formed by row blocks, within bf16's rounding of the exact one
// (as ATen's is).
TEST(LinearTest, MatchesAtensLinearLayerInBf16OnTheCpu) {
  torch::manual_seed(3);
  for (const bool with_bias : {false, true}) {
    SCOPED_TRACE(with_bias ? "with a bias" : "without a bias");
    // (B, T, I) with B x T = 150 rows: two full blocks of 64 and a part of one.
    const torch::Tensor x0 = torch::randn({3, 50, 96}).to(torch::kBFloat16);
    const torch::Tensor w0 = (torch::randn({200, 96}) * 0.1).to(torch::kBFloat16);
    const torch::Tensor b0 = with_bias ? torch::randn({200}).to(torch::kBFloat16) : torch::Tensor();
    const torch::Tensor dy = torch::randn({3, 50, 200}).to(torch::kBFloat16);
    struct Run {
      torch::Tensor y, dx, dw, db;
    };
    auto run = [&](const LinearFn& linear) {
      torch::Tensor x = x0.clone().requires_grad_(true);
      torch::Tensor w = w0.clone().requires_grad_(true);
      torch::Tensor b = with_bias ? b0.clone().requires_grad_(true) : torch::Tensor();
      torch::Tensor y = linear(x, w, b);
      y.backward(dy);
      return Run{y.detach(), x.grad(), w.grad(), with_bias ? b.grad() : torch::Tensor()};
    };
    const Run aten = run(AtenLinear);
    const Run ours = run(Linear);
    EXPECT_TRUE(torch::equal(ours.y, aten.y));
    EXPECT_TRUE(torch::equal(ours.dw, aten.dw));
    EXPECT_LT(WorstOverBound(ours.dx, dy, w0), 1.0);
    EXPECT_LT(WorstOverBound(aten.dx, dy, w0), 1.0);
    if (with_bias) {
      // Both sum 150 bf16 values in fp32 and round once, in their own order.
      const torch::Tensor exact = dy.to(torch::kFloat64).sum({0, 1});
      const torch::Tensor magnitude = dy.to(torch::kFloat64).abs().sum({0, 1});
      const torch::Tensor bound =
          std::ldexp(1.0, -8) * exact.abs() + 1.01 * 150 * std::ldexp(1.0, -24) * magnitude + 1e-30;
      EXPECT_LT(((ours.db.to(torch::kFloat64) - exact).abs() / bound).max().item<double>(), 1.0);
    }
  }
}

// Off the CPU's 16-bit path (float32 here) Linear is ATen's linear layer itself: equal bit for bit.
TEST(LinearTest, IsAtensLinearLayerInFloat32) {
  torch::manual_seed(4);
  const torch::Tensor x0 = torch::randn({2, 70, 48});
  const torch::Tensor w0 = torch::randn({32, 48});
  const torch::Tensor dy = torch::randn({2, 70, 32});
  auto grads = [&](const LinearFn& linear) {
    torch::Tensor x = x0.clone().requires_grad_(true);
    torch::Tensor w = w0.clone().requires_grad_(true);
    torch::Tensor y = linear(x, w, torch::Tensor());
    y.backward(dy);
    return std::vector<torch::Tensor>{y.detach(), x.grad(), w.grad()};
  };
  const auto aten = grads(AtenLinear);
  const auto ours = grads(Linear);
  for (size_t i = 0; i < aten.size(); ++i) EXPECT_TRUE(torch::equal(ours[i], aten[i])) << i;
}

// Under CPU autocast, Linear casts as autocast's linear does: the same output, and the weight's
// bf16 copy made once for two calls (autocast's cache), so the graph holds the same bytes.
TEST(LinearTest, CastsAndCachesAsAutocastsLinearLayer) {
  CountingCpuAllocator& allocator = CountingCpuAllocator::Install();
  torch::manual_seed(5);
  const torch::Tensor x0 = torch::randn({4, 40, 64});
  const torch::Tensor w0 = torch::randn({80, 64});
  auto forward_twice = [&](const LinearFn& linear, torch::Tensor& out, uint64_t& held) {
    torch::Tensor x = x0.clone().requires_grad_(true);
    torch::Tensor w = w0.clone().requires_grad_(true);
    const uint64_t before = allocator.device().allocated_bytes;
    {
      at::autocast::set_autocast_enabled(at::kCPU, true);
      at::autocast::set_autocast_dtype(at::kCPU, torch::kBFloat16);
      torch::Tensor first = linear(x, w, torch::Tensor());
      torch::Tensor second = linear(x * 2, w, torch::Tensor());
      out = (first + second).detach();
      held = allocator.device().allocated_bytes - before;
      (first.sum() + second.sum()).backward();
      at::autocast::set_autocast_enabled(at::kCPU, false);
      at::autocast::clear_cache();
    }
    EXPECT_EQ(w.grad().scalar_type(), torch::kFloat32);
  };
  torch::Tensor aten_out, ours_out;
  uint64_t aten_held = 0, ours_held = 0;
  forward_twice(AtenLinear, aten_out, aten_held);
  forward_twice(Linear, ours_out, ours_held);
  EXPECT_EQ(ours_out.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(ours_out, aten_out));
  EXPECT_EQ(ours_held, aten_held);
}

// What the row blocks cost, as the estimate counts it (common/matmul_layout.h): with a frozen
// weight (nothing else forms in backward), the peak of backward is ATen's plus one block of
// kInputGradientRows rows of dy, or of all its rows when there are fewer, and the buffer LibTorch
// transposes it through.
TEST(LinearTest, BackwardPeaksOneRowBlockAboveAtens) {
  CountingCpuAllocator& allocator = CountingCpuAllocator::Install();
  torch::manual_seed(6);
  for (const int64_t rows : {150, 40}) {
    SCOPED_TRACE(rows);
    const torch::Tensor x0 = torch::randn({rows, 96}).to(torch::kBFloat16);
    const torch::Tensor w = torch::randn({200, 96}).to(torch::kBFloat16);  // frozen
    const torch::Tensor dy = torch::randn({rows, 200}).to(torch::kBFloat16);
    auto backward_peak = [&](const LinearFn& linear) {
      torch::Tensor x = x0.clone().requires_grad_(true);
      torch::Tensor y = linear(x, w, torch::Tensor());
      const uint64_t before = allocator.device().allocated_bytes;
      allocator.ResetPeaks();
      y.backward(dy);
      return allocator.device().peak_bytes - before;
    };
    const uint64_t aten = backward_peak(AtenLinear);
    const uint64_t ours = backward_peak(Linear);
    EXPECT_EQ(ours - aten, InputGradientCopyBytes(/*on_cpu=*/true, 2, rows, 200));
    // The block, and LibTorch's 60 x 60 buffer while it is transposed.
    EXPECT_EQ(InputGradientCopyBytes(/*on_cpu=*/true, 2, rows, 200),
              static_cast<uint64_t>(std::min<int64_t>(rows, 64) * 200 + 60 * 60) * 2);
  }
  EXPECT_EQ(InputGradientCopyBytes(/*on_cpu=*/true, 2, 2, 100),
            400u);  // under 360 values: no buffer
  EXPECT_EQ(InputGradientCopyBytes(/*on_cpu=*/true, 4, 150, 200), 0u);
  EXPECT_EQ(InputGradientCopyBytes(/*on_cpu=*/false, 2, 150, 200), 0u);
}

}  // namespace
}  // namespace llmctl::trainer
