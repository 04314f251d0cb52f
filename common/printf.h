// printf into a string sized to the text: a fixed buffer cut a huge figure's digits (%f of 1e300
// is 301 of them) and printed a number many times smaller. The one way figures are printed with a
// printf format.
#ifndef LLMCTL_COMMON_PRINTF_H_
#define LLMCTL_COMMON_PRINTF_H_

#include <cstddef>
#include <cstdio>
#include <string>

namespace llmctl {

// `format` with `args`, whole; "" when the format fails.
template <typename... Args>
std::string SizedPrintf(const char* format, Args... args) {
  const int length = std::snprintf(nullptr, 0, format, args...);
  if (length <= 0) return "";
  std::string text(static_cast<size_t>(length) + 1, '\0');
  std::snprintf(text.data(), text.size(), format, args...);
  text.resize(static_cast<size_t>(length));
  return text;
}

// `value` through the printf `format` (one double conversion), whole.
inline std::string Printf(const char* format, double value) { return SizedPrintf(format, value); }

}  // namespace llmctl

#endif  // LLMCTL_COMMON_PRINTF_H_
