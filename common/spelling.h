// "Did you mean ...?" for names a user mistyped: trial keys, presets, enum values, trial fields.
#ifndef LLMCTL_COMMON_SPELLING_H_
#define LLMCTL_COMMON_SPELLING_H_

#include <cstddef>
#include <string_view>
#include <vector>

namespace llmctl {

// Edit distance counting insertions, deletions, substitutions and swaps of two adjacent characters
// as one edit each (optimal string alignment), because "trian" for "train" is one slip of the
// fingers, not two. Case-sensitive.
size_t EditDistance(std::string_view a, std::string_view b);

// The largest edit distance at which `typed` still counts as a slip rather than a different word:
// 1 up to 3 characters, 2 up to 8, 3 beyond.
size_t MaxTypoDistance(std::string_view typed);

// The candidate closest to `typed` (ASCII case ignored) within MaxTypoDistance(typed); the earliest
// candidate wins a tie. Returns "" when none is close enough.
std::string_view ClosestMatch(std::string_view typed,
                              const std::vector<std::string_view>& candidates);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_SPELLING_H_
