// The version every llmctl binary reports (llm-train --version, llm-agent's node info, llmctl --version).
#ifndef LLMCTL_COMMON_VERSION_H_
#define LLMCTL_COMMON_VERSION_H_

#include <string_view>

namespace llmctl {

inline constexpr std::string_view kVersion = "0.4.0";

}  // namespace llmctl

#endif  // LLMCTL_COMMON_VERSION_H_
