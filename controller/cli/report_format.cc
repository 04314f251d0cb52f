#include "controller/cli/report_format.h"

#include <algorithm>

#include "common/printf.h"
#include "common/text.h"

namespace llmctl::cli {

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
