#include "trainer/train/rate_probe.h"

#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "common/cpu_model.h"
#include "common/nvml/gpu_probe.h"
#include "trainer/train/versions.h"

namespace llmctl::trainer {
namespace {

using Clock = std::chrono::steady_clock;

// The weight sizes of the probed matmuls: a small model's hidden sizes up to a 1B model's.
constexpr int64_t kMatmulSizes[] = {256, 512, 1024};
// The rows of a micro-batch the matmuls are timed at, ending at estimate::kProbeMatmulTokens: a
// CPU trial's micro-batch holds a few hundred tokens, and a GEMM over fewer rows runs well below
// the rate of 512 (measured 11-29 on a Zen 3: a LLaMA step's 190-row matmuls at 46 GFLOP/s, one
// thread, where 512 rows ran at 67); a GPU's holds thousands.
constexpr int64_t kCpuMatmulTokens[] = {128, 256, estimate::kProbeMatmulTokens};
constexpr int64_t kCudaMatmulTokens[] = {estimate::kProbeMatmulTokens, 2048, 8192};
// Causal attention as a small model's micro-batch has it: batch 2, 8 heads, 128 tokens, 64 wide.
constexpr int64_t kSdpaBatch = 2, kSdpaHeads = 8, kSdpaTokens = 128, kSdpaWidth = 64;
constexpr int64_t kCopyBytes = 64 << 20;
constexpr int64_t kAdamValues = 4 << 20;
// A timed sample runs enough calls to last this long, so a clock read or a device
// synchronisation does not count in a short op's time.
constexpr double kSampleSeconds = 2e-3;

double Elapsed(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

class Timer {
 public:
  Timer(torch::Device device, double seconds) : device_(device), seconds_(seconds) {}

  // The median seconds of one call of `run` over samples lasting at least `seconds` in all
  // (at least two samples, after one call that warms caches and kernels up). The median, not
  // the mean: a sample slowed by something else on the machine does not move it.
  double SecondsPerCall(const std::function<void()>& run) const {
    const Clock::time_point warm = Clock::now();
    run();
    Sync();
    const double first = Elapsed(warm);
    const int64_t calls = first >= kSampleSeconds
                              ? 1
                              : static_cast<int64_t>(std::ceil(kSampleSeconds / first + 1e-12));
    std::vector<double> samples;
    const Clock::time_point start = Clock::now();
    while (samples.size() < 2 || (Elapsed(start) < seconds_ && samples.size() < 10000)) {
      const Clock::time_point t = Clock::now();
      for (int64_t i = 0; i < calls; ++i) run();
      Sync();
      samples.push_back(Elapsed(t) / static_cast<double>(calls));
    }
    std::nth_element(samples.begin(), samples.begin() + static_cast<ptrdiff_t>(samples.size() / 2),
                     samples.end());
    return samples[samples.size() / 2];
  }

  torch::Device device() const { return device_; }
  double seconds() const { return seconds_; }

 private:
  void Sync() const {
    if (device_.is_cuda()) torch::cuda::synchronize();
  }

  torch::Device device_;
  double seconds_;
};

torch::ScalarType DtypeOf(const std::string& name) {
  return name == "bf16" ? torch::kBFloat16 : name == "fp16" ? torch::kHalf : torch::kFloat;
}

// A projection's forward and both of its backward matmuls, (tokens x size) x (size x size): the
// three layouts a training step runs, at each of the device's micro-batch token counts (the rows
// other than kProbeMatmulTokens' in half the time, to keep the probe short). Sizes go up until a
// call would take longer than a measurement (a CPU that emulates 16-bit matmuls).
void ProbeMatmuls(const Timer& timer, estimate::RateProbe& probe) {
  torch::NoGradGuard no_grad;
  const Timer shorter(timer.device(), timer.seconds() / 2);
  const bool cuda = timer.device().is_cuda();
  const std::vector<int64_t> token_counts =
      cuda ? std::vector<int64_t>(std::begin(kCudaMatmulTokens), std::end(kCudaMatmulTokens))
           : std::vector<int64_t>(std::begin(kCpuMatmulTokens), std::end(kCpuMatmulTokens));
  for (const std::string dtype : {"fp32", "bf16", "fp16"}) {
    const auto options = torch::TensorOptions().dtype(DtypeOf(dtype)).device(timer.device());
    // The estimate times a step's matmuls at fp32's or bf16's rates (rate_probe.h's ProbedSpeed):
    // fp16's are kept at one token count, for `llmctl nodes`, and cost the probe less.
    const std::vector<int64_t> dtype_token_counts =
        dtype == "fp16" ? std::vector<int64_t>{estimate::kProbeMatmulTokens} : token_counts;
    for (const int64_t size : kMatmulSizes) {
      const torch::Tensor w = torch::randn({size, size}, options);
      double longest = 0;
      for (const int64_t tokens : dtype_token_counts) {
        const torch::Tensor x = torch::randn({tokens, size}, options);
        const torch::Tensor dy = torch::randn({tokens, size}, options);
        const Timer& used = tokens == estimate::kProbeMatmulTokens ? timer : shorter;
        const double seconds = used.SecondsPerCall([&] {
          (void)torch::matmul(x, w);
          (void)torch::matmul(dy, w.t());
          (void)torch::matmul(dy.t(), x);
        });
        const double flops = 3 * 2 * static_cast<double>(tokens * size * size);
        probe.matmul.push_back({dtype, size, flops / seconds, tokens});
        longest = std::max(longest, seconds);
      }
      // The next size does four times the work.
      if (4 * longest > timer.seconds()) break;
    }
  }
}

void ProbeAttention(const Timer& timer, estimate::RateProbe& probe) {
  torch::NoGradGuard no_grad;
  for (const std::string dtype : {"fp32", "bf16", "fp16"}) {
    const auto options = torch::TensorOptions().dtype(DtypeOf(dtype)).device(timer.device());
    const std::vector<int64_t> shape = {kSdpaBatch, kSdpaHeads, kSdpaTokens, kSdpaWidth};
    const torch::Tensor q = torch::randn(shape, options);
    const torch::Tensor k = torch::randn(shape, options);
    const torch::Tensor v = torch::randn(shape, options);
    const double seconds = timer.SecondsPerCall([&] {
      (void)at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                             /*is_causal=*/true);
    });
    // Scores and weighted sum, the causal half not discounted (as step_work.h counts them).
    const double flops =
        4.0 * static_cast<double>(kSdpaBatch * kSdpaHeads * kSdpaTokens * kSdpaTokens * kSdpaWidth);
    probe.sdpa.push_back({dtype, flops / seconds});
  }
}

void ProbeMemoryAndLaunches(const Timer& timer, estimate::RateProbe& probe) {
  torch::NoGradGuard no_grad;
  const auto options = torch::TensorOptions().dtype(torch::kFloat).device(timer.device());
  const torch::Tensor source = torch::randn({kCopyBytes / 4}, options);
  torch::Tensor target = torch::empty_like(source);
  probe.memory_bytes_per_s =
      2.0 * kCopyBytes / timer.SecondsPerCall([&] { target.copy_(source); });
  torch::Tensor one = torch::zeros({1}, options);
  probe.launch_seconds = timer.SecondsPerCall([&] { one.add_(1); });
}

// One fused AdamW step over kAdamValues fp32 values on the host: an offloaded optimizer's step.
void ProbeHostAdamW(const Timer& host, estimate::RateProbe& probe) {
  torch::NoGradGuard no_grad;
  const torch::Tensor param = torch::randn({kAdamValues});
  const torch::Tensor grad = torch::randn({kAdamValues});
  const torch::Tensor exp_avg = torch::zeros({kAdamValues});
  const torch::Tensor exp_avg_sq = torch::zeros({kAdamValues});
  const torch::Tensor step = torch::zeros({1});
  const double seconds = host.SecondsPerCall([&] {
    step.add_(1);
    at::_fused_adamw_({param}, {grad}, {exp_avg}, {exp_avg_sq}, /*max_exp_avg_sqs=*/{}, {step},
                      1e-6, 0.9, 0.999, 0.0, 1e-8, /*amsgrad=*/false, /*maximize=*/false);
  });
  probe.host_adamw_values_per_s = kAdamValues / seconds;
}

void ProbeHostLink(const Timer& timer, estimate::RateProbe& probe) {
  torch::NoGradGuard no_grad;
  const torch::Tensor host = torch::empty({kCopyBytes / 4}, torch::kFloat).pin_memory();
  torch::Tensor device = torch::empty({kCopyBytes / 4}, torch::kFloat).to(timer.device());
  probe.host_to_device_bytes_per_s = kCopyBytes / timer.SecondsPerCall([&] { device.copy_(host); });
  probe.device_to_host_bytes_per_s = kCopyBytes / timer.SecondsPerCall([&] { host.copy_(device); });
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string GpuName() {
  auto nvml = nvml::OpenNvml();
  if (!nvml.ok()) return "cuda";
  auto name = (*nvml)->Name(0);
  return name.ok() ? *name : "cuda";
}

}  // namespace

StatusOr<estimate::RateProbe> ProbeRates(const RateProbeOptions& options) {
  if (options.device != "cpu" && options.device != "cuda") {
    return InvalidArgumentError("--probe-device: expected cpu or cuda, got '" + options.device +
                                "'");
  }
  const bool cuda = options.device == "cuda";
  if (cuda && !torch::cuda::is_available()) {
    return FailedPreconditionError(
        "--probe-device cuda: LibTorch sees no CUDA device on this machine (a CPU LibTorch, no "
        "GPU, or a driver too old for it)");
  }
  const Clock::time_point start = Clock::now();
  estimate::RateProbe probe;
  probe.measured_at = UtcNow();
  probe.device = options.device;
  probe.device_name = cuda ? GpuName() : CpuModelName();
  probe.threads = at::get_num_threads();
  probe.versions = ProbeTrainerVersions();
  const Timer timer(cuda ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU),
                    options.seconds_per_measurement);
  torch::manual_seed(0);
  ProbeMatmuls(timer, probe);
  ProbeAttention(timer, probe);
  ProbeMemoryAndLaunches(timer, probe);
  ProbeHostAdamW(Timer(torch::Device(torch::kCPU), options.seconds_per_measurement), probe);
  if (cuda) ProbeHostLink(timer, probe);
  probe.seconds = Elapsed(start);
  return probe;
}

}  // namespace llmctl::trainer
