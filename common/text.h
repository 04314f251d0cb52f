// Small text helpers every parser needs.
#ifndef LLMCTL_COMMON_TEXT_H_
#define LLMCTL_COMMON_TEXT_H_

#include <cstddef>
#include <string_view>

namespace llmctl {

// `text` without leading and trailing ASCII white space.
std::string_view Trim(std::string_view text);

// The offset of the first byte that breaks UTF-8 (overlong forms, surrogates and code points past
// U+10FFFF included), or std::string_view::npos when `text` is valid.
size_t FirstInvalidUtf8(std::string_view text);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_TEXT_H_
