#include "common/tokenizer/normalizer.h"

#include <utility>

#include "common/tokenizer/precompiled.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/stage_common.h"
#include "common/tokenizer/unicode.h"

namespace llmctl::tokenizer_internal {
namespace {

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  Status Normalize(std::string* text) const override {
    for (const auto& step : steps_) RETURN_IF_ERROR(step->Normalize(text));
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  Status Normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);
    return Status::Ok();
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Pattern> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  Status Normalize(std::string* text) const override {
    return ReplaceMatches(*pattern_, content_, text);
  }

 private:
  std::unique_ptr<Pattern> pattern_;
  std::string content_;
};

class NfcNormalizer : public Normalizer {
 public:
  Status Normalize(std::string* text) const override {
    *text = NormalizeNfc(*text);
    return Status::Ok();
  }
};

class NfdNormalizer : public Normalizer {
 public:
  Status Normalize(std::string* text) const override {
    *text = NormalizeNfd(*text);
    return Status::Ok();
  }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  Status Normalize(std::string* text) const override {
    size_t begin = 0;
    size_t end = text->size();
    if (left_) {
      while (begin < end) {
        size_t next = begin;
        if (!IsWhiteSpace(DecodeUtf8(*text, &next))) break;
        begin = next;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && ((*text)[start] & 0xC0) == 0x80) --start;
        size_t next = start;
        if (!IsWhiteSpace(DecodeUtf8(*text, &next))) break;
        end = start;
      }
    }
    *text = text->substr(begin, end - begin);
    return Status::Ok();
  }

 private:
  bool left_;
  bool right_;
};

class ByteLevelNormalizer : public Normalizer {
 public:
  Status Normalize(std::string* text) const override {
    *text = ToByteLevel(*text);
    return Status::Ok();
  }
};

}  // namespace

StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const JsonSource& src, const Json& json,
                                                      const std::string& path, int depth) {
  if (depth > kMaxNesting) return src.Invalid(path, "normalizers nested too deeply");
  ASSIGN_OR_RETURN(const std::string type, ComponentType(src, json, path));
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const Json* list, RequireMember(src, json, path, "normalizers"));
    const std::string list_path = JoinPath(path, "normalizers");
    if (!list->is_array()) return src.Invalid(list_path, "expected an array");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < list->size(); ++i) {
      ASSIGN_OR_RETURN(auto step,
                       ParseNormalizer(src, (*list)[i], IndexPath(list_path, i), depth + 1));
      steps.push_back(std::move(step));
    }
    return MakeStage<Normalizer, SequenceNormalizer>(std::move(steps));
  }
  if (type == "Prepend") {
    ASSIGN_OR_RETURN(std::string prefix, RequireString(src, json, path, "prepend"));
    return MakeStage<Normalizer, PrependNormalizer>(std::move(prefix));
  }
  if (type == "Replace") {
    ASSIGN_OR_RETURN(auto pattern, ParsePattern(src, json, path));
    ASSIGN_OR_RETURN(std::string content, RequireString(src, json, path, "content"));
    return MakeStage<Normalizer, ReplaceNormalizer>(std::move(pattern), std::move(content));
  }
  if (type == "NFC") return MakeStage<Normalizer, NfcNormalizer>();
  if (type == "NFD") return MakeStage<Normalizer, NfdNormalizer>();
  if (type == "Strip") {
    ASSIGN_OR_RETURN(const bool left, OptionalBool(src, json, path, "strip_left", true));
    ASSIGN_OR_RETURN(const bool right, OptionalBool(src, json, path, "strip_right", true));
    return MakeStage<Normalizer, StripNormalizer>(left, right);
  }
  if (type == "ByteLevel") return MakeStage<Normalizer, ByteLevelNormalizer>();
  if (type == "Precompiled") return ParsePrecompiled(src, json, path);
  if (type == "NFKC" || type == "NFKD" || type == "Lowercase" || type == "BertNormalizer" ||
      type == "StripAccents" || type == "Nmt") {
    return src.Unsupported(JoinPath(path, "type"),
                           "normalizer \"" + type +
                               "\" is not supported (supported: Sequence, Prepend, Replace, NFC, "
                               "NFD, Strip, ByteLevel, Precompiled)");
  }
  return src.Invalid(JoinPath(path, "type"), "unknown normalizer type \"" + type + "\"");
}

}  // namespace llmctl::tokenizer_internal
