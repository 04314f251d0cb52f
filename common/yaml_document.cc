#include "common/yaml_document.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <cctype>
#include <sstream>
#include <string>

#include "common/text.h"

namespace llmctl {
namespace {

// `text` with each byte that breaks UTF-8 written as \xNN (yaml-cpp quotes input bytes in some
// messages, e.g. "unknown escape character").
std::string EscapeInvalidUtf8(std::string_view text) {
  std::string escaped;
  while (!text.empty()) {
    const size_t bad = FirstInvalidUtf8(text);
    escaped.append(text.substr(0, bad));
    if (bad == std::string_view::npos) break;
    constexpr char kHex[] = "0123456789ABCDEF";
    const unsigned char byte = static_cast<unsigned char>(text[bad]);
    escaped += "\\x";
    escaped += kHex[byte >> 4];
    escaped += kHex[byte & 0xF];
    text.remove_prefix(bad + 1);
  }
  return escaped;
}

// What a file is read as: an experiment's text is checked further (see the header).
enum class YamlFileKind { kExperiment, kSettings };

// Thrown by DocumentScanner at the first document's value past kMaxYamlValues, to stop the parse.
struct TooManyValues {
  YAML::Mark mark;
};

// Records where each document starts and whether it holds anything.
class DocumentScanner : public YAML::EventHandler {
 public:
  struct Document {
    YAML::Mark start;
    bool has_content = false;
  };
  std::vector<Document> documents;
  // The first key or value of the first document that is not UTF-8 text.
  std::optional<YAML::Mark> bad_utf8;
  // The first YAML feature an experiment file may not use, and what to say about it.
  std::optional<std::pair<YAML::Mark, std::string>> untrusted;

  void OnDocumentStart(const YAML::Mark& mark) override { documents.push_back({mark}); }
  void OnDocumentEnd() override {}
  // Not content: an empty document after a trailing "---" is a null.
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    Count(mark);
    Check(mark, "", anchor);
  }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override {
    Count(mark);
    Content();
    Untrusted(mark,
              "YAML alias (*name): anchors and aliases are not supported in experiment "
              "files (they can expand without bound, and `<<` merges hide where a value "
              "came from); write the values out, or put shared values in the base config");
  }
  void OnScalar(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                const std::string& value) override {
    Node(mark, tag, anchor);
    if (!bad_utf8 && documents.size() <= 1 && FirstInvalidUtf8(value) != std::string::npos) {
      bad_utf8 = mark;
    }
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    Node(mark, tag, anchor);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    Node(mark, tag, anchor);
  }
  void OnMapEnd() override {}

 private:
  void Content() {
    if (!documents.empty()) documents.back().has_content = true;
  }
  void Count(const YAML::Mark& mark) {
    if (documents.size() <= 1 && ++values_ > kMaxYamlValues) throw TooManyValues{mark};
  }
  void Untrusted(const YAML::Mark& mark, std::string problem) {
    if (!untrusted) untrusted.emplace(mark, std::move(problem));
  }
  void Node(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor) {
    Count(mark);
    Content();
    Check(mark, tag, anchor);
  }
  // Values are plain text to llmctl: an explicit tag (!!binary, !!python/object...) would ask a
  // YAML loader to build something else, and an anchor exists only to be aliased.
  void Check(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor) {
    if (anchor != YAML::NullAnchor) {
      Untrusted(mark,
                "YAML anchor (&name): anchors and aliases are not supported in experiment "
                "files (they can expand without bound, and `<<` merges hide where a "
                "value came from); write the values out, or put shared values in the "
                "base config");
    }
    if (!tag.empty() && tag != "?" && tag != "!") {
      constexpr std::string_view kCoreTags = "tag:yaml.org,2002:";
      const std::string shown =
          tag.starts_with(kCoreTags) ? "!!" + tag.substr(kCoreTags.size()) : tag;
      Untrusted(mark, "YAML tag '" + shown +
                          "': tags are not supported in experiment files; values are plain "
                          "text, numbers, lists and maps");
    }
  }

  size_t values_ = 0;  // of the first document, so far
};

Status SyntaxError(std::string_view text, std::string_view filename, const YAML::Exception& error) {
  // yaml-cpp reports a tab in indentation as "illegal map value" or similar; say what is wrong.
  int line_number = 0;
  size_t start = 0;
  while (start <= text.size() && line_number <= error.mark.line) {
    const size_t end = std::min(text.find('\n', start), text.size());
    const std::string_view line = text.substr(start, end - start);
    for (size_t column = 0; column < line.size() && (line[column] == ' ' || line[column] == '\t');
         ++column) {
      if (line[column] == '\t') {
        YAML::Mark tab;
        tab.line = line_number;
        tab.column = static_cast<int>(column);
        return YamlErrorAt(filename, tab,
                           "tab character in indentation; YAML indents with spaces only");
      }
    }
    start = end + 1;
    ++line_number;
  }
  return YamlErrorAt(filename, error.mark, "YAML syntax error: " + error.msg);
}

// An experiment is one document; a second one after "---" would be silently ignored by Load.
// Reads the text as events, building no nodes: Load's nodes take about 500 bytes a value (900 MB
// for a 4 MB list of numbers), so a document of more than kMaxYamlValues is refused before it.
// May throw YAML::Exception for malformed YAML.
Status CheckSingleDocument(std::string_view text, std::string_view filename, YamlFileKind kind) {
  std::stringstream stream{std::string(text)};
  YAML::Parser parser(stream);
  DocumentScanner scanner;
  bool two_calls = false;
  try {
    // At most two calls: yaml-cpp's parser does not always advance on bad input (see Parse).
    two_calls = parser.HandleNextDocument(scanner) && parser.HandleNextDocument(scanner);
  } catch (const TooManyValues& too_many) {
    std::string message = std::string("more than ")
                              .append(std::to_string(kMaxYamlValues))
                              .append(" values (scalars, lists and maps) in one file");
    if (kind == YamlFileKind::kExperiment) {
      message += "; an experiment holds at most 1000 trials of a few keys each";
    }
    return YamlErrorAt(filename, too_many.mark, message);
  }
  // Keys and values end up in messages and in JSON (TrialConfig::ToJson), which must be UTF-8.
  if (kind == YamlFileKind::kExperiment && scanner.bad_utf8) {
    return YamlErrorAt(filename, *scanner.bad_utf8,
                       "text that is not valid UTF-8; experiment files must be UTF-8 text");
  }
  if (kind == YamlFileKind::kExperiment && scanner.untrusted)
    return YamlErrorAt(filename, scanner.untrusted->first, scanner.untrusted->second);
  if (!two_calls) return Status::Ok();
  if (scanner.documents.size() < 2) return Status::Ok();
  const YAML::Mark& first = scanner.documents[0].start;
  const YAML::Mark& second = scanner.documents[1].start;
  if (second.pos <= first.pos) {
    // The parser is stuck on a token it cannot place (yaml-cpp accepts a lone "," as a document).
    const size_t pos = static_cast<size_t>(std::max(second.pos, 0));
    const std::string token = pos < text.size() ? std::string(1, text[pos]) : "end of file";
    return YamlErrorAt(filename, second, "YAML syntax error: unexpected '" + token + "'");
  }
  // A settings file's further documents are yaml-cpp's to ignore, as they always were.
  if (kind == YamlFileKind::kSettings) return Status::Ok();
  if (!scanner.documents[1].has_content) return Status::Ok();  // a trailing "---" alone
  return YamlErrorAt(filename, second,
                     "expected one YAML document, found another after '---'; put each experiment "
                     "in its own file");
}

StatusOr<YAML::Node> LoadOneDocument(std::string_view text, std::string_view filename,
                                     YamlFileKind kind) {
  try {
    // Not YAML::LoadAll: yaml-cpp 0.7 loops forever, allocating, on some invalid input such as
    // "," (jbeder/yaml-cpp#1040, fixed upstream in 0.8.x). Load reads one document;
    // CheckSingleDocument looks for a second one without that loop.
    RETURN_IF_ERROR(CheckSingleDocument(text, filename, kind));
    return YAML::Load(std::string(text));
  } catch (const YAML::DeepRecursion& error) {
    // yaml-cpp's own message for it is "bad file".
    std::string message = "lists and maps nested " + std::to_string(error.depth()) +
                          " levels deep, more than the YAML reader takes";
    if (kind == YamlFileKind::kExperiment) message += "; an experiment file's nest a few levels";
    return YamlErrorAt(filename, error.mark, message);
  } catch (const YAML::Exception& error) {
    return SyntaxError(text, filename, error);
  }
}

}  // namespace

Status YamlErrorAt(std::string_view filename, const YAML::Mark& mark, const std::string& message) {
  const int line = std::max(mark.line, 0) + 1;
  const int column = std::max(mark.column, 0) + 1;
  return InvalidArgumentError(std::string(filename) + ":" + std::to_string(line) + ":" +
                              std::to_string(column) + ": " + EscapeInvalidUtf8(message));
}

StatusOr<YAML::Node> LoadYamlDocument(std::string_view text, std::string_view filename) {
  return LoadOneDocument(text, filename, YamlFileKind::kExperiment);
}

StatusOr<YAML::Node> LoadYamlSettings(std::string_view text, std::string_view filename) {
  return LoadOneDocument(text, filename, YamlFileKind::kSettings);
}

bool HasNoYamlContent(std::string_view text) {
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = std::min(text.find('\n', start), text.size());
    std::string_view line = text.substr(start, end - start);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front()))) {
      line.remove_prefix(1);
    }
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) {
      line.remove_suffix(1);
    }
    if (!line.empty() && line.front() != '#' && line != "---" && line != "...") return false;
    start = end + 1;
  }
  return true;
}

}  // namespace llmctl
