// common/image against PIL and transformers (tests/fixtures/images, written by
// scripts/fixtures/make_image_fixtures.py): decoding, the bicubic resize and BLIP's pixel values
// bit for bit; broken images and imagefolder metadata refused with the file and line named.
#include "common/image/image.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <string_view>

#include "common/digest/digest.h"
#include "common/image/imagefolder.h"
#include "common/image/resample.h"
#include "common/text.h"
#include "tests/support/server_process.h"
#include "tests/support/shell_command.h"

namespace llmctl::image {
namespace {

namespace fs = std::filesystem;

std::string Fixtures() { return (testing::SourceDir() / "tests/fixtures/images/").string(); }

nlohmann::json Expected() {
  std::ifstream in(Fixtures() + "expected.json");
  return nlohmann::json::parse(in);
}

template <typename T>
std::string Sha256Of(const std::vector<T>& values) {
  return digest::Sha256Hex(
      std::string_view(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T)));
}

TEST(ImageTest, DecodesResizesAndNormalisesAsPilAndBlipImageProcessorDo) {
  const nlohmann::json expected = Expected();
  ASSERT_EQ(expected.size(), 4u);
  for (const auto& [name, want] : expected.items()) {
    SCOPED_TRACE(name);
    auto decoded = DecodeImageFile(Fixtures() + name, name);
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(decoded->width, want["width"]);
    EXPECT_EQ(decoded->height, want["height"]);
    EXPECT_EQ(Sha256Of(decoded->pixels), want["rgb_sha256"]) << "decoded RGB differs from PIL's";
    const RgbImage resized = ResizeBicubic(*decoded, 224, 224);
    EXPECT_EQ(Sha256Of(resized.pixels), want["resized_sha256"]) << "resize differs from PIL's";
    const std::vector<float> pixels = NormalizedPixels(resized, kClipMean, kClipStd);
    ASSERT_EQ(pixels.size(), 3u * 224 * 224);
    EXPECT_EQ(Sha256Of(pixels), want["pixel_values_sha256"]);
    for (const auto& sample : want["pixel_value_samples"]) {
      const size_t index = sample[0].get<size_t>();
      EXPECT_EQ(pixels[index], sample[1].get<float>()) << "pixel_values[" << index << "]";
    }
  }
}

// A header is read, not mapped: in llmctl a mapping was a SIGBUS waiting for the user's image to
// be written over meanwhile. A photo followed by 4 GiB (a hole in the file) gives its header in a
// process allowed 256 MiB more than it holds, where mapping it cannot.
TEST(ImageTest, AHeaderIsReadWithoutMappingTheFile) {
#ifdef __SANITIZE_ADDRESS__
  GTEST_SKIP() << "AddressSanitizer maps terabytes of shadow and its own allocator's space, which "
                  "RLIMIT_AS counts";
#endif
  const nlohmann::json expected = Expected();
  const fs::path large = fs::path(::testing::TempDir()) / "photo-then-a-hole.jpg";
  fs::copy_file(Fixtures() + "photo.jpg", large, fs::copy_options::overwrite_existing);
  fs::resize_file(large, fs::file_size(large) + (uint64_t{4} << 30));
  const auto read_within_limit = [&] {
    std::ifstream statm("/proc/self/statm");
    uint64_t pages = 0;
    statm >> pages;
    const rlimit limit{
        pages * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) + (uint64_t{256} << 20),
        RLIM_INFINITY};
    if (::setrlimit(RLIMIT_AS, &limit) != 0) std::_Exit(2);
    StatusOr<ImageHeader> header = ReadImageHeader(large.string(), "photo.jpg");
    if (!header.ok()) std::cerr << header.status().message() << "\n";
    std::_Exit(header.ok() && header->width == expected["photo.jpg"]["width"] ? 0 : 1);
  };
  EXPECT_EXIT(read_within_limit(), ::testing::ExitedWithCode(0), "");
  fs::remove(large);
}

// A header gives each fixture's format and the size its full decoding gives; a file that is
// neither format, or a PNG whose first chunk is not IHDR, is refused by name.
TEST(ImageTest, AHeaderSaysTheFormatAndSizeWithoutDecoding) {
  const nlohmann::json expected = Expected();
  for (const auto& [name, format] :
       std::vector<std::pair<std::string, ImageFormat>>{{"photo.jpg", ImageFormat::kJpeg},
                                                        {"gray.jpg", ImageFormat::kJpeg},
                                                        {"rgba.png", ImageFormat::kPng},
                                                        {"palette.png", ImageFormat::kPng}}) {
    StatusOr<ImageHeader> header = ReadImageHeader(Fixtures() + name, name);
    ASSERT_TRUE(header.ok()) << header.status().ToString();
    EXPECT_EQ(header->format, format) << name;
    EXPECT_EQ(header->width, expected[name]["width"]) << name;
    EXPECT_EQ(header->height, expected[name]["height"]) << name;
  }
  EXPECT_EQ(ReadImageHeader(Fixtures() + "not-an-image.jpg", "captions/not-an-image.jpg")
                .status()
                .message(),
            "captions/not-an-image.jpg: not a JPEG or PNG image (by its first bytes)");
  const fs::path broken = fs::path(::testing::TempDir()) / "no-ihdr.png";
  std::ofstream(broken, std::ios::binary) << std::string("\x89PNG\r\n\x1A\n", 8)
                                          << std::string(
                                                 "\0\0\0\x0D"
                                                 "IEND",
                                                 8)
                                          << std::string(16, '\0');
  EXPECT_EQ(ReadImageHeader(broken.string(), "captions/no-ihdr.png").status().message(),
            "captions/no-ihdr.png: not a readable PNG image: no IHDR chunk first");
  // A side past what the decoder reads (libpng's limit, 1,000,000): refused by both alike, and
  // one at the limit passes both (the decoder then finds no image data).
  const auto png_of_width = [](const std::string& name, const std::string& width_and_crc) {
    const fs::path path = fs::path(::testing::TempDir()) / name;
    std::ofstream(path, std::ios::binary)
        << std::string("\x89PNG\r\n\x1A\n", 8) << std::string("\0\0\0\x0DIHDR", 8)
        << width_and_crc.substr(0, 4) << std::string("\x00\x00\x00\x01\x08\x02\x00\x00\x00", 9)
        << width_and_crc.substr(4);  // the chunk's CRC: libpng reads on to the size
    return path.string();
  };
  const std::string wide =
      png_of_width("wide.png", std::string("\x00\x0F\x42\x41\xF2\x7D\x6B\x21", 8));
  EXPECT_EQ(ReadImageHeader(wide, "captions/wide.png").status().message(),
            "captions/wide.png: not a readable PNG image: 1000001 x 1 pixels, past the 1000000 a "
            "side it is decoded at");
  EXPECT_EQ(DecodeImageFile(wide, "captions/wide.png").status().message(),
            "captions/wide.png: not a readable PNG image: Invalid IHDR data");
  const std::string widest =
      png_of_width("widest.png", std::string("\x00\x0F\x42\x40\x1D\xBF\x00\x1F", 8));
  StatusOr<ImageHeader> at_limit = ReadImageHeader(widest, "captions/widest.png");
  ASSERT_TRUE(at_limit.ok()) << at_limit.status().message();
  EXPECT_EQ(at_limit->width, 1'000'000);
  const Status decoded = DecodeImageFile(widest, "captions/widest.png").status();
  EXPECT_FALSE(decoded.ok());
  EXPECT_NE(decoded.message(), "captions/widest.png: not a readable PNG image: Invalid IHDR data");
  // An empty file and a JPEG that ends inside its markers.
  const fs::path empty = fs::path(::testing::TempDir()) / "empty.jpg";
  std::ofstream(empty, std::ios::binary).flush();
  EXPECT_EQ(ReadImageHeader(empty.string(), "captions/empty.jpg").status().message(),
            "captions/empty.jpg: not a JPEG or PNG image (by its first bytes)");
  const fs::path torn = fs::path(::testing::TempDir()) / "torn.jpg";
  std::ofstream(torn, std::ios::binary) << std::string("\xFF\xD8\xFF\xE0\x00\x10JFIF", 10);
  EXPECT_TRUE(ReadImageHeader(torn.string(), "captions/torn.jpg")
                  .status()
                  .message()
                  .starts_with("captions/torn.jpg: not a readable JPEG image: "));
}

// The probe's images: a PNG decodes to the pixels it was made from, a JPEG to pixels near them
// (its quantisation; a smooth image at quality 90 moves none by more than a few levels).
TEST(ImageTest, EncodedImagesDecodeToWhatTheyWereMadeFrom) {
  RgbImage image{64, 48, std::vector<uint8_t>(64 * 48 * 3)};
  for (int y = 0; y < image.height; ++y) {
    for (int x = 0; x < image.width; ++x) {
      for (int c = 0; c < 3; ++c) {
        image.pixels[(static_cast<size_t>(y) * image.width + x) * 3 + c] =
            static_cast<uint8_t>(x + y + 40 * c);
      }
    }
  }
  StatusOr<RgbImage> png = DecodeImage(EncodePng(image), "probe.png");
  ASSERT_TRUE(png.ok()) << png.status().ToString();
  EXPECT_EQ(png->width, 64);
  EXPECT_EQ(png->height, 48);
  EXPECT_EQ(png->pixels, image.pixels);
  StatusOr<RgbImage> jpeg = DecodeImage(EncodeJpeg(image, 90), "probe.jpg");
  ASSERT_TRUE(jpeg.ok()) << jpeg.status().ToString();
  ASSERT_EQ(jpeg->pixels.size(), image.pixels.size());
  int largest = 0;
  for (size_t i = 0; i < image.pixels.size(); ++i) {
    largest = std::max(largest, std::abs(jpeg->pixels[i] - image.pixels[i]));
  }
  EXPECT_LE(largest, 8);
}

TEST(ImageTest, SameSizeIsACopyAndShrinkingAveragesNeighbours) {
  RgbImage image{4, 2, std::vector<uint8_t>(4 * 2 * 3)};
  for (size_t i = 0; i < image.pixels.size(); ++i) image.pixels[i] = static_cast<uint8_t>(i * 9);
  EXPECT_EQ(ResizeBicubic(image, 4, 2).pixels, image.pixels);
  RgbImage flat{8, 8, std::vector<uint8_t>(8 * 8 * 3, 77)};
  const RgbImage small = ResizeBicubic(flat, 3, 5);
  EXPECT_EQ(small.width, 3);
  EXPECT_EQ(small.height, 5);
  EXPECT_EQ(small.pixels, std::vector<uint8_t>(3 * 5 * 3, 77)) << "weights must sum to one";
}

TEST(ImageTest, BrokenImagesAreRefusedWithTheirName) {
  auto truncated = DecodeImageFile(Fixtures() + "truncated.jpg", "captions/truncated.jpg");
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(truncated.status().message().find("captions/truncated.jpg"), std::string::npos)
      << truncated.status().ToString();
  auto text = DecodeImageFile(Fixtures() + "not-an-image.jpg", "captions/not-an-image.jpg");
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().message(),
            "captions/not-an-image.jpg: not a JPEG or PNG image (by its first bytes)");
  const std::string png = Fixtures() + "rgba.png";
  std::ifstream in(png, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const fs::path cut =
      fs::temp_directory_path() / ("llmctl-image-cut-" + std::to_string(getpid()) + ".png");
  std::ofstream(cut, std::ios::binary) << data.substr(0, data.size() / 2);
  auto half = DecodeImageFile(cut.string(), "captions/half.png");
  fs::remove(cut);
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.status().message().find("captions/half.png: not a readable PNG image"),
            std::string::npos)
      << half.status().ToString();
}

// `data`, a file of EncodeJpeg's or EncodePng's, claiming `width` x `height` pixels: the JPEG's
// frame header (SOF0) or the PNG's IHDR, its CRC made again, rewritten; the pixel data is not.
std::string Claiming(std::string data, uint32_t width, uint32_t height) {
  auto put = [&data](size_t at, uint32_t value, int bytes) {
    for (int i = bytes - 1; i >= 0; --i, value >>= 8) data[at + i] = static_cast<char>(value);
  };
  if (data.starts_with("\xFF\xD8")) {
    const size_t frame =
        data.find("\xFF\xC0");  // length (2), precision (1), height, width (2 each)
    put(frame + 5, height, 2);
    put(frame + 7, width, 2);
    return data;
  }
  put(16, width, 4);  // IHDR: length (4), type (4), width, height
  put(20, height, 4);
  put(29, static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(data.data() + 12), 17)), 4);
  return data;
}

// Past PIL's decompression-bomb limit (2 x Image.MAX_IMAGE_PIXELS) an image is refused by the
// header reader and the decoder alike, before a pixel is allocated; at it, read as before.
TEST(ImageTest, AnImagePastPilsDecompressionBombLimitIsRefusedBeforeItsPixelsAreAllocated) {
  const RgbImage small{.width = 2, .height = 2, .pixels = std::vector<uint8_t>(12, 128)};
  const fs::path dir = fs::path(::testing::TempDir());
  for (const auto& [name, data] : std::vector<std::pair<std::string, std::string>>{
           {"bomb.jpg", Claiming(EncodeJpeg(small, 90), 60000, 60000)},
           {"bomb.png", Claiming(EncodePng(small), 1'000'000, 1'000'000)},
           {"tall.png", Claiming(EncodePng(small), 1000, 178'957)}}) {
    std::ofstream(dir / name, std::ios::binary) << data;
    const std::string size = name == "bomb.jpg"   ? "60000 x 60000"
                             : name == "bomb.png" ? "1000000 x 1000000"
                                                  : "1000 x 178957";
    const std::string expected = "captions/" + name + ": " + size +
                                 " pixels, more than the 178956970 PIL opens (twice its "
                                 "Image.MAX_IMAGE_PIXELS: past it a decompression bomb, which "
                                 "transformers' image processors never read); resize it";
    EXPECT_EQ(ReadImageHeader((dir / name).string(), "captions/" + name).status().message(),
              expected);
    EXPECT_EQ(DecodeImage(data, "captions/" + name).status().message(), expected);
  }
  // At the limit the header reads (and the decoder, which finds the pixel data short, writes no
  // more than the file's rows into the pixels it allocates).
  const std::string at_limit = Claiming(EncodePng(small), 1000, 178'956);
  std::ofstream(dir / "at-limit.png", std::ios::binary) << at_limit;
  StatusOr<ImageHeader> header = ReadImageHeader((dir / "at-limit.png").string(), "at-limit.png");
  ASSERT_TRUE(header.ok()) << header.status().message();
  EXPECT_EQ(header->height, 178'956);
  EXPECT_TRUE(DecodeImage(at_limit, "at-limit.png")
                  .status()
                  .message()
                  .starts_with("at-limit.png: not a readable PNG image"));
}

class ImageFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("llmctl-imagefolder-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "img");
    for (const char* name : {"photo.jpg", "gray.jpg", "truncated.jpg"}) {
      fs::copy_file(Fixtures() + name, dir_ / "img" / name);
    }
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  StatusOr<std::vector<CaptionedImage>> Read() {
    return ReadImageFolder(dir_.string(), "captions", "text");
  }
  fs::path dir_;
};

TEST_F(ImageFolderTest, ReadsJsonLinesAndCsvWithQuotedCaptions) {
  Write("metadata.jsonl",
        "{\"file_name\": \"img/photo.jpg\", \"text\": \"a red circle on a blue square\"}\n\n"
        "{\"file_name\": \"img/gray.jpg\", \"text\": \"a grey photo\", \"extra\": 3}\n");
  auto rows = Read();
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0].caption, "a red circle on a blue square");
  EXPECT_EQ((*rows)[1].path, (dir_ / "img/gray.jpg").string());
  EXPECT_TRUE(CheckImages(*rows, "captions").ok());

  fs::remove(dir_ / "metadata.jsonl");
  Write("metadata.csv",
        "file_name,text\r\nimg/photo.jpg,\"a plate, with \"\"fries\"\"\nand a burger\"\r\n"
        "img/gray.jpg,plain\r\n");
  rows = Read();
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0].caption, "a plate, with \"fries\"\nand a burger");
  EXPECT_EQ((*rows)[1].caption, "plain");
}

TEST_F(ImageFolderTest, BadMetadataIsOneMessageNamingTheFileAndLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"file_name\": \"img/photo.jpg\"}\n",
       "captions/metadata.jsonl:1: no caption column 'text'"},
      {"{\"file_name\": \"img/photo.jpg\", \"text\": \"ok\"}\n{\"text\": \"x\"}\n",
       "captions/metadata.jsonl:2: no file_name"},
      {"{\"file_name\": \"img/photo.jpg\", \"text\": \"  \"}\n",
       "captions/metadata.jsonl:1: the caption ('text') is empty or not text"},
      {"{\"file_name\": \"img/missing.jpg\", \"text\": \"x\"}\n",
       "captions/metadata.jsonl:1: file_name 'img/missing.jpg': no such file in captions"},
      {"{\"file_name\": \"../outside.jpg\", \"text\": \"x\"}\n",
       "captions/metadata.jsonl:1: file_name '../outside.jpg' is outside the folder"},
      {"{\"file_name\": \"img/photo.jpg\", \"text\": \"x\"}\n[1]\n",
       "captions/metadata.jsonl:2: not a JSON object"},
      {"{\"file_name\": \"img/photo.jpg\", \"text\": \"x\"}\n{\"file_name\": \"img/photo.jpg\", "
       "\"text\": \"y\"}\n",
       "captions/metadata.jsonl:2: file_name 'img/photo.jpg' is listed twice"},
      // A name the system will not look up is the metadata's error, not an exception, and it is
      // repeated only in part.
      {"{\"file_name\": \"img/" + std::string(5000, 'a') + ".jpg\", \"text\": \"x\"}\n",
       "captions/metadata.jsonl:1: file_name 'img/" + std::string(196, 'a') +
           "... (5008 bytes)': File name too long"},
      {"{\"file_name\": \"img/photo.jpg\\u0000../../x\", \"text\": \"x\"}\n",
       "captions/metadata.jsonl:1: file_name 'img/photo.jpg...' holds a NUL byte"},
      // ".." past a folder that is not there: the image cannot be opened as named, though the path
      // read as text leads to one (found by tests/fuzz/dataset_fuzz.cc).
      {"{\"file_name\": \"nowhere/../img/photo.jpg\", \"text\": \"x\"}\n",
       "captions/metadata.jsonl:1: file_name 'nowhere/../img/photo.jpg': no such file in captions"},
  };
  for (const auto& [metadata, message] : cases) {
    Write("metadata.jsonl", metadata);
    auto rows = Read();
    ASSERT_FALSE(rows.ok()) << metadata;
    EXPECT_EQ(rows.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(rows.status().message(), message);
  }
  Write("metadata.csv", "file_name,text\nimg/photo.jpg,a,b\n");
  EXPECT_EQ(Read().status().message(), "captions: both metadata.jsonl and metadata.csv; keep one");
  fs::remove(dir_ / "metadata.jsonl");
  EXPECT_EQ(Read().status().message(), "captions/metadata.csv:2: 3 fields where the header has 2");
  fs::remove(dir_ / "metadata.csv");
  EXPECT_EQ(Read().status().code(), StatusCode::kNotFound);
}

// Excel's "CSV UTF-8" starts the file with a byte-order mark, which the datasets library skips;
// kept, it made the header's first column "\xEF\xBB\xBFfile_name" and every row lack its file_name,
// and a metadata.jsonl's line 1 that held only it "not a JSON object" (found by
// tests/fuzz/dataset_fuzz.cc).
TEST_F(ImageFolderTest, MetadataWithAByteOrderMarkReadsAsWithout) {
  Write("metadata.csv",
        "\xEF\xBB\xBF"
        "file_name,text\r\nimg/photo.jpg,saved from Excel\r\n");
  auto rows = Read();
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].file_name, "img/photo.jpg");
  EXPECT_EQ((*rows)[0].caption, "saved from Excel");

  fs::remove(dir_ / "metadata.csv");
  Write("metadata.jsonl",
        "\xEF\xBB\xBF\r\n{\"file_name\": \"img/gray.jpg\", \"text\": \"from Notepad\"}\r\n");
  rows = Read();
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].caption, "from Notepad");
}

// A caption that is not UTF-8 (a Latin-1 metadata.csv) went on to the tokenizer, whose refusal
// names no file; a metadata.jsonl's was "not a JSON object". Both are refused by line and column,
// as ParseJsonl refuses a dataset's (found by tests/fuzz/dataset_fuzz.cc).
TEST_F(ImageFolderTest, MetadataThatIsNotUtf8IsRefusedWithItsLineAndColumn) {
  Write("metadata.csv",
        "file_name,text\nimg/photo.jpg,\"two\nlines\"\nimg/gray.jpg,caf\xE9 au lait\n");
  auto rows = Read();
  ASSERT_FALSE(rows.ok());
  EXPECT_EQ(rows.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rows.status().message(), "captions/metadata.csv:4: invalid UTF-8 at column 17");
  // A lone CR ends a CSV record, so it ends a line.
  Write("metadata.csv", "file_name,text\rimg/photo.jpg,\xC3\r");
  EXPECT_EQ(Read().status().message(), "captions/metadata.csv:2: invalid UTF-8 at column 15");

  fs::remove(dir_ / "metadata.csv");
  Write("metadata.jsonl",
        "{\"file_name\": \"img/photo.jpg\", \"text\": \"fine\"}\n\n"
        "{\"file_name\": \"img/gray.jpg\", \"text\": \"caf\xE9\"}\n");
  rows = Read();
  ASSERT_FALSE(rows.ok());
  EXPECT_EQ(rows.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rows.status().message(), "captions/metadata.jsonl:3: invalid UTF-8 at column 43");
}

TEST_F(ImageFolderTest, ABrokenImageIsRefusedByName) {
  Write("metadata.jsonl",
        "{\"file_name\": \"img/photo.jpg\", \"text\": \"fine\"}\n"
        "{\"file_name\": \"img/truncated.jpg\", \"text\": \"cut short\"}\n");
  auto rows = Read();
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  const Status checked = CheckImages(*rows, "captions");
  ASSERT_FALSE(checked.ok());
  EXPECT_NE(checked.message().find("captions/img/truncated.jpg: a corrupt JPEG image"),
            std::string::npos)
      << checked.ToString();
}

// scripts/make_caption_set.py, the tests' and the demo's data: an imagefolder whose every image
// decodes, in the two colours its caption names, its shape as large or small as the caption says.
TEST_F(ImageFolderTest, TheSyntheticCaptionSetIsAnImageFolderWhoseCaptionsAreTrue) {
  const fs::path out = dir_ / "shapes";
  const std::string command =
      ShellWord(testing::kTestPython) + " " +
      ShellWord((testing::SourceDir() / "scripts/make_caption_set.py").string()) + " " +
      ShellWord(out.string()) + " --count 12 --size 48 --seed 3";
  const testing::CommandResult made = testing::RunShellCommand(command);
  ASSERT_EQ(made.exit_code, 0) << command << "\n" << made.out;
  auto rows = ReadImageFolder(out.string(), "shapes", "text");
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 12u);
  const std::map<std::string, std::array<uint8_t, 3>> colours = {
      {"red", {220, 30, 30}},     {"green", {30, 170, 60}},   {"blue", {40, 70, 220}},
      {"yellow", {240, 210, 30}}, {"purple", {140, 50, 170}}, {"orange", {245, 140, 20}},
      {"white", {255, 255, 255}}, {"black", {0, 0, 0}},       {"grey", {128, 128, 128}}};
  for (const CaptionedImage& row : *rows) {
    SCOPED_TRACE(row.caption);
    std::istringstream words(row.caption);  // "a large red circle on a white background"
    std::string a, size, colour, shape, on, a2, background;
    words >> a >> size >> colour >> shape >> on >> a2 >> background;
    auto image = DecodeImageFile(row.path, row.file_name);
    ASSERT_TRUE(image.ok()) << image.status().ToString();
    ASSERT_EQ(image->width, 48);
    // Every pixel is the shape's colour or the background's, and the shape covers at least a fifth
    // of a large image (a large triangle's 2r^2 with r = 0.35 x 48: 24%) and at most 15% of a small
    // one (a small square's: 13%).
    int shape_pixels = 0, background_pixels = 0;
    for (size_t i = 0; i < image->pixels.size(); i += 3) {
      const std::array<uint8_t, 3> p = {image->pixels[i], image->pixels[i + 1],
                                        image->pixels[i + 2]};
      shape_pixels += p == colours.at(colour);
      background_pixels += p == colours.at(background);
    }
    EXPECT_EQ(shape_pixels + background_pixels, 48 * 48);
    EXPECT_GT(shape_pixels, 0);
    if (size == "large") {
      EXPECT_GE(shape_pixels, 48 * 48 / 5);
    } else {
      EXPECT_LE(shape_pixels, 48 * 48 * 15 / 100);
    }
  }
}

}  // namespace
}  // namespace llmctl::image
