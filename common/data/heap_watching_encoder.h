// Test support: a TextEncoder that records the most heap in use at any of its calls, for tests
// that a preparation holds a bounded part of its input in memory at once.
#ifndef LLMCTL_COMMON_DATA_HEAP_WATCHING_ENCODER_H_
#define LLMCTL_COMMON_DATA_HEAP_WATCHING_ENCODER_H_

#include <malloc.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/data/text_encoder.h"
#include "common/status.h"

namespace llmctl::data {

// Encodes as ByteTextEncoder does and records the most heap in use at any call (glibc's count of
// what malloc has handed out and not had back).
class HeapWatchingEncoder final : public TextEncoder {
 public:
  static size_t HeapInUse() {
    const struct mallinfo2 info = ::mallinfo2();
    return info.uordblks + info.hblkhd;
  }

  StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                        bool add_special_tokens) const override {
    peak_heap_ = std::max(peak_heap_, HeapInUse());
    return bytes_.Encode(text, add_special_tokens);
  }
  int32_t bos_id() const override { return bytes_.bos_id(); }
  int32_t eos_id() const override { return bytes_.eos_id(); }
  std::string fingerprint() const override { return bytes_.fingerprint(); }
  size_t peak_heap() const { return peak_heap_; }

 private:
  ByteTextEncoder bytes_;
  mutable size_t peak_heap_ = 0;
};

}  // namespace llmctl::data

#endif  // LLMCTL_COMMON_DATA_HEAP_WATCHING_ENCODER_H_
