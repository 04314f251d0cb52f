#include "common/image/image.h"

// jpeglib.h uses size_t and FILE without including their headers.
#include <cstddef>
#include <cstdio>
// clang-format off
#include <jpeglib.h>
// clang-format on
#include <png.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <csetjmp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>
#include <variant>

#include "common/files.h"

namespace llmctl::image {
namespace {

// PIL's Image.MAX_IMAGE_PIXELS (1024^3 / 4 / 3) twice: past it Image.open raises
// DecompressionBombError, so transformers' image processors never read such an image. It also
// bounds what a file of a few bytes can make a reader allocate: 537 MB of RGB, 716 MB of RGBA (a
// PNG's IHDR may claim 1,000,000 x 1,000,000 pixels, a JPEG's frame 65,535 x 65,535).
constexpr uint64_t kMaxPixels = 2 * 89'478'485;

// InvalidArgument naming `display_path` for an image of more than kMaxPixels.
Status CheckPixels(uint64_t width, uint64_t height, const std::string& display_path) {
  if (width * height <= kMaxPixels) return Status::Ok();
  return InvalidArgumentError(display_path + ": " + std::to_string(width) + " x " +
                              std::to_string(height) + " pixels, more than the " +
                              std::to_string(kMaxPixels) +
                              " PIL opens (twice its Image.MAX_IMAGE_PIXELS: past it a "
                              "decompression bomb, which transformers' image processors never "
                              "read); resize it");
}

// libjpeg reports errors through a callback that must not return: it jumps back to ReadJpeg.
// Warnings (corrupt data, a premature end of file) are kept and refuse the image afterwards.
struct JpegErrors {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {};
  char warning[JMSG_LENGTH_MAX] = {};
};

void OnJpegError(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

void OnJpegMessage(j_common_ptr cinfo, int level) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  if (level < 0 && errors->warning[0] == '\0') {  // a warning; trace messages are >= 0
    (*cinfo->err->format_message)(cinfo, errors->warning);
  }
}

// Where libjpeg reads a JPEG from: its bytes in memory, or an open file, read (4 KiB at a time)
// only as far as the parse goes.
using JpegSource = std::variant<std::string_view, std::FILE*>;

// Reads a JPEG's size from its frame header into `header` and, with `image`, decodes its pixels
// into it; without, libjpeg stops at the first scan. No C++ object is created between setjmp and
// the calls that may jump back: `image` is sized before the scanlines are read, the pixel check's
// Status ends before the next libjpeg call, and the jump only skips libjpeg's own C frames.
Status ReadJpeg(JpegSource source, const std::string& display_path, ImageHeader& header,
                RgbImage* image) {
  jpeg_decompress_struct cinfo;
  JpegErrors errors;
  cinfo.err = jpeg_std_error(&errors.manager);
  errors.manager.error_exit = OnJpegError;
  errors.manager.emit_message = OnJpegMessage;
  if (setjmp(errors.jump) != 0) {
    jpeg_destroy_decompress(&cinfo);
    return InvalidArgumentError(display_path + ": not a readable JPEG image: " + errors.message);
  }
  jpeg_create_decompress(&cinfo);
  if (const std::string_view* data = std::get_if<std::string_view>(&source)) {
    jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(data->data()), data->size());
  } else {
    jpeg_stdio_src(&cinfo, std::get<std::FILE*>(source));
  }
  jpeg_read_header(&cinfo, TRUE);
  header.width = static_cast<int>(cinfo.image_width);
  header.height = static_cast<int>(cinfo.image_height);
  if (Status pixels = CheckPixels(cinfo.image_width, cinfo.image_height, display_path);
      !pixels.ok()) {
    jpeg_destroy_decompress(&cinfo);
    return pixels;
  }
  if (image == nullptr) {
    jpeg_destroy_decompress(&cinfo);
    return Status::Ok();
  }
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    return InvalidArgumentError(
        display_path +
        ": a CMYK JPEG image; convert it to RGB (e.g. `convert IN -colorspace "
        "sRGB OUT`)");
  }
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  image->width = static_cast<int>(cinfo.output_width);
  image->height = static_cast<int>(cinfo.output_height);
  image->pixels.resize(static_cast<size_t>(image->width) * image->height * 3);
  // Up to the first warning, which refuses the image: libjpeg would fill a truncated file's
  // missing rows with gray, to the last of its 65,535.
  while (cinfo.output_scanline < cinfo.output_height && errors.warning[0] == '\0') {
    JSAMPROW row =
        image->pixels.data() + static_cast<size_t>(cinfo.output_scanline) * image->width * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  if (errors.warning[0] == '\0') jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  if (errors.warning[0] != '\0') {
    return InvalidArgumentError(display_path + ": a corrupt JPEG image: " + errors.warning);
  }
  return Status::Ok();
}

// transformers' convert_to_rgb: an image with alpha is composited onto opaque white with PIL's
// Image.alpha_composite (libImaging/AlphaComposite.c: 7 extra bits of precision, divisions by 255
// rounded by shifts), then its alpha dropped. With alpha 255 the colour comes back unchanged.
void OverWhite(const uint8_t* rgba, uint8_t* rgb) {
  constexpr uint32_t kPrecisionBits = 7;
  const uint32_t alpha = rgba[3];
  if (alpha == 0) {
    rgb[0] = rgb[1] = rgb[2] = 255;
    return;
  }
  const uint32_t blend = 255 * (255 - alpha);
  const uint32_t out_alpha_255 = alpha * 255 + blend;
  const uint32_t coef1 = alpha * 255 * 255 * (1u << kPrecisionBits) / out_alpha_255;
  const uint32_t coef2 = 255 * (1u << kPrecisionBits) - coef1;
  for (int c = 0; c < 3; ++c) {
    const uint32_t sum = rgba[c] * coef1 + 255 * coef2 + (0x80u << kPrecisionBits);
    rgb[c] = static_cast<uint8_t>((((sum >> 8) + sum) >> 8) >> kPrecisionBits);
  }
}

struct PngReader {
  const std::string* data;
  size_t offset = 0;
  char message[256] = {};
};

void OnPngRead(png_structp png, png_bytep out, png_size_t length) {
  auto* reader = static_cast<PngReader*>(png_get_io_ptr(png));
  if (reader->data->size() - reader->offset < length) png_error(png, "the file ends early");
  std::memcpy(out, reader->data->data() + reader->offset, length);
  reader->offset += length;
}

void OnPngError(png_structp png, png_const_charp message) {
  auto* reader = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(reader->message, sizeof(reader->message), "%s", message);
  png_longjmp(png, 1);
}

void OnPngWarning(png_structp, png_const_charp) {}  // e.g. an unknown sRGB profile: PIL reads on

// The widest and tallest PNG decoded: libpng's own default limit, set here by name so that the
// header reader refuses what the decoder would (an estimate must not count an image the trial
// cannot read).
constexpr uint32_t kMaxPngSide = 1'000'000;

Status DecodePng(const std::string& data, const std::string& display_path, RgbImage& image) {
  PngReader reader{&data};
  png_structp png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, &reader, OnPngError, OnPngWarning);
  png_infop info = png != nullptr ? png_create_info_struct(png) : nullptr;
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    return InternalError("libpng could not start");
  }
  std::vector<png_bytep> rows;
  // (H, W, 4), not zeroed: libpng writes every row or fails, so a header claiming more pixels
  // than the file holds touches no more pages than its data fills.
  std::unique_ptr<uint8_t[]> rgba;
  if (setjmp(png_jmpbuf(png)) != 0) {
    png_destroy_read_struct(&png, &info, nullptr);
    return InvalidArgumentError(display_path + ": not a readable PNG image: " + reader.message);
  }
  png_set_read_fn(png, &reader, OnPngRead);
  png_set_user_limits(png, kMaxPngSide, kMaxPngSide);
  png_read_info(png, info);
  if (Status pixels = CheckPixels(png_get_image_width(png, info), png_get_image_height(png, info),
                                  display_path);
      !pixels.ok()) {
    png_destroy_read_struct(&png, &info, nullptr);
    return pixels;
  }
  const png_byte color = png_get_color_type(png, info);
  // Everything to 8-bit RGBA: 16-bit samples cut to their high byte (PIL's "RGB;16B" unpacker),
  // palettes and grayscale expanded, a tRNS chunk made alpha, opaque images given alpha 255.
  png_set_strip_16(png);
  png_set_packing(png);
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && png_get_bit_depth(png, info) < 8) {
    png_set_expand_gray_1_2_4_to_8(png);
  }
  if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  png_set_filler(png, 0xFF, PNG_FILLER_AFTER);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  image.width = static_cast<int>(png_get_image_width(png, info));
  image.height = static_cast<int>(png_get_image_height(png, info));
  if (png_get_rowbytes(png, info) != static_cast<size_t>(image.width) * 4) {
    png_error(png, "unexpected row layout after conversion to RGBA");
  }
  rgba.reset(new uint8_t[static_cast<size_t>(image.width) * image.height * 4]);
  rows.resize(image.height);
  for (int y = 0; y < image.height; ++y) {
    rows[y] = rgba.get() + static_cast<size_t>(y) * image.width * 4;
  }
  png_read_image(png, rows.data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  image.pixels.resize(static_cast<size_t>(image.width) * image.height * 3);
  for (size_t i = 0; i < image.pixels.size() / 3; ++i) {
    OverWhite(&rgba[i * 4], &image.pixels[i * 3]);
  }
  return Status::Ok();
}

constexpr std::string_view kPngSignature("\x89PNG\r\n\x1A\n", 8);

// The format by the file's first bytes, not its name.
StatusOr<ImageFormat> FormatOf(std::string_view data, const std::string& display_path) {
  const std::string_view head(data.data(), std::min<size_t>(data.size(), 8));
  if (head.starts_with("\xFF\xD8\xFF")) return ImageFormat::kJpeg;
  if (head == kPngSignature) return ImageFormat::kPng;
  return InvalidArgumentError(display_path + ": not a JPEG or PNG image (by its first bytes)");
}

// A PNG's signature and the start of its IHDR chunk up to the height: what ReadPngHeader reads.
constexpr size_t kPngHeaderBytes = 24;

// A PNG's size from its IHDR chunk, which follows the signature: its length (13), its type, then
// the width and height, 4 bytes each, most significant first.
Status ReadPngHeader(std::string_view data, const std::string& display_path, ImageHeader& header) {
  if (data.size() < kPngHeaderBytes || data.compare(12, 4, "IHDR") != 0) {
    return InvalidArgumentError(display_path + ": not a readable PNG image: no IHDR chunk first");
  }
  auto big_endian = [&data](size_t at) {
    uint32_t value = 0;
    for (size_t i = 0; i < 4; ++i) value = value << 8 | static_cast<uint8_t>(data[at + i]);
    return value;
  };
  const uint32_t width = big_endian(16), height = big_endian(20);
  if (width > kMaxPngSide || height > kMaxPngSide) {
    return InvalidArgumentError(display_path +
                                ": not a readable PNG image: " + std::to_string(width) + " x " +
                                std::to_string(height) + " pixels, past the " +
                                std::to_string(kMaxPngSide) + " a side it is decoded at");
  }
  RETURN_IF_ERROR(CheckPixels(width, height, display_path));
  header.width = static_cast<int>(width);
  header.height = static_cast<int>(height);
  return Status::Ok();
}

// `header` when it has pixels; else InvalidArgument naming `display_path`.
StatusOr<ImageHeader> CheckHasPixels(const ImageHeader& header, const std::string& display_path) {
  if (header.width <= 0 || header.height <= 0) {
    return InvalidArgumentError(display_path + ": an image without pixels");
  }
  return header;
}

}  // namespace

StatusOr<ImageHeader> ReadImageHeader(const std::string& path, const std::string& display_path) {
  // Read, not mapped: only what the header's parse needs comes from the disk (a PNG's first 24
  // bytes; a JPEG's markers up to its frame header), not a photo's megabytes, and a file another
  // process truncates meanwhile is an error, where a mapping's page past its new end would kill
  // llmctl with SIGBUS.
  struct stat st;
  ASSIGN_OR_RETURN(UniqueFd fd, OpenRegularFile(path, st));
  ASSIGN_OR_RETURN(
      const std::string head,
      ReadFileRange(fd.get(), path, 0,
                    static_cast<size_t>(std::min<off_t>(st.st_size, kPngHeaderBytes))));
  ImageHeader header;
  ASSIGN_OR_RETURN(header.format, FormatOf(head, display_path));
  if (header.format == ImageFormat::kPng) {
    RETURN_IF_ERROR(ReadPngHeader(head, display_path, header));
  } else {
    const std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(::fdopen(fd.get(), "rb"),
                                                               std::fclose);
    if (file == nullptr) {
      return UnavailableError(
          std::string("cannot read ").append(path).append(": ").append(std::strerror(errno)));
    }
    fd.release();  // the FILE closes it
    RETURN_IF_ERROR(ReadJpeg(file.get(), display_path, header, /*image=*/nullptr));
  }
  return CheckHasPixels(header, display_path);
}

StatusOr<ImageHeader> ParseImageHeader(std::string_view data, const std::string& display_path) {
  ImageHeader header;
  ASSIGN_OR_RETURN(header.format, FormatOf(data, display_path));
  RETURN_IF_ERROR(header.format == ImageFormat::kJpeg
                      ? ReadJpeg(data, display_path, header, /*image=*/nullptr)
                      : ReadPngHeader(data, display_path, header));
  return CheckHasPixels(header, display_path);
}

// libjpeg writes into a buffer it grows itself; jpeg_mem_dest's, freed by the caller.
std::string EncodeJpeg(const RgbImage& image, int quality) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr errors;
  cinfo.err = jpeg_std_error(&errors);  // libjpeg's own exit: only on a programming error here
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;  // NOLINT(runtime/int): libjpeg's type
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = static_cast<JDIMENSION>(image.width);
  cinfo.image_height = static_cast<JDIMENSION>(image.height);
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    // libjpeg reads the row without writing to it.
    JSAMPROW row = const_cast<uint8_t*>(image.pixels.data()) +
                   static_cast<size_t>(cinfo.next_scanline) * image.width * 3;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  std::string bytes(reinterpret_cast<const char*>(buffer), size);
  jpeg_destroy_compress(&cinfo);
  std::free(buffer);
  return bytes;
}

std::string EncodePng(const RgbImage& image) {
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.width);
  png.height = static_cast<png_uint_32>(image.height);
  png.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  // The first call sizes the buffer, the second fills it.
  png_image_write_to_memory(&png, nullptr, &size, 0, image.pixels.data(), 0, nullptr);
  std::string bytes(size, '\0');
  png_image_write_to_memory(&png, bytes.data(), &size, 0, image.pixels.data(), 0, nullptr);
  png_image_free(&png);
  bytes.resize(size);
  return bytes;
}

StatusOr<RgbImage> DecodeImageFile(const std::string& path, const std::string& display_path) {
  ASSIGN_OR_RETURN(const std::string data, ReadFileToString(path));
  return DecodeImage(data, display_path);
}

StatusOr<RgbImage> DecodeImage(const std::string& data, const std::string& display_path) {
  RgbImage image;
  ASSIGN_OR_RETURN(const ImageFormat format, FormatOf(data, display_path));
  if (format == ImageFormat::kJpeg) {
    ImageHeader header;
    RETURN_IF_ERROR(ReadJpeg(data, display_path, header, &image));
  } else {
    RETURN_IF_ERROR(DecodePng(data, display_path, image));
  }
  if (image.width <= 0 || image.height <= 0) {
    return InvalidArgumentError(display_path + ": an image without pixels");
  }
  return image;
}

}  // namespace llmctl::image
