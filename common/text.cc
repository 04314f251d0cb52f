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

size_t FirstInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
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
      return i;
    }
    if (i + len > s.size()) return i;
    for (size_t k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3f);
    }
    constexpr uint32_t kMinForLen[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLen[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += len;
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
  if (std::any_of(text.begin(), text.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
    return "holds a control character";
  }
  if (FirstInvalidUtf8(text) != std::string_view::npos) return "not valid UTF-8";
  return "";
}

namespace {

// `text` with each control character that `keep` does not keep replaced by a space: C0 (below
// 0x20), DEL, and C1 (U+0080 to U+009F, UTF-8 C2 80 to C2 9F, which terminals take as CSI and its
// kind too) as one space each.
template <typename Keep>
std::string WithoutControls(std::string_view text, Keep keep) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == 0xC2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
        static_cast<unsigned char>(text[i + 1]) <= 0x9F) {
      out += ' ';
      ++i;
    } else if ((c < 0x20 || c == 0x7f) && !keep(static_cast<char>(c))) {
      out += ' ';
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace

std::string OnOneLine(std::string_view text) {
  return WithoutControls(text, [](char) { return false; });
}

std::string ForTerminal(std::string_view text) {
  return WithoutControls(text, [](char c) { return c == '\n' || c == '\t'; });
}

std::string ReplaceInvalidUtf8(std::string_view text) {
  std::string out;
  for (size_t bad = FirstInvalidUtf8(text); bad != std::string_view::npos;
       bad = FirstInvalidUtf8(text)) {
    out.append(text.substr(0, bad));
    out.append("\xEF\xBF\xBD");
    text.remove_prefix(bad + 1);
  }
  out.append(text);
  return out;
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

}  // namespace llmctl
