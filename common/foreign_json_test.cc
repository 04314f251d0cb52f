#include "common/foreign_json.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "common/status.h"
#include "common/text.h"

namespace llmctl {
namespace {

TEST(ForeignJsonTest, ParsesWhatNestsWithinTheLimitAndDiscardsTheRest) {
  EXPECT_EQ(ParseForeignJson(R"({"type":"step","step":[1,{"a":2}]})")["step"][1]["a"], 2);
  EXPECT_TRUE(ParseForeignJson("not json").is_discarded());
  EXPECT_TRUE(ParseForeignJson("").is_discarded());
  auto nested = [](int levels) { return std::string(levels, '[') + std::string(levels, ']'); };
  EXPECT_FALSE(ParseForeignJson(nested(kMaxForeignJsonDepth)).is_discarded());
  EXPECT_TRUE(ParseForeignJson(nested(kMaxForeignJsonDepth + 1)).is_discarded());
  // 200,000 levels: a copy or dump() of it would overflow the stack; the parse ends at level 65.
  const nlohmann::json deep = ParseForeignJson("{\"a\":" + nested(200000) + "}");
  EXPECT_TRUE(deep.is_discarded());
}

// The parse ends at the first array nested past the limit and reads no byte after it: here the text
// runs on into a page that cannot be read. A parser that read on, keeping a level of stack for each
// '[' (408 MB for a 60 MB hub listing), would fault there.
TEST(ForeignJsonTest, TheParseReadsNothingPastTheFirstArrayNestedTooDeep) {
  const size_t page = sysconf(_SC_PAGESIZE);
  void* pages = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(pages, MAP_FAILED);
  char* unreadable = static_cast<char*>(pages) + page;
  ASSERT_EQ(mprotect(unreadable, page, PROT_NONE), 0);
  const size_t levels = kMaxForeignJsonDepth + 1;
  std::memset(unreadable - levels, '[', levels);
  const std::string_view text(unreadable - levels, levels + page);
  EXPECT_EXIT(
      {
        const StatusOr<nlohmann::json> parsed = ParseJsonWithinDepth(text);
        std::exit(parsed.status().message() == "arrays and objects nested more than 64 levels deep"
                      ? 0
                      : 1);
      },
      testing::ExitedWithCode(0), "");
  munmap(pages, 2 * page);
}

TEST(ForeignJsonTest, WhyTextIsRefusedIsSaid) {
  const StatusOr<nlohmann::json> deep =
      ParseJsonWithinDepth(std::string(kMaxForeignJsonDepth + 1, '[') + "\xff not json");
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(deep.status().message(), "arrays and objects nested more than 64 levels deep");
  const StatusOr<nlohmann::json> within =
      ParseJsonWithinDepth(std::string(kMaxForeignJsonDepth, '[') + "\xff not json");
  ASSERT_FALSE(within.ok());
  EXPECT_TRUE(within.status().message().starts_with("not valid JSON: "))
      << within.status().message();
  EXPECT_EQ(FirstInvalidUtf8(within.status().message()), std::string::npos);
  EXPECT_EQ(ParseJsonWithinDepth("not json").status().message(),
            "not valid JSON: parse error at line 1, column 2: syntax error while parsing value - "
            "invalid literal; last read: 'no'");
  const StatusOr<nlohmann::json> objects = ParseJsonWithinDepth(
      std::string("{\"a\":").append(kMaxForeignJsonDepth, '[') + "{\"b\": not json");
  ASSERT_FALSE(objects.ok());
  EXPECT_EQ(objects.status().message(), "arrays and objects nested more than 64 levels deep");
  EXPECT_EQ(*ParseJsonWithinDepth(R"({"a":[1,2.5,"x",null,true]})"),
            nlohmann::json::parse(R"({"a":[1,2.5,"x",null,true]})"));
}

TEST(ForeignJsonTest, NestsAtMostCountsLevelsOfArraysAndObjects) {
  EXPECT_TRUE(NestsAtMost(nlohmann::json(3), 0));
  EXPECT_TRUE(NestsAtMost(nlohmann::json::parse("[[1]]"), 2));
  EXPECT_FALSE(NestsAtMost(nlohmann::json::parse("[[1]]"), 1));
  EXPECT_FALSE(NestsAtMost(nlohmann::json::parse(R"({"a":{"b":[]}})"), 1));
}

TEST(ForeignJsonTest, ShortJsonAndDumpLossyNeverThrow) {
  EXPECT_EQ(ShortJson(nlohmann::json("short")), "\"short\"");
  EXPECT_EQ(ShortJson(nlohmann::json(std::string(100, 'x'))).size(), 40u);
  nlohmann::json deep = nlohmann::json::array();
  for (int i = 0; i < 20; ++i) deep = nlohmann::json::array({deep});
  EXPECT_EQ(ShortJson(deep), "[...]");
  // A trainer's stderr cut inside a character: written with U+FFFD in its place.
  const nlohmann::json cut = {{"error", "killed \xe2\x82"}};
  EXPECT_THROW((void)cut.dump(), nlohmann::json::type_error);
  EXPECT_EQ(DumpLossy(cut), "{\"error\":\"killed \xef\xbf\xbd\"}");
  EXPECT_EQ(ShortJson(cut["error"]), "\"killed \xef\xbf\xbd\"");
}

}  // namespace
}  // namespace llmctl
