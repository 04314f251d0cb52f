// RateProbe's figures read as rates (rate_probe.h): the tables by dtype and shape the estimate
// interpolates, the identity a node's probe is kept by, and what its moment says of it. The JSON
// it is read from and written to: rate_probe_json.cc.
#include "common/estimate/rate_probe.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/machine_cpu.h"
#include "common/median.h"

namespace llmctl::estimate {

std::vector<ShapeRate> RateProbe::MatmulRates(const std::string& dtype) const {
  std::vector<ShapeRate> rates;
  for (const ProbedMatmul& m : matmul) {
    if (m.dtype == dtype && m.flops_per_s > 0) rates.push_back({m.tokens, m.size, m.flops_per_s});
  }
  return rates;
}

double RateProbe::MatmulFlops(const std::string& dtype, int64_t size, int64_t tokens) const {
  const std::vector<ShapeRate> rates = MatmulRates(dtype);
  return rates.empty() ? 0
                       : RateAtShape(rates, static_cast<double>(tokens), static_cast<double>(size));
}

std::vector<ShapeRate> RateProbe::HeadRates(const std::string& dtype) const {
  std::vector<ShapeRate> rates;
  for (const ProbedHead& h : head_matmul) {
    if (h.dtype == dtype && h.flops_per_s > 0) rates.push_back({h.tokens, h.hidden, h.flops_per_s});
  }
  return rates;
}

MatmulBuffers RateProbe::HeadBuffers() const {
  MatmulBuffers buffers;
  for (const ProbedHeadBuffers& b : head_buffers) {
    std::vector<HeadProductBuffers>& heads = b.dtype == "bf16" ? buffers.bf16 : buffers.fp32;
    auto at = std::find_if(heads.begin(), heads.end(),
                           [&b](const HeadProductBuffers& h) { return h.vocab == b.vocab; });
    if (at == heads.end()) at = heads.insert(heads.end(), HeadProductBuffers{.vocab = b.vocab});
    at->logits = std::max(at->logits, b.logits_bytes);
    at->input_gradient = std::max(at->input_gradient, b.input_gradient_bytes);
    at->weight_gradient = std::max(at->weight_gradient, b.weight_gradient_bytes);
  }
  for (std::vector<HeadProductBuffers>* heads : {&buffers.fp32, &buffers.bf16}) {
    std::sort(
        heads->begin(), heads->end(),
        [](const HeadProductBuffers& a, const HeadProductBuffers& b) { return a.vocab < b.vocab; });
  }
  return buffers;
}

std::vector<ShapeRate> RateProbe::AttentionRates(const std::string& dtype) const {
  std::vector<ShapeRate> rates;
  for (const ProbedAttention& a : sdpa) {
    if (a.dtype == dtype && a.flops_per_s > 0) {
      rates.push_back({a.tokens, a.head_width, a.flops_per_s});
    }
  }
  return rates;
}

std::vector<ElementwiseRate> RateProbe::ElementwiseRates(const std::string& dtype) const {
  // By size; two cells of one size (another process's JSON) keep the first.
  std::map<int64_t, double> by_bytes;
  for (const ProbedElementwise& e : elementwise) {
    if (e.dtype == dtype && e.bytes_per_s > 0) by_bytes.emplace(e.bytes, e.bytes_per_s);
  }
  std::vector<ElementwiseRate> rates;
  for (const auto& [bytes, rate] : by_bytes) {
    rates.push_back({static_cast<double>(bytes), rate});
  }
  return rates;
}

std::vector<LayerElementwiseRate> RateProbe::LayerElementwiseRates() const {
  // By dtypes, kernels and stream size; two cells of one key (another process's JSON) keep the
  // first.
  std::map<std::tuple<MatmulClass, MatmulClass, Kernels, double>, double> by_key;
  for (const ProbedLayerElementwise& l : layer_elementwise) {
    if (!(l.seconds > 0)) continue;
    const MatmulClass stream = MatmulClassNamed(l.stream),
                      projected = MatmulClassNamed(l.projected);
    const Kernels kernels = KernelsNamed(l.kernels);
    const double stream_element = stream == MatmulClass::kBf16 ? 2 : 4;
    const double tokens = static_cast<double>(l.tokens);
    const double bytes =
        tokens * LayerElementwiseBytes({.hidden = static_cast<double>(l.hidden),
                                        .q = static_cast<double>(l.q_width),
                                        .kv = static_cast<double>(l.kv_width),
                                        .inter = static_cast<double>(l.inter)},
                                       stream_element, projected == MatmulClass::kBf16 ? 2 : 4,
                                       kernels);
    // The cell's ops' dispatch, which the step's launches count, is not its bytes' time; a
    // quarter of the cell at the least, should its launches have been measured slow.
    const double dispatch = LayerElementwiseLaunches(kernels) * launch_seconds;
    const double seconds = std::max(l.seconds - dispatch, l.seconds / 4);
    by_key.emplace(std::tuple{stream, projected, kernels,
                              tokens * static_cast<double>(l.hidden) * stream_element},
                   bytes / seconds);
  }
  std::vector<LayerElementwiseRate> rates;
  for (const auto& [key, rate] : by_key) {
    const auto& [stream, projected, kernels, tensor_bytes] = key;
    rates.push_back({stream, projected, kernels, tensor_bytes, rate});
  }
  return rates;
}

bool RateProbe::SameIdentity(const RateProbe& other) const {
  return device == other.device && device_name == other.device_name && threads == other.threads &&
         versions.ToJson() == other.versions.ToJson();
}

namespace {

bool SpeedMoved(const RateProbe& probe) {
  return probe.speed_spread && *probe.speed_spread >= kSpreadWorthSaying;
}
bool OthersBusy(const RateProbe& probe) {
  return probe.others_cpu_share && *probe.others_cpu_share >= kBusyMachineShare;
}
// A GPU probe measures no new lengths: its driver's system calls say nothing of them.
bool KernelBusy(const RateProbe& probe) {
  return probe.device == "cpu" && probe.kernel_cpu_share &&
         *probe.kernel_cpu_share >= kKernelShareWorthSaying;
}

}  // namespace

bool RateProbe::WarnsOfItsMoment() const {
  return SpeedMoved(*this) || OthersBusy(*this) || KernelBusy(*this);
}

std::string RateProbe::Summary() const {
  std::string summary = device + " " + device_name + " (" + std::to_string(threads) + " thread" +
                        (threads == 1 ? "" : "s") + ", LibTorch " + versions.libtorch + "), " +
                        measured_at;
  if (SpeedMoved(*this)) {
    char moved[96];
    std::snprintf(moved, sizeof moved, ", its speed moving %.0f%% while measured",
                  *speed_spread * 100);
    summary += moved;
  }
  if (OthersBusy(*this)) {
    char busy[96];
    std::snprintf(busy, sizeof busy, ", other processes taking %.0f%% of its CPU time meanwhile",
                  *others_cpu_share * 100);
    summary += busy;
  }
  if (KernelBusy(*this)) {
    char kernel[128];
    std::snprintf(kernel, sizeof kernel,
                  ", the kernel taking %.0f%% of its CPU time (page faults: a new length's cost "
                  "may read high)",
                  *kernel_cpu_share * 100);
    summary += kernel;
  }
  return summary;
}

double SpeedSpread(const std::vector<std::vector<double>>& samples) {
  std::vector<double> spreads;
  for (const std::vector<double>& measured : samples) {
    if (measured.size() < 2) continue;
    const auto [quickest, slowest] = std::minmax_element(measured.begin(), measured.end());
    if (*quickest > 0) spreads.push_back(*slowest / *quickest - 1);
  }
  return spreads.empty() ? 0 : Median(std::move(spreads));
}

}  // namespace llmctl::estimate
