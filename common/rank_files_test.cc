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

// fsdp's optimizer shards: llm-train writes the names, the controller reads the rank back from the
// files a node sent, and nothing else passes for one.
TEST(RankOptimizerFileTest, NamesEachRanksShardAndReadsTheRankBack) {
  EXPECT_EQ(RankOptimizerFile(0), "optimizer.safetensors");
  EXPECT_EQ(RankOptimizerFile(13), "optimizer.rank13.safetensors");
  for (int rank : {0, 1, 7, 130}) EXPECT_EQ(RankOfOptimizerFile(RankOptimizerFile(rank)), rank);
  for (const char* other :
       {"model.safetensors", "optimizer.rank.safetensors", "optimizer.rank01.safetensors",
        "optimizer.rank1.safetensors.tmp", "optimizer.rank-1.safetensors",
        "optimizer.rank1x.safetensors", "optimizer.rank99999999999.safetensors",
        "sub/optimizer.rank1.safetensors"}) {
    EXPECT_EQ(RankOfOptimizerFile(other), -1) << other;
  }
}

}  // namespace
}  // namespace llmctl
