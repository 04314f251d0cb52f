#include "common/flat_layout.h"

#include <algorithm>

namespace llmctl {

FlatLayout LayOutFlat(const std::vector<int64_t>& numels, int64_t world_size, int64_t alignment) {
  const auto round_up = [](int64_t n, int64_t multiple) {
    return (n + multiple - 1) / multiple * multiple;
  };
  FlatLayout layout;
  layout.world_size = world_size;
  for (int64_t numel : numels) {
    const int64_t offset = round_up(layout.numel, alignment);
    layout.offsets.push_back(offset);
    layout.numel = offset + numel;
  }
  layout.padded = round_up(layout.numel, world_size * alignment);
  return layout;
}

std::vector<ShardPiece> ShardPieces(const FlatLayout& layout, const std::vector<int64_t>& numels,
                                    int64_t rank) {
  const int64_t begin = rank * layout.shard();
  const int64_t end = begin + layout.shard();
  std::vector<ShardPiece> pieces;
  int64_t at = begin;  // the next element of the shard not yet in a piece
  const auto pad_to = [&](int64_t position) {
    if (position > at) pieces.push_back({.length = position - at});
    at = std::max(at, position);
  };
  for (size_t i = 0; i < numels.size(); ++i) {
    const int64_t first = std::max(begin, layout.offsets[i]);
    const int64_t last = std::min(end, layout.offsets[i] + numels[i]);
    if (first >= last) continue;
    pad_to(first);
    pieces.push_back({.length = last - first,
                      .tensor = static_cast<int64_t>(i),
                      .tensor_numel = numels[i],
                      .tensor_offset = first - layout.offsets[i]});
    at = last;
  }
  pad_to(end);
  return pieces;
}

}  // namespace llmctl
