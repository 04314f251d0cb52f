// Bounds on a model's shapes, read from a config.json the user names (LLaMA-family and BLIP-2):
// far above any published model's (Llama 3.1 405B: 16,384 wide, a 53,248 FFN, 126 layers, 128
// heads, 128,256 tokens; Flan-T5-XXL: 4,096 wide, 32,128 tokens; Llama 4's 10M positions) and low
// enough that parameter counts, and the estimate's products and per-layer loops over them, stay in
// 64 bits and in memory: past one a config is refused by field, not counted over 2^40 layers.
#ifndef LLMCTL_COMMON_MODEL_BOUNDS_H_
#define LLMCTL_COMMON_MODEL_BOUNDS_H_

#include <cstdint>

namespace llmctl::model_bounds {

inline constexpr int64_t kMaxWidth = int64_t{1} << 18;  // hidden sizes, FFN widths, a head's width
inline constexpr int64_t kMaxLayers = int64_t{1} << 10;
inline constexpr int64_t kMaxHeads = int64_t{1} << 10;
inline constexpr int64_t kMaxVocabulary = int64_t{1} << 24;
inline constexpr int64_t kMaxPositions = int64_t{1} << 24;  // positions, T5's relative distances

}  // namespace llmctl::model_bounds

#endif  // LLMCTL_COMMON_MODEL_BOUNDS_H_
