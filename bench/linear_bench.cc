// The trainer's bf16 linear layer (trainer/kernels/linear.h) against ATen's, forward and both
// gradients, at the CPU lab's projections (experiments/models/cpu-lab-large: 768 wide, MLP 2,048;
// cpu-lab-small: 384, 1,024) and at a micro-batch's token rows (the lab's 1 and 4 sequences of
// about 90 tokens), on the CPU with the threads LibTorch was given. Each cell runs a layer of
// kWeights weights in turn, as a step runs its layers, so that their bf16 values come from memory
// rather than a core's cache. On a CPU where LibTorch has no native bf16 GEMM (common/cpu_matmul.h:
// a Zen 3, Cascade Lake; or ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI) ours is the fp32 route, and
// ATen's bf16 side is LibTorch's own slower path; elsewhere both are ATen's. The fp32 column is
// the same products in fp32, for scale. Prints each side's median of `repeats` passes,
// interleaved, and ATen bf16 / ours (> 1: ours is faster).
//
//   build/bench/linear_bench [repeats]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <utility>
#include <vector>

#include "common/median.h"
#include "trainer/kernels/linear.h"

namespace {

constexpr int kWeights = 8;

using LinearFn = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>;

// One pass: each of `weights` (O, I) forward on x (T, I) and backward from dy (T, O), in seconds.
double TimePass(const LinearFn& linear, const std::vector<torch::Tensor>& weights,
                const torch::Tensor& x, const torch::Tensor& dy) {
  const auto start = std::chrono::steady_clock::now();
  for (const torch::Tensor& weight : weights) {
    torch::Tensor leaf_x = x.detach().requires_grad_(true);
    torch::Tensor leaf_w = weight.detach().requires_grad_(true);
    linear(leaf_x, leaf_w).backward(dy);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void Compare(int64_t tokens, int64_t in, int64_t out, int repeats) {
  std::vector<torch::Tensor> bf16_weights, fp32_weights;
  for (int i = 0; i < kWeights; ++i) {
    fp32_weights.push_back(torch::randn({out, in}) * 0.02);  // (O, I)
    bf16_weights.push_back(fp32_weights.back().to(torch::kBFloat16));
  }
  const torch::Tensor x = torch::randn({tokens, in});    // (T, I)
  const torch::Tensor dy = torch::randn({tokens, out});  // (T, O)
  const torch::Tensor x16 = x.to(torch::kBFloat16);
  const torch::Tensor dy16 = dy.to(torch::kBFloat16);
  const LinearFn aten = [](const torch::Tensor& x, const torch::Tensor& w) {
    return torch::linear(x, w);
  };
  const LinearFn ours = [](const torch::Tensor& x, const torch::Tensor& w) {
    return llmctl::trainer::Linear(x, w);
  };
  std::vector<double> aten_s, ours_s, fp32_s;
  // Warm-up: first-touch allocations, the GEMMs' kernels for these shapes.
  TimePass(aten, bf16_weights, x16, dy16);
  TimePass(ours, bf16_weights, x16, dy16);
  TimePass(aten, fp32_weights, x, dy);
  for (int i = 0; i < repeats; ++i) {
    aten_s.push_back(TimePass(aten, bf16_weights, x16, dy16));
    ours_s.push_back(TimePass(ours, bf16_weights, x16, dy16));
    fp32_s.push_back(TimePass(aten, fp32_weights, x, dy));
  }
  const double a = llmctl::Median(aten_s), o = llmctl::Median(ours_s), f = llmctl::Median(fp32_s);
  const double flops = 6.0 * static_cast<double>(tokens * in * out * kWeights);
  std::printf("| %lld | %lld x %lld | %.2f | %.2f | %.2f | %.0f | %.2fx |\n",
              static_cast<long long>(tokens), static_cast<long long>(in),
              static_cast<long long>(out), a * 1e3, o * 1e3, f * 1e3, flops / o / 1e9, a / o);
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::max(1, std::atoi(argv[1])) : 9;
  torch::manual_seed(0);
  std::printf("bf16 GEMM route: %s; %d threads; %d weights a pass\n",
              llmctl::trainer::MultipliesInFp32(torch::empty({1, 1}, torch::kBFloat16),
                                                torch::empty({1, 1}, torch::kBFloat16))
                  ? "the trainer's fp32 route"
                  : "LibTorch's native bf16 GEMM",
              torch::get_num_threads(), kWeights);
  std::printf(
      "| tokens | in x out | ATen bf16 ms | ours ms | fp32 ms | ours GFLOP/s | ATen / ours |\n");
  std::printf("|---:|---|---:|---:|---:|---:|---:|\n");
  for (const int64_t tokens : {96, 384}) {
    for (const auto& [in, out] : std::vector<std::pair<int64_t, int64_t>>{
             {384, 1024}, {1024, 384}, {768, 768}, {768, 2048}, {2048, 768}}) {
      Compare(tokens, in, out, repeats);
    }
  }
  return 0;
}
