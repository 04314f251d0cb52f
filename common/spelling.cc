#include "common/spelling.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <string>

namespace llmctl {
namespace {

std::string ToLowerAscii(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower;
}

}  // namespace

size_t EditDistance(std::string_view a, std::string_view b) {
  // Three rolling rows of the dynamic-programming table: the swap rule looks two rows back.
  const size_t columns = b.size() + 1;
  std::vector<size_t> two_back(columns), previous(columns), current(columns);
  for (size_t j = 0; j < columns; ++j) previous[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitution = a[i - 1] == b[j - 1] ? 0 : 1;
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, previous[j - 1] + substitution});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        current[j] = std::min(current[j], two_back[j - 2] + 1);
      }
    }
    two_back.swap(previous);
    previous.swap(current);
  }
  return previous[b.size()];
}

size_t MaxTypoDistance(std::string_view typed) {
  if (typed.size() <= 3) return 1;
  if (typed.size() <= 8) return 2;
  return 3;
}

std::string_view ClosestMatch(std::string_view typed,
                              const std::vector<std::string_view>& candidates) {
  const std::string typed_lower = ToLowerAscii(typed);
  const size_t limit = MaxTypoDistance(typed);
  std::string_view best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (std::string_view candidate : candidates) {
    const size_t distance = EditDistance(typed_lower, ToLowerAscii(candidate));
    if (distance <= limit && distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

}  // namespace llmctl
