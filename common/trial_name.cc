#include "common/trial_name.h"

#include <cctype>

#include "common/text.h"

namespace llmctl {
namespace {

bool KeptAsIs(unsigned char c) { return std::isalnum(c) || c == '.' || c == '_' || c == '-'; }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string EncodeTrialName(std::string_view trial) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string encoded;
  for (unsigned char c : trial) {
    if (KeptAsIs(c)) {
      encoded += static_cast<char>(c);
    } else {
      encoded += '%';
      encoded += kHex[c >> 4];
      encoded += kHex[c & 15];
    }
  }
  return encoded;
}

std::optional<std::string> DecodeTrialName(std::string_view encoded) {
  std::string trial;
  for (size_t i = 0; i < encoded.size(); ++i) {
    if (encoded[i] != '%') {
      trial += encoded[i];
      continue;
    }
    if (i + 2 >= encoded.size()) return std::nullopt;
    const int high = HexValue(encoded[i + 1]);
    const int low = HexValue(encoded[i + 2]);
    if (high < 0 || low < 0) return std::nullopt;
    trial += static_cast<char>(high * 16 + low);
    i += 2;
  }
  return trial;
}

std::string TrialNameProblem(std::string_view name) {
  if (name.empty() || name == "." || name == ".." || name.size() > kMaxTrialNameBytes) {
    return "must be 1 to " + std::to_string(kMaxTrialNameBytes) + " bytes and not '.' or '..'";
  }
  const size_t encoded = EncodeTrialName(name).size();
  if (encoded > kMaxEncodedTrialNameBytes) {
    return "is " + std::to_string(encoded) +
           " bytes as a directory name ('/', '=', ',' and other bytes than letters, digits, '.', "
           "'_' and '-' take 3), over " +
           std::to_string(kMaxEncodedTrialNameBytes);
  }
  // Every command that lists trials prints their names.
  if (std::string problem = PrintableTextProblem(name, kMaxTrialNameBytes); !problem.empty()) {
    return problem;
  }
  return "";
}

}  // namespace llmctl
