// The fused decoder-block ops (trainer/kernels/fused_ops.h) against the ATen composition
// transformers runs, op by op, forward and backward, at bench/run_train_bench.py's shapes (the 110M
// LLaMA at micro-batch 4 x 256: 1,024 tokens, hidden 768, MLP 2,048, 12 heads of 64), in fp32 and
// bf16, on the CPU with the threads LibTorch was given, and one chunk of the chunked loss' fused
// cross-entropy gradient. Prints each op's median time of `repeats`
// runs per side, interleaved, and the ratio aten / fused (> 1: fused is faster).
//
//   build/bench/fused_ops_bench [repeats]
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "common/median.h"
#include "common/model_config.h"
#include "trainer/kernels/fused_ops.h"
#include "trainer/model/llama.h"

namespace {

using llmctl::trainer::AtenCrossEntropyGrad;
using llmctl::trainer::FusedCrossEntropyGrad;
using llmctl::trainer::FusedRmsNorm;
using llmctl::trainer::FusedRope;
using llmctl::trainer::FusedSwiGlu;

constexpr int64_t kTokens = 1024;
constexpr int64_t kHidden = 768;
constexpr int64_t kInter = 2048;
constexpr int64_t kHeads = 12;
constexpr int64_t kHeadDim = 64;
constexpr int64_t kVocab = 32000;

// Forward and backward of `op` on leaves made from `inputs`, in seconds.
double TimeOnce(const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& op,
                const std::vector<torch::Tensor>& inputs, const torch::Tensor& grad) {
  std::vector<torch::Tensor> leaves;
  for (const torch::Tensor& t : inputs) leaves.push_back(t.detach().requires_grad_(true));
  const auto start = std::chrono::steady_clock::now();
  op(leaves).backward(grad);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void Compare(const std::string& name, torch::Dtype dtype, int repeats,
             const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& aten,
             const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& fused,
             const std::vector<torch::Tensor>& inputs, const torch::Tensor& grad) {
  std::vector<double> aten_s, fused_s;
  TimeOnce(aten, inputs, grad);  // warm-up: first-touch allocations, oneDNN/ATen dispatch
  TimeOnce(fused, inputs, grad);
  for (int i = 0; i < repeats; ++i) {
    aten_s.push_back(TimeOnce(aten, inputs, grad));
    fused_s.push_back(TimeOnce(fused, inputs, grad));
  }
  const double a = llmctl::Median(aten_s);
  const double f = llmctl::Median(fused_s);
  std::printf("| %s | %s | %.2f | %.2f | %.2fx |\n", name.c_str(), c10::toString(dtype), a * 1e3,
              f * 1e3, a / f);
}

// `op` over a fresh copy of `logits` (the copy not timed), in seconds.
double TimeInPlace(const std::function<void(torch::Tensor&)>& op, const torch::Tensor& logits) {
  torch::Tensor copy = logits.clone();
  const auto start = std::chrono::steady_clock::now();
  op(copy);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void CompareInPlace(const std::string& name, torch::Dtype dtype, int repeats,
                    const std::function<void(torch::Tensor&)>& aten,
                    const std::function<void(torch::Tensor&)>& fused, const torch::Tensor& logits) {
  std::vector<double> aten_s, fused_s;
  TimeInPlace(aten, logits);
  TimeInPlace(fused, logits);
  for (int i = 0; i < repeats; ++i) {
    aten_s.push_back(TimeInPlace(aten, logits));
    fused_s.push_back(TimeInPlace(fused, logits));
  }
  const double a = llmctl::Median(aten_s);
  const double f = llmctl::Median(fused_s);
  std::printf("| %s | %s | %.2f | %.2f | %.2fx |\n", name.c_str(), c10::toString(dtype), a * 1e3,
              f * 1e3, a / f);
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 20;
  llmctl::ModelConfig config = *llmctl::FindPreset("llmctl-demo");
  config.head_dim = kHeadDim;
  const llmctl::trainer::RotaryTables rope =
      llmctl::trainer::MakeRotaryTables(config, 256, torch::kCPU);
  std::printf("%d threads, %d repeats; forward + backward, median ms\n\n", torch::get_num_threads(),
              repeats);
  std::printf("| op | dtype | aten ms | fused ms | aten / fused |\n|---|---|---:|---:|---:|\n");
  for (const torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    torch::manual_seed(1);
    const torch::Tensor x = torch::randn({4, 256, kHidden}).to(dtype);
    const torch::Tensor w = torch::ones({kHidden}).to(dtype);
    Compare(
        "RMSNorm (1,024 x 768)", dtype, repeats,
        [](const std::vector<torch::Tensor>& in) {
          auto x32 = in[0].to(torch::kFloat32);
          auto variance = x32.pow(2).mean(-1, true);
          return in[1] * (x32 * torch::rsqrt(variance + 1e-5)).to(in[0].scalar_type());
        },
        [](const std::vector<torch::Tensor>& in) { return FusedRmsNorm(in[0], in[1], 1e-5); },
        {x, w}, torch::randn_like(x));
    const torch::Tensor g = torch::randn({4, 256, kInter}).to(dtype);
    const torch::Tensor u = torch::randn({4, 256, kInter}).to(dtype);
    Compare(
        "SwiGLU (1,024 x 2,048)", dtype, repeats,
        [](const std::vector<torch::Tensor>& in) { return torch::silu(in[0]) * in[1]; },
        [](const std::vector<torch::Tensor>& in) { return FusedSwiGlu(in[0], in[1]); }, {g, u},
        torch::randn_like(g));
    const torch::Tensor q = torch::randn({4, 256, kHeads, kHeadDim}).to(dtype);
    Compare(
        "RoPE (1,024 x 12 x 64)", dtype, repeats,
        [&](const std::vector<torch::Tensor>& in) {
          const torch::Tensor t = in[0].transpose(1, 2);
          const torch::Tensor rotated = torch::cat(
              {-t.narrow(-1, kHeadDim / 2, kHeadDim / 2), t.narrow(-1, 0, kHeadDim / 2)}, -1);
          return (t * rope.cos.to(t.scalar_type()) + rotated * rope.sin.to(t.scalar_type()))
              .transpose(1, 2);
        },
        [&](const std::vector<torch::Tensor>& in) { return FusedRope(in[0], rope.cos, rope.sin); },
        {q}, torch::randn_like(q));
    // One chunk of the chunked loss (256 tokens of a 32,000-token vocabulary): the loss and, in
    // place, its gradient over the logits.
    const torch::Tensor logits = (torch::randn({256, kVocab}) * 4).to(dtype);
    const torch::Tensor labels = torch::randint(kVocab, {256}, torch::kInt64);
    const torch::Tensor inverse_count = torch::full({}, 1.0f / 1024);
    CompareInPlace(
        "cross-entropy gradient (256 x 32,000)", dtype, repeats,
        [&](torch::Tensor& l) { AtenCrossEntropyGrad(l, labels, inverse_count); },
        [&](torch::Tensor& l) { FusedCrossEntropyGrad(l, labels, inverse_count); }, logits);
  }
  return 0;
}
