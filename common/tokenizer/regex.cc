#include "common/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utility>

#include "common/tokenizer/unicode.h"

namespace llmctl::tokenizer_internal {
namespace {

// Enough for any real pre-tokenizer pattern on long inputs (the work per match grows with the
// length of a whitespace run or word), small enough that a pathological pattern fails within a
// second.
constexpr uint32_t kMatchLimit = 10'000'000;
constexpr PCRE2_SIZE kHeapLimitKib = 64 * 1024;

// Oniguruma's word characters (\w) are letters, marks, numbers and connector punctuation;
// PCRE2 10.42's are letters, numbers and "_" only.
constexpr std::string_view kOnigWordClassBody = R"(\p{L}\p{M}\p{N}\p{Pc})";

// Rewrites the escapes whose meaning differs between Oniguruma (Ruby syntax) and PCRE2 so that the
// pattern matches what the library matches: \w \W \b \B (word characters include marks) and \h \H
// (hex digits in Ruby, horizontal space in PCRE2). Inside a character class only \w and \h can be
// rewritten; \W and \H there keep PCRE2's meaning (no tokenizer pattern uses them).
std::string TranslateOniguruma(std::string_view pattern) {
  const std::string word = "[" + std::string(kOnigWordClassBody) + "]";
  const std::string not_word = "[^" + std::string(kOnigWordClassBody) + "]";
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  size_t class_start = 0;  // index in `out` just after the '[' (or "[^") that opened the class
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 'Q') {  // \Q...\E is literal text
        const size_t end = pattern.find("\\E", i + 1);
        const size_t stop = end == std::string_view::npos ? pattern.size() : end + 2;
        out.append(pattern.substr(i - 1, stop - (i - 1)));
        i = stop - 1;
        continue;
      }
      if (in_class) {
        if (e == 'w') {
          out += kOnigWordClassBody;
        } else if (e == 'h') {
          out += "0-9a-fA-F";
        } else {
          out += c;
          out += e;
        }
        continue;
      }
      switch (e) {
        case 'w':
          out += word;
          break;
        case 'W':
          out += not_word;
          break;
        case 'b':
          out += "(?:(?<=" + word + ")(?!" + word + ")|(?<!" + word + ")(?=" + word + "))";
          break;
        case 'B':
          out += "(?:(?<=" + word + ")(?=" + word + ")|(?<!" + word + ")(?!" + word + "))";
          break;
        case 'h':
          out += "[0-9a-fA-F]";
          break;
        case 'H':
          out += "[^0-9a-fA-F]";
          break;
        default:
          out += c;
          out += e;
      }
      continue;
    }
    out += c;
    if (!in_class && c == '[') {
      in_class = true;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      class_start = out.size();
    } else if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t end = pattern.find(":]", i + 2);  // a POSIX class such as [:alpha:]
      if (end != std::string_view::npos) {
        out.append(pattern.substr(i + 1, end + 2 - (i + 1)));
        i = end + 1;
      }
    } else if (in_class && c == ']' && out.size() - 1 != class_start) {
      in_class = false;  // a ']' right after '[' or "[^" is a literal
    }
  }
  return out;
}

std::string Pcre2ErrorMessage(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) {
    return "PCRE2 error " + std::to_string(code);
  }
  return std::string(reinterpret_cast<const char*>(buffer));
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

}  // namespace

StatusOr<std::unique_ptr<Pattern>> Pattern::Literal(std::string_view text) {
  if (!text.empty()) {
    std::unique_ptr<Pattern> pattern(new Pattern());
    pattern->source_ = std::string(text);
    pattern->literal_ = std::string(text);
    return pattern;
  }
  // An empty literal matches the empty string everywhere; the regex engine has those semantics
  // already.
  return Regex("");
}

StatusOr<std::unique_ptr<Pattern>> Pattern::Regex(std::string_view regex) {
  std::unique_ptr<Pattern> pattern(new Pattern());
  pattern->source_ = std::string(regex);
  const std::string translated = TranslateOniguruma(regex);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pattern->code_ =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error_code, &error_offset, nullptr);
  if (pattern->code_ == nullptr) {
    return InvalidArgumentError("regex /" + std::string(regex) +
                                "/ does not compile: " + Pcre2ErrorMessage(error_code));
  }
  // JIT is several times faster; when it is unavailable the interpreter gives the same results.
  (void)pcre2_jit_compile(pattern->code_, PCRE2_JIT_COMPLETE);
  pattern->context_ = pcre2_match_context_create(nullptr);
  if (pattern->context_ == nullptr) return ResourceExhaustedError("out of memory compiling regex");
  pcre2_set_match_limit(pattern->context_, kMatchLimit);
  pcre2_set_heap_limit(pattern->context_, kHeapLimitKib);
  return pattern;
}

Pattern::~Pattern() {
  if (context_ != nullptr) pcre2_match_context_free(context_);
  if (code_ != nullptr) pcre2_code_free(code_);
}

Status Pattern::FindAll(std::string_view text, std::vector<MatchSpan>* matches) const {
  matches->clear();
  if (code_ == nullptr) {
    for (size_t pos = text.find(literal_); pos != std::string_view::npos;
         pos = text.find(literal_, pos + literal_.size())) {
      matches->push_back({pos, pos + literal_.size()});
    }
    return Status::Ok();
  }
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(pcre2_match_data_create(1, nullptr));
  if (data == nullptr) return ResourceExhaustedError("out of memory matching regex");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t search_from = 0;
  bool has_last_match = false;
  size_t last_match_end = 0;
  while (search_from <= text.size()) {
    uint32_t options = PCRE2_NO_UTF_CHECK;  // callers validated the whole input once
    int rc = pcre2_match(code_, subject, text.size(), search_from, options, data.get(), context_);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      options |= PCRE2_NO_JIT;  // the interpreter keeps its backtracking state on the heap
      rc = pcre2_match(code_, subject, text.size(), search_from, options, data.get(), context_);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return ResourceExhaustedError("regex /" + source_ + "/ gave up on a " +
                                    std::to_string(text.size()) +
                                    "-byte input: " + Pcre2ErrorMessage(rc));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (begin > end || end > text.size()) {
      return InvalidArgumentError(
          "regex /" + source_ +
          "/ reported a match ending before it starts (\\K is not supported)");
    }
    if (begin == end && has_last_match && last_match_end == end) {
      // Oniguruma's find_iter never accepts an empty match right after the previous match; it steps
      // one character forward and searches again.
      search_from += search_from < text.size()
                         ? Utf8SequenceLength(static_cast<unsigned char>(text[search_from]))
                         : 1;
      continue;
    }
    matches->push_back({begin, end});
    has_last_match = true;
    last_match_end = end;
    search_from = end;
  }
  return Status::Ok();
}

}  // namespace llmctl::tokenizer_internal
