// The fused ops against the ATen composition transformers runs (kernels: aten), forward and both
// gradients, on odd shapes (a width that is no multiple of a vector, one row, no rows) in fp32 and
// bf16; a LLaMA step with each, on the demo model; and the chunked loss' cross-entropy gradient
// against cross_entropy's in float64. Every test runs on the CPU (the loops of cpu_kernels.cc) and
// on CUDA (cuda_kernels.cu's kernels against ATen's CUDA ops), the same inputs drawn on the CPU;
// the CUDA ones are skipped, and say so, where no CUDA device is visible (deploy/gpu-check's
// kernels stage runs them on a GPU). Each checks that its op ran the kernel of its device
// (kernel_choice.h): a CUDA instance that compared the ATen fallback with ATen would pass without
// cuda_kernels.cu.
#include "trainer/kernels/fused_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "common/model_config.h"
#include "trainer/kernels/kernel_choice.h"
#include "trainer/model/llama.h"
#include "trainer/model/loss.h"
#include "trainer/train/precision.h"

#if defined(LLMCTL_HAVE_CUDA_KERNELS)
#include "trainer/kernels/cuda_kernels.h"
#endif

namespace llmctl::trainer {
namespace {

// fp32's, bf16's and fp16's unit roundoff.
constexpr double kFp32Unit = 0x1p-24;
constexpr double kBf16Unit = 0x1p-8;
constexpr double kFp16Unit = 0x1p-11;

// A 16-bit dtype's unit roundoff: the ops' bounds in a 16-bit dtype are its own roundings (one
// per op each side, the sums in fp32), so bf16's derivations hold for fp16 (16-mixed's compute
// dtype) in its unit.
double SixteenBitUnit(torch::Dtype dtype) { return dtype == torch::kHalf ? kFp16Unit : kBf16Unit; }

// The dtypes each op is checked in: fp32, bf16 and fp16.
const std::vector<torch::Dtype> kDtypes = {torch::kFloat32, torch::kBFloat16, torch::kHalf};

struct Outputs {
  torch::Tensor y;
  std::vector<torch::Tensor> grads;  // of the inputs, in order
};

// `op` on fresh leaf copies of `inputs`, backward with `grad_y`.
Outputs RunOp(const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& op,
              const std::vector<torch::Tensor>& inputs, const torch::Tensor& grad_y) {
  std::vector<torch::Tensor> leaves;
  for (const torch::Tensor& t : inputs) leaves.push_back(t.detach().clone().requires_grad_(true));
  Outputs out;
  out.y = op(leaves);
  out.y.backward(grad_y);
  for (const torch::Tensor& leaf : leaves) out.grads.push_back(leaf.grad());
  return out;
}

// |a - b| <= rel * max|b| + abs elementwise, over tensors in fp32.
void ExpectClose(const torch::Tensor& a, const torch::Tensor& b, double rel,
                 const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  ASSERT_EQ(a.scalar_type(), b.scalar_type()) << what;
  if (b.numel() == 0) return;
  const double scale = b.to(torch::kFloat64).abs().max().item<double>();
  const double diff = (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
  EXPECT_LE(diff, rel * scale + 1e-30)
      << what << ": largest difference " << diff << " of " << scale;
}

using kernels::FusedOp;
using kernels::Implementation;

// That `op`'s latest call ran the fused kernel of `device`, not the ATen fallback.
void ExpectRanTheKernelOf(torch::Device device, FusedOp op) {
  const Implementation expected =
      device.is_cuda() ? Implementation::kCudaKernel : Implementation::kCpuLoop;
  const Implementation ran = kernels::LastImplementation(op);
  EXPECT_EQ(ran, expected) << kernels::FusedOpName(op) << " ran the "
                           << kernels::ImplementationName(ran) << ", not the "
                           << kernels::ImplementationName(expected)
                           << (ran == Implementation::kAtenFallback
                                   ? ": " + kernels::LastFallbackReason(op)
                                   : std::string());
}

// The device a test runs its ops on: the CPU, or CUDA where one is visible.
class FusedOpsOn : public ::testing::TestWithParam<torch::DeviceType> {
 protected:
  void SetUp() override {
    if (GetParam() == torch::kCUDA && !torch::cuda::is_available()) {
      GTEST_SKIP() << "no CUDA device: the CUDA kernels are checked on a GPU machine";
    }
  }
  torch::Device device() const { return torch::Device(GetParam()); }
};

// The shapes: (rows, width) as (B, T, C) with a width no vector divides, one row, no rows.
const std::vector<std::vector<int64_t>> kShapes = {{2, 3, 37}, {1, 1, 64}, {0, 5, 16}};

// transformers' LlamaRMSNorm.
torch::Tensor AtenRmsNorm(const std::vector<torch::Tensor>& in) {
  auto x32 = in[0].to(torch::kFloat32);
  auto variance = x32.pow(2).mean(-1, true);
  return in[1] * (x32 * torch::rsqrt(variance + 1e-6)).to(in[0].scalar_type());
}

// Bounds: in fp32 the two differ only in the order of a row's sum of squares (the fused op sums
// in double, ATen in fp32 vector lanes: C u relative at most) and in rounding each element's few
// operations; 64 C u covers both. In bf16 each side rounds the normalised value and the product
// to bf16 (one ulp each: 2 u_bf16 relative), and the gradients' sums run over C fp32 terms of
// bf16-rounded factors: 4 u_bf16 relative to the tensor's largest.
TEST_P(FusedOpsOn, RmsNormMatchesTheAtenCompositionAndItsGradients) {
  for (const torch::Dtype dtype : kDtypes) {
    for (const std::vector<int64_t>& shape : kShapes) {
      const std::string what = std::string(c10::toString(dtype)) + " (" + std::to_string(shape[0]) +
                               ", " + std::to_string(shape[1]) + ", " + std::to_string(shape[2]) +
                               ")";
      torch::manual_seed(3);
      const torch::Tensor x = torch::randn(shape).to(device(), dtype);
      const torch::Tensor w = (1.0 + 0.1 * torch::randn({shape[2]})).to(device(), dtype);
      const torch::Tensor dy = torch::randn(shape).to(device(), dtype);
      const Outputs aten = RunOp(AtenRmsNorm, {x, w}, dy);
      const Outputs fused = RunOp(
          [](const std::vector<torch::Tensor>& in) { return FusedRmsNorm(in[0], in[1], 1e-6); },
          {x, w}, dy);
      ExpectRanTheKernelOf(device(), FusedOp::kRmsNorm);
      const double rel = dtype == torch::kFloat32 ? 64 * static_cast<double>(shape[2]) * kFp32Unit
                                                  : 4 * SixteenBitUnit(dtype);
      ExpectClose(fused.y, aten.y, rel, what + " y");
      ExpectClose(fused.grads[0], aten.grads[0], rel, what + " dx");
      ExpectClose(fused.grads[1], aten.grads[1], rel, what + " dweight");
    }
  }
}

using GluOp = torch::Tensor (*)(const torch::Tensor& gate, const torch::Tensor& up);

// A gated activation act(g) u, fused against its ATen composition, forward and both gradients, on
// every shape in fp32, bf16 and fp16: gate values of `gate_scale` standard deviations, the
// bounds relative to each tensor's largest element in units of fp32's and the 16-bit dtype's
// roundoff.
void ExpectGluMatchesAten(torch::Device device, GluOp aten_op, GluOp fused_op, FusedOp fused_name,
                          double gate_scale, double fp32_units, double sixteen_bit_units) {
  for (const torch::Dtype dtype : kDtypes) {
    for (const std::vector<int64_t>& shape : kShapes) {
      const std::string what =
          std::string(c10::toString(dtype)) + " rows " + std::to_string(shape[0] * shape[1]);
      torch::manual_seed(4);
      const torch::Tensor g = (gate_scale * torch::randn(shape)).to(device, dtype);
      const torch::Tensor u = torch::randn(shape).to(device, dtype);
      const torch::Tensor dh = torch::randn(shape).to(device, dtype);
      const Outputs aten =
          RunOp([aten_op](const std::vector<torch::Tensor>& in) { return aten_op(in[0], in[1]); },
                {g, u}, dh);
      const Outputs fused =
          RunOp([fused_op](const std::vector<torch::Tensor>& in) { return fused_op(in[0], in[1]); },
                {g, u}, dh);
      ExpectRanTheKernelOf(device, fused_name);
      const double rel = dtype == torch::kFloat32 ? fp32_units * kFp32Unit
                                                  : sixteen_bit_units * SixteenBitUnit(dtype);
      ExpectClose(fused.y, aten.y, rel, what + " h");
      ExpectClose(fused.grads[0], aten.grads[0], rel, what + " dgate");
      ExpectClose(fused.grads[1], aten.grads[1], rel, what + " dup");
    }
  }
}

// silu(g) u: in fp32 the two differ in exp's last bits (ATen's vectorised exp is within a few ulps)
// and the products' rounding; in bf16 ATen rounds silu(g) to bf16 before the product.
TEST_P(FusedOpsOn, SwiGluMatchesTheAtenCompositionAndItsGradients) {
  ExpectGluMatchesAten(
      device(), [](const torch::Tensor& g, const torch::Tensor& u) { return torch::silu(g) * u; },
      FusedSwiGlu, FusedOp::kSwiGlu, /*gate_scale=*/3, /*fp32_units=*/32, /*sixteen_bit_units=*/4);
}

// linear(silu(g) u, W) as one node against FusedSwiGlu then the linear layer: the same product
// (the same kernel), recomputed in backward for W's gradient, and the same matmuls; the bounds
// are the product's (SwiGluMatchesTheAtenComposition's) carried through a sum of I terms, relative
// to the largest.
TEST_P(FusedOpsOn, SwiGluLinearMatchesSwiGluThenTheLinearLayerAndItsGradients) {
  for (const torch::Dtype dtype : kDtypes) {
    for (const std::vector<int64_t>& shape : kShapes) {
      const std::string what =
          std::string(c10::toString(dtype)) + " rows " + std::to_string(shape[0] * shape[1]);
      torch::manual_seed(5);
      const int64_t out_features = 5;
      const torch::Tensor g = (3 * torch::randn(shape)).to(device(), dtype);
      const torch::Tensor u = torch::randn(shape).to(device(), dtype);
      const torch::Tensor w = torch::randn({out_features, shape[2]}).to(device(), dtype);
      const torch::Tensor dy = torch::randn({shape[0], shape[1], out_features}).to(device(), dtype);
      const Outputs composed = RunOp(
          [](const std::vector<torch::Tensor>& in) {
            return torch::nn::functional::linear(FusedSwiGlu(in[0], in[1]), in[2]);
          },
          {g, u, w}, dy);
      const Outputs fused = RunOp(
          [](const std::vector<torch::Tensor>& in) {
            return FusedSwiGluLinear(in[0], in[1], in[2]);
          },
          {g, u, w}, dy);
      ExpectRanTheKernelOf(device(), FusedOp::kSwiGluLinear);
      const double rel = dtype == torch::kFloat32 ? 64 * kFp32Unit : 4 * SixteenBitUnit(dtype);
      ExpectClose(fused.y, composed.y, rel, what + " y");
      ExpectClose(fused.grads[0], composed.grads[0], rel, what + " dgate");
      ExpectClose(fused.grads[1], composed.grads[1], rel, what + " dup");
      ExpectClose(fused.grads[2], composed.grads[2], rel, what + " dweight");
    }
  }
}

// T5's gelu_new(g) u. The fused op computes gelu_new as g sigmoid(2 z) (the same function), ATen
// as seven ops through tanh. In fp32 both are within a few ulps of the exact value, relative to
// the tensor's largest (near saturation 1 + tanh(z) is tiny, but so is the product). In bf16 ATen
// rounds every one of the seven intermediates (x^3, the sum, its scale, tanh, 1 + tanh, the halves)
// to bf16, and its backward as many, where the fused op rounds once.
TEST_P(FusedOpsOn, GeGluMatchesTheAtenCompositionAndItsGradients) {
  ExpectGluMatchesAten(
      device(), [](const torch::Tensor& g, const torch::Tensor& u) { return AtenGeluNew(g) * u; },
      FusedGeGlu, FusedOp::kGeGlu, /*gate_scale=*/2, /*fp32_units=*/64, /*sixteen_bit_units=*/8);
}

// x cos + rotate_half(x) sin over (B, T, H, D): in fp32 each output is x1 c - x2 s (or x2 c + x1
// s), two products and one sum each rounded once on both sides (cpu_kernels.cc contracts no
// multiply-add), so the same bits; bf16's ATen composition rounds the tables, both products and
// the sum to bf16 (4 rounding steps of u_bf16 relative to the largest term).
TEST_P(FusedOpsOn, RopeMatchesTheAtenCompositionAndItsGradients) {
  ModelConfig config = *FindPreset("llmctl-demo");
  for (const torch::Dtype dtype : kDtypes) {
    for (const int64_t batch : {2, 1, 0}) {
      const int64_t seq = 7;
      const int64_t heads = 3;
      const RotaryTables rope = MakeRotaryTables(config, seq, device());
      const int64_t dim = config.head_dim;
      torch::manual_seed(5);
      const torch::Tensor x = torch::randn({batch, seq, heads, dim}).to(device(), dtype);
      const torch::Tensor dy = torch::randn({batch, seq, heads, dim}).to(device(), dtype);
      const auto aten_rope = [&](const std::vector<torch::Tensor>& in) {
        const torch::Tensor t = in[0].transpose(1, 2);  // (B, H, T, D), as the ATen path runs it
        const int64_t half = dim / 2;
        const torch::Tensor rotated =
            torch::cat({-t.narrow(-1, half, half), t.narrow(-1, 0, half)}, -1);
        return (t * rope.cos.to(dtype) + rotated * rope.sin.to(dtype)).transpose(1, 2);
      };
      const Outputs aten = RunOp(aten_rope, {x}, dy);
      const Outputs fused = RunOp(
          [&](const std::vector<torch::Tensor>& in) {
            return FusedRope(in[0], rope.cos, rope.sin);
          },
          {x}, dy);
      ExpectRanTheKernelOf(device(), FusedOp::kRope);
      const std::string what =
          std::string(c10::toString(dtype)) + " batch " + std::to_string(batch);
      if (dtype == torch::kFloat32 && device().is_cpu()) {
        EXPECT_TRUE(torch::equal(fused.y, aten.y.contiguous())) << what;
        EXPECT_TRUE(torch::equal(fused.grads[0], aten.grads[0].contiguous())) << what;
      } else {
        // CUDA: nvcc and ATen's kernels may each contract a product and the sum into one
        // multiply-add, one rounding fewer: within 2 u of the largest term.
        const double rel = dtype == torch::kFloat32 ? 2 * kFp32Unit : 4 * SixteenBitUnit(dtype);
        ExpectClose(fused.y, aten.y.contiguous(), rel, what + " y");
        ExpectClose(fused.grads[0], aten.grads[0].contiguous(), rel, what + " dx");
      }
    }
  }
}

// The demo model's loss and every parameter's gradient with each, in fp32 and bf16: the fused
// block is the same function. fp32: the ops' differences above, through 4 layers, stay below
// 1e-5 relative; bf16: within a few bf16 ulps of the loss, and of each gradient's largest element.
TEST_P(FusedOpsOn, ADemoModelStepGivesTheAtenLossAndGradients) {
  const ModelConfig* preset = FindPreset("llmctl-demo");
  ASSERT_NE(preset, nullptr);
  for (const torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    const auto step = [&](Kernels kernels) {
      torch::manual_seed(7);
      LlamaForCausalLM model(*preset);
      model->InitializeRandom();
      model->to(device(), dtype);
      torch::manual_seed(8);
      const torch::Tensor ids =
          torch::randint(0, preset->vocab_size, {2, 32}, torch::kInt64).to(device());
      LlamaOptions options;
      options.kernels = kernels;
      const torch::Tensor loss = CausalLmLoss(model->Logits(model->Hidden(ids, options)), ids);
      loss.backward();
      std::vector<torch::Tensor> grads = {loss.detach()};
      for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
      return grads;
    };
    const auto aten = step(Kernels::kAten);
    kernels::FallbackWatch watch;
    const auto fused = step(Kernels::kFused);
    for (const kernels::Fallback& fallback : watch.TakeNew()) {
      ADD_FAILURE() << kernels::FusedOpName(fallback.op)
                    << " fell back to ATen in the fused step: " << fallback.reason;
    }
    ExpectRanTheKernelOf(device(), FusedOp::kRmsNorm);
    ExpectRanTheKernelOf(device(), FusedOp::kRope);
    ASSERT_EQ(aten.size(), fused.size());
    const double rel = dtype == torch::kFloat32 ? 1e-5 : 16 * kBf16Unit;
    for (size_t i = 0; i < aten.size(); ++i) {
      ExpectClose(fused[i], aten[i], rel,
                  std::string(c10::toString(dtype)) +
                      (i == 0 ? " loss" : " gradient " + std::to_string(i - 1)));
    }
  }
}

// The cross-entropy gradient against the truth: cross_entropy's mean over the scored rows and its
// autograd gradient, in float64 from the same logits. Rows: (5, 1037) with an unscored row and
// labels at both ends of the vocabulary (no vector divides 1037), one row, no rows, and rows none
// of which is scored (zero gradients, an infinite inverse count).
//
// Bounds, for any order of the sums (ATen's and the fused kernel's differ). A row's log-sum-exp
// is max + log(s), s a sum of V exponentials each within 2 ulp: s is within (V + 2) u of its value
// relatively, so log s within that absolutely; rounding max + log s and lse - x_t (values under 64
// here) adds 128 u: (V + 128) u on each row's loss. Each gradient element is exp(x - lse) scale:
// lse's error above, x - lse's rounding (|x - lse| < 64 here) and exp's 2 ulp, relative:
// (V + 64) u of the largest element. bf16 gradients are those values rounded once to bf16: one
// bf16 unit more (fp16: one fp16 unit).
void ExpectCrossEntropyMatchesTruth(torch::Device device, torch::Dtype dtype, int64_t rows,
                                    int64_t vocab, const std::vector<int64_t>& label_values) {
  SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + std::to_string(rows) + " x " +
               std::to_string(vocab));
  torch::manual_seed(5);
  const torch::Tensor logits = (torch::randn({rows, vocab}) * 6).to(dtype);
  const torch::Tensor labels = torch::tensor(label_values, torch::kInt64);
  const torch::Tensor scored = labels.ne(-100);
  const torch::Tensor count = scored.sum().to(torch::kFloat32);
  const torch::Tensor inverse_count = count.reciprocal();

  torch::Tensor truth_logits = logits.to(torch::kFloat64).requires_grad_(true);
  const torch::Tensor truth_rows = torch::nn::functional::cross_entropy(
      truth_logits, labels,
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kNone));
  torch::Tensor truth_grad = torch::zeros_like(truth_logits);
  if (count.item<float>() > 0) {
    (truth_rows.sum() / count.to(torch::kFloat64)).backward();
    truth_grad = truth_logits.grad();
  }

  const double u = kFp32Unit;
  const double loss_bound = static_cast<double>(vocab + 128) * u;
  const double grad_rel = static_cast<double>(vocab + 64) * u +
                          (dtype == torch::kFloat32 ? 0.0 : SixteenBitUnit(dtype));
  for (const bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "aten");
    torch::Tensor grad = logits.clone().to(device);  // a copy: the gradient is formed in place
    const torch::Tensor on_device_labels = labels.to(device);
    const torch::Tensor on_device_inverse = inverse_count.to(device);
    torch::Tensor row_loss = fused
                                 ? FusedCrossEntropyGrad(grad, on_device_labels, on_device_inverse)
                                 : AtenCrossEntropyGrad(grad, on_device_labels, on_device_inverse);
    if (fused) ExpectRanTheKernelOf(device, FusedOp::kCrossEntropy);
    row_loss = row_loss.cpu();
    grad = grad.cpu();
    ASSERT_EQ(row_loss.scalar_type(), torch::kFloat32);
    ASSERT_EQ(grad.scalar_type(), dtype);
    if (rows == 0) continue;
    const double loss_diff =
        (row_loss.to(torch::kFloat64) - truth_rows.detach()).abs().max().item<double>();
    EXPECT_LE(loss_diff, loss_bound);
    EXPECT_EQ(row_loss.masked_select(scored.logical_not()).abs().sum().item<float>(), 0.0f)
        << "unscored rows add no loss";
    const torch::Tensor truth_in_dtype = truth_grad.to(torch::kFloat32).to(dtype);
    ExpectClose(grad.to(torch::kFloat32), truth_in_dtype.to(torch::kFloat32), grad_rel,
                "the logits' gradient");
    EXPECT_EQ(grad.index({scored.logical_not()}).abs().sum().item<float>(), 0.0f)
        << "unscored rows get zero gradients";
  }
}

TEST_P(FusedOpsOn, CrossEntropyGradMatchesCrossEntropyAndItsGradient) {
  for (const torch::Dtype dtype : kDtypes) {
    ExpectCrossEntropyMatchesTruth(device(), dtype, 5, 1037, {0, 1036, -100, 517, 3});
    ExpectCrossEntropyMatchesTruth(device(), dtype, 1, 37, {36});
    ExpectCrossEntropyMatchesTruth(device(), dtype, 0, 16, {});
    ExpectCrossEntropyMatchesTruth(device(), dtype, 2, 16, {-100, -100});
  }
}

// The chunked loss of a plain head (trainer/model/loss.cc: its matmuls into slices of the
// gradient, the weight's gradient summed chunk by chunk, the softmax's gradient formed in place by
// the cross-entropy kernel) against the full logits' loss on the same device, under each precision
// that changes what the chunks compute in: fp32, bf16-mixed and 16-mixed, the last with the loss
// scaler's first factor, as the trainer runs it. 300 tokens over 2 chunks of 256, a 1,000-token
// vocabulary, about a third of the labels -100. Bounds: fp32 1e-5 (the chunks sum the weight's
// gradient in two parts); under autocast, twice the plain path's own distance from fp32's.
TEST_P(FusedOpsOn, ChunkedLossOfAPlainHeadGivesThePlainLossAndGradients) {
  constexpr int64_t kTokens = 150, kWidth = 64, kVocab = 1000;
  constexpr double kLossScale = 65536;
  torch::manual_seed(11);
  const torch::Tensor hidden0 = torch::randn({2, kTokens, kWidth}).to(device());
  const torch::Tensor weight0 = (0.02 * torch::randn({kVocab, kWidth})).to(device());
  torch::Tensor labels = torch::randint(0, kVocab, {2, kTokens}, torch::kInt64);
  labels.masked_fill_(torch::rand({2, kTokens}) < 0.3, -100);
  labels = labels.to(device());
  struct Result {
    torch::Tensor loss, hidden, weight;
  };
  const auto run = [&](const char* precision, bool chunked) {
    torch::Tensor hidden = hidden0.clone().requires_grad_(true);
    torch::Tensor weight = weight0.clone().requires_grad_(true);
    const auto logits_of = [weight](const torch::Tensor& h) {
      return torch::nn::functional::linear(h, weight);
    };
    const Precision mode = *Precision::FromName(precision);
    const double scale = mode.loss_scaling ? kLossScale : 1.0;
    torch::Tensor loss;
    {
      AutocastScope autocast(mode, device());
      loss = chunked ? ChunkedCausalLmLoss(hidden, labels, logits_of, {weight}, kLossChunkTokens,
                                           weight)
                     : CausalLmLoss(logits_of(hidden), labels);
    }
    (loss * scale).backward();
    return Result{loss.detach().cpu(), (hidden.grad() / scale).cpu(),
                  (weight.grad() / scale).cpu()};
  };
  const Result fp32 = run("32-true", false);
  for (const char* precision : {"32-true", "bf16-mixed", "16-mixed"}) {
    SCOPED_TRACE(precision);
    const Result plain = run(precision, false);
    const Result chunked = run(precision, true);
    ExpectRanTheKernelOf(device(), FusedOp::kCrossEntropy);
    const bool exact = std::string(precision) == "32-true";
    const auto bound = [&](const torch::Tensor& of_plain, const torch::Tensor& truth) {
      if (exact) return 1e-5;
      const torch::Tensor plain_error = (of_plain - truth).abs().max() / truth.abs().max();
      return 2 * std::max(plain_error.item<double>(), 1e-3);
    };
    ExpectClose(chunked.loss, fp32.loss, bound(plain.loss, fp32.loss), "loss");
    ExpectClose(chunked.hidden, fp32.hidden, bound(plain.hidden, fp32.hidden), "hidden gradient");
    ExpectClose(chunked.weight, fp32.weight, bound(plain.weight, fp32.weight), "weight gradient");
  }
}

TEST(FusedCrossEntropyGradTest, ALabelOutsideTheVocabularyIsRefused) {
  torch::Tensor logits = torch::randn({2, 16});
  const torch::Tensor labels = torch::tensor({3, 16}, torch::kInt64);
  try {
    FusedCrossEntropyGrad(logits, labels, torch::full({}, 0.5f));
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("label 16 is outside the vocabulary"),
              std::string::npos)
        << e.what_without_backtrace();
  }
}

// The error `call` raises, "" if none.
std::string ErrorOf(const std::function<void()>& call) {
  try {
    call();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

// Labels or an inverse count the op cannot pair with the logits are refused before any kernel
// reads them (on a GPU, a pointer to another device's memory); the meta device stands in for
// another device here.
TEST(FusedCrossEntropyGradTest, LabelsOrAnInverseCountThatDoNotFitTheLogitsAreRefused) {
  const torch::Tensor labels = torch::tensor({3, 5}, torch::kInt64);
  const torch::Tensor inverse_count = torch::full({}, 0.5f);
  const auto error = [](const torch::Tensor& labels, const torch::Tensor& inverse_count) {
    return ErrorOf([&] {
      torch::Tensor logits = torch::randn({2, 16});
      FusedCrossEntropyGrad(logits, labels, inverse_count);
    });
  };
  EXPECT_EQ(error(labels, inverse_count), "");
  EXPECT_NE(
      error(labels.to(torch::kInt32), inverse_count).find("the labels' dtype Int is not int64"),
      std::string::npos);
  EXPECT_NE(error(torch::tensor({3, 5, 7}, torch::kInt64), inverse_count)
                .find("the labels' shape [3] is not (2,)"),
            std::string::npos);
  EXPECT_NE(error(labels.to(torch::kMeta), inverse_count).find("the labels are on meta"),
            std::string::npos);
  EXPECT_NE(error(labels, inverse_count.to(torch::kMeta)).find("the inverse count is on meta"),
            std::string::npos);
  EXPECT_NE(error(labels, torch::full({2}, 0.5f)).find("the inverse count has 2 values"),
            std::string::npos);
}

// An input beside the leading one on another device, or of another dtype or shape, is not read by
// a kernel: the op records the fallback and why, and ATen's composition computes (or refuses the
// mixed devices itself). The meta device stands in for a second GPU.
TEST(KernelChoiceTest, InputsThatDoNotMatchTheLeadingOneFallBackWithTheReason) {
  const auto reason_after = [](FusedOp op, const std::function<void()>& call) {
    (void)ErrorOf(call);  // ATen's error, where it mixes no devices
    EXPECT_EQ(kernels::LastImplementation(op), Implementation::kAtenFallback);
    return kernels::LastFallbackReason(op);
  };
  const torch::Tensor x = torch::randn({2, 3, 4, 8});  // (B, T, H, D)
  const torch::Tensor w = torch::ones({8});
  EXPECT_EQ(reason_after(FusedOp::kRmsNorm, [&] { FusedRmsNorm(x, w.to(torch::kMeta), 1e-6); }),
            "the weight is on meta, the input on cpu");
  EXPECT_EQ(reason_after(FusedOp::kRmsNorm, [&] { FusedRmsNorm(x, torch::ones({1}), 1e-6); }),
            "the weight's shape is not (8,)");
  EXPECT_EQ(reason_after(FusedOp::kSwiGlu, [&] { FusedSwiGlu(x, x.to(torch::kMeta)); }),
            "up is on meta, gate on cpu");
  EXPECT_EQ(reason_after(FusedOp::kGeGlu, [&] { FusedGeGlu(x, x.to(torch::kMeta)); }),
            "up is on meta, gate on cpu");
  EXPECT_EQ(reason_after(FusedOp::kSwiGluLinear,
                         [&] {
                           FusedSwiGluLinear(x, x, torch::ones({5, 8}, torch::kMeta));
                         }),
            "the weight is on meta, gate on cpu");
  const torch::Tensor table = torch::ones({3, 8});  // (T, D)
  EXPECT_EQ(reason_after(FusedOp::kRope, [&] { FusedRope(x, table, table.to(torch::kMeta)); }),
            "the sin table is on meta, the input on cpu");
  EXPECT_EQ(reason_after(FusedOp::kRope, [&] { FusedRope(x, table.to(torch::kFloat64), table); }),
            "the cos table's dtype Double is not float32");
  EXPECT_EQ(reason_after(FusedOp::kRope, [&] { FusedRope(x, table, table.narrow(0, 0, 2)); }),
            "the sin table's shape is not (3, 8)");
  EXPECT_EQ(reason_after(FusedOp::kRope, [&] { FusedRope(x, table, table.to(torch::kBFloat16)); }),
            "the sin table's dtype BFloat16 is not float32");
}

#if defined(LLMCTL_HAVE_CUDA_KERNELS)
// The launchers of one block a row refuse more rows than a grid holds, before any CUDA call (so
// here, without a GPU): 2^32 + 1 rows would otherwise launch as one block.
TEST(CudaKernelsTest, MoreRowsThanAGridHoldsAreRefusedBeforeAnyLaunch) {
  using kernels::cuda::Element;
  const int64_t rows = (int64_t{1} << 32) + 1;
  for (const char* error :
       {kernels::cuda::RmsNormForward(Element::kBFloat16, nullptr, nullptr, nullptr, nullptr, rows,
                                      8, 1e-6f, nullptr),
        kernels::cuda::RmsNormBackward(Element::kBFloat16, nullptr, nullptr, nullptr, nullptr,
                                       nullptr, rows, 8, nullptr),
        kernels::cuda::CrossEntropyGrad(Element::kBFloat16, nullptr, nullptr, nullptr, nullptr,
                                        rows, 8, -100, nullptr)}) {
    ASSERT_NE(error, nullptr);
    EXPECT_NE(std::string(error).find("more rows than a grid has blocks"), std::string::npos)
        << error;
  }
}
#endif

// An input no kernel takes runs ATen's composition, and the record says so and why; a watch made
// before reports the op once, with the reason, however often it falls back after.
TEST(KernelChoiceTest, AFallbackIsRecordedWithItsReasonAndReportedOnce) {
  kernels::FallbackWatch watch;
  const torch::Tensor x = torch::randn({2, 8}, torch::kFloat64);
  const torch::Tensor w = torch::ones({8}, torch::kFloat64);
  EXPECT_TRUE(torch::allclose(FusedRmsNorm(x, w, 1e-6), trainer::AtenRmsNorm(x, w, 1e-6)));
  EXPECT_EQ(kernels::LastImplementation(FusedOp::kRmsNorm), Implementation::kAtenFallback);
  EXPECT_NE(kernels::LastFallbackReason(FusedOp::kRmsNorm).find("dtype Double"), std::string::npos)
      << kernels::LastFallbackReason(FusedOp::kRmsNorm);
  FusedRmsNorm(x.to(torch::kFloat32), w, 1e-6);  // a float64 weight: a second reason
  const std::vector<kernels::Fallback> first = watch.TakeNew();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].op, FusedOp::kRmsNorm);
  EXPECT_EQ(first[0].reason, "the weight's dtype Double is not the input's Float");
  FusedRmsNorm(x, w, 1e-6);
  EXPECT_TRUE(watch.TakeNew().empty()) << "each op is reported once";

  FusedRmsNorm(x.to(torch::kFloat32), w.to(torch::kFloat32), 1e-6);
  EXPECT_EQ(kernels::LastImplementation(FusedOp::kRmsNorm), Implementation::kCpuLoop);
  kernels::FallbackWatch later;
  EXPECT_TRUE(later.TakeNew().empty()) << "a watch reports only what falls back after it is made";
}

INSTANTIATE_TEST_SUITE_P(Devices, FusedOpsOn, ::testing::Values(torch::kCPU, torch::kCUDA),
                         [](const ::testing::TestParamInfo<torch::DeviceType>& info) {
                           return std::string(info.param == torch::kCUDA ? "cuda" : "cpu");
                         });

}  // namespace
}  // namespace llmctl::trainer
