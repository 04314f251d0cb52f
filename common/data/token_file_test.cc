#include "common/data/token_file.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "common/data/heap_watching_encoder.h"
#include "common/data/token_file_testing.h"
#include "tests/support/shell_command.h"

namespace llmctl::data {
namespace {

std::string FixtureDir() { return (testing::SourceDir() / "tests/fixtures/data").string(); }

std::string DemoData() {
  return (testing::SourceDir() / "experiments/data/alpaca-demo.jsonl").string();
}

std::string MakeTempDir() {
  std::string templ = ::testing::TempDir() + "token_file_test_XXXXXX";
  EXPECT_NE(::mkdtemp(templ.data()), nullptr);
  return templ;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

TokenizedExample Example(std::vector<int32_t> ids, size_t masked) {
  TokenizedExample e;
  e.labels = ids;
  for (size_t i = 0; i < masked && i < e.labels.size(); ++i) e.labels[i] = kIgnoreIndex;
  e.input_ids = std::move(ids);
  return e;
}

TEST(TokenFileTest, RoundTrips) {
  const std::string path = MakeTempDir() + "/t.tok";
  const std::vector<TokenizedExample> examples = {Example({1, 10, 11, 12, 2}, 2),
                                                  Example({1, 20, 2}, 0), Example({7}, 0)};
  ASSERT_TRUE(WriteTokenFile(path, "fp v1", 1, 2, examples).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_EQ(std::filesystem::file_size(path) % 8, 0u);

  auto file = TokenFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const TokenFile& f = **file;
  EXPECT_EQ(f.fingerprint(), "fp v1");
  EXPECT_EQ(f.num_examples(), 3);
  EXPECT_EQ(f.total_tokens(), 9);
  // Targets exclude position 0: 3 in the first example, 2 in the second, 0 in the third.
  EXPECT_EQ(f.target_tokens(), 5);
  EXPECT_EQ(f.bos_id(), 1);
  EXPECT_EQ(f.eos_id(), 2);
  EXPECT_EQ(f.max_token_id(), 20);
  EXPECT_EQ(f.length(0), 5);
  EXPECT_EQ(std::vector<int32_t>(f.input_ids(0).begin(), f.input_ids(0).end()),
            (std::vector<int32_t>{1, 10, 11, 12, 2}));
  EXPECT_EQ(std::vector<uint8_t>(f.label_mask(0).begin(), f.label_mask(0).end()),
            (std::vector<uint8_t>{0, 0, 1, 1, 1}));
  EXPECT_EQ(std::vector<int32_t>(f.input_ids(2).begin(), f.input_ids(2).end()),
            (std::vector<int32_t>{7}));
}

// The bytes of these examples as the writer made them before it streamed: the format is unchanged.
TEST(TokenFileTest, WritesTheSameBytesAsBeforeItStreamed) {
  const std::string path = MakeTempDir() + "/t.tok";
  ASSERT_TRUE(
      WriteTokenFile(path, "fp v1", 1, 2,
                     {Example({1, 10, 11, 12, 2}, 2), Example({1, 20, 2}, 0), Example({7}, 0)})
          .ok());
  const std::string bytes = ReadBytes(path);
  std::string hex;
  for (const unsigned char c : bytes) {
    hex += "0123456789abcdef"[c >> 4];
    hex += "0123456789abcdef"[c & 15];
  }
  EXPECT_EQ(hex,
            // header: magic, version 1, fingerprint 5 bytes, 3 examples, 9 tokens, 5 targets
            "4c4c4d43544c544b"
            "01000000"
            "05000000"
            "0300000000000000"
            "0900000000000000"
            "0500000000000000"
            // content hash, bos 1, eos 2, max id 20, reserved
            "04dc2d292638ad8d"
            "01000000"
            "02000000"
            "14000000"
            "00000000"
            // "fp v1" and its padding
            "6670207631000000"
            // offsets 0, 5, 8, 9
            "0000000000000000"
            "0500000000000000"
            "0800000000000000"
            "0900000000000000"
            // ids
            "010000000a0000000b0000000c00000002000000"
            "010000001400000002000000"
            "07000000"
            // mask, then padding to a multiple of 8
            "000001010101010101"
            "000000");
}

// Preparing needs the file's size twice in its directory (the scratch files, then the file): less
// free is refused before a byte is written, naming the directory and both figures.
TEST(TokenFileTest, PreparingWithoutRoomForTwiceTheFileIsRefused) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/a.tok";
  constexpr int64_t kFile = int64_t{3} << 30;
  EXPECT_TRUE(CheckRoomToPrepare(path, kFile, uint64_t{6} << 30).ok());
  const Status refused = CheckRoomToPrepare(path, kFile, uint64_t{5} << 30);
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable);
  EXPECT_EQ(refused.message(), "cannot prepare " + path +
                                   " (its scratch files, then the file: twice the 3.00 GiB it is "
                                   "estimated at): 6.00 GiB do not fit in " +
                                   dir + ", whose filesystem has 5.00 GiB available");
}

// The scratch files take the name of WriteFileAtomically's temporaries, so a crash between their
// creation and their unlink leaves what RemoveAtomicWriteLeftovers removes: the names the open
// scratch files had, made again as files, are both removed.
TEST(TokenFileTest, AScratchFileACrashLeftIsAnAtomicWriteLeftover) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/a.tok";
  auto writer = TokenFileWriter::Create(path);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  const std::string deleted = " (deleted)";
  std::vector<std::string> scratch;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code unreadable;
    const std::string target = std::filesystem::read_symlink(fd.path(), unreadable).string();
    if (!unreadable && target.starts_with(dir + "/") && target.ends_with(deleted)) {
      scratch.push_back(target.substr(0, target.size() - deleted.size()));
    }
  }
  ASSERT_EQ(scratch.size(), 2u);
  for (const std::string& name : scratch) std::ofstream(name) << "left by a crash";
  StatusOr<int> removed = RemoveAtomicWriteLeftovers(path);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_EQ(*removed, 2);
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

// The scratch files are unlinked as soon as they are made: a writer never finished, as when
// tokenizing fails, leaves nothing in the directory, nor does one at work.
TEST(TokenFileTest, AWriterLeavesNoScratchFiles) {
  const std::string dir = MakeTempDir();
  {
    auto writer = TokenFileWriter::Create(dir + "/a.tok");
    ASSERT_TRUE(writer.ok()) << writer.status().ToString();
    ASSERT_TRUE(writer->Add(Example({1, 2, 3}, 1)).ok());
    EXPECT_TRUE(std::filesystem::is_empty(dir));
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  const Status missing_dir = TokenFileWriter::Create(dir + "/nope/a.tok").status();
  EXPECT_NE(missing_dir.message().find("cannot write " + dir + "/nope/a.tok: scratch file"),
            std::string::npos)
      << missing_dir.message();
}

TEST(TokenFileTest, WriterRefusesBadExamples) {
  const std::string dir = MakeTempDir();
  EXPECT_FALSE(WriteTokenFile(dir + "/a.tok", "fp", 1, 2, {}).ok());
  EXPECT_FALSE(WriteTokenFile(dir + "/a.tok", "fp", 1, 2, {Example({}, 0)}).ok());
  TokenizedExample bad_label = Example({1, 2, 3}, 0);
  bad_label.labels[1] = 5;
  const Status status = WriteTokenFile(dir + "/a.tok", "fp", 1, 2, {bad_label});
  EXPECT_NE(status.message().find("neither its id nor -100"), std::string::npos)
      << status.message();
  EXPECT_FALSE(WriteTokenFile(dir + "/a.tok", "fp", 1, 2, {Example({1, -4}, 0)}).ok());
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

// Corruptions of a valid file, each with the message it must produce. Built here rather than stored
// as fixtures so they follow the format if its version changes.
class CorruptTokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    good_ = dir_ + "/good.tok";
    ASSERT_TRUE(WriteTokenFile(good_, "fingerprint", 1, 2,
                               {Example({1, 10, 11, 2}, 1), Example({1, 12, 2}, 1)})
                    .ok());
    bytes_ = ReadBytes(good_);
  }

  Status OpenVariant(const std::string& bytes, bool verify = true) {
    const std::string path = dir_ + "/variant.tok";
    WriteBytes(path, bytes);
    TokenFile::Options options;
    options.verify_contents = verify;
    auto file = TokenFile::Open(path, options);
    return file.ok() ? Status::Ok() : file.status();
  }

  void ExpectError(const std::string& bytes, const std::string& expected, bool verify = true) {
    const Status status = OpenVariant(bytes, verify);
    ASSERT_FALSE(status.ok()) << expected;
    EXPECT_NE(status.message().find(expected), std::string::npos) << status.message();
    EXPECT_NE(status.message().find(dir_ + "/variant.tok"), std::string::npos) << status.message();
    EXPECT_NE(status.message().find("re-run llm-train --prepare"), std::string::npos)
        << status.message();
  }

  std::string With(size_t offset, const void* value, size_t size) {
    std::string bytes = bytes_;
    std::memcpy(bytes.data() + offset, value, size);
    return bytes;
  }

  // Offsets start after the 64-byte header and the fingerprint ("fingerprint", 11 bytes → 16).
  static constexpr size_t kOffsets = 64 + 16;
  std::string dir_, good_, bytes_;
};

TEST_F(CorruptTokenFileTest, ValidFileOpens) { EXPECT_TRUE(OpenVariant(bytes_).ok()); }

TEST_F(CorruptTokenFileTest, BadMagic) {
  ExpectError("not a token file at all", "variant.tok is not an llmctl token file (bad magic)");
  ExpectError("", "is not an llmctl token file (bad magic)");
  ExpectError(ReadBytes(FixtureDir() + "/alpaca_small.jsonl"), "bad magic");
}

TEST_F(CorruptTokenFileTest, VersionMismatch) {
  const uint32_t version = 99;
  ExpectError(With(8, &version, 4), "is token file version 99 but this build reads version 1");
}

TEST_F(CorruptTokenFileTest, Truncated) {
  ExpectError(bytes_.substr(0, 40), "is truncated: 40 bytes, shorter than the 64-byte header");
  ExpectError(bytes_.substr(0, bytes_.size() - 8), "is truncated");
  ExpectError(bytes_ + std::string(8, '\0'), "8 bytes past the end the header describes");
}

TEST_F(CorruptTokenFileTest, OffsetsOutOfOrderOrRange) {
  const uint64_t backwards = 0;
  ExpectError(With(kOffsets + 8, &backwards, 8), "offset of example 1 (0) is not increasing",
              /*verify=*/false);
  const uint64_t past_end = 1000;
  ExpectError(With(kOffsets + 8, &past_end, 8), "offset of example 1 (1000) is not increasing",
              /*verify=*/false);
  const uint64_t nonzero = 1;
  ExpectError(With(kOffsets, &nonzero, 8), "offsets start at 1", /*verify=*/false);
}

TEST_F(CorruptTokenFileTest, HugeCountsDoNotOverflow) {
  const uint64_t huge = ~uint64_t{0} / 2;
  ExpectError(With(16, &huge, 8), "header counts overflow");  // num_examples
  ExpectError(With(24, &huge, 8), "header counts overflow");  // total_tokens
}

TEST_F(CorruptTokenFileTest, ContentHashCatchesFlippedToken) {
  std::string bytes = bytes_;
  bytes[kOffsets + 3 * 8 + 4] ^= 1;  // second token id
  ExpectError(bytes, "content hash mismatch");
  EXPECT_TRUE(OpenVariant(bytes, /*verify=*/false).ok());  // only offsets are checked then
}

TEST(PrepareTest, PreparesTheFixtureAndRecordsTheFingerprint) {
  const std::string out = MakeTempDir() + "/alpaca.tok";
  ByteTextEncoder encoder;
  PrepareOptions options;
  options.max_seq_length = 160;
  auto stats = PrepareTokenFile(FixtureDir() + "/alpaca_small.jsonl", encoder, options, out);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->records_in_file, 5);
  EXPECT_EQ(stats->examples, 5);
  EXPECT_EQ(stats->max_length, 160);  // the with-input prompt alone is longer than 160 bytes
  EXPECT_GT(stats->truncated, 0);

  auto file = TokenFile::Open(out);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->num_examples(), 5);
  EXPECT_EQ((*file)->total_tokens(), stats->total_tokens);
  EXPECT_EQ((*file)->target_tokens(), stats->target_tokens);
  EXPECT_EQ((*file)->fingerprint(), stats->fingerprint);
  EXPECT_EQ((*file)->eos_id(), ByteTextEncoder::kEos);

  auto expected = ExpectedFingerprint(FixtureDir() + "/alpaca_small.jsonl", encoder, options);
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(*expected, (*file)->fingerprint());
  EXPECT_EQ(expected->find("llmctl-tokens v1; tokenizer=bytes-v1; data=fnv1a64:"), 0u) << *expected;
  EXPECT_NE(expected->find("; format=alpaca; template=alpaca; max_seq_length=160; "
                           "mask_prompt=true; samples=all"),
            std::string::npos)
      << *expected;

  // Every option that changes the tokens changes the fingerprint.
  const uint64_t hash = 42;
  const std::string base = MakeFingerprint("tok", hash, options);
  PrepareOptions changed = options;
  changed.samples = 3;
  EXPECT_NE(MakeFingerprint("tok", hash, changed), base);
  changed = options;
  changed.mask_prompt = false;
  EXPECT_NE(MakeFingerprint("tok", hash, changed), base);
  changed = options;
  changed.max_seq_length = 161;
  EXPECT_NE(MakeFingerprint("tok", hash, changed), base);
  changed = options;
  changed.prompt_template = PromptTemplate::kNone;
  EXPECT_NE(MakeFingerprint("tok", hash, changed), base);
  EXPECT_NE(MakeFingerprint("tok2", hash, options), base);
  EXPECT_NE(MakeFingerprint("tok", hash + 1, options), base);
}

TEST(PrepareTest, SamplesTakesTheFirstN) {
  const std::string out = MakeTempDir() + "/demo.tok";
  ByteTextEncoder encoder;
  PrepareOptions options;
  options.samples = 100;
  auto stats = PrepareTokenFile(DemoData(), encoder, options, out);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->records_in_file, 600);
  EXPECT_EQ(stats->examples, 100);
  EXPECT_EQ(stats->truncated, 0);
  EXPECT_EQ(stats->without_targets, 0);
  EXPECT_NE(stats->fingerprint.find("samples=100"), std::string::npos);

  // The first example is the first line, rendered with the no-input or with-input Alpaca prompt.
  auto records = LoadJsonl(DemoData(), DatasetFormat::kAlpaca);
  ASSERT_TRUE(records.ok());
  auto rendered = RenderExample((*records)[0], DatasetFormat::kAlpaca, PromptTemplate::kAlpaca);
  ASSERT_TRUE(rendered.ok());
  auto file = TokenFile::Open(out);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->length(0),
            static_cast<int64_t>(1 + rendered->prompt.size() + rendered->response.size() + 1));
  const auto mask = (*file)->label_mask(0);
  EXPECT_EQ(std::count(mask.begin(), mask.end(), 1),
            static_cast<int64_t>(rendered->response.size() + 1));
}

TEST(PrepareTest, ErrorsNameTheDataFileAndLine) {
  const std::string out = MakeTempDir() + "/x.tok";
  ByteTextEncoder encoder;
  PrepareOptions options;
  auto stats =
      PrepareTokenFile(FixtureDir() + "/broken/missing_output.jsonl", encoder, options, out);
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.status().message().find("missing_output.jsonl:2: missing field 'output'"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(out));

  options.format = DatasetFormat::kText;  // with the default alpaca template: refused
  stats = PrepareTokenFile(FixtureDir() + "/text_small.jsonl", encoder, options, out);
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.status().message().find("format 'text' takes template 'none'"),
            std::string::npos);

  options.prompt_template = PromptTemplate::kNone;
  stats = PrepareTokenFile(FixtureDir() + "/text_small.jsonl", encoder, options, out);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->examples, 3);
  EXPECT_EQ(stats->without_targets, 0);  // even "" trains EOS

  options.samples = -1;
  EXPECT_FALSE(PrepareTokenFile(FixtureDir() + "/text_small.jsonl", encoder, options, out).ok());
}

// A JSON Lines file of `records` Alpaca records whose outputs run to about 2,000 bytes, the same
// bytes on every run (a linear congruential generator, not the library's random engines).
void WriteLongJsonl(const std::string& path, int records) {
  std::ofstream out(path, std::ios::binary);
  uint64_t state = 7;
  auto next = [&state](uint64_t bound) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (state >> 33) % bound;
  };
  for (int r = 0; r < records; ++r) {
    std::string output;
    const uint64_t words = 50 + next(400);
    for (uint64_t w = 0; w < words; ++w)
      output.append("word").append(std::to_string(next(1000))).append(" ");
    out << "{\"instruction\": \"Say something " << r << ".\", \"input\": \""
        << (r % 3 == 0 ? "" : "with input") << "\", \"output\": \"" << output << "\"}\n";
  }
}

// The token file the writer made of WriteLongJsonl(1000) with ByteTextEncoder before it streamed.
constexpr uint64_t kLongJsonlBytes = 1986903;
constexpr uint64_t kLongJsonlHash = 0x0ac3feb270c52cdeULL;
constexpr uint64_t kLongTokenFileBytes = 10634192;
constexpr uint64_t kLongTokenFileHash = 0x4a0543df9714d20cULL;

// Many scratch buffers' worth of tokens (2.1 million), so the writer fills and copies them in
// several pieces.
TEST(PrepareTest, PreparesTheSameBytesAsBeforeItStreamed) {
  const std::string dir = MakeTempDir();
  WriteLongJsonl(dir + "/long.jsonl", 1000);
  const std::string jsonl = ReadBytes(dir + "/long.jsonl");
  ASSERT_EQ(jsonl.size(), kLongJsonlBytes);
  ASSERT_EQ(Fnv1a64(jsonl), kLongJsonlHash);
  ByteTextEncoder encoder;
  PrepareOptions options;
  options.max_seq_length = 4096;
  auto stats = PrepareTokenFile(dir + "/long.jsonl", encoder, options, dir + "/long.tok");
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->total_tokens, 2125193);
  const std::string bytes = ReadBytes(dir + "/long.tok");
  EXPECT_EQ(bytes.size(), kLongTokenFileBytes);
  EXPECT_EQ(Fnv1a64(bytes), kLongTokenFileHash);
}

// A dataset whose estimated token file (a token a byte, 5 bytes each) is twice more than its
// directory's filesystem holds is refused before it is read: an 8 TiB sparse JSONL here, whose
// first 64 MiB were read before and refused as a line too long.
TEST(PrepareTest, ADatasetTooLargeForTheDirectoryIsRefusedBeforeItIsRead) {
  const std::string dir = MakeTempDir();
  const std::string data = dir + "/huge.jsonl";
  std::ofstream(data) << "";
  std::filesystem::resize_file(data, uint64_t{8} << 40);
  ByteTextEncoder encoder;
  auto stats = PrepareTokenFile(data, encoder, PrepareOptions(), dir + "/huge.tok");
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), StatusCode::kUnavailable) << stats.status().message();
  EXPECT_NE(stats.status().message().find("twice the 40.00 TiB it is estimated at): 80.00 TiB do "
                                          "not fit in " +
                                          dir + ", whose filesystem has "),
            std::string::npos)
      << stats.status().message();
}

// The examples go to the file as they are tokenized: what preparing holds does not grow with the
// dataset. Before, every example's ids and labels were held until the end, 17 MB and more here.
TEST(PrepareTest, HoldsEachExamplesOffsetNotItsTokens) {
  const std::string dir = MakeTempDir();
  WriteLongJsonl(dir + "/long.jsonl", 1000);
  HeapWatchingEncoder encoder;
  PrepareOptions options;
  options.max_seq_length = 4096;
  const size_t before = HeapWatchingEncoder::HeapInUse();
  auto stats = PrepareTokenFile(dir + "/long.jsonl", encoder, options, dir + "/long.tok");
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  ASSERT_EQ(stats->total_tokens, 2125193);
  // The scratch buffers (1.25 MiB), the offsets (8 kB), one line and its example.
  EXPECT_LT(encoder.peak_heap() - before, size_t{4} << 20);
}

// A record that fails after many have gone to the scratch files: the previous token file is still
// there, unchanged, and nothing else is left in its directory.
TEST(PrepareTest, AFailureMidwayLeavesThePreviousFileAndNothingElse) {
  const std::string dir = MakeTempDir();
  WriteLongJsonl(dir + "/long.jsonl", 1000);
  std::ofstream(dir + "/long.jsonl", std::ios::app) << "{\"instruction\": \"no output\"}\n";
  const std::string out = dir + "/long.tok";
  ASSERT_TRUE(WriteTokenFile(out, "previous", 1, 2, {Example({1, 5, 2}, 1)}).ok());
  const std::string previous = ReadBytes(out);

  ByteTextEncoder encoder;
  PrepareOptions options;
  options.max_seq_length = 4096;
  auto stats = PrepareTokenFile(dir + "/long.jsonl", encoder, options, out);
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.status().message().find("long.jsonl:1001: missing field 'output'"),
            std::string::npos)
      << stats.status().message();
  EXPECT_EQ(ReadBytes(out), previous);
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"long.jsonl", "long.tok"}));
}

TEST(HashTest, Fnv1a64KnownValues) {
  // Reference values of 64-bit FNV-1a.
  EXPECT_EQ(Fnv1a64(std::string_view("")), 0xcbf29ce484222325ULL);
  EXPECT_EQ(Fnv1a64(std::string_view("a")), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(Fnv1a64(std::string_view("foobar")), 0x85944171f73967e8ULL);
  EXPECT_EQ(Fnv1a64(std::string_view("bar"), Fnv1a64(std::string_view("foo"))),
            Fnv1a64(std::string_view("foobar")));
  EXPECT_EQ(HexU64(0xaf63dc4c8601ec8cULL), "af63dc4c8601ec8c");
}

}  // namespace
}  // namespace llmctl::data
