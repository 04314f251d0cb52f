// The event-line rule both daemons apply: what is refused, and the replacement it gets.
#include "common/event_line.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

namespace llmctl::event_line {
namespace {

TEST(EventLineTest, AnObjectWithAStringTypeIsTakenAsItIs) {
  const Accepted accepted = Accept(R"({"type":"step","step":1,"loss":2.5})");
  EXPECT_EQ(accepted.refusal, "");
  EXPECT_EQ(accepted.type, "step");
  EXPECT_EQ(accepted.json, R"({"type":"step","step":1,"loss":2.5})");
}

TEST(EventLineTest, EveryOtherLineIsReplacedByARefusedLineOfItsSize) {
  const std::string overlong = R"({"type":"log","message":")" + std::string(kMaxBytes, 'a') + "\"}";
  const std::pair<std::string, std::string> cases[] = {
      {R"({"type":1,"x":"result"})", "its \"type\" is not a string"},
      {R"({"type":""})", "its \"type\" is empty"},
      {R"({"step":1})", "no \"type\""},
      {"[1,2]", "not a JSON object"},
      {"\"result\"", "not a JSON object"},
      {"not json", "not valid JSON"},
      {"", "not valid JSON"},
      {"{\"type\":\"step\"} {}", "not valid JSON"},
      {"{\"type\":\"\xff\xfe\"}", "not valid UTF-8 (byte 9)"},
      // Copying or writing it would recurse once per level, past a thread's stack.
      {R"({"type":"step","x":)" + std::string(100000, '[') + std::string(100000, ']') + "}",
       "nested past 64 levels"},
      {overlong, std::to_string(overlong.size()) + " bytes, more than the 1048576-byte cap"},
  };
  for (const auto& [line, why] : cases) {
    const Accepted accepted = Accept(line);
    EXPECT_NE(accepted.refusal.find(why), std::string::npos)
        << line.substr(0, 40) << ": " << accepted.refusal;
    EXPECT_EQ(accepted.type, kRefusedType);
    const nlohmann::json replacement = nlohmann::json::parse(accepted.json);
    EXPECT_EQ(replacement.at("type"), std::string(kRefusedType));
    EXPECT_EQ(replacement.at("bytes"), line.size());
    EXPECT_EQ(replacement.at("error"), accepted.refusal);
    EXPECT_EQ(Refusal(accepted.json, static_cast<int64_t>(accepted.json.size())), "")
        << "the replacement keeps the rule";
  }
}

TEST(EventLineTest, ALineCutShortByItsReaderIsRefusedWithTheSizeItWasWrittenWith) {
  // What the agent's reader hands on for a line over the cap: nothing of it, and its size.
  const Accepted accepted = Accept("", kMaxBytes + 5);
  EXPECT_EQ(accepted.refusal, "1048581 bytes, more than the 1048576-byte cap on an event line");
  EXPECT_EQ(nlohmann::json::parse(accepted.json).at("bytes"), kMaxBytes + 5);
  // A line of exactly the cap is taken.
  const std::string at_cap =
      R"({"type":"log","m":")" +
      std::string(kMaxBytes - std::string(R"({"type":"log","m":""})").size(), 'a') + "\"}";
  ASSERT_EQ(static_cast<int64_t>(at_cap.size()), kMaxBytes);
  EXPECT_EQ(Accept(at_cap).refusal, "");
}

}  // namespace
}  // namespace llmctl::event_line
