#include "controller/cli/rates_text.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "common/byte_size.h"
#include "common/estimate/gpus.h"
#include "common/estimate/rate_probe.h"
#include "common/estimate/step_time.h"
#include "common/status.h"
#include "common/text.h"
#include "controller/cli/local_rates.h"

namespace llmctl::cli {
namespace {

// "fp32 51 GFLOP/s (sheet 192)": a measured rate in its unit, beside the data sheet's when there is
// one; 0 was not measured.
std::string RateText(const std::optional<estimate::DeviceSpeed>& sheet, const char* name,
                     double value, double sheet_value, double unit, const char* unit_name) {
  char text[96];
  if (value > 0) {
    std::snprintf(text, sizeof text, "%s %.3g %s", name, value / unit, unit_name);
  } else {
    std::snprintf(text, sizeof text, "%s not measured", name);
  }
  std::string described = text;
  if (sheet.has_value()) {
    std::snprintf(text, sizeof text, " (sheet %.3g)", sheet_value / unit);
    described += text;
  }
  return described;
}

// A CPU's own optimizer step, quantisation and dropout rates, each from the probe version that
// measures it: "8-bit AdamW 90 M values/s (sheet 83.3), NF4 dequant ...".
std::string CpuWorkRates(const estimate::RateProbe& probe,
                         const std::optional<estimate::DeviceSpeed>& sheet,
                         const estimate::DeviceSpeed& nominal) {
  std::string described = RateText(sheet, "8-bit AdamW", probe.adamw_8bit_values_per_s,
                                   nominal.adamw_8bit_values_per_s, 1e6, "M values/s");
  if (probe.version >= 5) {
    described += ", " + RateText(sheet, "NF4 dequant", probe.nf4_dequant_values_per_s,
                                 nominal.nf4_dequant_values_per_s, 1e6, "M values/s");
  }
  if (probe.version >= 7) {
    described += ", " + RateText(sheet, "dropout", probe.dropout_values_per_s,
                                 nominal.dropout_values_per_s, 1e6, "M values/s");
  }
  return described;
}

// "loss fp32: ATen 216 M logits/s (sheet 220), fused 704 M logits/s (sheet 700); bf16: ...".
std::string LossRates(const estimate::RateProbe& probe,
                      const std::optional<estimate::DeviceSpeed>& sheet,
                      const estimate::DeviceSpeed& nominal) {
  const auto measured = [&probe](const std::string& kernels, const std::string& dtype) {
    for (const estimate::ProbedLoss& l : probe.loss) {
      if (l.kernels == kernels && l.dtype == dtype) return l.logits_per_s;
    }
    return 0.0;
  };
  std::string described;
  for (const estimate::MatmulClass c :
       {estimate::MatmulClass::kFp32, estimate::MatmulClass::kBf16}) {
    const std::string dtype(estimate::MatmulClassName(c));
    described +=
        (described.empty() ? "loss " : "; ") + dtype + ": " +
        RateText(sheet, "ATen", measured("aten", dtype),
                 nominal.loss_logits_per_s.Of(estimate::Kernels::kAten, c), 1e6, "M logits/s") +
        ", " +
        RateText(sheet, "fused", measured("fused", dtype),
                 nominal.loss_logits_per_s.Of(estimate::Kernels::kFused, c), 1e6, "M logits/s");
  }
  return described;
}

// The factors the reference steps measured (the LLaMA family's calibration there until the store
// has runs of it) and what a new length costs; "" where the probe has no reference steps.
std::string ReferenceFactors(const estimate::DeviceSpeed& probed) {
  if (probed.probed_fp32_factor <= 0 && probed.probed_bf16_factor <= 0) return "";
  char text[160];
  std::snprintf(text, sizeof text, "its reference steps' factors fp32 %.3f, bf16 %.3f",
                probed.probed_fp32_factor, probed.probed_bf16_factor);
  std::string described = text;
  for (const auto& [dtype, cost] :
       {std::pair{"fp32", &probed.fp32_new_length}, std::pair{"bf16", &probed.bf16_new_length}}) {
    if (!cost->measured()) continue;
    described += std::string(", a new length (") + dtype + ")";
    const std::vector<estimate::NewLengthCost::AtValues>& costs = cost->by_values;
    const bool by_rows = !costs.empty() && costs.front().rows != costs.back().rows;
    for (size_t i = 0; i < costs.size(); ++i) {
      const estimate::NewLengthCost::AtValues& at = costs[i];
      const bool opens_rows = i == 0 || at.rows != costs[i - 1].rows;
      if (by_rows && opens_rows) {
        std::snprintf(text, sizeof text, "%s at %.0f rows:", i == 0 ? "" : ";", at.rows);
        described += text;
      }
      std::snprintf(text, sizeof text, "%s %.2f ms", opens_rows ? "" : ",", at.seconds * 1e3);
      described += text;
      if (costs.size() > 1) {
        std::snprintf(text, sizeof text, " at %.3g M values", at.values / 1e6);
        described += text;
      }
    }
    described += costs.size() == 1 ? " a weight shape" : " of a weight";
    std::snprintf(text, sizeof text, " %s %.2f ms a micro-batch",
                  cost->per_micro_batch < 0 ? "-" : "+", std::abs(cost->per_micro_batch) * 1e3);
    described += text;
  }
  return described;
}

// The element-wise product's rates by tensor size (version 15), "" before them: "element-wise
// fp32 150 GB/s at 256 KiB, ...; bf16 ...".
std::string ElementwiseText(const estimate::DeviceSpeed& probed) {
  std::string described;
  for (const auto& [dtype, rates] :
       {std::pair{"fp32", &probed.fp32_elementwise}, std::pair{"bf16", &probed.bf16_elementwise}}) {
    if (rates->empty()) continue;
    described += described.empty() ? "element-wise " : "; ";
    described += dtype;
    for (size_t i = 0; i < rates->size(); ++i) {
      char text[96];
      std::snprintf(text, sizeof text, "%s %.0f GB/s at %s", i == 0 ? "" : ",",
                    (*rates)[i].bytes_per_s / 1e9,
                    FormatBytes(static_cast<uint64_t>((*rates)[i].tensor_bytes)).c_str());
      described += text;
    }
  }
  return described;
}

// A layer's element-wise ops' rates (version 16), "" before them: each measured stream and
// projections' dtype pair by kernels, its slowest to its fastest over the sizes: "a layer's
// element-wise ops (stream/projections) aten fp32/fp32 26-35 GB/s, ...; fused ...".
std::string LayerElementwiseText(const estimate::DeviceSpeed& probed) {
  std::map<std::tuple<estimate::Kernels, estimate::MatmulClass, estimate::MatmulClass>,
           std::pair<double, double>>
      ranges;  // by kernels, stream and projections: the slowest and the fastest
  for (const estimate::LayerElementwiseRate& rate : probed.layer_elementwise) {
    const auto [at, added] = ranges.try_emplace({rate.kernels, rate.stream, rate.projected},
                                                rate.bytes_per_s, rate.bytes_per_s);
    at->second = {std::min(at->second.first, rate.bytes_per_s),
                  std::max(at->second.second, rate.bytes_per_s)};
  }
  std::string described;
  std::optional<estimate::Kernels> kernels_named;
  for (const auto& [key, range] : ranges) {
    const auto& [kernels, stream, projected] = key;
    described += described.empty()          ? "a layer's element-wise ops (stream/projections) "
                 : kernels_named != kernels ? "; "
                                            : ", ";
    if (kernels_named != kernels) described += std::string(estimate::KernelsName(kernels)) + " ";
    kernels_named = kernels;
    described += std::string(estimate::MatmulClassName(stream)) + "/" +
                 std::string(estimate::MatmulClassName(projected));
    char text[64];
    if (std::lround(range.first / 1e9) == std::lround(range.second / 1e9)) {
      std::snprintf(text, sizeof text, " %.0f GB/s", range.first / 1e9);
    } else {
      std::snprintf(text, sizeof text, " %.0f-%.0f GB/s", range.first / 1e9, range.second / 1e9);
    }
    described += text;
  }
  return described;
}

// What the memory estimate adds while one of a head's products runs (matmul_buffers.h): the
// largest of the three at each vocabulary measured.
std::string HeadBuffersText(const estimate::MatmulBuffers& buffers) {
  std::string described;
  for (const auto& [dtype, heads] :
       {std::pair{"fp32", &buffers.fp32}, std::pair{"bf16", &buffers.bf16}}) {
    std::string sizes;
    for (const estimate::HeadProductBuffers& h : *heads) {
      sizes += (sizes.empty() ? " " : ", ") + FormatBytes(h.Largest()) + " at " +
               std::to_string(h.vocab) + " words";
    }
    described += (described.empty() ? " " : "; ") + std::string(dtype) +
                 (sizes.empty() ? " not measured" : sizes);
  }
  return "a head GEMM's buffers" + described;
}

}  // namespace

std::vector<std::string> DescribeNodeRates(const std::string& probe_json) {
  StatusOr<estimate::RateProbe> probe = ParseStoredProbe(probe_json);
  if (!probe.ok()) return {"not readable: " + probe.status().message()};
  std::optional<estimate::DeviceSpeed> sheet;
  if (probe->device == "cpu") {
    sheet = estimate::CpuSpeed();
  } else if (std::optional<estimate::Gpu> gpu = estimate::GpuOfDeviceName(probe->device_name)) {
    sheet = estimate::GpuSpeed(*gpu);
  }
  const estimate::DeviceSpeed nominal = sheet.value_or(estimate::DeviceSpeed{});
  const int64_t size = estimate::kProbeMatmulSizeUsed;
  std::vector<std::string> lines = {
      probe->Summary(),
      "matmuls " +
          RateText(sheet, "fp32", probe->MatmulFlops("fp32", size), nominal.fp32_flops, 1e9,
                   "GFLOP/s") +
          ", " +
          RateText(sheet, "bf16", probe->MatmulFlops("bf16", size), nominal.bf16_flops, 1e9,
                   "GFLOP/s"),
      RateText(sheet, "memory", probe->memory_bytes_per_s, nominal.memory_bytes_per_s, 1e9,
               "GB/s") +
          ", " +
          RateText(sheet, "launch", probe->launch_seconds, nominal.launch_seconds, 1e-6, "us")};
  if (probe->device != "cpu") return lines;
  const estimate::DeviceSpeed probed = estimate::ProbedSpeed(nominal, *probe, "");
  const auto add = [&lines](std::string line) {
    if (!line.empty()) lines.push_back(std::move(line));
  };
  add(ElementwiseText(probed));
  add(LayerElementwiseText(probed));
  if (probe->version >= 8) {
    char text[128];
    std::snprintf(text, sizeof text,
                  "attention's partial query block at %.2f (fp32), %.2f (bf16) of a whole one",
                  probed.fp32_attention_block_share, probed.bf16_attention_block_share);
    add(text);
  }
  if (probe->version >= 10) add(LossRates(*probe, sheet, nominal));
  add(CpuWorkRates(*probe, sheet, nominal));
  add(ReferenceFactors(probed));
  if (probe->version >= 13) add(HeadBuffersText(probed.matmul_buffers));
  if (probe->pace_seconds) {
    char text[160];
    std::snprintf(text, sizeof text,
                  "the machine's pace: its canary (four fp32 256 x 256 products) in %.3f ms",
                  *probe->pace_seconds * 1e3);
    add(text);
  }
  return lines;
}

std::string NodeRatesText(std::string_view label, const std::string& probe_json) {
  const std::vector<std::string> lines = DescribeNodeRates(probe_json);
  std::string text = OnOneLine(label) + " " + OnOneLine(lines.front()) + "\n";
  for (size_t i = 1; i < lines.size(); ++i) text += "  " + OnOneLine(lines[i]) + "\n";
  return text;
}

}  // namespace llmctl::cli
