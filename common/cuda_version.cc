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

}  // namespace llmctl
