#include "common/spelling.h"

#include <gtest/gtest.h>

namespace llmctl {
namespace {

TEST(EditDistanceTest, BasicEdits) {
  EXPECT_EQ(EditDistance("", ""), 0u);
  EXPECT_EQ(EditDistance("abc", ""), 3u);
  EXPECT_EQ(EditDistance("", "abc"), 3u);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
  EXPECT_EQ(EditDistance("lr", "lr"), 0u);
  EXPECT_EQ(EditDistance("seed", "seeds"), 1u);
  EXPECT_EQ(EditDistance("precison", "precision"), 1u);
}

TEST(EditDistanceTest, AdjacentSwapIsOneEdit) {
  EXPECT_EQ(EditDistance("trian", "train"), 1u);
  EXPECT_EQ(EditDistance("epcohs", "epochs"), 1u);
  EXPECT_EQ(EditDistance("ab", "ba"), 1u);
}

TEST(EditDistanceTest, IsCaseSensitiveAndSymmetric) {
  EXPECT_EQ(EditDistance("Model", "model"), 1u);
  EXPECT_EQ(EditDistance("optimiser", "optimizer"), EditDistance("optimizer", "optimiser"));
}

TEST(MaxTypoDistanceTest, GrowsWithLength) {
  EXPECT_EQ(MaxTypoDistance("lr"), 1u);
  EXPECT_EQ(MaxTypoDistance("seed"), 2u);
  EXPECT_EQ(MaxTypoDistance("optimizer"), 3u);
}

TEST(ClosestMatchTest, FindsTheNearestWithinTheLimit) {
  const std::vector<std::string_view> presets = {"tinyllama-1.1b", "open_llama_3b",
                                                 "open_llama_7b"};
  EXPECT_EQ(ClosestMatch("tinylama-1.1b", presets), "tinyllama-1.1b");
  EXPECT_EQ(ClosestMatch("open_llama_8b", presets), "open_llama_3b");  // tie: the earlier one
  EXPECT_EQ(ClosestMatch("OPEN_LLAMA_7B", presets), "open_llama_7b");  // case ignored
  EXPECT_EQ(ClosestMatch("gpt2", presets), "");
  EXPECT_EQ(ClosestMatch("x", {}), "");
}

}  // namespace
}  // namespace llmctl
