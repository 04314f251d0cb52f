// Fuzz target for the image reader (common/image/image.h): a captioning set's JPEG and PNG files,
// which `llmctl estimate` and `submit` read the headers of and llm-train decodes (libjpeg-turbo,
// libpng, and this project's error handling, transparency and size checks around them).
//
// Beyond "no crash": a refusal is InvalidArgument naming the file; a decoded image has
// width x height x 3 bytes of pixels, no more pixels than PIL opens (178,956,970), and the size
// and format its header says (the estimate counts what the trial will decode); a header that
// reads is of a positive size within that limit.
//
// Replayed over tests/fuzz/corpus/image/ by the `image_fuzz_replay` test, with seeded mutations.
// To fuzz for real (clang with libFuzzer: apt-get install clang libclang-rt-14-dev), from the
// repository root, in bash:
//
//   SRCS="tests/fuzz/image_fuzz.cc common/image/decode.cc common/files.cc common/status.cc
//         common/errno_status.cc common/byte_size.cc common/text.cc common/atomic_file.cc"
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
//       -I. -I/usr/include/x86_64-linux-gnu $SRCS -ljpeg -lpng -lz -o /tmp/image_fuzz  # one line
//   mkdir -p /tmp/image_corpus
//   /tmp/image_fuzz -runs=200000 -max_len=65536 -timeout=10 -rss_limit_mb=2048
//       -dict=tests/fuzz/image_fuzz.dict /tmp/image_corpus tests/fuzz/corpus/image  # one line
//
// Inputs that crash go into tests/fuzz/corpus/image/ with the fix.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/image/image.h"

namespace {

void Check(bool condition) {
  if (!condition) std::abort();
}

constexpr int64_t kPilPixels = 178'956'970;
const std::string kName = "fuzz/captions/img";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace image = llmctl::image;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const llmctl::StatusOr<image::ImageHeader> header = image::ParseImageHeader(bytes, kName);
  if (header.ok()) {
    Check(header->width > 0 && header->height > 0);
    Check(static_cast<int64_t>(header->width) * header->height <= kPilPixels);
  } else {
    Check(header.status().code() == llmctl::StatusCode::kInvalidArgument);
    Check(header.status().message().rfind(kName, 0) == 0);
  }
  const llmctl::StatusOr<image::RgbImage> decoded = image::DecodeImage(bytes, kName);
  if (!decoded.ok()) {
    Check(decoded.status().code() == llmctl::StatusCode::kInvalidArgument);
    Check(decoded.status().message().rfind(kName, 0) == 0);
    return 0;
  }
  Check(decoded->pixels.size() == static_cast<size_t>(decoded->width) * decoded->height * 3);
  Check(static_cast<int64_t>(decoded->width) * decoded->height <= kPilPixels);
  // What decodes has the header the estimate counted it by.
  Check(header.ok() && header->width == decoded->width && header->height == decoded->height);
  return 0;
}
