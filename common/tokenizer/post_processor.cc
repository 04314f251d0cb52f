#include "common/tokenizer/post_processor.h"

#include <optional>
#include <utility>

#include "common/tokenizer/stage_common.h"

namespace llmctl::tokenizer_internal {
namespace {

class TemplatePostProcessor : public PostProcessor {
 public:
  // Each element is either the ids of a special token or std::nullopt for the sequence ($A).
  explicit TemplatePostProcessor(std::vector<std::optional<std::vector<int32_t>>> pieces)
      : pieces_(std::move(pieces)) {}
  void AddSpecialTokens(std::vector<int32_t>* ids) const override {
    std::vector<int32_t> out;
    out.reserve(ids->size() + 4);
    for (const auto& piece : pieces_) {
      if (piece.has_value()) {
        out.insert(out.end(), piece->begin(), piece->end());
      } else {
        out.insert(out.end(), ids->begin(), ids->end());
      }
    }
    *ids = std::move(out);
  }

 private:
  std::vector<std::optional<std::vector<int32_t>>> pieces_;
};

class SequencePostProcessor : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> steps)
      : steps_(std::move(steps)) {}
  void AddSpecialTokens(std::vector<int32_t>* ids) const override {
    for (const auto& step : steps_) step->AddSpecialTokens(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

// ByteLevel's post-processor only trims offsets; it never changes ids.
class NoOpPostProcessor : public PostProcessor {
 public:
  void AddSpecialTokens(std::vector<int32_t>* ids) const override {}
};

StatusOr<std::unique_ptr<PostProcessor>> ParseTemplate(const JsonSource& src, const Json& json,
                                                       const std::string& path) {
  ASSIGN_OR_RETURN(const Json* single, RequireMember(src, json, path, "single"));
  const std::string single_path = JoinPath(path, "single");
  if (!single->is_array()) return src.Invalid(single_path, "expected an array of pieces");
  const Json* specials = FindMember(json, "special_tokens");
  const std::string specials_path = JoinPath(path, "special_tokens");
  if (specials != nullptr && !specials->is_object()) {
    return src.Invalid(specials_path, "expected an object");
  }
  std::vector<std::optional<std::vector<int32_t>>> pieces;
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& piece = (*single)[i];
    const std::string piece_path = IndexPath(single_path, i);
    if (const Json* sequence = FindMember(piece, "Sequence")) {
      const Json* id = FindMember(*sequence, "id");
      if (id == nullptr || !id->is_string() || (*id != "A" && *id != "B")) {
        return src.Invalid(piece_path, R"(expected {"Sequence": {"id": "A", ...}})");
      }
      if (*id == "B") return src.Invalid(piece_path, "the single-sequence template uses $B");
      pieces.emplace_back(std::nullopt);
      continue;
    }
    const Json* special = FindMember(piece, "SpecialToken");
    if (special == nullptr) {
      return src.Invalid(piece_path, R"(expected {"Sequence": ...} or {"SpecialToken": ...})");
    }
    ASSIGN_OR_RETURN(const std::string name,
                     RequireString(src, *special, JoinPath(piece_path, "SpecialToken"), "id"));
    const Json* entry = specials != nullptr ? FindMember(*specials, name) : nullptr;
    if (entry == nullptr) {
      return src.Invalid(specials_path,
                         "missing special token \"" + name + "\" used by the template");
    }
    const std::string entry_path = JoinPath(specials_path, name);
    ASSIGN_OR_RETURN(const Json* ids_json, RequireMember(src, *entry, entry_path, "ids"));
    if (!ids_json->is_array()) return src.Invalid(JoinPath(entry_path, "ids"), "expected an array");
    std::vector<int32_t> ids;
    for (size_t k = 0; k < ids_json->size(); ++k) {
      ASSIGN_OR_RETURN(const int32_t id,
                       AsTokenId(src, (*ids_json)[k], IndexPath(JoinPath(entry_path, "ids"), k)));
      ids.push_back(id);
    }
    pieces.emplace_back(std::move(ids));
  }
  return MakeStage<PostProcessor, TemplatePostProcessor>(std::move(pieces));
}

// Bert's and Roberta's processors: "cls" and "sep" are [token, id] pairs around the sequence.
StatusOr<std::unique_ptr<PostProcessor>> ParseClsSep(const JsonSource& src, const Json& json,
                                                     const std::string& path) {
  std::vector<int32_t> ids[2];
  const char* const keys[2] = {"cls", "sep"};
  for (int k = 0; k < 2; ++k) {
    ASSIGN_OR_RETURN(const Json* pair, RequireMember(src, json, path, keys[k]));
    const std::string pair_path = JoinPath(path, keys[k]);
    if (!pair->is_array() || pair->size() != 2 || !(*pair)[0].is_string()) {
      return src.Invalid(pair_path, "expected [token, id]");
    }
    ASSIGN_OR_RETURN(const int32_t id, AsTokenId(src, (*pair)[1], IndexPath(pair_path, 1)));
    ids[k].push_back(id);
  }
  std::vector<std::optional<std::vector<int32_t>>> pieces = {ids[0], std::nullopt, ids[1]};
  return MakeStage<PostProcessor, TemplatePostProcessor>(std::move(pieces));
}

}  // namespace

StatusOr<std::unique_ptr<PostProcessor>> ParsePostProcessor(const JsonSource& src, const Json& json,
                                                            const std::string& path, int depth) {
  if (depth > kMaxNesting) return src.Invalid(path, "post-processors nested too deeply");
  ASSIGN_OR_RETURN(const std::string type, ComponentType(src, json, path));
  if (type == "TemplateProcessing") return ParseTemplate(src, json, path);
  if (type == "BertProcessing" || type == "RobertaProcessing") return ParseClsSep(src, json, path);
  if (type == "ByteLevel") return MakeStage<PostProcessor, NoOpPostProcessor>();
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const Json* list, RequireMember(src, json, path, "processors"));
    const std::string list_path = JoinPath(path, "processors");
    if (!list->is_array()) return src.Invalid(list_path, "expected an array");
    std::vector<std::unique_ptr<PostProcessor>> steps;
    int adding_steps = 0;
    for (size_t i = 0; i < list->size(); ++i) {
      ASSIGN_OR_RETURN(auto step,
                       ParsePostProcessor(src, (*list)[i], IndexPath(list_path, i), depth + 1));
      const Json* step_type = FindMember((*list)[i], "type");
      if (step_type == nullptr || *step_type != "ByteLevel") ++adding_steps;
      steps.push_back(std::move(step));
    }
    // The library hands the second template one encoding per piece of the first (so it applies its
    // pair template); no real file chains two, and copying that quirk is not worth it.
    if (adding_steps > 1) {
      return src.Unsupported(list_path, "more than one post-processor that adds special tokens");
    }
    return MakeStage<PostProcessor, SequencePostProcessor>(std::move(steps));
  }
  return src.Invalid(JoinPath(path, "type"), "unknown post-processor type \"" + type + "\"");
}

}  // namespace llmctl::tokenizer_internal
