// fsdp's flat parameter layout: how a unit's tensors are laid end to end in one flat tensor and
// which pieces of them each rank's shard holds. trainer/parallel/fsdp.cc lays its flats out this
// way, the optimizers step the shards' pieces (8-bit AdamW keeps state per piece), and
// common/estimate counts the same bytes.
//
// Tensor i starts at offsets[i], the first multiple of `alignment` at or after the end of tensor
// i - 1 (tensor 0 at 0); the gaps and the tail up to `padded`, the next multiple of world_size ×
// alignment, are zeros that belong to no tensor. Rank r's shard is elements [r × shard, (r + 1) ×
// shard) with shard = padded / world_size, itself a multiple of `alignment`. So with an alignment
// of a block size, every piece of a tensor that a shard holds starts on a block boundary of that
// tensor: blockwise state over the pieces is blockwise state over the whole tensor, cut at block
// boundaries. An alignment of 1 is FSDP1's flat parameter: tensors back to back, padded to a
// multiple of the world size.
#ifndef LLMCTL_COMMON_FLAT_LAYOUT_H_
#define LLMCTL_COMMON_FLAT_LAYOUT_H_

#include <cstdint>
#include <string_view>
#include <vector>

namespace llmctl {

struct FlatLayout {
  std::vector<int64_t> offsets;  // each tensor's first element
  int64_t numel = 0;             // the end of the last tensor
  int64_t padded = 0;            // the flat's length: a multiple of world_size × alignment
  int64_t world_size = 1;
  int64_t shard() const { return padded / world_size; }
};

// The alignment fsdp gives a unit's trainable flat under `optimizer` (the trial key): 8-bit AdamW's
// state block (bitsandbytes' 256 elements), so that its state per piece is its state per
// parameter; 1 for the elementwise optimizers.
constexpr int64_t ShardAlignment(std::string_view optimizer) {
  return optimizer == "adamw_8bit" ? 256 : 1;
}

// `numels`: the tensors' element counts, in layout order. world_size and alignment are >= 1.
FlatLayout LayOutFlat(const std::vector<int64_t>& numels, int64_t world_size, int64_t alignment);

// A run of elements of a shard: a piece of one tensor, or padding.
struct ShardPiece {
  int64_t length = 0;
  int64_t tensor = -1;        // index into the layout's tensors; -1: padding
  int64_t tensor_numel = 0;   // the whole tensor's element count (0 for padding)
  int64_t tensor_offset = 0;  // the piece's first element within the tensor
};

// Rank `rank`'s shard as consecutive pieces covering all of it, in order.
std::vector<ShardPiece> ShardPieces(const FlatLayout& layout, const std::vector<int64_t>& numels,
                                    int64_t rank);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_FLAT_LAYOUT_H_
