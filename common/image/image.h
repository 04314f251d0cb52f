// Images as the captioning models read them: decoded from JPEG (libjpeg-turbo) or PNG (libpng) into
// 8-bit RGB as Hugging Face's image processors (Blip2Processor's) make it from Image.open(path):
// PIL's decoding, then transformers' convert_to_rgb, which composites any transparency onto white.
// No LibTorch, so `llmctl submit` checks a dataset's images where the user is.
#ifndef LLMCTL_COMMON_IMAGE_IMAGE_H_
#define LLMCTL_COMMON_IMAGE_IMAGE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace llmctl::image {

struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // (H, W, 3), row-major
};

// Decodes a JPEG or PNG file (told apart by its first bytes, not its name) into RGB:
//   JPEG: libjpeg's YCbCr -> RGB; grayscale repeated to R, G and B. CMYK is refused.
//   PNG: palette expanded, 16-bit samples cut to their high byte (PIL's for RGB; PIL clips 16-bit
//   grayscale at 255 instead, which this does not reproduce), grayscale repeated; an alpha channel
//   or tRNS transparency is composited onto white exactly as PIL's Image.alpha_composite does.
// A file that is neither, or is truncated or corrupt (libjpeg's warnings included, as PIL refuses a
// truncated image), is InvalidArgument naming `display_path` and what is wrong.
StatusOr<RgbImage> DecodeImageFile(const std::string& path, const std::string& display_path);
// The same over a file's bytes.
StatusOr<RgbImage> DecodeImage(const std::string& data, const std::string& display_path);

enum class ImageFormat { kJpeg, kPng };

// What decoding an image costs depends on: its format and size, read from its header alone (a
// JPEG's frame header through libjpeg, a PNG's IHDR chunk, which the format puts first).
struct ImageHeader {
  ImageFormat format = ImageFormat::kJpeg;
  int width = 0;
  int height = 0;
};
// InvalidArgument naming `display_path` as DecodeImageFile's, for a file that is neither format or
// whose header is broken.
StatusOr<ImageHeader> ReadImageHeader(const std::string& path, const std::string& display_path);
// The same over a file's bytes.
StatusOr<ImageHeader> ParseImageHeader(std::string_view data, const std::string& display_path);

// `image` (its pixels width x height x 3) as a baseline JPEG of `quality` (1 to 100, libjpeg's
// 4:2:0 sampling) and as an 8-bit RGB PNG (libpng's default filters and compression): what the
// rate probe decodes (trainer/train/rate_probe.h), which has no dataset of its own.
std::string EncodeJpeg(const RgbImage& image, int quality);
std::string EncodePng(const RgbImage& image);

}  // namespace llmctl::image

#endif  // LLMCTL_COMMON_IMAGE_IMAGE_H_
