// The median of a sample, as the probe and the benchmarks take it: the upper middle value of an
// even count (no mean of two), so it is always a time that was measured.
#ifndef LLMCTL_COMMON_MEDIAN_H_
#define LLMCTL_COMMON_MEDIAN_H_

#include <algorithm>
#include <cstddef>
#include <vector>

namespace llmctl {

// The value at index size / 2 of `values` sorted; `values` must not be empty.
inline double Median(std::vector<double> values) {
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

}  // namespace llmctl

#endif  // LLMCTL_COMMON_MEDIAN_H_
