// Reading tokenizer.json without exceptions: every accessor checks presence and type and returns an
// error that names the file and the field ("tokenizer.json: model.merges[3]: ...").
//
// Internal to common/tokenizer.
#ifndef LLMCTL_COMMON_TOKENIZER_JSON_UTIL_H_
#define LLMCTL_COMMON_TOKENIZER_JSON_UTIL_H_

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>

#include "common/status.h"

namespace llmctl::tokenizer_internal {

using Json = nlohmann::json;

// Nested Sequence normalizers/pre-tokenizers/decoders deeper than this are refused: real files nest
// at most twice, and the limit keeps a hostile file from overflowing the stack.
inline constexpr int kMaxNesting = 16;

// Where errors point: the file (or other source) being read.
class JsonSource {
 public:
  explicit JsonSource(std::string name) : name_(std::move(name)) {}
  const std::string& name() const { return name_; }

  // A malformed or missing field.
  Status Invalid(std::string_view path, std::string_view message) const {
    return InvalidArgumentError(Prefix(path) + std::string(message));
  }
  // A well-formed feature this implementation does not support.
  Status Unsupported(std::string_view path, std::string_view message) const {
    return UnimplementedError(Prefix(path) + std::string(message));
  }

 private:
  std::string Prefix(std::string_view path) const {
    return path.empty() ? name_ + ": " : name_ + ": " + std::string(path) + ": ";
  }
  std::string name_;
};

inline std::string JoinPath(std::string_view path, std::string_view key) {
  return path.empty() ? std::string(key) : std::string(path) + "." + std::string(key);
}
inline std::string IndexPath(std::string_view path, size_t index) {
  return std::string(path) + "[" + std::to_string(index) + "]";
}

// The member `key` of `object`, or nullptr when it is absent or JSON null.
inline const Json* FindMember(const Json& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

inline StatusOr<const Json*> RequireMember(const JsonSource& src, const Json& object,
                                           std::string_view path, std::string_view key) {
  if (!object.is_object()) return src.Invalid(path, "expected an object");
  const Json* member = FindMember(object, key);
  if (member == nullptr) return src.Invalid(JoinPath(path, key), "missing required field");
  return member;
}

inline StatusOr<std::string> RequireString(const JsonSource& src, const Json& object,
                                           std::string_view path, std::string_view key) {
  ASSIGN_OR_RETURN(const Json* member, RequireMember(src, object, path, key));
  if (!member->is_string()) return src.Invalid(JoinPath(path, key), "expected a string");
  return member->get_ref<const std::string&>();
}

// A boolean that may be absent (or null), in which case `fallback` applies.
inline StatusOr<bool> OptionalBool(const JsonSource& src, const Json& object, std::string_view path,
                                   std::string_view key, bool fallback) {
  const Json* member = FindMember(object, key);
  if (member == nullptr) return fallback;
  if (!member->is_boolean()) return src.Invalid(JoinPath(path, key), "expected true or false");
  return member->get<bool>();
}

// A token id: an integer in [0, 2^31 - 1] (the library's ids are u32; the trainer's are int32). The
// error says why not, without the place (AsTokenId adds it).
inline StatusOr<int32_t> TokenIdOf(const Json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
      return static_cast<int32_t>(v);
    }
    return InvalidArgumentError("token id " + std::to_string(v) + " is out of range");
  }
  if (value.is_number_integer()) return InvalidArgumentError("token id must not be negative");
  return InvalidArgumentError("expected a token id (a non-negative integer)");
}

inline StatusOr<int32_t> AsTokenId(const JsonSource& src, const Json& value,
                                   std::string_view path) {
  StatusOr<int32_t> id = TokenIdOf(value);
  if (!id.ok()) return src.Invalid(path, id.status().message());
  return id;
}

inline StatusOr<uint64_t> OptionalCount(const JsonSource& src, const Json& object,
                                        std::string_view path, std::string_view key,
                                        uint64_t fallback) {
  const Json* member = FindMember(object, key);
  if (member == nullptr) return fallback;
  if (!member->is_number_unsigned()) {
    return src.Invalid(JoinPath(path, key), "expected a non-negative integer");
  }
  return member->get<uint64_t>();
}

// The "type" of a component object.
inline StatusOr<std::string> ComponentType(const JsonSource& src, const Json& object,
                                           std::string_view path) {
  if (!object.is_object()) return src.Invalid(path, "expected an object");
  return RequireString(src, object, path, "type");
}

}  // namespace llmctl::tokenizer_internal

#endif  // LLMCTL_COMMON_TOKENIZER_JSON_UTIL_H_
