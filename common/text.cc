#include "common/text.h"

#include <algorithm>
#include <cctype>
#include <cstdint>

namespace llmctl {

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view Trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) {
    text.remove_prefix(1);
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  return text;
}

std::string_view LastNonBlankLine(std::string_view text) {
  while (!text.empty()) {
    const size_t newline = text.find_last_of('\n');
    const std::string_view line =
        Trim(newline == std::string_view::npos ? text : text.substr(newline + 1));
    if (!line.empty()) return line;
    if (newline == std::string_view::npos) break;
    text = text.substr(0, newline);
  }
  return {};
}

void AppendKeepingTail(std::string& tail, std::string_view bytes, size_t max_bytes) {
  tail.append(bytes);
  if (tail.size() > max_bytes) tail.erase(0, tail.size() - max_bytes);
}

namespace {

// The code point that starts at `text[at]` and its length in bytes: 0 bytes when the bytes there
// break UTF-8 (overlong forms, surrogates and code points past U+10FFFF included).
struct Utf8Char {
  uint32_t code_point = 0;
  size_t bytes = 0;
};

Utf8Char DecodeUtf8(std::string_view text, size_t at) {
  const unsigned char c = static_cast<unsigned char>(text[at]);
  if (c < 0x80) return {c, 1};
  size_t len;
  uint32_t cp;
  if ((c & 0xe0) == 0xc0) {
    len = 2;
    cp = c & 0x1f;
  } else if ((c & 0xf0) == 0xe0) {
    len = 3;
    cp = c & 0x0f;
  } else if ((c & 0xf8) == 0xf0) {
    len = 4;
    cp = c & 0x07;
  } else {
    return {};
  }
  if (at + len > text.size()) return {};
  for (size_t k = 1; k < len; ++k) {
    const unsigned char cc = static_cast<unsigned char>(text[at + k]);
    if ((cc & 0xc0) != 0x80) return {};
    cp = (cp << 6) | (cc & 0x3f);
  }
  constexpr uint32_t kMinForLen[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMinForLen[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return {};
  return {cp, len};
}

// C0, DEL and C1 (which terminals take as CSI and its kind too), and the line and paragraph
// separators, which some readers take as line ends.
bool IsControl(uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029;
}

// The marks, embeddings, overrides and isolates of Unicode's bidirectional algorithm: U+202E makes
// "exe.txt" of "txt.exe", and the text after it on the line too.
bool IsBidiControl(uint32_t cp) {
  return cp == 0x061c || cp == 0x200e || cp == 0x200f || (cp >= 0x202a && cp <= 0x202e) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";
constexpr std::string_view kEllipsis = "\xE2\x80\xA6";

}  // namespace

size_t FirstInvalidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t bytes = DecodeUtf8(s, i).bytes;
    if (bytes == 0) return i;
    i += bytes;
  }
  return std::string_view::npos;
}

namespace {

size_t DisplayWidth(std::string_view text) {
  size_t width = 0;
  for (char c : text)
    width += (static_cast<unsigned char>(c) & 0xC0) != 0x80;  // not a continuation
  return width;
}

}  // namespace

std::string FormatColumns(const std::vector<std::vector<std::string>>& rows,
                          size_t first_right_aligned) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], DisplayWidth(row[i]));
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      const std::string padding(widths[i] - DisplayWidth(row[i]), ' ');
      if (i > 0) line += "  ";
      line += i >= first_right_aligned ? padding + row[i] : row[i] + padding;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string PrintableTextProblem(std::string_view text, size_t max_bytes) {
  if (text.size() > max_bytes) return "longer than " + std::to_string(max_bytes) + " bytes";
  for (size_t i = 0; i < text.size();) {
    const Utf8Char c = DecodeUtf8(text, i);
    if (c.bytes == 0) return "not valid UTF-8";
    if (IsControl(c.code_point)) return "holds a control character";
    if (IsBidiControl(c.code_point)) return "holds a bidirectional text control";
    i += c.bytes;
  }
  return "";
}

namespace {

// OnOneLine's text, keeping newlines and tabs when `keep_lines` and then starting each line after
// the first with white space.
std::string Displayed(std::string_view text, bool keep_lines, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes));
  for (size_t i = 0; i < text.size() && out.size() <= max_bytes;) {
    const Utf8Char c = DecodeUtf8(text, i);
    if (c.bytes == 0) {
      out += kReplacementCharacter;
      ++i;
      continue;
    }
    if (keep_lines && (c.code_point == '\n' || c.code_point == '\t')) {
      out += static_cast<char>(c.code_point);
      const bool line_starts = c.code_point == '\n' && i + 1 < text.size();
      if (line_starts && text[i + 1] != ' ' && text[i + 1] != '\t' && text[i + 1] != '\n') {
        out += "  ";
      }
    } else if (IsControl(c.code_point) || IsBidiControl(c.code_point)) {
      out += ' ';
    } else {
      out += text.substr(i, c.bytes);
    }
    i += c.bytes;
  }
  if (out.size() <= max_bytes) return out;
  // `out` is valid UTF-8: a character starts at any byte that is not a continuation byte.
  const bool ellipsis = max_bytes >= kEllipsis.size();
  size_t cut = ellipsis ? max_bytes - kEllipsis.size() : max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;
  out.resize(cut);
  if (ellipsis) out += kEllipsis;
  return out;
}

}  // namespace

std::string OnOneLine(std::string_view text, size_t max_bytes) {
  return Displayed(text, /*keep_lines=*/false, max_bytes);
}

std::string ForTerminal(std::string_view text, size_t max_bytes) {
  return Displayed(text, /*keep_lines=*/true, max_bytes);
}

std::string ReplaceInvalidUtf8(std::string_view text) {
  std::string out;
  for (size_t bad = FirstInvalidUtf8(text); bad != std::string_view::npos;
       bad = FirstInvalidUtf8(text)) {
    out.append(text.substr(0, bad));
    out.append(kReplacementCharacter);
    text.remove_prefix(bad + 1);
  }
  out.append(text);
  return out;
}

std::string CountOf(int64_t count, std::string_view one, std::string_view many) {
  std::string text = std::to_string(count);
  text += ' ';
  text += count == 1 ? one : many;
  return text;
}

std::string Join(const std::vector<std::string_view>& items, std::string_view separator) {
  std::string joined;
  for (std::string_view item : items) {
    if (!joined.empty()) joined += separator;
    joined += item;
  }
  return joined;
}

std::string NameInputs(std::string text, const std::map<std::string, std::string>& names) {
  std::vector<const std::pair<const std::string, std::string>*> longest_first;
  for (const auto& entry : names) {
    if (!entry.first.empty()) longest_first.push_back(&entry);
  }
  std::sort(longest_first.begin(), longest_first.end(),
            [](auto* a, auto* b) { return a->first.size() > b->first.size(); });
  for (const auto* entry : longest_first) {
    const auto& [from, to] = *entry;
    for (size_t at = text.find(from); at != std::string::npos;
         at = text.find(from, at + to.size())) {
      text.replace(at, from.size(), to);
    }
  }
  return text;
}

std::string InputNameArgument(std::string_view path, std::string_view name) {
  std::string argument;
  for (char c : path) {
    if (c == '\\' || c == '=') argument += '\\';
    argument += c;
  }
  return argument.append("=").append(name);
}

std::optional<std::pair<std::string, std::string>> ParseInputNameArgument(
    std::string_view argument) {
  std::string path;
  for (size_t i = 0; i < argument.size(); ++i) {
    const char c = argument[i];
    if (c == '=') {
      if (path.empty() || i + 1 == argument.size()) return std::nullopt;
      return std::pair(std::move(path), std::string(argument.substr(i + 1)));
    }
    if (c == '\\') {
      if (i + 1 == argument.size() || (argument[i + 1] != '\\' && argument[i + 1] != '=')) {
        return std::nullopt;
      }
      ++i;
    }
    path += argument[i];
  }
  return std::nullopt;
}

std::string PercentEncode(std::string_view text, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' ||
        (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string ShellWord(std::string_view word) {
  if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                              "0123456789_-./:=@%+,") == std::string_view::npos) {
    return std::string(word);
  }
  std::string quoted = "'";
  for (char c : word) {
    if (c == '\'') {
      quoted.append("'\\''");
    } else {
      quoted.push_back(c);
    }
  }
  quoted.push_back('\'');
  return quoted;
}

}  // namespace llmctl
