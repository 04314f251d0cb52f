#include "common/estimate/gpus.h"

#include "common/text.h"

namespace llmctl::estimate {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

}  // namespace

const std::vector<Gpu>& KnownGpus() {
  // Rates: NVIDIA's data sheets, dense (the sparsity figures halved). One entry per card a node
  // can carry; the H100 80GB row takes the PCIe card's rates, the lower of PCIe and SXM, so a
  // lease sized from it is long enough on either.
  static const auto* const gpus = new std::vector<Gpu>{
      {"h100-94gb",
       "NVIDIA H100 NVL (94 GB)",
       95830 * kMiB,
       {835, 60, 3.9, 64, 300},
       {"H100", "NVL"}},
      {"h100-80gb", "NVIDIA H100 80GB (PCIe, SXM)", 81559 * kMiB, {756, 51, 2.0, 64, 64}, {"H100"}},
      {"a100-80gb", "NVIDIA A100 80GB", 81920 * kMiB, {312, 19.5, 1.94, 32, 32}, {"A100", "80GB"}},
      {"a100-40gb", "NVIDIA A100 40GB", 40960 * kMiB, {312, 19.5, 1.55, 32, 32}, {"A100"}},
      {"v100-32gb", "NVIDIA V100 32GB", 32768 * kMiB, {125, 15.7, 0.9, 16, 150}, {"V100", "32GB"}},
      {"v100-16gb", "NVIDIA V100 16GB", 16384 * kMiB, {125, 15.7, 0.9, 16, 150}, {"V100"}},
      // Turing has fp16 tensor cores but no bf16 ones: bf16 matmuls run at about the fp32 rate.
      {"rtx6000-24gb",
       "NVIDIA Quadro RTX 6000 (24 GB)",
       24576 * kMiB,
       {16.3, 16.3, 0.672, 16, 16},
       {"RTX", "6000"}},
      {"h200-141gb", "NVIDIA H200 (141 GB)", 143771 * kMiB, {989, 67, 4.8, 64, 450}, {"H200"}},
  };
  return *gpus;
}

std::optional<Gpu> GpuNamed(std::string_view name) {
  for (const Gpu& gpu : KnownGpus()) {
    if (EqualsIgnoreCase(gpu.name, name)) return gpu;
  }
  return std::nullopt;
}

std::optional<Gpu> GpuOfTarget(const std::map<std::string, std::string>& target) {
  // The seeds' nodes (shared/seeds: the labs' "Reserve" sections): KVM@TACC's g1.h100.pci.*
  // flavors carry H100 NVL 94GB cards; CHI@UC's gpu_a100_pcie (4 cards) and compute_gigaio (1)
  // A100 80GB.
  if (auto flavor = target.find("flavor"); flavor != target.end()) {
    if (flavor->second.starts_with("g1.h100.")) return GpuNamed("h100-94gb");
  }
  if (auto node_type = target.find("node_type"); node_type != target.end()) {
    if (node_type->second == "gpu_a100_pcie" || node_type->second == "compute_gigaio") {
      return GpuNamed("a100-80gb");
    }
  }
  return std::nullopt;
}

std::optional<Gpu> GpuOfDeviceName(std::string_view device_name) {
  for (const Gpu& gpu : KnownGpus()) {
    size_t at = 0;
    bool all = true;
    for (const std::string& word : gpu.device_name_words) {
      at = device_name.find(word, at);
      if (at == std::string_view::npos) {
        all = false;
        break;
      }
      at += word.size();
    }
    if (all) return gpu;
  }
  return std::nullopt;
}

}  // namespace llmctl::estimate
