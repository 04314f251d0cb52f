#include "common/rank_files.h"

#include <gtest/gtest.h>

namespace llmctl {
namespace {

// llm-train writes these names and the agent streams them back: the agent's run directory and any
// --events path a user gives follow the same rule.
TEST(RankEventsPathTest, RankZeroKeepsThePathOthersNameTheirRankBeforeTheExtension) {
  EXPECT_EQ(RankEventsPath(kEventsFile, 0), "events.jsonl");
  EXPECT_EQ(RankEventsPath(kEventsFile, 1), "events.rank1.jsonl");
  EXPECT_EQ(RankEventsPath("/runs/7/trial.events.jsonl", 12), "/runs/7/trial.events.rank12.jsonl");
  EXPECT_EQ(RankEventsPath("out/events", 3), "out/events.rank3");
  EXPECT_EQ(RankEventsPath("", 2), "");
}

}  // namespace
}  // namespace llmctl
