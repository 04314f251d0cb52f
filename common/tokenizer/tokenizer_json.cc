#include "common/tokenizer/tokenizer_json.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "common/foreign_json.h"

namespace llmctl::tokenizer_internal {
namespace {

using JsonType = Json::value_t;

constexpr std::string_view kVocabPath = "model.vocab";
constexpr std::string_view kMergesPath = "model.merges";

// How many values may still be kept as JSON.
struct KeptBudget {
  size_t values_left = kMaxKeptJsonValues;
  bool exceeded = false;
};

// The events of a value that is not kept: a top level that is not an object.
struct SkippedValue {
  void null() {}
  void boolean(bool /*value*/) {}
  void number_integer(int64_t /*value*/) {}
  void number_unsigned(uint64_t /*value*/) {}
  void number_float(double /*value*/, const std::string& /*text*/) {}
  void string(std::string& /*value*/) {}
  void binary(Json::binary_t& /*value*/) {}
  void key(std::string& /*value*/) {}
  void start_object(size_t /*elements*/) {}
  void end_object() {}
  void start_array(size_t /*elements*/) {}
  void end_array() {}
};

// A member kept as JSON: nlohmann's DOM builder, while the budget lasts. Past it, every later
// event is dropped and the read fails.
class KeptValue {
 public:
  KeptValue(Json* slot, KeptBudget* budget)
      : builder_(*slot, /*allow_exceptions=*/false), budget_(*budget) {}

  void null() {
    if (Count()) builder_.null();
  }
  void boolean(bool value) {
    if (Count()) builder_.boolean(value);
  }
  void number_integer(int64_t value) {
    if (Count()) builder_.number_integer(value);
  }
  void number_unsigned(uint64_t value) {
    if (Count()) builder_.number_unsigned(value);
  }
  void number_float(double value, const std::string& text) {
    if (Count()) builder_.number_float(value, text);
  }
  void string(std::string& value) {
    if (Count()) builder_.string(value);
  }
  void binary(Json::binary_t& value) {
    if (Count()) builder_.binary(value);
  }
  void key(std::string& value) {
    if (!budget_.exceeded) builder_.key(value);
  }
  void start_object(size_t elements) {
    if (Count()) builder_.start_object(elements);
  }
  void end_object() {
    if (!budget_.exceeded) builder_.end_object();
  }
  void start_array(size_t elements) {
    if (Count()) builder_.start_array(elements);
  }
  void end_array() {
    if (!budget_.exceeded) builder_.end_array();
  }

 private:
  bool Count() {
    if (budget_.values_left == 0) budget_.exceeded = true;
    if (budget_.exceeded) return false;
    --budget_.values_left;
    return true;
  }

  // What nlohmann::json::parse builds with (detail: not its documented API, but the SAX events
  // are).
  nlohmann::detail::json_sax_dom_parser<Json> builder_;
  KeptBudget& budget_;
};

// model.vocab as the parse goes past it: an object of token ids (BPE) or an array of
// [piece, score] (Unigram), into `out`. Depth 0 is the vocabulary itself, 1 its entries, 2 inside a
// Unigram entry.
class VocabReader {
 public:
  VocabReader(const JsonSource& src, StreamedVocab* out) : src_(src), out_(*out) {
    out_ = StreamedVocab();
  }

  void null() { Scalar(Json()); }
  void boolean(bool value) { Scalar(Json(value)); }
  void number_integer(int64_t value) { Scalar(Json(value)); }
  void number_unsigned(uint64_t value) { Scalar(Json(value)); }
  void number_float(double value, const std::string& /*text*/) { Scalar(Json(value)); }
  void binary(Json::binary_t& /*value*/) { Scalar(Json(JsonType::binary)); }
  void string(std::string& value) {
    if (depth_ == 0) {
      out_.shape = MemberShape::kOther;
      return;
    }
    if (!Reading()) return;
    if (out_.shape == MemberShape::kObject) {
      if (depth_ == 1) AddTokenId(Json(JsonType::string));
    } else if (depth_ == 1) {
      EntryFailed();
    } else if (depth_ == 2) {
      if (elements_ == 0) {
        // Copied, not moved: `value` is the lexer's buffer, which its last number (a score's
        // digits) grew past a short string's inline 15 bytes, so a moved piece held a heap block
        // of 31 bytes or more whatever its length.
        piece_.text.assign(value);
      } else {
        entry_ok_ = false;
      }
      ++elements_;
    }
  }
  void key(std::string& value) {
    if (depth_ == 1) token_ = std::move(value);
  }
  void start_object(size_t /*elements*/) { Open(JsonType::object); }
  void end_object() { Close(); }
  void start_array(size_t /*elements*/) { Open(JsonType::array); }
  void end_array() { Close(); }

 private:
  // Whether entries are still read: the vocabulary is an object or array and no entry failed.
  bool Reading() const {
    return out_.error.ok() &&
           (out_.shape == MemberShape::kObject || out_.shape == MemberShape::kArray);
  }

  // Any value but a string.
  void Scalar(const Json& value) {
    if (depth_ == 0) {
      out_.shape = value.is_null() ? MemberShape::kAbsent : MemberShape::kOther;
      return;
    }
    if (!Reading()) return;
    if (out_.shape == MemberShape::kObject) {
      if (depth_ == 1) AddTokenId(value);
    } else if (depth_ == 1) {
      EntryFailed();
    } else if (depth_ == 2) {
      if (elements_ == 1 && value.is_number()) {
        score_ = value;
      } else {
        entry_ok_ = false;
      }
      ++elements_;
    }
  }

  void Open(JsonType type) {
    const int depth = depth_++;
    if (depth == 0) {
      out_.shape = type == JsonType::object ? MemberShape::kObject : MemberShape::kArray;
      return;
    }
    if (!Reading()) return;
    if (out_.shape == MemberShape::kObject) {
      if (depth == 1) AddTokenId(Json(type));
    } else if (depth == 1) {
      if (type == JsonType::array) {
        piece_.text.clear();
        elements_ = 0;
        entry_ok_ = true;
      } else {
        EntryFailed();
      }
    } else if (depth == 2) {
      entry_ok_ = false;
      ++elements_;
    }
  }

  void Close() {
    --depth_;
    if (depth_ == 1 && out_.shape == MemberShape::kArray && Reading()) EndEntry();
  }

  void AddTokenId(const Json& value) {
    StatusOr<int32_t> id = TokenIdOf(value);
    if (!id.ok()) {
      out_.error = src_.Invalid(JoinPath(kVocabPath, token_), id.status().message());
      return;
    }
    // A token listed twice keeps its last id, as a JSON object keeps its last member.
    out_.token_ids.Set(token_, *id);
  }

  void EndEntry() {
    if (!entry_ok_ || elements_ != 2) return EntryFailed();
    if (score_.is_number_float()) {
      StatusOr<double> score = LibraryJsonDouble(score_.get<double>());
      if (!score.ok()) {
        out_.error = src_.Invalid(IndexPath(kVocabPath, index_), score.status().message());
        return;
      }
      piece_.score = *score;
    } else if (score_.is_number_unsigned()) {
      piece_.score = static_cast<double>(score_.get<uint64_t>());
    } else {
      piece_.score = static_cast<double>(score_.get<int64_t>());
    }
    out_.pieces.push_back(piece_);  // a copy: its text's block no larger than the text
    ++index_;
  }

  void EntryFailed() {
    out_.error = src_.Invalid(IndexPath(kVocabPath, index_), "expected [piece, score]");
  }

  const JsonSource& src_;
  StreamedVocab& out_;
  int depth_ = 0;
  std::string token_;  // the BPE entry's key
  // The Unigram entry being read: its index, its elements so far, and whether they are a string
  // and then a number.
  size_t index_ = 0;
  UnigramPiece piece_;
  Json score_;
  int elements_ = 0;
  bool entry_ok_ = false;
};

// model.merges as the parse goes past it: an array of "left right" strings or ["left", "right"]
// pairs, into `out`. Depth 0 is the list itself, 1 its merges, 2 inside a pair.
class MergesReader {
 public:
  MergesReader(const JsonSource& src, StreamedMerges* out) : src_(src), out_(*out) {
    out_ = StreamedMerges();
  }

  void null() { NotAString(/*is_null=*/true); }
  void boolean(bool /*value*/) { NotAString(false); }
  void number_integer(int64_t /*value*/) { NotAString(false); }
  void number_unsigned(uint64_t /*value*/) { NotAString(false); }
  void number_float(double /*value*/, const std::string& /*text*/) { NotAString(false); }
  void binary(Json::binary_t& /*value*/) { NotAString(false); }
  void string(std::string& value) {
    if (depth_ == 0) {
      out_.shape = MemberShape::kOther;
      return;
    }
    if (!Reading()) return;
    if (depth_ == 1) {
      AddLine(value);
    } else if (depth_ == 2) {
      if (elements_ == 0) {
        left_ = std::move(value);
      } else if (elements_ == 1) {
        right_ = std::move(value);
      }
      ++elements_;
    }
  }
  void key(std::string& /*value*/) {}
  void start_object(size_t /*elements*/) { Open(JsonType::object); }
  void end_object() { Close(); }
  void start_array(size_t /*elements*/) { Open(JsonType::array); }
  void end_array() { Close(); }

 private:
  bool Reading() const { return out_.error.ok() && out_.shape == MemberShape::kArray; }

  void NotAString(bool is_null) {
    if (depth_ == 0) {
      out_.shape = is_null ? MemberShape::kAbsent : MemberShape::kOther;
      return;
    }
    if (!Reading()) return;
    if (depth_ == 1) {
      MergeFailed();
    } else if (depth_ == 2) {
      entry_ok_ = false;
      ++elements_;
    }
  }

  void Open(JsonType type) {
    const int depth = depth_++;
    if (depth == 0) {
      out_.shape = type == JsonType::array ? MemberShape::kArray : MemberShape::kOther;
      return;
    }
    if (!Reading()) return;
    if (depth == 1) {
      if (type == JsonType::array) {
        elements_ = 0;
        entry_ok_ = true;
      } else {
        MergeFailed();
      }
    } else if (depth == 2) {
      entry_ok_ = false;
      ++elements_;
    }
  }

  void Close() {
    --depth_;
    if (depth_ != 1 || !Reading()) return;
    if (!entry_ok_ || elements_ != 2) return MergeFailed();
    out_.merges.Add(left_, right_);
    ++index_;
  }

  // The older "left right" form: exactly one space, as the library requires.
  void AddLine(const std::string& line) {
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      out_.error =
          src_.Invalid(IndexPath(kMergesPath, index_),
                       "expected \"left right\" with exactly one space, got \"" + line + "\"");
      return;
    }
    const std::string_view text = line;
    out_.merges.Add(text.substr(0, space), text.substr(space + 1));
    ++index_;
  }

  void MergeFailed() {
    out_.error = src_.Invalid(IndexPath(kMergesPath, index_),
                              R"(expected "left right" or ["left", "right"])");
  }

  const JsonSource& src_;
  StreamedMerges& out_;
  int depth_ = 0;
  size_t index_ = 0;
  // The pair being read: its elements so far, and whether they are strings.
  std::string left_;
  std::string right_;
  int elements_ = 0;
  bool entry_ok_ = false;
};

// The SAX handler: the top-level object and the model object are followed here; each member's
// value goes to its reader (model.vocab, model.merges) or is kept as JSON.
class TokenizerJsonReader {
 public:
  TokenizerJsonReader(const JsonSource& src, TokenizerJson* out) : src_(src), out_(*out) {}

  bool null() {
    return Scalar([](auto& value) { value.null(); });
  }
  bool boolean(bool v) {
    return Scalar([v](auto& value) { value.boolean(v); });
  }
  bool number_integer(int64_t v) {
    return Scalar([v](auto& value) { value.number_integer(v); });
  }
  bool number_unsigned(uint64_t v) {
    return Scalar([v](auto& value) { value.number_unsigned(v); });
  }
  bool number_float(double v, const std::string& text) {
    return Scalar([v, &text](auto& value) { value.number_float(v, text); });
  }
  bool string(std::string& v) {
    return Scalar([&v](auto& value) { value.string(v); });
  }
  bool binary(Json::binary_t& v) {
    return Scalar([&v](auto& value) { value.binary(v); });
  }
  bool key(std::string& v) {
    if (InStructure()) {
      key_ = std::move(v);
    } else {
      Forward([&v](auto& value) { value.key(v); });
    }
    return true;
  }
  bool start_object(size_t elements) {
    return Open(JsonType::object, [elements](auto& value) { value.start_object(elements); });
  }
  bool end_object() {
    return Close([](auto& value) { value.end_object(); });
  }
  bool start_array(size_t elements) {
    return Open(JsonType::array, [elements](auto& value) { value.start_array(elements); });
  }
  bool end_array() {
    return Close([](auto& value) { value.end_array(); });
  }

  // The read's own errors, once the parse succeeded.
  Status Finish() const {
    if (not_an_object_) return src_.Invalid("", "expected a JSON object at the top level");
    if (budget_.exceeded) {
      return src_.Invalid("", std::string("more than ")
                                  .append(std::to_string(kMaxKeptJsonValues))
                                  .append(" values outside model.vocab and model.merges"));
    }
    return Status::Ok();
  }

 private:
  // Between members of the top-level or model object, where no member's value is being read.
  bool InStructure() const { return std::holds_alternative<std::monostate>(value_); }

  template <typename Event>
  void Forward(const Event& event) {
    std::visit(
        [&event](auto& value) {
          if constexpr (!std::is_same_v<std::decay_t<decltype(value)>, std::monostate>) {
            event(value);
          }
        },
        value_);
  }

  template <typename Event>
  bool Scalar(const Event& event) {
    const bool starts_a_member = InStructure();
    if (starts_a_member) StartValue();
    Forward(event);
    if (starts_a_member) value_ = std::monostate();  // a scalar ends where it starts
    return true;
  }

  template <typename Event>
  bool Open(JsonType type, const Event& event) {
    if (InStructure()) {
      if (depth_ == 0 && type == JsonType::object) {
        out_.kept = Json::object();
        ++depth_;
        return true;
      }
      if (depth_ == 1 && key_ == "model" && type == JsonType::object) {
        out_.kept["model"] = Json::object();
        ForgetModelTables();
        ++depth_;
        return true;
      }
      StartValue();
      value_depth_ = depth_;
    }
    Forward(event);
    ++depth_;
    return true;
  }

  template <typename Event>
  bool Close(const Event& event) {
    --depth_;
    if (!InStructure()) {
      Forward(event);
      if (depth_ == value_depth_) value_ = std::monostate();
    }
    return true;
  }

  // A second "model" replaces the first, as in a JSON object.
  void ForgetModelTables() {
    out_.vocab = StreamedVocab();
    out_.merges = StreamedMerges();
  }

  // A value starts in the structure: the top level that is not an object, a top-level member or a
  // model member.
  void StartValue() {
    if (depth_ == 0) {
      not_an_object_ = true;
      value_.emplace<SkippedValue>();
    } else if (depth_ == 1) {
      if (key_ == "model") ForgetModelTables();
      value_.emplace<KeptValue>(&out_.kept[key_], &budget_);
    } else if (key_ == "vocab") {
      value_.emplace<VocabReader>(src_, &out_.vocab);
    } else if (key_ == "merges") {
      value_.emplace<MergesReader>(src_, &out_.merges);
    } else {
      value_.emplace<KeptValue>(&out_.kept["model"][key_], &budget_);
    }
  }

  const JsonSource& src_;
  TokenizerJson& out_;
  int depth_ = 0;  // arrays and objects open
  std::string key_;
  // The member value being read (monostate: none) and the depth it started at.
  std::variant<std::monostate, SkippedValue, KeptValue, VocabReader, MergesReader> value_;
  int value_depth_ = 0;
  bool not_an_object_ = false;
  KeptBudget budget_;
};

}  // namespace

StatusOr<TokenizerJson> ReadTokenizerJson(const JsonSource& src, std::string_view text) {
  TokenizerJson file;
  TokenizerJsonReader reader(src, &file);
  if (Status parsed = SaxParseWithinDepth(text, &reader); !parsed.ok()) {
    return src.Invalid("", parsed.message());
  }
  RETURN_IF_ERROR(reader.Finish());
  return file;
}

}  // namespace llmctl::tokenizer_internal
