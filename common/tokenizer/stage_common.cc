#include "common/tokenizer/stage_common.h"

#include "common/tokenizer/unicode.h"

namespace llmctl::tokenizer_internal {

StatusOr<std::unique_ptr<Pattern>> ParsePattern(const JsonSource& src, const Json& json,
                                                const std::string& path) {
  ASSIGN_OR_RETURN(const Json* pattern, RequireMember(src, json, path, "pattern"));
  const std::string pattern_path = JoinPath(path, "pattern");
  const Json* literal = FindMember(*pattern, "String");
  const Json* regex = FindMember(*pattern, "Regex");
  if ((literal == nullptr) == (regex == nullptr)) {
    return src.Invalid(pattern_path, R"(expected {"String": "..."} or {"Regex": "..."})");
  }
  const Json& value = literal != nullptr ? *literal : *regex;
  if (!value.is_string()) return src.Invalid(pattern_path, "expected a string");
  const auto& text = value.get_ref<const std::string&>();
  StatusOr<std::unique_ptr<Pattern>> compiled =
      literal != nullptr ? Pattern::Literal(text) : Pattern::Regex(text);
  if (!compiled.ok()) return src.Invalid(pattern_path, compiled.status().message());
  return std::move(*compiled);
}

StatusOr<std::string> RequireChar(const JsonSource& src, const Json& json, const std::string& path,
                                  std::string_view key) {
  ASSIGN_OR_RETURN(std::string value, RequireString(src, json, path, key));
  if (value.empty() || Utf8SequenceLength(static_cast<unsigned char>(value[0])) != value.size()) {
    return src.Invalid(JoinPath(path, key), "expected exactly one character");
  }
  return value;
}

Status ReplaceMatches(const Pattern& pattern, std::string_view content, std::string* text) {
  std::vector<MatchSpan> matches;
  RETURN_IF_ERROR(pattern.FindAll(*text, &matches));
  if (matches.empty()) return Status::Ok();
  std::string out;
  out.reserve(text->size());
  size_t pos = 0;
  for (const MatchSpan& m : matches) {
    out.append(*text, pos, m.begin - pos).append(content);
    pos = m.end;
  }
  out.append(*text, pos);
  *text = std::move(out);
  return Status::Ok();
}

std::string ToByteLevel(std::string_view text) {
  const ByteLevelAlphabet& alphabet = GetByteLevelAlphabet();
  std::string out;
  out.reserve(text.size() * 2);
  for (char c : text) out += alphabet.byte_to_utf8[static_cast<unsigned char>(c)];
  return out;
}

StatusOr<PrependScheme> ParsePrependScheme(const JsonSource& src, const Json& json,
                                           const std::string& path) {
  PrependScheme scheme = PrependScheme::kAlways;
  const Json* scheme_json = FindMember(json, "prepend_scheme");
  if (scheme_json != nullptr) {
    const std::string name = scheme_json->is_string() ? scheme_json->get<std::string>() : "";
    if (name == "always") {
      scheme = PrependScheme::kAlways;
    } else if (name == "first") {
      scheme = PrependScheme::kFirst;
    } else if (name == "never") {
      scheme = PrependScheme::kNever;
    } else {
      return src.Invalid(JoinPath(path, "prepend_scheme"),
                         R"(expected "always", "first" or "never")");
    }
  }
  const Json* legacy = FindMember(json, "add_prefix_space");
  if (legacy != nullptr) {
    if (!legacy->is_boolean()) {
      return src.Invalid(JoinPath(path, "add_prefix_space"), "expected true or false");
    }
    if (!legacy->get<bool>()) {
      if (scheme_json != nullptr && scheme != PrependScheme::kNever) {
        return src.Invalid(path, "add_prefix_space does not match prepend_scheme");
      }
      scheme = PrependScheme::kNever;
    }
  }
  return scheme;
}

}  // namespace llmctl::tokenizer_internal
