#include "common/cuda_version.h"

#include <charconv>

namespace llmctl {
namespace {

// Digits only: from_chars would also take a sign.
bool ParseNumber(std::string_view text, int* value) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return !text.empty() && text[0] != '-' && error == std::errc() &&
         end == text.data() + text.size();
}

}  // namespace

StatusOr<CudaVersion> ParseCudaVersion(std::string_view text) {
  const size_t dot = text.find('.');
  CudaVersion version;
  if (dot != std::string_view::npos) {
    std::string_view minor = text.substr(dot + 1);
    minor = minor.substr(0, minor.find('.'));
    if (ParseNumber(text.substr(0, dot), &version.major) && ParseNumber(minor, &version.minor)) {
      return version;
    }
  }
  return InvalidArgumentError(std::string(text).insert(0, 1, '\'') +
                              "' is not a CUDA version (expected major.minor, e.g. 12.4)");
}

std::string_view MinimumDriverForCuda(int cuda_major) {
  switch (cuda_major) {
    case 11:
      return "450.80.02";
    case 12:
      return "525.60.13";
    case 13:
      return "580.65.06";
  }
  return "";
}

Status CheckDriverRunsLibTorch(const NodeCuda& node) {
  if (node.gpus == 0 || node.libtorch_cuda.empty()) return Status::Ok();
  auto driver = ParseCudaVersion(node.driver_cuda);
  auto needed = ParseCudaVersion(node.libtorch_cuda);
  if (!driver.ok() || !needed.ok() || driver->major >= needed->major) return Status::Ok();
  std::string remedy =
      "use an image whose NVIDIA driver supports CUDA " + std::to_string(needed->major);
  if (const std::string_view minimum = MinimumDriverForCuda(needed->major); !minimum.empty()) {
    remedy += " (driver >= " + std::string(minimum) + ")";
  }
  return FailedPreconditionError(
      "node " + node.node + ": NVIDIA driver " + node.driver + " supports CUDA up to " +
      driver->ToString() + ", but llm-train's LibTorch " + node.libtorch + " was built for CUDA " +
      needed->ToString() + ": " + remedy + ", or an llm-train built with a LibTorch for CUDA " +
      std::to_string(driver->major) + ".x");
}

}  // namespace llmctl
