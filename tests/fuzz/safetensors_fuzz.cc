// Fuzz target for the safetensors reader (common/safetensors/), through its in-memory entry point
// so no input ever touches the disk.
//
// Run it from the repository root (libFuzzer ships with clang 14: libclang-rt-14-dev):
//   clang++-14 -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -I.
//   tests/fuzz/safetensors_fuzz.cc common/safetensors/safetensors.cc
//       common/safetensors/strict_json.cc common/status.cc common/files.cc common/text.cc
//       common/atomic_file.cc common/errno_status.cc common/byte_size.cc
//       -o /tmp/safetensors_fuzz
//   mkdir -p /tmp/st_corpus
//   /tmp/safetensors_fuzz -max_total_time=120 -max_len=4096 -dict=tests/fuzz/safetensors_fuzz.dict
//       /tmp/st_corpus tests/fuzz/corpus/safetensors
// (each command on one line).
// New inputs land in /tmp/st_corpus; `/tmp/safetensors_fuzz -merge=1 -use_counters=0
// tests/fuzz/corpus/safetensors /tmp/st_corpus` adds those that reach new edges to the checked-in
// corpus, which the ctest safetensors_fuzz_replay replays on every test run without libFuzzer.
//
// Beyond "no crash, no sanitizer report", the target checks the reader's promises on every accepted
// input: the views tile the data buffer exactly, each view's size is shape × dtype size, and Find
// returns each view by name.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "common/safetensors/safetensors.h"

namespace {

void Check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using llmctl::safetensors::DTypeSize;
  using llmctl::safetensors::SafetensorsFile;
  using llmctl::safetensors::TensorView;

  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto file = SafetensorsFile::FromBuffer(bytes, "fuzz");
  if (!file.ok()) {
    Check(!file.status().message().empty());
    return 0;
  }
  const std::byte* expected = nullptr;
  unsigned checksum = 0;
  for (const TensorView& t : (*file)->tensors()) {
    Check(t.bytes.size() == static_cast<size_t>(t.numel()) * DTypeSize(t.dtype));
    Check(t.bytes.data() >= bytes.data() && t.bytes.data() + t.bytes.size() <= bytes.data() + size);
    if (expected != nullptr) Check(t.bytes.data() == expected);
    expected = t.bytes.data() + t.bytes.size();
    Check((*file)->Find(t.name) == &t);
    // Read every byte so AddressSanitizer sees any view that strays outside the input.
    for (std::byte b : t.bytes) checksum += static_cast<unsigned>(b);
  }
  if (expected != nullptr) Check(expected == bytes.data() + size);
  volatile unsigned sink = checksum;
  (void)sink;
  return 0;
}
