#include "controller/cli/report_format.h"

#include <algorithm>
#include <cstdio>

namespace llmctl::cli {

namespace {

// printf into a string sized to the text: a fixed buffer cut a huge figure's digits (%f of 1e300
// is 301 of them) and printed a number many times smaller.
template <typename... Args>
std::string SizedPrintf(const char* format, Args... args) {
  const int length = std::snprintf(nullptr, 0, format, args...);
  if (length <= 0) return "";
  std::string text(static_cast<size_t>(length) + 1, '\0');
  std::snprintf(text.data(), text.size(), format, args...);
  text.resize(static_cast<size_t>(length));
  return text;
}

}  // namespace

std::string Printf(const char* format, double value) { return SizedPrintf(format, value); }

std::string Grouped(double value, int decimals) {
  const std::string printed = SizedPrintf("%.*f", decimals, value);
  if (printed.empty()) return printed;
  const std::string_view text = printed;
  const size_t sign = text[0] == '-' ? 1 : 0;
  const size_t integer_end = std::min(text.find('.'), text.size());
  std::string grouped(text.substr(0, sign));
  for (size_t i = sign; i < integer_end; ++i) {
    if (i > sign && (integer_end - i) % 3 == 0) grouped.push_back(',');
    grouped.push_back(text[i]);
  }
  grouped.append(text.substr(integer_end));
  return grouped;
}

std::string Mib(int64_t bytes) { return Grouped(static_cast<double>(bytes) / kMiB, 1); }

}  // namespace llmctl::cli
