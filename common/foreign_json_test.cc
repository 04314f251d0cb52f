#include "common/foreign_json.h"

#include <gtest/gtest.h>

#include <string>

namespace llmctl {
namespace {

TEST(ForeignJsonTest, ParsesWhatNestsWithinTheLimitAndDiscardsTheRest) {
  EXPECT_EQ(ParseForeignJson(R"({"type":"step","step":[1,{"a":2}]})")["step"][1]["a"], 2);
  EXPECT_TRUE(ParseForeignJson("not json").is_discarded());
  EXPECT_TRUE(ParseForeignJson("").is_discarded());
  auto nested = [](int levels) { return std::string(levels, '[') + std::string(levels, ']'); };
  EXPECT_FALSE(ParseForeignJson(nested(kMaxForeignJsonDepth)).is_discarded());
  EXPECT_TRUE(ParseForeignJson(nested(kMaxForeignJsonDepth + 1)).is_discarded());
  // 200,000 levels: a copy or dump() of it would overflow the stack; the parse reads it through.
  const nlohmann::json deep = ParseForeignJson("{\"a\":" + nested(200000) + "}");
  EXPECT_TRUE(deep.is_discarded());
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
