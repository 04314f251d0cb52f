// quant_bench: CPU throughput of the bitsandbytes-compatible quantisation (trainer/quant) and of
// one 8-bit AdamW step (trainer/train/adamw_8bit) beside PyTorch's fused AdamW (at::_fused_adamw_,
// what optimizer "adamw" runs) on the same parameters. A benchmark, not a test: nothing is
// asserted.
//
//   build/bench/quant_bench [--threads N] [--repeats R]
//
// Every time is the best of R runs (the machine may be shared). "peak MiB" is the counting
// allocator's high-water mark during the call minus the bytes allocated before it: the outputs plus
// any temporaries for quantisation, the transient memory of an optimizer step.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "trainer/memory/counting_allocator.h"
#include "trainer/quant/quant.h"
#include "trainer/train/optimizer.h"

namespace llmctl::trainer {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

struct Timing {
  double seconds = 1e30;
  uint64_t peak_bytes = 0;  // largest over the runs
};

// Runs `fn` `repeats` times; the fastest time and the largest peak above the bytes allocated
// before.
Timing Measure(int repeats, const std::function<void()>& fn) {
  CountingCpuAllocator& allocator = *CountingCpuAllocator::Installed();
  Timing timing;
  for (int r = 0; r < repeats; ++r) {
    const uint64_t before = allocator.device().allocated_bytes;
    allocator.ResetPeaks();
    const auto start = std::chrono::steady_clock::now();
    fn();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    timing.seconds = std::min(timing.seconds, seconds);
    timing.peak_bytes = std::max(timing.peak_bytes, allocator.device().peak_bytes - before);
  }
  return timing;
}

void BenchQuantisation(int repeats) {
  torch::manual_seed(0);
  const torch::Tensor weight = torch::randn({4096, 4096}).mul_(0.02);
  const double numel = static_cast<double>(weight.numel());
  std::printf("quantisation, 4096x4096 (%.1f Mparam)\n", numel / 1e6);
  std::printf("  %-40s %10s %12s %14s\n", "", "ms", "Mparam/s", "peak MiB");
  auto row = [&](const char* name, const Timing& t) {
    std::printf("  %-40s %10.1f %12.0f %14.1f\n", name, t.seconds * 1e3, numel / t.seconds / 1e6,
                static_cast<double>(t.peak_bytes) / kMiB);
  };
  const torch::Tensor bf16 = weight.to(torch::kBFloat16);
  for (const bool double_quant : {false, true}) {
    for (const torch::Tensor& w : {bf16, weight}) {
      const std::string name = std::string("QuantizeNf4 ") +
                               (w.scalar_type() == torch::kFloat32 ? "fp32" : "bf16") +
                               (double_quant ? ", double quant" : ", plain");
      row(name.c_str(), Measure(repeats, [&] { QuantizeNf4(w, double_quant); }));
    }
  }
  const Nf4Weight nf4 = QuantizeNf4(bf16, /*double_quant=*/true);
  row("DequantizeNf4 -> bf16 (double quant)",
      Measure(repeats, [&] { DequantizeNf4(nf4, torch::kBFloat16); }));
  const torch::Tensor signed_map = DynamicMap(/*is_signed=*/true);
  row("QuantizeBlockwise8bit fp32, 256",
      Measure(repeats, [&] { QuantizeBlockwise8bit(weight, signed_map, 256); }));
  const Blockwise8bit q = QuantizeBlockwise8bit(weight, signed_map, 256);
  row("DequantizeBlockwise8bit, 256",
      Measure(repeats, [&] { DequantizeBlockwise8bit(q, signed_map); }));
}

// A transformer-like parameter set of ~30M: sixteen 768x2048 MLP matrices, an embedding, four
// 768x768 projections and a few norm vectors (small: fp32 state in the 8-bit optimizer).
std::vector<torch::Tensor> MakeParams(torch::ScalarType dtype) {
  std::vector<std::vector<int64_t>> shapes = {{4000, 768}};
  for (int i = 0; i < 8; ++i) shapes.insert(shapes.end(), {{768, 2048}, {2048, 768}});
  for (int i = 0; i < 4; ++i) shapes.insert(shapes.end(), {{768, 768}, {768}});
  std::vector<torch::Tensor> params;
  for (const auto& shape : shapes) {
    torch::Tensor p = (torch::randn(shape) * 0.02).to(dtype).requires_grad_(true);
    p.mutable_grad() = (torch::randn(shape) * 1e-3).to(dtype);
    params.push_back(p);
  }
  return params;
}

void BenchOptimizers(int repeats) {
  for (const torch::ScalarType dtype : {torch::kBFloat16, torch::kFloat32}) {
    int64_t numel = 0;
    for (const torch::Tensor& p : MakeParams(dtype)) numel += p.numel();
    std::printf("optimizer step, %.1f Mparam %s\n", static_cast<double>(numel) / 1e6,
                torch::toString(dtype));
    std::printf("  %-40s %10s %12s %14s\n", "", "ms", "Mparam/s", "peak MiB");
    for (const std::string name : {"adamw_8bit", "adamw"}) {
      std::vector<torch::Tensor> params = MakeParams(dtype);
      OptimizerOptions options;
      options.name = name;
      options.weight_decay = 0.01;
      auto optimizer = std::move(*MakeOptimizer(options, params));
      optimizer->Step(1e-4);  // creates the state
      const Timing t = Measure(repeats, [&] { optimizer->Step(1e-4); });
      const std::string label = name == "adamw" ? "adamw (at::_fused_adamw_)" : name;
      std::printf("  %-40s %10.1f %12.0f %14.1f\n", label.c_str(), t.seconds * 1e3,
                  static_cast<double>(numel) / t.seconds / 1e6,
                  static_cast<double>(t.peak_bytes) / kMiB);
    }
  }
}

}  // namespace
}  // namespace llmctl::trainer

int main(int argc, char** argv) {
  int threads = 2;
  int repeats = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--threads") == 0) {
      threads = std::atoi(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--repeats") == 0) {
      repeats = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: %s [--threads N] [--repeats R]\n", argv[0]);
      return 2;
    }
  }
  llmctl::trainer::CountingCpuAllocator::Install();
  at::set_num_threads(threads);
  std::printf("threads %d, best of %d\n", at::get_num_threads(), repeats);
  llmctl::trainer::BenchQuantisation(repeats);
  llmctl::trainer::BenchOptimizers(repeats);
  return 0;
}
