#include "common/byte_size.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace llmctl {
namespace {

uint64_t Parsed(std::string_view text) {
  StatusOr<uint64_t> bytes = ParseByteSize(text);
  EXPECT_TRUE(bytes.ok()) << text << ": " << bytes.status().ToString();
  return bytes.ok() ? *bytes : 0;
}

TEST(ParseByteSizeTest, BinaryUnits) {
  EXPECT_EQ(Parsed("2GiB"), uint64_t{2} << 30);
  EXPECT_EQ(Parsed("512MiB"), uint64_t{512} << 20);
  EXPECT_EQ(Parsed("4KiB"), 4096u);
  EXPECT_EQ(Parsed("1TiB"), uint64_t{1} << 40);
}

TEST(ParseByteSizeTest, DecimalUnits) {
  EXPECT_EQ(Parsed("2GB"), 2000000000u);
  EXPECT_EQ(Parsed("3MB"), 3000000u);
  EXPECT_EQ(Parsed("7KB"), 7000u);
  EXPECT_EQ(Parsed("2TB"), 2000000000000u);
}

TEST(ParseByteSizeTest, PlainNumbersAndBytes) {
  EXPECT_EQ(Parsed("1024"), 1024u);
  EXPECT_EQ(Parsed("0"), 0u);
  EXPECT_EQ(Parsed("10B"), 10u);
  EXPECT_EQ(Parsed("18446744073709551615"), std::numeric_limits<uint64_t>::max());
}

TEST(ParseByteSizeTest, FractionsRoundToNearestByte) {
  EXPECT_EQ(Parsed("1.5GiB"), 1610612736u);
  EXPECT_EQ(Parsed("0.5KiB"), 512u);
  EXPECT_EQ(Parsed(".5MiB"), 524288u);
  EXPECT_EQ(Parsed("1.5GB"), 1500000000u);
  EXPECT_EQ(Parsed("0.1KiB"), 102u);  // 102.4 rounds down
  EXPECT_EQ(Parsed("2.0"), 2u);       // a zero fraction of a byte is fine
}

TEST(ParseByteSizeTest, SpacesAndCaseAreForgiven) {
  EXPECT_EQ(Parsed(" 24 GiB "), uint64_t{24} << 30);
  EXPECT_EQ(Parsed("24gib"), uint64_t{24} << 30);
  EXPECT_EQ(Parsed("1gb"), 1000000000u);
}

TEST(ParseByteSizeTest, RejectsMalformedText) {
  for (std::string_view bad : {"", "  ", "GiB", "abc", "2XB", "2G", "1.2.3GiB", "2 GiB extra",
                               "-1GiB", "1e9", "0x10", "1.5", "1.5B"}) {
    StatusOr<uint64_t> bytes = ParseByteSize(bad);
    EXPECT_FALSE(bytes.ok()) << "'" << bad << "' parsed as " << (bytes.ok() ? *bytes : 0);
    if (!bytes.ok()) {
      EXPECT_EQ(bytes.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
}

TEST(ParseByteSizeTest, ErrorNamesTheTextAndTheUnits) {
  StatusOr<uint64_t> bytes = ParseByteSize("2XB");
  ASSERT_FALSE(bytes.ok());
  EXPECT_NE(bytes.status().message().find("'2XB'"), std::string::npos) << bytes.status().message();
  EXPECT_NE(bytes.status().message().find("unknown unit 'XB'"), std::string::npos);
  EXPECT_NE(bytes.status().message().find("GiB"), std::string::npos);
  EXPECT_NE(ParseByteSize("-1GiB").status().message().find("negative"), std::string::npos);
  EXPECT_NE(ParseByteSize("1.5").status().message().find("whole number"), std::string::npos);
}

TEST(ParseByteSizeTest, OverflowIsOutOfRange) {
  EXPECT_EQ(ParseByteSize("18446744073709551616").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(ParseByteSize("16777216TiB").status().code(), StatusCode::kOutOfRange);  // 2^64
  EXPECT_EQ(ParseByteSize("99999999999999999999999GiB").status().code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(ParseByteSize("16777215TiB").ok());
}

TEST(FormatGiBTest, TwoDecimals) {
  EXPECT_EQ(FormatGiB(0), "0.00 GiB");
  EXPECT_EQ(FormatGiB(uint64_t{1} << 30), "1.00 GiB");
  EXPECT_EQ(FormatGiB(558345748), "0.52 GiB");
  EXPECT_EQ(FormatGiB(uint64_t{80} << 30), "80.00 GiB");
  EXPECT_EQ(FormatGiB(32652853002), "30.41 GiB");
}

TEST(FormatBytesTest, PicksTheLargestUnitAtLeastOne) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.00 KiB");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(uint64_t{12} << 20 | uint64_t{1} << 18), "12.25 MiB");
  EXPECT_EQ(FormatBytes(uint64_t{512} << 20), "512.00 MiB");
  EXPECT_EQ(FormatBytes(uint64_t{3} << 30), "3.00 GiB");
  EXPECT_EQ(FormatBytes(uint64_t{2} << 40), "2.00 TiB");
}

TEST(FormatBytesTest, RoundingUpMovesToTheNextUnit) {
  EXPECT_EQ(FormatBytes((uint64_t{1} << 30) - 1), "1.00 GiB");  // not "1024.00 MiB"
  EXPECT_EQ(FormatBytes((uint64_t{1} << 20) - 1), "1.00 MiB");
  EXPECT_EQ(FormatBytes(std::numeric_limits<uint64_t>::max()), "16777216.00 TiB");
}

TEST(ByteSizeRoundTripTest, FormattedGiBParsesBackClose) {
  const uint64_t bytes = uint64_t{30} << 30 | uint64_t{1} << 28;  // 30.25 GiB
  StatusOr<uint64_t> parsed = ParseByteSize(FormatBytes(bytes));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(*parsed, bytes);
}

}  // namespace
}  // namespace llmctl
