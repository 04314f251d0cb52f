#include "common/flat_layout.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

namespace llmctl {
namespace {

TEST(FlatLayoutTest, WithoutAlignmentTheTensorsAreBackToBackPaddedToTheWorldSize) {
  const FlatLayout layout = LayOutFlat({10, 7, 1}, /*world_size=*/4, /*alignment=*/1);
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 10, 17}));
  EXPECT_EQ(layout.numel, 18);
  EXPECT_EQ(layout.padded, 20);
  EXPECT_EQ(layout.shard(), 5);
}

TEST(FlatLayoutTest, AlignedTensorsStartOnMultiplesAndShardsAreWholeBlocks) {
  const FlatLayout layout = LayOutFlat({300, 4096, 5}, /*world_size=*/3, /*alignment=*/256);
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 512, 4608}));
  EXPECT_EQ(layout.numel, 4613);
  EXPECT_EQ(layout.padded, 3 * 256 * 7);  // the first multiple of 768 at or after 4613
  EXPECT_EQ(layout.shard() % 256, 0);
}

// Every rank's pieces cover its shard in order, and over the ranks every element of every tensor
// is in exactly one piece, at the offset the layout gives it; with alignment every tensor piece
// starts on one of its tensor's blocks.
TEST(FlatLayoutTest, TheRanksPiecesCoverEveryTensorOnceAndStartOnBlocks) {
  const std::vector<int64_t> numels = {300, 4096, 0, 5, 1000};
  for (int64_t alignment : {1, 256}) {
    for (int64_t world_size : {1, 2, 3, 8}) {
      SCOPED_TRACE("alignment " + std::to_string(alignment) + ", world size " +
                   std::to_string(world_size));
      const FlatLayout layout = LayOutFlat(numels, world_size, alignment);
      std::map<int64_t, int64_t> covered;  // tensor -> elements seen
      for (int64_t rank = 0; rank < world_size; ++rank) {
        int64_t position = rank * layout.shard();
        for (const ShardPiece& piece : ShardPieces(layout, numels, rank)) {
          ASSERT_GT(piece.length, 0);
          if (piece.tensor >= 0) {
            EXPECT_EQ(piece.tensor_numel, numels[piece.tensor]);
            EXPECT_EQ(layout.offsets[piece.tensor] + piece.tensor_offset, position);
            EXPECT_EQ(piece.tensor_offset, covered[piece.tensor]) << "tensor " << piece.tensor;
            EXPECT_EQ(piece.tensor_offset % alignment, 0);
            covered[piece.tensor] += piece.length;
          }
          position += piece.length;
        }
        EXPECT_EQ(position, (rank + 1) * layout.shard());
      }
      for (size_t i = 0; i < numels.size(); ++i) EXPECT_EQ(covered[i], numels[i]) << i;
    }
  }
}

}  // namespace
}  // namespace llmctl
