#include "common/safetensors/safetensors.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "common/text.h"
#include "tests/support/shell_command.h"

namespace llmctl::safetensors {
namespace {

std::string FixtureDir() {
  return (llmctl::testing::SourceDir() / "tests" / "fixtures" / "safetensors").string();
}

std::string MakeTempDir() {
  std::string templ = ::testing::TempDir() + "safetensors_test_XXXXXX";
  const char* dir = ::mkdtemp(templ.data());
  EXPECT_NE(dir, nullptr);
  return templ;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

template <typename T>
std::vector<T> Values(const TensorView& view) {
  std::vector<T> out(view.bytes.size() / sizeof(T));
  std::memcpy(out.data(), view.bytes.data(), view.bytes.size());
  return out;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float magnitude;
  if (exp == 0) {
    magnitude = std::ldexp(static_cast<float>(mant), -24);
  } else {
    magnitude = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  }
  return sign ? -magnitude : magnitude;
}

float Bf16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

std::span<const std::byte> AsBytes(const auto& vec) { return std::as_bytes(std::span(vec)); }

TEST(SafetensorsTest, ReadsEveryDtypeWrittenByPython) {
  auto file = SafetensorsFile::Open(FixtureDir() + "/small.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const SafetensorsFile& f = **file;
  EXPECT_EQ(f.tensors().size(), 12u);
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));

  const TensorView* f64 = f.Find("f64");
  ASSERT_NE(f64, nullptr);
  EXPECT_EQ(f64->dtype, DType::kF64);
  EXPECT_EQ(f64->shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(Values<double>(*f64), (std::vector<double>{-0.5, -0.25, 0.0}));

  const TensorView* f32 = f.Find("f32");
  ASSERT_NE(f32, nullptr);
  EXPECT_EQ(f32->dtype, DType::kF32);
  EXPECT_EQ(f32->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f32->numel(), 6);
  EXPECT_EQ(Values<float>(*f32), (std::vector<float>{-1, -0.5, 0, 0.5, 1, 1.5}));

  const TensorView* f16 = f.Find("f16");
  ASSERT_NE(f16, nullptr);
  EXPECT_EQ(f16->dtype, DType::kF16);
  std::vector<float> halves;
  for (uint16_t h : Values<uint16_t>(*f16)) halves.push_back(HalfToFloat(h));
  EXPECT_EQ(halves, (std::vector<float>{-1, -0.5, 0, 0.5}));

  const TensorView* bf16 = f.Find("bf16");
  ASSERT_NE(bf16, nullptr);
  EXPECT_EQ(bf16->dtype, DType::kBF16);
  std::vector<float> brains;
  for (uint16_t b : Values<uint16_t>(*bf16)) brains.push_back(Bf16ToFloat(b));
  EXPECT_EQ(brains, (std::vector<float>{-1, -0.5, 0, 0.5}));

  EXPECT_EQ(Values<int64_t>(*f.Find("i64")),
            (std::vector<int64_t>{-(int64_t{1} << 40), (int64_t{1} << 40) + 7}));
  EXPECT_EQ(Values<int32_t>(*f.Find("i32")), (std::vector<int32_t>{-1000, 0, 1000}));
  EXPECT_EQ(Values<int16_t>(*f.Find("i16")), (std::vector<int16_t>{-300, 300}));
  EXPECT_EQ(Values<int8_t>(*f.Find("i8")), (std::vector<int8_t>{-128, -1, 0, 127}));
  EXPECT_EQ(Values<uint8_t>(*f.Find("u8")), (std::vector<uint8_t>{0, 128, 255}));
  EXPECT_EQ(f.Find("mask")->dtype, DType::kBool);
  EXPECT_EQ(Values<uint8_t>(*f.Find("mask")), (std::vector<uint8_t>{1, 0, 1}));

  const TensorView* scalar = f.Find("scalar");
  ASSERT_NE(scalar, nullptr);
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(scalar->numel(), 1);
  EXPECT_EQ(Values<float>(*scalar), (std::vector<float>{3.5f}));

  const TensorView* empty = f.Find("empty");
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->shape, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(empty->numel(), 0);
  EXPECT_TRUE(empty->bytes.empty());

  EXPECT_EQ(f.Find("nope"), nullptr);
}

TEST(SafetensorsTest, TensorsComeInBufferOrderAndAligned) {
  auto file = SafetensorsFile::Open(FixtureDir() + "/small.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const std::byte* previous_end = nullptr;
  for (const TensorView& t : (*file)->tensors()) {
    if (previous_end != nullptr) {
      EXPECT_EQ(t.bytes.data(), previous_end) << t.name;
    }
    previous_end = t.bytes.data() + t.bytes.size();
    // The reference writer pads the header and orders by dtype size; the mapping is page-aligned.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.bytes.data()) % DTypeSize(t.dtype), 0u) << t.name;
  }
}

TEST(SafetensorsTest, DTypeNamesRoundTrip) {
  for (DType d : {DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kI64, DType::kI32,
                  DType::kI16, DType::kI8, DType::kU8, DType::kBool}) {
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_FALSE(ParseDType("F8_E5M2").ok());
}

struct BrokenCase {
  const char* file;
  const char* expected;  // substring of the error message
  StatusCode code = StatusCode::kDataLoss;
};

void PrintTo(const BrokenCase& c, std::ostream* os) { *os << c.file; }

class BrokenFileTest : public ::testing::TestWithParam<BrokenCase> {};

TEST_P(BrokenFileTest, FailsWithOneLineErrorNamingTheFile) {
  const std::string path = FixtureDir() + "/broken/" + GetParam().file;
  auto file = SafetensorsFile::Open(path);
  ASSERT_FALSE(file.ok()) << path;
  const std::string& message = file.status().message();
  EXPECT_NE(message.find(GetParam().expected), std::string::npos) << message;
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_EQ(file.status().code(), GetParam().code) << file.status().ToString();

  // The in-memory entry point (the fuzzer's) agrees with the file reader.
  const std::string bytes = ReadBytes(path);
  auto parsed = SafetensorsFile::FromBuffer(AsBytes(bytes), path);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(), message);

  // So does the header's reader (pread, nothing mapped).
  auto header_only = SafetensorsFile::Open(path, Reading::kHeaderOnly);
  ASSERT_FALSE(header_only.ok());
  EXPECT_EQ(header_only.status().message(), message);
}

INSTANTIATE_TEST_SUITE_P(
    Broken, BrokenFileTest,
    ::testing::Values(
        BrokenCase{"empty.safetensors", "file is 0 bytes, shorter than the 8-byte header length"},
        BrokenCase{"short.safetensors", "file is 5 bytes, shorter than the 8-byte header length"},
        BrokenCase{"header_past_end.safetensors", "header length 1000 runs past the end"},
        BrokenCase{"header_absurd.safetensors", "exceeds the 100000000-byte limit"},
        BrokenCase{"not_json.safetensors", "header is not valid JSON"},
        BrokenCase{"not_utf8.safetensors", "header is not valid UTF-8 (byte 3)"},
        BrokenCase{"not_object.safetensors", "header must be a JSON object, got array"},
        BrokenCase{"entry_not_object.safetensors", "tensor 'w': entry must be an object"},
        BrokenCase{"missing_dtype.safetensors", "tensor 'w': missing field 'dtype'"},
        BrokenCase{"missing_offsets.safetensors", "tensor 'w': missing field 'data_offsets'"},
        BrokenCase{"dtype_not_string.safetensors", "tensor 'w': 'dtype' must be a string"},
        BrokenCase{"shape_not_array.safetensors", "tensor 'w': 'shape' must be an array"},
        BrokenCase{"negative_dim.safetensors", "tensor 'w': 'shape' value -2 is negative"},
        BrokenCase{"float_dim.safetensors", "tensor 'w': 'shape' must hold integers, got number"},
        BrokenCase{"offsets_arity.safetensors", "'data_offsets' must be an array [begin, end]"},
        BrokenCase{"offsets_reversed.safetensors", "data_offsets [8, 0] end before they begin"},
        BrokenCase{
            "size_mismatch.safetensors",
            "tensor 'w': shape [2, 3] of F32 needs 24 bytes but data_offsets [0, 20] hold 20"},
        BrokenCase{"offsets_out_of_range.safetensors", "run past the 16-byte data buffer"},
        BrokenCase{"overlap.safetensors", "tensor 'b' at bytes [4, 12) overlaps tensor 'a'"},
        BrokenCase{"hole.safetensors", "bytes [8, 12) of the data buffer belong to no tensor"},
        BrokenCase{"trailing_bytes.safetensors", "the tensors cover only 8"},
        BrokenCase{"shape_overflow.safetensors", "overflows a 64-bit byte count"},
        BrokenCase{"unsupported_dtype.safetensors", "unsupported dtype 'F8_E4M3' for tensor 'w' in",
                   StatusCode::kUnimplemented},
        BrokenCase{"duplicate_name.safetensors", "header names 'w' twice"},
        BrokenCase{"duplicate_field.safetensors",
                   "header repeats the key 'dtype' within one object"},
        BrokenCase{"metadata_not_string.safetensors",
                   "'__metadata__' value for 'format' must be a string"},
        BrokenCase{"deep_nesting.safetensors", "nests deeper than 64 levels"}),
    [](const ::testing::TestParamInfo<BrokenCase>& info) {
      std::string name = info.param.file;
      return name.substr(0, name.find('.'));
    });

TEST(SafetensorsTest, MissingFileIsNotFound) {
  auto file = SafetensorsFile::Open(FixtureDir() + "/no_such.safetensors");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kNotFound);
  EXPECT_NE(file.status().message().find("no_such.safetensors"), std::string::npos);
}

TEST(SafetensorsTest, DirectoryIsRefused) {
  auto file = SafetensorsFile::Open(FixtureDir());
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("not a regular file"), std::string::npos);
}

// A tensor's name comes from the file: an error quotes it without its C1 or bidirectional controls,
// cut at a character's start.
TEST(SafetensorsTest, AnErrorQuotesAHostileNameOnOneLineCutAtACharacter) {
  std::string name = "w\u202e\u009b[2J\x1b]0;T\x07";
  for (int i = 0; i < 100; ++i) name += "\u00e9";
  const std::string header =
      nlohmann::json{{name, {{"dtype", "F8_E4M3"}, {"shape", {1}}, {"data_offsets", {0, 1}}}}}
          .dump();
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  bytes += header + std::string(1, '\0');
  auto file = SafetensorsFile::FromBuffer(AsBytes(bytes), "mem");
  ASSERT_FALSE(file.ok());
  const std::string& message = file.status().message();
  EXPECT_EQ(message.rfind("unsupported dtype 'F8_E4M3' for tensor 'w  [2J ]0;T \u00e9", 0), 0u)
      << message;
  EXPECT_NE(message.find("\u00e9\u2026' in mem"), std::string::npos) << message;
  EXPECT_EQ(FirstInvalidUtf8(message), std::string_view::npos) << message;
}

TEST(SafetensorsTest, EmptyHeaderIsAValidEmptyFile) {
  const std::string bytes = std::string("\x08\0\0\0\0\0\0\0", 8) + "{}      ";
  auto file = SafetensorsFile::FromBuffer(AsBytes(bytes), "mem");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_TRUE((*file)->tensors().empty());
  EXPECT_TRUE((*file)->metadata().empty());
}

TEST(SafetensorsWriterTest, RewritingPythonsFileGivesTheSameBytes) {
  // Same tensors and metadata in, byte-identical file out: header layout, ordering and padding all
  // match the reference writer.
  const std::string source = FixtureDir() + "/small.safetensors";
  auto file = SafetensorsFile::Open(source);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  std::vector<TensorToWrite> tensors;
  for (const TensorView& t : (*file)->tensors()) {
    tensors.push_back({t.name, t.dtype, t.shape, t.bytes});
  }
  std::reverse(tensors.begin(), tensors.end());  // input order must not matter
  const std::string out = MakeTempDir() + "/copy.safetensors";
  ASSERT_TRUE(WriteSafetensors(out, tensors, (*file)->metadata()).ok());
  EXPECT_EQ(ReadBytes(out), ReadBytes(source));
  EXPECT_FALSE(std::filesystem::exists(out + ".tmp"));
}

TEST(SafetensorsWriterTest, RoundTripsValuesAndAlignsEveryTensor) {
  const std::vector<float> weights = {1.5f, -2.0f, 3.25f, 0.0f, 8.0f, -0.125f};
  const std::vector<uint8_t> flags = {1, 0, 1};
  const std::vector<int64_t> ids = {-5, 1LL << 50};
  const std::vector<uint16_t> halves = {0x3c00, 0xc000};
  const std::string path = MakeTempDir() + "/w.safetensors";
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"flags", DType::kU8, {3}, AsBytes(flags)},
                                {"w", DType::kF32, {2, 3}, AsBytes(weights)},
                                {"h", DType::kF16, {2}, AsBytes(halves)},
                                {"ids", DType::kI64, {2}, AsBytes(ids)},
                                {"none", DType::kF32, {0}, {}}},
                               {{"format", "pt"}, {"step", "7"}})
                  .ok());
  const std::string bytes = ReadBytes(path);
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(bytes[8 + header_len - 1] == ' ' || bytes[8 + header_len - 1] == '}', true);

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->metadata().at("step"), "7");
  EXPECT_EQ(Values<float>(*(*file)->Find("w")), weights);
  EXPECT_EQ(Values<uint8_t>(*(*file)->Find("flags")), flags);
  EXPECT_EQ(Values<int64_t>(*(*file)->Find("ids")), ids);
  EXPECT_EQ(Values<uint16_t>(*(*file)->Find("h")), halves);
  EXPECT_EQ((*file)->Find("none")->numel(), 0);
  for (const TensorView& t : (*file)->tensors()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.bytes.data()) % DTypeSize(t.dtype), 0u) << t.name;
  }
}

TEST(SafetensorsWriterTest, RefusesBadInputAndLeavesNothingBehind) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/bad.safetensors";
  const std::vector<float> four = {1, 2, 3, 4};
  struct Case {
    std::vector<TensorToWrite> tensors;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {{{"a", DType::kF32, {4}, AsBytes(four)}, {"a", DType::kF32, {4}, AsBytes(four)}},
       "tensor 'a': written twice"},
      {{{"__metadata__", DType::kF32, {4}, AsBytes(four)}}, "reserved"},
      {{{"a", DType::kF32, {3}, AsBytes(four)}}, "shape [3] of F32 needs 12 bytes, got 16"},
      {{{"a", DType::kF32, {-1, -4}, AsBytes(four)}}, "negative dimension"},
      {{{"a", DType::kI64, {1LL << 62, 4}, AsBytes(four)}}, "overflows"},
      {{{"bad\xff", DType::kF32, {4}, AsBytes(four)}}, "not valid UTF-8"},
  };
  for (const Case& c : cases) {
    Status status = WriteSafetensors(path, c.tensors);
    ASSERT_FALSE(status.ok()) << c.expected;
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find(c.expected), std::string::npos) << status.message();
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir));

  // A failed write never replaces what was there.
  ASSERT_TRUE(WriteSafetensors(path, {{"a", DType::kF32, {4}, AsBytes(four)}}).ok());
  const std::string before = ReadBytes(path);
  EXPECT_FALSE(WriteSafetensors(path, {{"a", DType::kF32, {5}, AsBytes(four)}}).ok());
  EXPECT_EQ(ReadBytes(path), before);
  EXPECT_FALSE(WriteSafetensors(dir + "/missing_dir/x.safetensors", {}).ok());
}

TEST(ShardedCheckpointTest, ResolvesTensorsAcrossShards) {
  auto ckpt = ShardedCheckpoint::Open(FixtureDir() + "/sharded");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->names(), (std::vector<std::string>{"lm_head.weight", "model.embed.weight",
                                                        "model.norm.weight"}));
  EXPECT_EQ((*ckpt)->shards().size(), 2u);
  EXPECT_EQ((*ckpt)->metadata().at("total_size"), "72");
  const TensorView* embed = (*ckpt)->Find("model.embed.weight");
  ASSERT_NE(embed, nullptr);
  EXPECT_EQ(embed->shape, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(Values<float>(*embed), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
  const TensorView* head = (*ckpt)->Find("lm_head.weight");
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(Values<float>(*head), (std::vector<float>{100, 101, 102, 103, 104, 105, 106, 107}));
  EXPECT_EQ(Values<float>(*(*ckpt)->Find("model.norm.weight")), (std::vector<float>{1, 1}));
  EXPECT_EQ((*ckpt)->Find("missing"), nullptr);
}

// llmctl's inputs check reads the headers alone: the same tensors, metadata and shards, no bytes.
TEST(ShardedCheckpointTest, TheHeadersAloneGiveTheSameTensorsWithoutTheirBytes) {
  auto mapped = ShardedCheckpoint::Open(FixtureDir() + "/sharded");
  auto headers = ShardedCheckpoint::Open(FixtureDir() + "/sharded", Reading::kHeaderOnly);
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  ASSERT_TRUE(headers.ok()) << headers.status().ToString();
  EXPECT_EQ((*headers)->names(), (*mapped)->names());
  EXPECT_EQ((*headers)->metadata(), (*mapped)->metadata());
  EXPECT_EQ((*headers)->shards().size(), (*mapped)->shards().size());
  for (const std::string& name : (*mapped)->names()) {
    const TensorView* header = (*headers)->Find(name);
    ASSERT_NE(header, nullptr) << name;
    EXPECT_EQ(header->dtype, (*mapped)->Find(name)->dtype) << name;
    EXPECT_EQ(header->shape, (*mapped)->Find(name)->shape) << name;
    EXPECT_TRUE(header->bytes.empty()) << name;
  }
}

TEST(ShardedCheckpointTest, OpensASingleFileDirectory) {
  auto ckpt = ShardedCheckpoint::Open(FixtureDir() + "/single");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->names().size(), 12u);
  EXPECT_EQ((*ckpt)->metadata().at("format"), "pt");
  EXPECT_EQ(Values<float>(*(*ckpt)->Find("scalar")), (std::vector<float>{3.5f}));
}

TEST(ShardedCheckpointTest, BrokenIndexesNameTheProblem) {
  const std::string broken = FixtureDir() + "/broken";
  struct Case {
    const char* dir;
    const char* expected;
    StatusCode code;
  };
  for (const Case& c : std::vector<Case>{
           {"missing_shard", "tensor 'lm_head.weight': shard file ", StatusCode::kNotFound},
           {"absent_tensor",
            "tensor 'model.absent.weight' is listed in shard 'model-00001-of-00002.safetensors' "
            "but that file has no such tensor",
            StatusCode::kDataLoss},
           {"shard_outside", "must be a plain file name", StatusCode::kDataLoss},
       }) {
    auto ckpt = ShardedCheckpoint::Open(broken + "/" + c.dir);
    ASSERT_FALSE(ckpt.ok()) << c.dir;
    EXPECT_EQ(ckpt.status().code(), c.code) << ckpt.status().ToString();
    EXPECT_NE(ckpt.status().message().find(c.expected), std::string::npos)
        << ckpt.status().message();
    EXPECT_NE(ckpt.status().message().find("model.safetensors.index.json"), std::string::npos);
  }
  auto missing = ShardedCheckpoint::Open(broken + "/missing_shard");
  EXPECT_NE(missing.status().message().find("model-00002-of-00002.safetensors does not exist"),
            std::string::npos)
      << missing.status().message();

  auto nothing = ShardedCheckpoint::Open(broken);
  ASSERT_FALSE(nothing.ok());
  EXPECT_EQ(nothing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(nothing.status().message().find("neither model.safetensors nor"), std::string::npos);
  EXPECT_EQ(ShardedCheckpoint::Open(broken + "/nope").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace llmctl::safetensors
