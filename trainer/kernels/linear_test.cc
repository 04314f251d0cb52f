#include "trainer/kernels/linear.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>

#include "common/cpu_matmul.h"
#include "trainer/memory/counting_allocator.h"

namespace llmctl::trainer {
namespace {

using LinearFn =
    std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)>;

torch::Tensor AtenLinear(const torch::Tensor& x, const torch::Tensor& weight,
                         const torch::Tensor& bias) {
  return torch::linear(x, weight, bias);
}

// The largest distance of `got` from a (M, K) @ b (K, N) (+ c (M, N) where defined) computed
// exactly (in fp64), over what the arithmetic allows a 16-bit GEMM that accumulates in fp32 and
// rounds once: each product of two bf16 or fp16 values is exact in fp32; K of them (and c) summed
// in fp32 are off by at most (K + 1) u32 sum|terms| (u32 = 2^-24), and the rounding to the 16-bit
// type adds at most u16 |result| (bf16: u16 = 2^-8; fp16: 2^-11). Below 1 passes.
double WorstOverBound(const torch::Tensor& got, const torch::Tensor& a, const torch::Tensor& b,
                      const torch::Tensor& c = {}) {
  const torch::Tensor a64 = a.to(torch::kFloat64);  // (M, K)
  const torch::Tensor b64 = b.to(torch::kFloat64);  // (K, N)
  torch::Tensor exact = a64.mm(b64);
  torch::Tensor magnitude = a64.abs().mm(b64.abs());
  if (c.defined()) {
    exact = exact + c.to(torch::kFloat64).expand_as(exact);
    magnitude = magnitude + c.to(torch::kFloat64).abs().expand_as(magnitude);
  }
  const double terms = static_cast<double>(a.size(1) + 1);
  const double u16 = std::ldexp(1.0, got.scalar_type() == torch::kHalf ? -11 : -8);
  const torch::Tensor bound =
      u16 * exact.abs() + 1.01 * terms * std::ldexp(1.0, -24) * magnitude * (1 + u16) + 1e-30;
  const torch::Tensor distance = (got.reshape(exact.sizes()).to(torch::kFloat64) - exact).abs();
  return (distance / bound).max().item<double>();
}

// On the CPU in bf16, the forward and the three gradients are each within bf16's rounding of the
// exact product (ATen's too); where this CPU has LibTorch's own bf16 GEMM, Linear is ATen's linear
// layer, equal bit for bit.
TEST(LinearTest, MatchesAtensLinearLayerInBf16OnTheCpu) {
  torch::manual_seed(3);
  for (const bool with_bias : {false, true}) {
    SCOPED_TRACE(with_bias ? "with a bias" : "without a bias");
    // (B, T, I) with B x T = 150 rows.
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
    const torch::Tensor x_rows = x0.reshape({150, 96});
    const torch::Tensor dy_rows = dy.reshape({150, 200});
    for (const Run* r : {&aten, &ours}) {
      SCOPED_TRACE(r == &aten ? "ATen's" : "ours");
      EXPECT_LT(WorstOverBound(r->y, x_rows, w0.t(), b0), 1.0);
      EXPECT_LT(WorstOverBound(r->dx, dy_rows, w0), 1.0);
      EXPECT_LT(WorstOverBound(r->dw, dy_rows.t(), x_rows), 1.0);
    }
    if (!MultipliesInFp32(x0, w0)) {
      EXPECT_TRUE(torch::equal(ours.y, aten.y));
      EXPECT_TRUE(torch::equal(ours.dx, aten.dx));
      EXPECT_TRUE(torch::equal(ours.dw, aten.dw));
    }
    if (with_bias) {
      // Both sum 150 bf16 values in fp32 and round once, in their own order.
      const torch::Tensor exact = dy.to(torch::kFloat64).sum(torch::IntArrayRef{0, 1});
      const torch::Tensor magnitude = dy.to(torch::kFloat64).abs().sum(torch::IntArrayRef{0, 1});
      const torch::Tensor bound =
          std::ldexp(1.0, -8) * exact.abs() + 1.01 * 150 * std::ldexp(1.0, -24) * magnitude + 1e-30;
      EXPECT_LT(((ours.db.to(torch::kFloat64) - exact).abs() / bound).max().item<double>(), 1.0);
    }
  }
}

// Products larger than one block each way (300 x 1,100 @ 1,100 x 1,030: two row blocks, two inner
// blocks, two column blocks, each with a remainder), of operands running along their rows or down
// their columns, in bf16 and fp16, into a new tensor, into part of a larger one, added to what it
// holds, and under autocast: each within the 16-bit rounding of the exact product, what lies
// outside the part untouched.
TEST(LinearTest, ProductsAcrossBlocksAreRoundedOnceFromFp32Sums) {
  torch::manual_seed(7);
  for (const torch::ScalarType dtype : {torch::kBFloat16, torch::kHalf}) {
    SCOPED_TRACE(dtype == torch::kHalf ? "fp16" : "bf16");
    const torch::Tensor a = (torch::randn({300, 1100}) * 0.1).to(dtype);
    const torch::Tensor b_rows = (torch::randn({1030, 1100}) * 0.1).to(dtype);  // b = b_rows^T
    const torch::Tensor product = Matmul(a, b_rows.t());
    EXPECT_EQ(product.scalar_type(), dtype);
    EXPECT_LT(WorstOverBound(product, a, b_rows.t()), 1.0);
    // Both operands running down their columns (as dy^T of a weight's gradient), and neither.
    const torch::Tensor a_columns = a.t().contiguous();  // a = a_columns^T
    EXPECT_LT(WorstOverBound(Matmul(a_columns.t(), b_rows.t()), a, b_rows.t()), 1.0);
    const torch::Tensor b = b_rows.t().contiguous();
    EXPECT_LT(WorstOverBound(Matmul(a, b), a, b), 1.0);

    torch::Tensor larger = torch::full({310, 1040}, 3.0, torch::TensorOptions().dtype(dtype));
    torch::Tensor part = larger.narrow(0, 5, 300).narrow(1, 7, 1030);
    MatmulInto(part, a, b_rows.t());
    EXPECT_LT(WorstOverBound(part, a, b_rows.t()), 1.0);
    EXPECT_TRUE(torch::equal(larger.narrow(0, 0, 5), torch::full_like(larger.narrow(0, 0, 5), 3)));
    EXPECT_TRUE(torch::equal(larger.narrow(1, 0, 7), torch::full_like(larger.narrow(1, 0, 7), 3)));

    const torch::Tensor start = torch::randn({300, 1030}).to(dtype);
    torch::Tensor sum = start.clone();
    MatmulInto(sum, a, b_rows.t(), /*accumulate=*/true);
    EXPECT_LT(WorstOverBound(sum, a, b_rows.t(), start), 1.0);

    // Under autocast (the chunked loss runs inside bf16-mixed's), the same product.
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, torch::kBFloat16);
    const torch::Tensor under_autocast = Matmul(a, b_rows.t());
    at::autocast::set_autocast_enabled(at::kCPU, false);
    EXPECT_EQ(under_autocast.scalar_type(), dtype);
    EXPECT_LT(WorstOverBound(under_autocast, a, b_rows.t()), 1.0);
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

// Under CPU autocast, Linear casts as autocast's linear does: the product of the same bf16
// operands, and the weight's bf16 copy made once for two calls (autocast's cache), so the graph
// holds the same bytes.
TEST(LinearTest, CastsAndCachesAsAutocastsLinearLayer) {
  CountingCpuAllocator& allocator = CountingCpuAllocator::Install();
  torch::manual_seed(5);
  const torch::Tensor x0 = torch::randn({4, 40, 64});
  const torch::Tensor w0 = torch::randn({80, 64});
  // `out`: the first call's output; `held`: what both calls' graphs hold.
  auto forward_twice = [&](const LinearFn& linear, torch::Tensor& out, uint64_t& held) {
    torch::Tensor x = x0.clone().requires_grad_(true);
    torch::Tensor w = w0.clone().requires_grad_(true);
    const uint64_t before = allocator.device().allocated_bytes;
    {
      at::autocast::set_autocast_enabled(at::kCPU, true);
      at::autocast::set_autocast_dtype(at::kCPU, torch::kBFloat16);
      torch::Tensor first = linear(x, w, torch::Tensor());
      torch::Tensor second = linear(x * 2, w, torch::Tensor());
      out = first.detach();
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
  // Both the product of x and the weight cast to bf16, within bf16's rounding of the exact one.
  const torch::Tensor x16 = x0.reshape({-1, 64}).to(torch::kBFloat16);
  const torch::Tensor w16 = w0.to(torch::kBFloat16);
  EXPECT_LT(WorstOverBound(ours_out, x16, w16.t()), 1.0);
  EXPECT_LT(WorstOverBound(aten_out, x16, w16.t()), 1.0);
  if (!MultipliesInFp32(x16, w16)) {
    EXPECT_TRUE(torch::equal(ours_out, aten_out));
  }
  EXPECT_EQ(ours_held, aten_held);
}

// LibTorch's oneDNN turned off while it lives: its 16-bit products then run on ATen's own GEMM,
// which allocates only the tensors it returns.
class OneDnnOff {
 public:
  OneDnnOff() : was_enabled_(at::globalContext().userEnabledMkldnn()) {
    at::globalContext().setUserEnabledMkldnn(false);
  }
  ~OneDnnOff() { at::globalContext().setUserEnabledMkldnn(was_enabled_); }
  OneDnnOff(const OneDnnOff&) = delete;
  OneDnnOff& operator=(const OneDnnOff&) = delete;

 private:
  bool was_enabled_;
};

// What a step reports is what LibTorch's own GEMM allocates: with x and the weight training and a
// bias, the bytes forward holds for backward and the peaks of forward and of backward are ATen's
// linear layer's on its own GEMM, to the byte (the fp32 blocks sit in scratch outside LibTorch's
// allocator). oneDNN's GEMMs take a workspace from LibTorch's allocator besides: its native bf16
// one 51-197 KB a thread at 150-8,192 rows (the Zen 4 here), which the trainer runs where the CPU
// has one; its bf16 one without avx512_bf16 (gemm:jit:bf16) twice the output's bytes, which it
// does not (common/cpu_matmul.h). The rerun below takes that case on an AVX-512 CPU.
TEST(LinearTest, AllocatesWhatAtensLinearLayerAllocates) {
  CountingCpuAllocator& allocator = CountingCpuAllocator::Install();
  torch::manual_seed(6);
  for (const int64_t rows : {150, 40}) {
    SCOPED_TRACE(rows);
    const torch::Tensor x0 = torch::randn({rows, 96}).to(torch::kBFloat16);
    const torch::Tensor w0 = torch::randn({200, 96}).to(torch::kBFloat16);
    const torch::Tensor b0 = torch::randn({200}).to(torch::kBFloat16);
    const torch::Tensor dy = torch::randn({rows, 200}).to(torch::kBFloat16);
    struct Bytes {
      uint64_t held, forward_peak, backward_peak;
    };
    auto bytes = [&](const LinearFn& linear) {
      torch::Tensor x = x0.clone().requires_grad_(true);
      torch::Tensor w = w0.clone().requires_grad_(true);
      torch::Tensor b = b0.clone().requires_grad_(true);
      const uint64_t before = allocator.device().allocated_bytes;
      allocator.ResetPeaks();
      torch::Tensor y = linear(x, w, b);
      Bytes measured{allocator.device().allocated_bytes - before,
                     allocator.device().peak_bytes - before, 0};
      allocator.ResetPeaks();
      y.backward(dy);
      measured.backward_peak = allocator.device().peak_bytes - before;
      return measured;
    };
    Bytes aten{};
    {
      OneDnnOff one_dnn_off;
      aten = bytes(AtenLinear);
    }
    const Bytes ours = bytes(Linear);
    EXPECT_EQ(ours.held, aten.held);
    const bool fp32_route = MultipliesInFp32(x0, w0);
    // Under a cap without native bf16 (linear_test_cascade_lake) the trainer takes its route.
    if (OneDnnIsaCapOfEnvironment() < OneDnnIsa::kAvx512CoreBf16) {
      ASSERT_TRUE(fp32_route);
    }
    if (fp32_route) {
      EXPECT_EQ(ours.forward_peak, aten.forward_peak);
      EXPECT_EQ(ours.backward_peak, aten.backward_peak);
    } else {
      // ATen's linear layer on oneDNN's native GEMM: the same tensors and its workspace.
      EXPECT_GE(ours.forward_peak, aten.forward_peak);
      EXPECT_GE(ours.backward_peak, aten.backward_peak);
    }
  }
}

}  // namespace
}  // namespace llmctl::trainer
