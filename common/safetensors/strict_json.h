// JSON as the safetensors reader takes it from a file (a header, a sharded checkpoint's index):
// parsed strictly, and quoted in one-line errors. Internal to common/safetensors/ (safetensors.cc,
// safetensors_writer.cc, sharded_checkpoint.cc): not part of its API.
#ifndef LLMCTL_COMMON_SAFETENSORS_STRICT_JSON_H_
#define LLMCTL_COMMON_SAFETENSORS_STRICT_JSON_H_

#include <cstddef>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/status.h"

namespace llmctl::safetensors::internal {

// Tensor names and dtypes come from the file: each error quotes them through OnOneLine cut to this,
// so that it stays one readable line whatever the file holds.
inline constexpr size_t kMaxQuotedBytes = 120;

// An exception's message without nlohmann's category prefix, on one line.
std::string JsonErrorText(const std::exception& e);

// Parses `text` as JSON, refusing duplicate keys in any object (a header naming one tensor twice,
// or giving one tensor two dtypes, is lying about one of them; nlohmann would silently keep the
// last, the reference parser refuses), invalid UTF-8 and nesting deeper than 64 levels. Never
// throws; `what` names the document.
StatusOr<nlohmann::json> ParseJsonStrict(std::string_view text, const std::string& what);

inline const char* JsonTypeName(const nlohmann::json& v) { return v.type_name(); }

}  // namespace llmctl::safetensors::internal

#endif  // LLMCTL_COMMON_SAFETENSORS_STRICT_JSON_H_
