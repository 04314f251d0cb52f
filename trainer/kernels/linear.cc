#include "trainer/kernels/linear.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "common/cpu_matmul.h"

namespace llmctl::trainer {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The blocks MatmulInFp32 converts: rows of the left operand, its columns (the right one's rows),
// the right one's columns. kScratchFloats holds one of each and their sum.
constexpr int64_t kRowBlock = 256;
constexpr int64_t kInnerBlock = 1024;
constexpr int64_t kColumnBlock = 1024;
static_assert(kScratchFloats ==
              kRowBlock * kInnerBlock + kInnerBlock * kColumnBlock + kRowBlock * kColumnBlock);

// This thread's scratch, kScratchFloats long: kept between products, so a step converts into the
// same pages each time.
float* Scratch() {
  thread_local std::vector<float> scratch(kScratchFloats);
  return scratch.data();
}

// `block` (p, q), any strides, converted to fp32 into `scratch` (p x q floats), as a (p, q) view of
// it. A block that runs down its columns (a transposed operand: the weight of x W^T, dy of
// dy^T x) is copied in its own order and the copy viewed transposed: a copy that transposes
// gathers one value a row of the source and ran 3-9x slower (12-06, the 2-core Xeon held to
// AVX512_CORE_VNNI: a 1,024 x 768 block of a down projection's W^T at 104-183 Mvalues/s, 583-1,599
// in its own order), where LibTorch's fp32 GEMM takes a transposed operand at its rate.
torch::Tensor ConvertedBlock(float* scratch, const torch::Tensor& block) {
  const auto fp32 = torch::TensorOptions().dtype(torch::kFloat32);
  const int64_t p = block.size(0), q = block.size(1);
  if (block.stride(0) == 1 && block.stride(1) != 1) {
    torch::Tensor copy = torch::from_blob(scratch, {q, p}, fp32);  // (q, p)
    copy.copy_(block.t());
    return copy.t();
  }
  torch::Tensor copy = torch::from_blob(scratch, {p, q}, fp32);  // (p, q)
  copy.copy_(block);
  return copy;
}

// out (M, N) = a (M, K) @ b (K, N), plus out's own values where `accumulate`, else plus bias (N)
// where it is defined; all 16-bit of one dtype on the CPU, any strides. Each (row block, column
// block) of out sums its inner blocks' fp32 products in fp32 (beside the first, out's values or
// the bias), then is rounded once into out. The fp32 tensors are views of the scratch: nothing is
// allocated through LibTorch's allocator. Autocast is off meanwhile: the fp32 blocks stay fp32.
void MatmulInFp32(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b,
                  const torch::Tensor& bias, bool accumulate) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
  const int64_t rows = a.size(0), inner = a.size(1), columns = b.size(1);
  const int64_t row_block = std::min(rows, kRowBlock);
  const int64_t inner_block = std::min(inner, kInnerBlock);
  const int64_t column_block = std::min(columns, kColumnBlock);
  float* const a_scratch = Scratch();
  float* const b_scratch = a_scratch + row_block * inner_block;
  float* const sum_scratch = b_scratch + inner_block * column_block;
  const auto fp32 = torch::TensorOptions().dtype(torch::kFloat32);
  for (int64_t row = 0; row < rows; row += row_block) {
    const int64_t m = std::min(row_block, rows - row);
    for (int64_t column = 0; column < columns; column += column_block) {
      const int64_t n = std::min(column_block, columns - column);
      torch::Tensor out_block = out.narrow(0, row, m).narrow(1, column, n);
      torch::Tensor sum = torch::from_blob(sum_scratch, {m, n}, fp32);  // (m, n)
      bool started = true;  // whether `sum` holds a start the products are added to
      if (accumulate) {
        sum.copy_(out_block);
      } else if (bias.defined()) {
        sum.copy_(bias.narrow(0, column, n).expand({m, n}));
      } else if (inner == 0) {
        sum.zero_();
      } else {
        started = false;
      }
      for (int64_t k0 = 0; k0 < inner; k0 += inner_block) {
        const int64_t k = std::min(inner_block, inner - k0);
        const torch::Tensor a32 =
            ConvertedBlock(a_scratch, a.narrow(0, row, m).narrow(1, k0, k));  // (m, k)
        const torch::Tensor b32 =
            ConvertedBlock(b_scratch, b.narrow(0, k0, k).narrow(1, column, n));  // (k, n)
        if (started) {
          sum.addmm_(a32, b32);
        } else {
          torch::mm_out(sum, a32, b32);  // the first inner block's product is the start
          started = true;
        }
      }
      out_block.copy_(sum);
    }
  }
}

// x (N..., I) @ weight^T (+ bias) -> (N..., O), no autograd: ATen's linear, or MatmulInFp32 into
// the same (N, O) tensor ATen's would allocate.
torch::Tensor LinearForward(const torch::Tensor& x, const torch::Tensor& weight,
                            const torch::Tensor& bias) {
  if (!MultipliesInFp32(x, weight) ||
      (bias.defined() && bias.scalar_type() != weight.scalar_type())) {
    return torch::linear(x, weight, bias);
  }
  const torch::Tensor rows = x.reshape({-1, weight.size(1)});                     // (N, I)
  torch::Tensor out = torch::empty({rows.size(0), weight.size(0)}, x.options());  // (N, O)
  MatmulInFp32(out, rows, weight.t(), bias, /*accumulate=*/false);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = weight.size(0);
  return out.view(sizes);
}

// Without a bias, and with one: autograd's inputs are tensors that exist.
struct LinearFunction : public torch::autograd::Function<LinearFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight) {
    Save(ctx, x, weight);
    return LinearForward(x, weight, {});
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    tensor_list grads = Gradients(ctx, grad_outputs[0], /*bias=*/false);
    return {grads[0], grads[1]};
  }

  // What ATen's linear keeps: x for the weight's gradient, the weight for x's (saved variables,
  // which autograd frees once this node's backward has run).
  static void Save(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight) {
    ctx->save_for_backward({weight.requires_grad() ? x : torch::Tensor(),
                            x.requires_grad() ? weight : torch::Tensor()});
  }

  // {x's, the weight's, the bias'} gradients from dy (N..., O); undefined where not needed.
  static tensor_list Gradients(AutogradContext* ctx, const torch::Tensor& dy, bool bias) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];       // (N..., I)
    const torch::Tensor& weight = saved[1];  // (O, I)
    torch::Tensor dx, dweight, dbias;
    // x's first, as ATen's MmBackward forms them.
    if (ctx->needs_input_grad(0)) dx = InputGradient(dy, weight);
    const torch::Tensor dy_rows = dy.reshape({-1, dy.size(-1)});  // (N, O)
    if (ctx->needs_input_grad(1)) {
      dweight = Matmul(dy_rows.t(), x.reshape({-1, x.size(-1)}));  // (O, I)
    }
    if (bias && ctx->needs_input_grad(2)) dbias = dy_rows.sum(0);
    return {dx, dweight, dbias};
  }
};

struct BiasedLinearFunction : public torch::autograd::Function<BiasedLinearFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias) {
    LinearFunction::Save(ctx, x, weight);
    return LinearForward(x, weight, bias);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    return LinearFunction::Gradients(ctx, grad_outputs[0], /*bias=*/true);
  }
};

}  // namespace

bool MultipliesInFp32(const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.is_cpu() || !b.is_cpu() || a.scalar_type() != b.scalar_type()) return false;
  if (a.scalar_type() == torch::kBFloat16) return !CpuMultipliesBf16();
  if (a.scalar_type() == torch::kHalf) return !CpuMultipliesFp16();
  return false;
}

namespace {

// Whether `a` and `b` are of one 16-bit dtype: LibTorch's own product of such operands runs with
// autocast off, so that the operands' dtype is the product's, as on the fp32 route. Under bf16
// autocast torch::mm would otherwise turn fp16 operands into a bf16 product, and only on the CPUs
// with a native fp16 GEMM (the Xeons with avx512_fp16).
bool OneSixteenBitDtype(const torch::Tensor& a, const torch::Tensor& b) {
  return a.scalar_type() == b.scalar_type() &&
         (a.scalar_type() == torch::kBFloat16 || a.scalar_type() == torch::kHalf);
}

}  // namespace

torch::Tensor Matmul(const torch::Tensor& a, const torch::Tensor& b) {
  if (!MultipliesInFp32(a, b)) {
    std::optional<c10::impl::ExcludeDispatchKeyGuard> no_autocast;
    if (OneSixteenBitDtype(a, b)) no_autocast.emplace(c10::DispatchKey::AutocastCPU);
    return torch::mm(a, b);
  }
  torch::Tensor out = torch::empty({a.size(0), b.size(1)}, a.options());  // (M, N)
  MatmulInFp32(out, a, b, {}, /*accumulate=*/false);
  return out;
}

void MatmulInto(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b,
                bool accumulate) {
  if (!MultipliesInFp32(a, b) || out.scalar_type() != a.scalar_type()) {
    std::optional<c10::impl::ExcludeDispatchKeyGuard> no_autocast;
    if (OneSixteenBitDtype(a, b)) no_autocast.emplace(c10::DispatchKey::AutocastCPU);
    if (accumulate) {
      out.addmm_(a, b);
    } else {
      torch::mm_out(out, a, b);
    }
    return;
  }
  MatmulInFp32(out, a, b, {}, accumulate);
}

torch::Tensor InputGradient(const torch::Tensor& dy, const torch::Tensor& weight) {
  const torch::Tensor dy_rows = dy.reshape({-1, weight.size(0)});  // (N, O)
  std::vector<int64_t> sizes = dy.sizes().vec();
  sizes.back() = weight.size(1);
  return Matmul(dy_rows, weight).view(sizes);
}

torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias) {
  if (!weight.is_cpu()) return torch::linear(x, weight, bias);
  if (at::autocast::is_autocast_enabled(at::kCPU) && at::autocast::is_eligible(x, at::kCPU)) {
    const at::ScalarType dtype = at::autocast::get_autocast_dtype(at::kCPU);
    const torch::Tensor x_cast = at::autocast::cached_cast(dtype, x, at::kCPU);
    const torch::Tensor weight_cast = at::autocast::cached_cast(dtype, weight, at::kCPU);
    const torch::Tensor bias_cast =
        bias.defined() ? at::autocast::cached_cast(dtype, bias, at::kCPU) : bias;
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    return Linear(x_cast, weight_cast, bias_cast);
  }
  const bool records =
      torch::GradMode::is_enabled() &&
      (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  if (!records || !MultipliesInFp32(x, weight)) return LinearForward(x, weight, bias);
  return bias.defined() ? BiasedLinearFunction::apply(x, weight, bias)
                        : LinearFunction::apply(x, weight);
}

}  // namespace llmctl::trainer
