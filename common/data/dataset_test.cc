#include "common/data/dataset.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "common/data/file_util.h"
#include "common/text.h"
#include "tests/support/shell_command.h"

namespace llmctl::data {
namespace {

std::string FixtureDir() { return (testing::SourceDir() / "tests/fixtures/data").string(); }

// Decodes ByteTextEncoder ids back to text (specials as <s> and </s>), to state expectations as
// strings.
std::string Decode(const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) {
    if (id == ByteTextEncoder::kBos) {
      out += "<s>";
    } else if (id == ByteTextEncoder::kEos) {
      out += "</s>";
    } else {
      out += static_cast<char>(id - ByteTextEncoder::kOffset);
    }
  }
  return out;
}

Record Alpaca(std::string instruction, std::string input, std::string output) {
  Record r;
  r.instruction = std::move(instruction);
  r.input = std::move(input);
  r.output = std::move(output);
  return r;
}

Record Text(std::string text) {
  Record r;
  r.text = std::move(text);
  return r;
}

ExampleOptions Options(int64_t max_seq_length, bool mask_prompt) {
  ExampleOptions options;
  options.max_seq_length = max_seq_length;
  options.mask_prompt = mask_prompt;
  return options;
}

TEST(DatasetTest, LoadsAlpacaWithAndWithoutInput) {
  auto records = LoadJsonl(FixtureDir() + "/alpaca_small.jsonl", DatasetFormat::kAlpaca);
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  ASSERT_EQ(records->size(), 5u);
  EXPECT_EQ((*records)[0].instruction, "Add the numbers.");
  EXPECT_EQ((*records)[0].input, "2, 3");
  EXPECT_EQ((*records)[0].output, "5");
  EXPECT_EQ((*records)[0].line, 1);
  EXPECT_EQ((*records)[1].input, "");
  EXPECT_EQ((*records)[2].line, 4);    // the blank line 3 is skipped but counted
  EXPECT_EQ((*records)[2].input, "");  // absent
  EXPECT_EQ((*records)[3].output, "merci");
  EXPECT_EQ((*records)[4].input, "");  // null
  EXPECT_EQ((*records)[4].output, "Reykjav\xC3\xADk");
}

TEST(DatasetTest, LoadsTextFormat) {
  auto records = LoadJsonl(FixtureDir() + "/text_small.jsonl", DatasetFormat::kText);
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  ASSERT_EQ(records->size(), 3u);
  EXPECT_EQ((*records)[1].text, "Jumps over the lazy dog.");
  EXPECT_EQ((*records)[2].text, "");
}

TEST(DatasetTest, LoadsTheDemoDataset) {
  auto records = LoadJsonl((testing::SourceDir() / "experiments/data/alpaca-demo.jsonl").string(),
                           DatasetFormat::kAlpaca);
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  EXPECT_EQ(records->size(), 600u);
  int64_t with_input = 0;
  for (const Record& r : *records) with_input += r.input.empty() ? 0 : 1;
  EXPECT_GT(with_input, 100);
  EXPECT_LT(with_input, 550);
}

TEST(DatasetTest, AcceptsCrlfBomAndNoFinalNewline) {
  auto records = ParseJsonl("\xEF\xBB\xBF{\"text\": \"a\"}\r\n\r\n{\"text\": \"b\"}", "mem.jsonl",
                            DatasetFormat::kText);
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  ASSERT_EQ(records->size(), 2u);
  EXPECT_EQ((*records)[1].text, "b");
  EXPECT_EQ((*records)[1].line, 3);
}

TEST(DatasetTest, MixedLfAndCrlfLinesReadAlike) {
  auto records = ParseJsonl("{\"text\": \"a\"}\n{\"text\": \"b\"}\r\n\r\n{\"text\": \"c\"}\n",
                            "mem.jsonl", DatasetFormat::kText);
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  ASSERT_EQ(records->size(), 3u);
  EXPECT_EQ((*records)[1].text, "b");
  EXPECT_EQ((*records)[2].text, "c");
  EXPECT_EQ((*records)[2].line, 4);
}

TEST(DatasetTest, LinesEndingInACarriageReturnAloneAreRefusedAsSuch) {
  // Classic Mac OS line ends: without the check, "invalid JSON at column 14: syntax error ...".
  auto records = ParseJsonl("{\"text\": \"a\"}\r{\"text\": \"b\"}\r{\"text\": \"c\"}\r",
                            "mac.jsonl", DatasetFormat::kText);
  ASSERT_FALSE(records.ok());
  EXPECT_EQ(records.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(records.status().message(),
            "mac.jsonl:1: a carriage return without a line feed at column 14 and the line is not "
            "one JSON object: JSON Lines records end in LF or CRLF, not in CR alone (classic Mac "
            "OS line ends); convert the file's line ends to LF");

  // Among LF lines, the line that holds them is named.
  records = ParseJsonl("{\"text\": \"a\"}\n{\"text\": \"b\"}\r{\"text\": \"c\"}\n", "mixed.jsonl",
                       DatasetFormat::kText);
  ASSERT_FALSE(records.ok());
  EXPECT_TRUE(records.status().message().starts_with(
      "mixed.jsonl:2: a carriage return without a line feed at column 14"))
      << records.status().message();

  // A CR that ends the file, or sits between a record's tokens, is JSON whitespace: read.
  records = ParseJsonl("{\"text\": \"a\"}\r", "one.jsonl", DatasetFormat::kText);
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  EXPECT_EQ(records->size(), 1u);
  records = ParseJsonl("{\"text\":\r\"a\"}\n", "inside.jsonl", DatasetFormat::kText);
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  EXPECT_EQ((*records)[0].text, "a");
}

// A file read in pieces reads as the same bytes given whole: lines, CRLF and the byte-order mark
// across the pieces' seams, line numbers, and the hash of exactly what was read.
TEST(DatasetTest, AFileReadInPiecesReadsAsItsBytesGivenWhole) {
  std::string content = "\xEF\xBB\xBF";
  for (int i = 0; content.size() < 3 * kFilePieceBytes; ++i) {
    content += "{\"text\": \"" +
               std::string(static_cast<size_t>(i * 37 % 5000), static_cast<char>('a' + i % 26)) +
               "\"}" + (i % 3 == 0 ? "\r\n" : "\n") + (i % 7 == 0 ? "\n" : "");
  }
  // A CRLF split by the first seam, its CR the first piece's last byte.
  const size_t newline = content.rfind('\n', kFilePieceBytes - 2);
  content.replace(newline, 1, std::string(kFilePieceBytes - 1 - newline, ' ') + "\r\n");
  ASSERT_EQ(content[kFilePieceBytes - 1], '\r');
  const std::string path = ::testing::TempDir() + "/pieces.jsonl";
  std::ofstream(path, std::ios::binary) << content;

  auto whole = ParseJsonl(content, path, DatasetFormat::kText);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  std::vector<Record> read;
  uint64_t hash = 0;
  const Status status = ForEachJsonlRecord(
      path, DatasetFormat::kText,
      [&](Record record) {
        read.push_back(std::move(record));
        return Status::Ok();
      },
      &hash);
  ASSERT_TRUE(status.ok()) << status.ToString();
  ASSERT_EQ(read.size(), whole->size());
  for (size_t i = 0; i < read.size(); ++i) {
    EXPECT_EQ(read[i].text, (*whole)[i].text) << i;
    EXPECT_EQ(read[i].line, (*whole)[i].line) << i;
  }
  EXPECT_EQ(hash, Fnv1a64(content));
  EXPECT_EQ(*Fnv1a64File(path), Fnv1a64(content));

  // What the callback refuses ends the reading.
  int seen = 0;
  EXPECT_EQ(ForEachJsonlRecord(path, DatasetFormat::kText,
                               [&](Record) {
                                 ++seen;
                                 return InvalidArgumentError("stop");
                               })
                .message(),
            "stop");
  EXPECT_EQ(seen, 1);
}

// A line is held until its LF arrives, so one that never ends (a file that is not JSON Lines, or
// whose lines end in CR alone) is refused at kMaxJsonlLineBytes, naming it, not read whole.
TEST(DatasetTest, ALineLongerThanTheLimitIsRefusedNamingIt) {
  const std::string path = ::testing::TempDir() + "/one-long-line.jsonl";
  {
    std::ofstream out(path, std::ios::binary);
    out << "{\"text\": \"a\"}\n{\"text\": \"";
    const std::string chunk(1 << 20, 'b');
    for (size_t written = 0; written <= kMaxJsonlLineBytes; written += chunk.size()) out << chunk;
    out << "\"}\n";
  }
  int64_t records = 0;
  const Status status = ForEachJsonlRecord(path, DatasetFormat::kText, [&](Record) {
    ++records;
    return Status::Ok();
  });
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), path +
                                  ":2: the line is longer than 64 MiB, the most one record may "
                                  "take (JSON Lines holds one record a line, each ending in LF)");
  EXPECT_EQ(records, 1);
  std::remove(path.c_str());

  // A line of exactly the limit is read.
  const std::string line = "{\"text\": \"" + std::string(kMaxJsonlLineBytes - 12, 'c') + "\"}";
  ASSERT_EQ(line.size(), kMaxJsonlLineBytes);
  auto parsed = ParseJsonl(line + "\n", "limit.jsonl", DatasetFormat::kText);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->size(), 1u);
  EXPECT_EQ(ParseJsonl(line + "c\n", "limit.jsonl", DatasetFormat::kText).status().code(),
            StatusCode::kInvalidArgument);
}

struct BrokenCase {
  const char* file;
  DatasetFormat format;
  const char* expected;
};

void PrintTo(const BrokenCase& c, std::ostream* os) { *os << c.file; }

class BrokenJsonlTest : public ::testing::TestWithParam<BrokenCase> {};

TEST_P(BrokenJsonlTest, ErrorNamesFileAndLine) {
  const std::string path = FixtureDir() + "/broken/" + GetParam().file;
  auto records = LoadJsonl(path, GetParam().format);
  ASSERT_FALSE(records.ok());
  EXPECT_EQ(records.status().code(), StatusCode::kInvalidArgument);
  const std::string expected = path + GetParam().expected;
  EXPECT_EQ(records.status().message().substr(0, expected.size()), expected)
      << records.status().message();
  EXPECT_EQ(records.status().message().find('\n'), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Broken, BrokenJsonlTest,
    ::testing::Values(
        BrokenCase{"missing_output.jsonl", DatasetFormat::kAlpaca, ":2: missing field 'output'"},
        BrokenCase{"bad_json.jsonl", DatasetFormat::kAlpaca, ":2: invalid JSON at column"},
        BrokenCase{"bad_utf8.jsonl", DatasetFormat::kAlpaca, ":3: invalid UTF-8 at column 21"},
        BrokenCase{"not_object.jsonl", DatasetFormat::kAlpaca,
                   ":1: expected a JSON object, got array"},
        BrokenCase{"wrong_type.jsonl", DatasetFormat::kAlpaca,
                   ":1: field 'output' must be a string, got number"},
        BrokenCase{"input_not_string.jsonl", DatasetFormat::kAlpaca,
                   ":1: field 'input' must be a string, got array"},
        BrokenCase{"empty.jsonl", DatasetFormat::kAlpaca, ": no examples"},
        BrokenCase{"blank_only.jsonl", DatasetFormat::kText, ": no examples"},
        BrokenCase{"missing_text.jsonl", DatasetFormat::kText, ":2: missing field 'text'"},
        // An Alpaca file read as text lacks "text" on its first line.
        BrokenCase{"../alpaca_small.jsonl", DatasetFormat::kText, ":1: missing field 'text'"}),
    [](const ::testing::TestParamInfo<BrokenCase>& info) {
      std::string name = info.param.file;
      name = name.substr(name.rfind('/') + 1);
      return name.substr(0, name.find('.'));
    });

// nlohmann's message quotes what it last read byte by byte ("last read: '{\xE2'" for a line
// starting "{€"), and ParseJsonl cuts the message at 200 bytes, maybe inside a character: the
// message, printed and sent on, is UTF-8 all the same (found by tests/fuzz/dataset_fuzz.cc).
TEST(DatasetTest, AJsonErrorMessageIsUtf8WhereTheParserStoppedInsideACharacter) {
  std::vector<std::string> lines = {"{\xE2\x82\xAC\"instruction\": \"a\", \"output\": \"b\"}"};
  // A tab, which JSON wants escaped, after a long string of two-byte characters: the message quotes
  // the string, cut at 200 bytes, inside a character for one of the two offsets.
  for (const char* lead : {"", "x"}) {
    std::string umlauts;
    for (int i = 0; i < 150; ++i) umlauts += "\xC3\xBC";
    lines.push_back("{\"instruction\": \"" + std::string(lead) + umlauts +
                    "\t\", \"output\": \"b\"}");
  }
  for (const std::string& line : lines) {
    auto records = ParseJsonl(line + "\n", "mem.jsonl", DatasetFormat::kAlpaca);
    ASSERT_FALSE(records.ok()) << line;
    const std::string& message = records.status().message();
    EXPECT_TRUE(message.starts_with("mem.jsonl:1: invalid JSON at column ")) << message;
    EXPECT_EQ(FirstInvalidUtf8(message), std::string::npos) << message;
  }
}

// The parser's message quotes the line's own bytes: a bidirectional override, a DEL and a C1 CSI in
// the string before a raw tab reached the message as themselves, where the terminal that prints it
// acts on them. The quote now goes through OnOneLine, each of them a space, cut within 200 bytes.
TEST(DatasetTest, AJsonErrorQuotesTheLineWithoutItsControls) {
  const std::string line =
      "{\"instruction\": \"a\xE2\x80\xAE"
      "b\x7F"
      "c\xC2\x9B"
      "d\t\"}";
  auto records = ParseJsonl(line + "\n", "mem.jsonl", DatasetFormat::kAlpaca);
  ASSERT_FALSE(records.ok());
  const std::string& message = records.status().message();
  EXPECT_TRUE(message.starts_with("mem.jsonl:1: invalid JSON at column ")) << message;
  EXPECT_NE(message.find("a b c d"), std::string::npos) << message;
  EXPECT_EQ(OnOneLine(message), message);

  std::string umlauts;
  for (int i = 0; i < 150; ++i) umlauts += "\xC3\xBC";
  records = ParseJsonl(std::string("{\"instruction\": \"").append(umlauts).append("\t\"}\n"),
                       "mem.jsonl", DatasetFormat::kAlpaca);
  ASSERT_FALSE(records.ok());
  const std::string quoted =
      records.status().message().substr(std::string("mem.jsonl:1: invalid JSON at ").size());
  EXPECT_LE(quoted.size(), 200u);
  // "ü…": cut at a character's start, where a cut byte of "ü" read U+FFFD before.
  EXPECT_TRUE(quoted.ends_with("\xC3\xBC\xE2\x80\xA6")) << quoted;
}

TEST(DatasetTest, MissingFileIsNotFound) {
  auto records = LoadJsonl(FixtureDir() + "/nope.jsonl", DatasetFormat::kAlpaca);
  ASSERT_FALSE(records.ok());
  EXPECT_EQ(records.status().code(), StatusCode::kNotFound);
}

TEST(DatasetTest, ParsesNames) {
  EXPECT_EQ(*ParseDatasetFormat("alpaca"), DatasetFormat::kAlpaca);
  EXPECT_EQ(*ParseDatasetFormat("text"), DatasetFormat::kText);
  EXPECT_FALSE(ParseDatasetFormat("sharegpt").ok());
  EXPECT_EQ(*ParsePromptTemplate("alpaca"), PromptTemplate::kAlpaca);
  EXPECT_EQ(*ParsePromptTemplate("none"), PromptTemplate::kNone);
  EXPECT_NE(ParsePromptTemplate("chatml").status().message().find("unknown prompt template"),
            std::string::npos);
}

TEST(PromptTest, AlpacaTemplatesMatchStanfordAlpaca) {
  const Record with_input = Alpaca("Sum.", "1, 2", "3");
  auto a = RenderExample(with_input, DatasetFormat::kAlpaca, PromptTemplate::kAlpaca);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->prompt,
            "Below is an instruction that describes a task, paired with an input that provides "
            "further context. Write a response that appropriately completes the request.\n\n"
            "### Instruction:\nSum.\n\n### Input:\n1, 2\n\n### Response:\n");
  EXPECT_EQ(a->response, "3");

  const Record no_input = Alpaca("Use {input} literally.", "", "ok");
  auto b = RenderExample(no_input, DatasetFormat::kAlpaca, PromptTemplate::kAlpaca);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(
      b->prompt,
      "Below is an instruction that describes a task. Write a response that appropriately "
      "completes the request.\n\n### Instruction:\nUse {input} literally.\n\n### Response:\n");
}

TEST(PromptTest, NoneTemplateAndTextFormat) {
  Record r = Alpaca("Sum.", "1, 2", "3");
  EXPECT_EQ(RenderExample(r, DatasetFormat::kAlpaca, PromptTemplate::kNone)->prompt,
            "Sum.\n\n1, 2\n");
  r.input = "";
  EXPECT_EQ(RenderExample(r, DatasetFormat::kAlpaca, PromptTemplate::kNone)->prompt, "Sum.\n");

  const Record text = Text("hello");
  auto t = RenderExample(text, DatasetFormat::kText, PromptTemplate::kNone);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->prompt, "");
  EXPECT_EQ(t->response, "hello");
  auto bad = RenderExample(text, DatasetFormat::kText, PromptTemplate::kAlpaca);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("needs dataset format 'alpaca'"), std::string::npos);
}

TEST(TokenizeTest, BosPromptResponseEosWithPromptMasked) {
  ByteTextEncoder encoder;
  auto ex = TokenizeExample(encoder, {"Q:", "ab"}, Options(64, true));
  ASSERT_TRUE(ex.ok()) << ex.status().ToString();
  EXPECT_EQ(Decode(ex->input_ids), "<s>Q:ab</s>");
  const int32_t a = 'a' + ByteTextEncoder::kOffset, b = 'b' + ByteTextEncoder::kOffset;
  EXPECT_EQ(ex->labels, (std::vector<int32_t>{-100, -100, -100, a, b, ByteTextEncoder::kEos}));
  EXPECT_FALSE(ex->truncated);
}

TEST(TokenizeTest, UnmaskedLabelsEqualInputIds) {
  ByteTextEncoder encoder;
  auto ex = TokenizeExample(encoder, {"Q:", "ab"}, Options(64, false));
  ASSERT_TRUE(ex.ok());
  EXPECT_EQ(ex->labels, ex->input_ids);
}

TEST(TokenizeTest, TruncatesToMaxSeqLength) {
  ByteTextEncoder encoder;
  auto ex = TokenizeExample(encoder, {"Q:", "abcdef"}, Options(5, true));
  ASSERT_TRUE(ex.ok());
  EXPECT_EQ(Decode(ex->input_ids), "<s>Q:ab");
  EXPECT_EQ(ex->labels.size(), 5u);
  EXPECT_EQ(ex->labels[2], -100);
  EXPECT_NE(ex->labels[3], -100);
  EXPECT_TRUE(ex->truncated);

  // A prompt longer than max_seq_length leaves nothing to learn; that is reported, not an error.
  auto all_prompt = TokenizeExample(encoder, {"long prompt", "x"}, Options(4, true));
  ASSERT_TRUE(all_prompt.ok());
  EXPECT_EQ(all_prompt->labels, (std::vector<int32_t>(4, -100)));

  EXPECT_FALSE(TokenizeExample(encoder, {"", "x"}, Options(1, true)).ok());
}

// An encoder like Qwen2's: no BOS. Also merges "\nA" into one token, as a BPE tokenizer would at
// the prompt/response seam.
class NoBosMergingEncoder : public TextEncoder {
 public:
  StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool) const override {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text.substr(i, 2) == "\nA") {
        ids.push_back(1000);
        ++i;
      } else {
        ids.push_back(static_cast<unsigned char>(text[i]));
      }
    }
    return ids;
  }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return 999; }
  std::string fingerprint() const override { return "merging"; }
};

TEST(TokenizeTest, EncodesPromptAndResponseTogether) {
  NoBosMergingEncoder encoder;
  auto ex = TokenizeExample(encoder, {"P\n", "AB"}, Options(64, true));
  ASSERT_TRUE(ex.ok());
  // "P\nAB" encodes as P, "\nA", B: the seam token is what the model sees at inference, and the
  // mask covers the prompt's own token count (2), so "\nA" counts as prompt; B and EOS are targets.
  EXPECT_EQ(ex->input_ids, (std::vector<int32_t>{'P', 1000, 'B', 999}));
  EXPECT_EQ(ex->labels, (std::vector<int32_t>{-100, -100, 'B', 999}));
}

// Shaped like llmctl::Tokenizer: ids as std::optional.
struct OptionalIdTokenizer {
  StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool) const {
    return std::vector<int32_t>(text.size(), 7);
  }
  std::optional<int32_t> bos_id() const { return std::nullopt; }
  std::optional<int32_t> eos_id() const { return 5; }
};

// Shaped like the brief's tokenizer: plain ids.
struct PlainIdTokenizer {
  StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool) const {
    return std::vector<int32_t>(text.size(), 8);
  }
  int32_t bos_id() const { return 1; }
  int32_t eos_id() const { return 2; }
};

TEST(TokenizerTextEncoderTest, AdaptsOptionalAndPlainIds) {
  const OptionalIdTokenizer optional_ids;
  const TokenizerTextEncoder<OptionalIdTokenizer> a(optional_ids, "fp-a");
  EXPECT_EQ(a.bos_id(), -1);
  EXPECT_EQ(a.eos_id(), 5);
  EXPECT_EQ(a.fingerprint(), "fp-a");
  auto ex = TokenizeExample(a, {"p", "rr"}, Options(16, true));
  ASSERT_TRUE(ex.ok());
  EXPECT_EQ(ex->input_ids, (std::vector<int32_t>{7, 7, 7, 5}));
  EXPECT_EQ(ex->labels, (std::vector<int32_t>{-100, 7, 7, 5}));

  const PlainIdTokenizer plain_ids;
  const TokenizerTextEncoder<PlainIdTokenizer> b(plain_ids, "fp-b");
  EXPECT_EQ(b.bos_id(), 1);
  EXPECT_EQ(b.eos_id(), 2);
  EXPECT_EQ(b.Encode("xy", false)->size(), 2u);
}

}  // namespace
}  // namespace llmctl::data
