#include "common/byte_size.h"

#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>

#include "common/text.h"

namespace llmctl {
namespace {

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kTiB = uint64_t{1} << 40;

struct Unit {
  std::string_view name;
  uint64_t multiplier;
};

constexpr std::array<Unit, 9> kUnits = {{
    {"B", 1},
    {"KB", 1000},
    {"MB", 1000 * 1000},
    {"GB", 1000 * 1000 * 1000},
    {"TB", uint64_t{1000} * 1000 * 1000 * 1000},
    {"KiB", kKiB},
    {"MiB", kMiB},
    {"GiB", kGiB},
    {"TiB", kTiB},
}};

Status InvalidByteSize(std::string_view text, std::string_view why) {
  return InvalidArgumentError(
      "invalid byte size '" + std::string(text) + "': " + std::string(why) +
      "; write a number with an optional unit: B, KB, MB, GB, TB "
      "(powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. 24GiB");
}

// Formats `bytes / unit` with two decimals.
std::string FormatInUnit(uint64_t bytes, uint64_t unit, std::string_view unit_name) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.2f %.*s",
                static_cast<double>(bytes) / static_cast<double>(unit),
                static_cast<int>(unit_name.size()), unit_name.data());
  return buffer;
}

}  // namespace

StatusOr<uint64_t> ParseByteSize(std::string_view original) {
  const std::string_view text = Trim(original);
  if (text.empty()) return InvalidByteSize(original, "it is empty");
  if (text.front() == '-') return InvalidByteSize(original, "a size cannot be negative");

  // Split "1.5 GiB" into the integer digits, the fraction digits and the unit.
  size_t pos = 0;
  const size_t integer_begin = pos;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
  const std::string_view integer_digits = text.substr(integer_begin, pos - integer_begin);
  std::string_view fraction_digits;
  if (pos < text.size() && text[pos] == '.') {
    const size_t fraction_begin = ++pos;
    while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
    fraction_digits = text.substr(fraction_begin, pos - fraction_begin);
  }
  if (integer_digits.empty() && fraction_digits.empty()) {
    return InvalidByteSize(original, "it does not start with a number");
  }
  const std::string_view unit_text = Trim(text.substr(pos));

  uint64_t multiplier = 1;
  if (!unit_text.empty()) {
    bool found = false;
    for (const Unit& unit : kUnits) {
      if (EqualsIgnoreCase(unit_text, unit.name)) {
        multiplier = unit.multiplier;
        found = true;
        break;
      }
    }
    if (!found) {
      return InvalidByteSize(original, "unknown unit '" + std::string(unit_text) + "'");
    }
  }

  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  uint64_t whole = 0;
  for (char digit : integer_digits) {
    const uint64_t d = static_cast<uint64_t>(digit - '0');
    if (whole > (kMax - d) / 10) {
      return OutOfRangeError("byte size '" + std::string(original) + "' is too large");
    }
    whole = whole * 10 + d;
  }
  if (multiplier != 0 && whole > kMax / multiplier) {
    return OutOfRangeError("byte size '" + std::string(original) + "' is too large");
  }
  uint64_t bytes = whole * multiplier;

  // The fraction only matters down to a byte; long double keeps 64 bits of mantissa, which is exact
  // for every fraction of a TiB that rounds to a whole byte.
  bool has_nonzero_fraction = false;
  long double fraction = 0.0L;
  long double scale = 1.0L;
  for (char digit : fraction_digits) {
    scale /= 10.0L;
    fraction += static_cast<long double>(digit - '0') * scale;
    if (digit != '0') has_nonzero_fraction = true;
  }
  if (has_nonzero_fraction) {
    if (multiplier == 1) return InvalidByteSize(original, "a byte count must be a whole number");
    const long double extra = std::round(fraction * static_cast<long double>(multiplier));
    const uint64_t extra_bytes = static_cast<uint64_t>(extra);
    if (bytes > kMax - extra_bytes) {
      return OutOfRangeError("byte size '" + std::string(original) + "' is too large");
    }
    bytes += extra_bytes;
  }
  return bytes;
}

std::string FormatGiB(uint64_t bytes) { return FormatInUnit(bytes, kGiB, "GiB"); }

std::string FormatBytes(uint64_t bytes) {
  if (bytes < kKiB) return std::to_string(bytes) + " B";
  struct BinaryUnit {
    uint64_t size;
    std::string_view name;
  };
  constexpr std::array<BinaryUnit, 4> kBinaryUnits = {{
      {kTiB, "TiB"},
      {kGiB, "GiB"},
      {kMiB, "MiB"},
      {kKiB, "KiB"},
  }};
  for (size_t i = 0; i < kBinaryUnits.size(); ++i) {
    const BinaryUnit& unit = kBinaryUnits[i];
    if (bytes < unit.size) continue;
    // Rounding can print "1024.00 MiB" for a size just under 1 GiB; the larger unit reads better
    // there.
    if (i > 0) {
      const double in_larger =
          static_cast<double>(bytes) / static_cast<double>(kBinaryUnits[i - 1].size);
      if (std::round(in_larger * 100.0) >= 100.0) {
        return FormatInUnit(bytes, kBinaryUnits[i - 1].size, kBinaryUnits[i - 1].name);
      }
    }
    return FormatInUnit(bytes, unit.size, unit.name);
  }
  return std::to_string(bytes) + " B";  // unreachable: bytes >= 1 KiB matched a unit above
}

}  // namespace llmctl
