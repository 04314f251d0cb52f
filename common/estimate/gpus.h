// The GPUs an estimate's fits / out-of-memory verdict is made against: those of the Chameleon
// nodes the labs reserve, by the names an experiment's `target` gives them (a flavor such as
// g1.h100.pci.4, or a bare-metal node_type such as gpu_a100_pcie), and by plain names for
// `llmctl estimate --device-memory a100-80gb`.
//
// Each memory is the card's total as CUDA reports it (nvidia-smi's "MiB" total). A run cannot
// allocate all of it: the CUDA context and library workspaces (cuBLAS, cuDNN, NCCL) take a few
// hundred MiB that no allocator counts, so a peak within that of the total is not a safe fit.
#ifndef LLMCTL_COMMON_ESTIMATE_GPUS_H_
#define LLMCTL_COMMON_ESTIMATE_GPUS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace llmctl::estimate {

// A card's data-sheet figures (dense, no sparsity), which step_time.h divides a step's work by.
struct GpuRates {
  double bf16_tflops = 0;     // tensor cores, bf16 / fp16 inputs with fp32 accumulation
  double fp32_tflops = 0;     // plain fp32 (no TF32)
  double memory_tbps = 0;     // HBM / GDDR bandwidth, TB/s
  double host_link_gbps = 0;  // PCIe to the host, GB/s one way
  double peer_link_gbps = 0;  // to the node's other cards (NVLink, else PCIe), GB/s one way
};

struct Gpu {
  std::string name;   // "a100-80gb"
  std::string model;  // "NVIDIA A100 80GB PCIe"
  uint64_t memory_bytes;
  GpuRates rates;
  // What NVML calls the card ("NVIDIA H100 NVL"): every one of these words, in that order.
  std::vector<std::string> device_name_words;
};

// Every GPU the table knows, for error messages and the docs.
const std::vector<Gpu>& KnownGpus();

// A GPU by its plain name ("h100-94gb", "A100-80GB": case-insensitive).
std::optional<Gpu> GpuNamed(std::string_view name);

// The GPU of an experiment's target: its `flavor` (g1.h100.pci.N: KVM@TACC's H100 NVL) or its
// `node_type` (gpu_a100_pcie, compute_gigaio: CHI@UC's A100 80GB). nullopt when the target names
// neither or one this table does not know.
std::optional<Gpu> GpuOfTarget(const std::map<std::string, std::string>& target);

// The GPU of a device as a node reports it (NVML's name, "NVIDIA A100-SXM4-80GB"); nullopt for one
// the table does not know.
std::optional<Gpu> GpuOfDeviceName(std::string_view device_name);

}  // namespace llmctl::estimate

#endif  // LLMCTL_COMMON_ESTIMATE_GPUS_H_
