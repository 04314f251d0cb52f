#include "common/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/shell_command.h"

namespace llmctl {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

using llmctl::testing::SourceDir;

fs::path FixtureDir() { return SourceDir() / "tests" / "fixtures" / "tokenizers"; }

// The tokenizers scripts/fixtures/make_tokenizers.py trained, by the names cases.jsonl uses.
fs::path TokenizerPath(const std::string& name) {
  if (name == "demo") return SourceDir() / "experiments" / "tokenizers" / "demo" / "tokenizer.json";
  return FixtureDir() / name / "tokenizer.json";
}

const Tokenizer& Fixture(const std::string& name) {
  static auto* const loaded = new std::map<std::string, Tokenizer>();
  auto it = loaded->find(name);
  if (it == loaded->end()) {
    StatusOr<Tokenizer> tokenizer = Tokenizer::Load(TokenizerPath(name).string());
    if (!tokenizer.ok()) {
      std::fprintf(stderr, "cannot load fixture: %s\n", tokenizer.status().ToString().c_str());
      std::abort();
    }
    it = loaded->emplace(name, std::move(*tokenizer)).first;
  }
  return it->second;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

struct Case {
  std::string tokenizer;
  std::string text;
  std::vector<int32_t> ids;
  std::vector<int32_t> ids_no_special;
  std::string decoded;
  std::string decoded_skip_special;
};

// cases.jsonl (make_tokenizers.py's BPE tokenizers) and unigram_cases.jsonl
// (make_unigram_tokenizers.py's).
const std::vector<Case>& Cases() {
  static const auto* const cases = [] {
    auto* out = new std::vector<Case>();
    for (const char* file : {"cases.jsonl", "unigram_cases.jsonl"}) {
      std::ifstream in(FixtureDir() / file);
      std::string line;
      while (std::getline(in, line)) {
        const Json j = Json::parse(line);
        out->push_back({j["tokenizer"], j["text"], j["ids"].get<std::vector<int32_t>>(),
                        j["ids_no_special"].get<std::vector<int32_t>>(), j["decoded"],
                        j["decoded_skip_special"]});
      }
    }
    return out;
  }();
  return *cases;
}

std::vector<int32_t> EncodeOrDie(const Tokenizer& tokenizer, std::string_view text,
                                 bool add_special_tokens) {
  StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(text, add_special_tokens);
  EXPECT_TRUE(ids.ok()) << ids.status().ToString();
  return ids.ok() ? *ids : std::vector<int32_t>();
}

// ------------------------------------------------------------------------------------------------------------
// Id-for-id agreement with the `tokenizers` library.

class TokenizerReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerReferenceTest, EncodeAndDecodeMatchTheLibrary) {
  const Tokenizer& tokenizer = Fixture(GetParam());
  int checked = 0;
  for (const Case& c : Cases()) {
    if (c.tokenizer != GetParam()) continue;
    ++checked;
    SCOPED_TRACE(::testing::Message() << "text: " << ::testing::PrintToString(c.text));
    EXPECT_EQ(EncodeOrDie(tokenizer, c.text, /*add_special_tokens=*/true), c.ids);
    EXPECT_EQ(EncodeOrDie(tokenizer, c.text, /*add_special_tokens=*/false), c.ids_no_special);
    EXPECT_EQ(tokenizer.Decode(c.ids, /*skip_special_tokens=*/false), c.decoded);
    EXPECT_EQ(tokenizer.Decode(c.ids, /*skip_special_tokens=*/true), c.decoded_skip_special);
  }
  EXPECT_GT(checked, 100) << "cases.jsonl has too few cases for " << GetParam();
}

// t5_unigram is Flan-T5's (BLIP-2's) layout: Precompiled nmt_nfkc, WhitespaceSplit + Metaspace,
// Unigram; unigram_score_parsing holds a Viterbi tie that only the library's way of reading JSON
// numbers breaks as the library does.
INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerReferenceTest,
                         ::testing::Values("sp_bpe", "sp_bpe_metaspace", "byte_bpe",
                                           "byte_bpe_qwen2", "demo", "t5_unigram",
                                           "unigram_byte_fallback", "unigram_score_parsing"));

// ------------------------------------------------------------------------------------------------------------
// Round trips: text without added-token look-alikes decodes back to itself.

class TokenizerRoundTripTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerRoundTripTest, DecodeOfEncodeIsTheText) {
  const Tokenizer& tokenizer = Fixture(GetParam());
  int checked = 0;
  for (const Case& c : Cases()) {
    if (c.tokenizer != GetParam() || c.text.find('<') != std::string::npos ||
        c.text.find("[MASK]") != std::string::npos) {
      continue;
    }
    ++checked;
    const std::vector<int32_t> ids = EncodeOrDie(tokenizer, c.text, /*add_special_tokens=*/true);
    EXPECT_EQ(tokenizer.Decode(ids, /*skip_special_tokens=*/true), c.text)
        << "text: " << ::testing::PrintToString(c.text);
  }
  EXPECT_GT(checked, 100);
}

// Not the Metaspace variant (a leading space is dropped, as in the library) nor Qwen2's (NFC
// changes text).
INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerRoundTripTest,
                         ::testing::Values("sp_bpe", "byte_bpe", "demo"));

// ------------------------------------------------------------------------------------------------------------
// Special tokens and vocabulary.

TEST(TokenizerTest, LlamaTwoStyleSpecialTokens) {
  const Tokenizer& tokenizer = Fixture("sp_bpe");
  EXPECT_EQ(tokenizer.vocab_size(), 2048);
  EXPECT_EQ(tokenizer.bos_id(), 1);
  EXPECT_EQ(tokenizer.eos_id(), 2);
  EXPECT_EQ(tokenizer.pad_id(), std::nullopt);
  EXPECT_TRUE(tokenizer.adds_bos());
  EXPECT_FALSE(tokenizer.adds_eos());
  EXPECT_EQ(tokenizer.TokenToId("<unk>"), 0);
  EXPECT_EQ(tokenizer.TokenToId("<0x0A>"), 13);
  EXPECT_EQ(tokenizer.IdToToken(2), "</s>");
  EXPECT_EQ(tokenizer.IdToToken(99999), std::nullopt);
  EXPECT_EQ(tokenizer.TokenToId("no such token"), std::nullopt);
  // Newlines are not in this vocabulary: they come out as the byte token <0x0A>.
  const std::vector<int32_t> ids = EncodeOrDie(tokenizer, "\n", /*add_special_tokens=*/false);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.back(), 13);
}

TEST(TokenizerTest, MetaspaceVariantAddsEos) {
  const Tokenizer& tokenizer = Fixture("sp_bpe_metaspace");
  EXPECT_TRUE(tokenizer.adds_bos());
  EXPECT_TRUE(tokenizer.adds_eos());
  EXPECT_EQ(tokenizer.eos_id(), 2);
  EXPECT_EQ(tokenizer.vocab_size(), 2051);
  const std::vector<int32_t> ids = EncodeOrDie(tokenizer, "hi", /*add_special_tokens=*/true);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
}

TEST(TokenizerTest, LlamaThreeStyleSpecialTokens) {
  const Tokenizer& tokenizer = Fixture("byte_bpe");
  EXPECT_EQ(tokenizer.vocab_size(), 2048);
  EXPECT_EQ(tokenizer.bos_id(), tokenizer.TokenToId("<|begin_of_text|>"));
  EXPECT_EQ(tokenizer.eos_id(), tokenizer.TokenToId("<|end_of_text|>"));
  EXPECT_EQ(tokenizer.bos_id(),
            2042);  // special tokens follow the model's vocabulary, as in Llama 3
  EXPECT_TRUE(tokenizer.adds_bos());
  EXPECT_FALSE(tokenizer.adds_eos());
  EXPECT_EQ(EncodeOrDie(tokenizer, "<|eot_id|>", /*add_special_tokens=*/false),
            std::vector<int32_t>{*tokenizer.TokenToId("<|eot_id|>")});
  EXPECT_EQ(EncodeOrDie(tokenizer, "", /*add_special_tokens=*/true),
            std::vector<int32_t>{*tokenizer.bos_id()});
}

TEST(TokenizerTest, QwenTwoStyleHasNoBos) {
  const Tokenizer& tokenizer = Fixture("byte_bpe_qwen2");
  EXPECT_EQ(tokenizer.bos_id(), std::nullopt);
  EXPECT_EQ(tokenizer.eos_id(), tokenizer.TokenToId("<|endoftext|>"));
  EXPECT_FALSE(tokenizer.adds_bos());
  EXPECT_EQ(EncodeOrDie(tokenizer, "", /*add_special_tokens=*/true), std::vector<int32_t>{});
}

TEST(TokenizerTest, DemoTokenizerFitsTheDemoModel) {
  const Tokenizer& tokenizer = Fixture("demo");
  EXPECT_EQ(tokenizer.vocab_size(), 2048);
  EXPECT_EQ(tokenizer.bos_id(), 1);
  EXPECT_EQ(tokenizer.eos_id(), 2);
}

TEST(TokenizerTest, FlanT5StyleSpecialTokens) {
  // Loaded from the directory, so tokenizer_config.json names EOS and PAD, as for BLIP-2's T5.
  const StatusOr<Tokenizer> loaded = Tokenizer::Load((FixtureDir() / "t5_unigram").string());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const Tokenizer& tokenizer = *loaded;
  // 800 pieces, <extra_id_99> .. <extra_id_0> after them (as T5's 32000..32099), then <image>.
  EXPECT_EQ(tokenizer.vocab_size(), 901);
  EXPECT_EQ(tokenizer.pad_id(), 0);
  EXPECT_EQ(tokenizer.eos_id(), 1);
  EXPECT_EQ(tokenizer.bos_id(), std::nullopt);
  EXPECT_EQ(tokenizer.TokenToId("<unk>"), 2);
  EXPECT_EQ(tokenizer.TokenToId("<extra_id_99>"), 800);
  EXPECT_EQ(tokenizer.TokenToId("<extra_id_0>"), 899);
  EXPECT_EQ(tokenizer.TokenToId("<image>"), 900);
  EXPECT_EQ(tokenizer.IdToToken(900), "<image>");
  EXPECT_FALSE(tokenizer.adds_bos());
  EXPECT_TRUE(tokenizer.adds_eos());
  EXPECT_EQ(EncodeOrDie(tokenizer, "", /*add_special_tokens=*/true), std::vector<int32_t>{1});
  // BLIP-2 puts its query tokens' placeholders before the prompt.
  const std::vector<int32_t> ids =
      EncodeOrDie(tokenizer, "<image><image>a photo", /*add_special_tokens=*/true);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids[0], 900);
  EXPECT_EQ(ids[1], 900);
  EXPECT_EQ(ids.back(), 1);
  EXPECT_EQ(tokenizer.Decode(ids, /*skip_special_tokens=*/true), "a photo");
}

TEST(TokenizerTest, UnigramUnknownCharactersFuseIntoOneUnk) {
  const Tokenizer& tokenizer = Fixture("t5_unigram");
  // Characters the model has never seen, in a run, become one <unk>; byte fallback spells them.
  EXPECT_EQ(EncodeOrDie(tokenizer, "\xE9\xBE\x98\xE9\x9D\x90\xE9\xBD\x89", false),
            (std::vector<int32_t>{*tokenizer.TokenToId("\xE2\x96\x81"), 2}));
  const Tokenizer& with_bytes = Fixture("unigram_byte_fallback");
  const std::vector<int32_t> spelled = EncodeOrDie(with_bytes, "\xE9\xBE\x98", false);
  EXPECT_EQ(spelled.back(), *with_bytes.TokenToId("<0x98>"));
  EXPECT_EQ(with_bytes.Decode(spelled, false), "\xE9\xBE\x98");
}

TEST(TokenizerTest, DecodeSkipsUnknownIds) {
  const Tokenizer& tokenizer = Fixture("byte_bpe");
  std::vector<int32_t> ids = EncodeOrDie(tokenizer, "Hello world", /*add_special_tokens=*/false);
  std::vector<int32_t> with_junk = {-5, 1 << 30};
  with_junk.insert(with_junk.end(), ids.begin(), ids.end());
  with_junk.push_back(999999);
  EXPECT_EQ(tokenizer.Decode(with_junk, /*skip_special_tokens=*/false), "Hello world");
}

TEST(TokenizerTest, EncodeRejectsInvalidUtf8) {
  for (const char* name : {"sp_bpe", "byte_bpe"}) {
    const StatusOr<std::vector<int32_t>> ids = Fixture(name).Encode("ok \xC3( bad", true);
    ASSERT_FALSE(ids.ok());
    EXPECT_EQ(ids.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(ids.status().message().find("UTF-8"), std::string::npos);
  }
}

TEST(TokenizerTest, LongInputsAndRepeatedWordsAgreeWithTheCache) {
  // The same words again and again (served from the word cache) and one very long word (not cached)
  // must give the same ids as fresh encodes.
  const Tokenizer& tokenizer = Fixture("byte_bpe");
  const std::vector<int32_t> once = EncodeOrDie(tokenizer, " quick brown fox", false);
  std::string repeated;
  std::vector<int32_t> expected;
  for (int i = 0; i < 200; ++i) {
    repeated += " quick brown fox";
    expected.insert(expected.end(), once.begin(), once.end());
  }
  EXPECT_EQ(EncodeOrDie(tokenizer, repeated, false), expected);
  const std::string long_word(5000, 'z');
  const std::vector<int32_t> a = EncodeOrDie(tokenizer, long_word, false);
  EXPECT_EQ(EncodeOrDie(tokenizer, long_word, false), a);
  EXPECT_EQ(tokenizer.Decode(a, false), long_word);
}

TEST(TokenizerTest, ConcurrentEncodesAgree) {
  const Tokenizer& tokenizer = Fixture("sp_bpe");
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> expected;
  for (const Case& c : Cases()) {
    if (c.tokenizer == "sp_bpe") {
      texts.push_back(c.text);
      expected.push_back(c.ids);
    }
  }
  std::atomic<int> mismatches = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < texts.size() * 2; i += 3) {
        const size_t k = i % texts.size();
        StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(texts[k], true);
        if (!ids.ok() || *ids != expected[k]) ++mismatches;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches, 0);
}

// ------------------------------------------------------------------------------------------------------------
// Loading.

TEST(TokenizerLoadTest, AcceptsADirectoryOrTheFile) {
  const StatusOr<Tokenizer> from_dir = Tokenizer::Load((FixtureDir() / "sp_bpe").string());
  ASSERT_TRUE(from_dir.ok()) << from_dir.status().ToString();
  const StatusOr<Tokenizer> from_file = Tokenizer::Load(TokenizerPath("sp_bpe").string());
  ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
  EXPECT_EQ(EncodeOrDie(*from_dir, "Hello there", true),
            EncodeOrDie(*from_file, "Hello there", true));
  EXPECT_NE(from_file->source().find("tokenizer.json"), std::string::npos);
}

TEST(TokenizerLoadTest, MissingFileIsNotFound) {
  const StatusOr<Tokenizer> tokenizer = Tokenizer::Load((FixtureDir() / "no_such_dir").string());
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), StatusCode::kNotFound);
  EXPECT_NE(tokenizer.status().message().find("no_such_dir"), std::string::npos);
}

TEST(TokenizerLoadTest, SentencePieceModelAloneIsUnimplemented) {
  const fs::path dir = llmctl::testing::BuildDir() / "tokenizer_model_only_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.model") << "not read";
  const StatusOr<Tokenizer> tokenizer = Tokenizer::Load(dir.string());
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(tokenizer.status().message().find("tokenizer.model"), std::string::npos);
  fs::remove_all(dir);
}

TEST(TokenizerLoadTest, TokenizerConfigOverridesSpecialTokens) {
  const fs::path dir = llmctl::testing::BuildDir() / "tokenizer_config_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(TokenizerPath("byte_bpe"), dir / "tokenizer.json");
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"bos_token": null, "eos_token": {"content": "<|eot_id|>"}, "pad_token": "<|end_of_text|>",
            "chat_template": "ignored"})";
  const StatusOr<Tokenizer> tokenizer = Tokenizer::Load(dir.string());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  EXPECT_EQ(tokenizer->bos_id(), std::nullopt);
  EXPECT_EQ(tokenizer->eos_id(), tokenizer->TokenToId("<|eot_id|>"));
  EXPECT_EQ(tokenizer->pad_id(), tokenizer->TokenToId("<|end_of_text|>"));

  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<|not a token|>"})";
  const StatusOr<Tokenizer> bad = Tokenizer::Load(dir.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tokenizer_config.json: eos_token"), std::string::npos)
      << bad.status().message();
  fs::remove_all(dir);
}

struct BrokenCase {
  const char* file;
  StatusCode code;
  const char* field;  // must appear in the message, after the file name
};

// gtest prints parameters in test names and failures; the file name says it all.
void PrintTo(const BrokenCase& c, std::ostream* os) { *os << c.file; }

class TokenizerBrokenFileTest : public ::testing::TestWithParam<BrokenCase> {};

TEST_P(TokenizerBrokenFileTest, FailsWithAnErrorNamingFileAndField) {
  const BrokenCase& c = GetParam();
  const fs::path path = FixtureDir() / "broken" / c.file;
  ASSERT_TRUE(fs::exists(path)) << path;
  const StatusOr<Tokenizer> tokenizer = Tokenizer::Load(path.string());
  ASSERT_FALSE(tokenizer.ok());
  const std::string& message = tokenizer.status().message();
  EXPECT_EQ(tokenizer.status().code(), c.code) << message;
  EXPECT_NE(message.find(c.file), std::string::npos) << message;
  EXPECT_NE(message.find(c.field), std::string::npos) << message;
  // Same result through FromJson.
  const StatusOr<Tokenizer> from_json = Tokenizer::FromJson(ReadFile(path), c.file);
  ASSERT_FALSE(from_json.ok());
  EXPECT_EQ(from_json.status().code(), c.code);
}

INSTANTIATE_TEST_SUITE_P(
    Broken, TokenizerBrokenFileTest,
    ::testing::Values(
        BrokenCase{"truncated.json", StatusCode::kInvalidArgument, "not valid JSON"},
        BrokenCase{"empty.json", StatusCode::kInvalidArgument, "not valid JSON"},
        // nlohmann throws out_of_range, not parse_error, for a number past a double's range.
        BrokenCase{"number_out_of_range.json", StatusCode::kInvalidArgument, "not valid JSON"},
        BrokenCase{"not_an_object.json", StatusCode::kInvalidArgument, "JSON object"},
        BrokenCase{"missing_model.json", StatusCode::kInvalidArgument, "model: missing"},
        BrokenCase{"unknown_model_type.json", StatusCode::kInvalidArgument, "model.type"},
        BrokenCase{"unigram_unk_id_out_of_range.json", StatusCode::kInvalidArgument,
                   "model.unk_id: unk_id 5 is not in the vocabulary of 2 pieces"},
        BrokenCase{"unigram_bad_vocab_entry.json", StatusCode::kInvalidArgument,
                   "model.vocab[1]: expected [piece, score]"},
        BrokenCase{"precompiled_bad_base64.json", StatusCode::kInvalidArgument,
                   "normalizer.precompiled_charsmap: not valid base64"},
        BrokenCase{"precompiled_truncated_trie.json", StatusCode::kInvalidArgument,
                   "normalizer.normalizers[0].precompiled_charsmap: truncated"},
        BrokenCase{"precompiled_pool_missing.json", StatusCode::kInvalidArgument,
                   "normalizer.precompiled_charsmap: a trie entry points outside"},
        BrokenCase{"wordpiece_model.json", StatusCode::kUnimplemented, "\"WordPiece\""},
        BrokenCase{"bad_merges_unknown_token.json", StatusCode::kInvalidArgument,
                   "merges[1]: token \"c\""},
        BrokenCase{"bad_merges_format.json", StatusCode::kInvalidArgument, "model.merges[0]"},
        BrokenCase{"bad_merges_missing_result.json", StatusCode::kInvalidArgument,
                   "merged token \"ab\""},
        BrokenCase{"bad_merges_shape.json", StatusCode::kInvalidArgument, "model.merges[0]"},
        BrokenCase{"missing_merges.json", StatusCode::kInvalidArgument, "model.merges: missing"},
        BrokenCase{"bad_vocab_id.json", StatusCode::kInvalidArgument, "model.vocab.a"},
        BrokenCase{"bad_regex.json", StatusCode::kInvalidArgument,
                   "pre_tokenizer.pretokenizers[0].pattern"},
        BrokenCase{"unsupported_normalizer.json", StatusCode::kUnimplemented, "\"Lowercase\""},
        BrokenCase{"unsupported_pre_tokenizer.json", StatusCode::kUnimplemented, "\"Whitespace\""},
        BrokenCase{"template_missing_special.json", StatusCode::kInvalidArgument,
                   "special_tokens: missing special token \"<s>\""},
        BrokenCase{"dropout.json", StatusCode::kUnimplemented, "model.dropout"},
        BrokenCase{"unknown_version.json", StatusCode::kInvalidArgument, "version"},
        BrokenCase{"added_token_without_content.json", StatusCode::kInvalidArgument,
                   "added_tokens[0].content"}),
    [](const ::testing::TestParamInfo<BrokenCase>& info) {
      std::string name = info.param.file;
      name = name.substr(0, name.find('.'));
      return name;
    });

// As in the library: without unk_id a character no piece covers is an error, not a guess.
TEST(TokenizerLoadTest, UnigramWithoutUnkIdRefusesUnknownCharacters) {
  const std::string json = R"({"version":"1.0",
    "model":{"type":"Unigram","vocab":[["a",-1.0],["b",-2.0],["ab",-2.5]]}})";
  const StatusOr<Tokenizer> tokenizer = Tokenizer::FromJson(json, "no_unk.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  EXPECT_EQ(EncodeOrDie(*tokenizer, "abb", false), (std::vector<int32_t>{2, 1}));
  const StatusOr<std::vector<int32_t>> ids = tokenizer->Encode("abc", false);
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ids.status().message().find("no unk_id"), std::string::npos) << ids.status().message();
}

// In a malformed BPE vocabulary two tokens may share an id, and a token listed twice keeps its last
// id as a JSON object keeps its last member: the id's token is the smaller of those sharing it, ids
// need not be dense, and every token still encodes to its id.
TEST(TokenizerLoadTest, ASharedIdDecodesAsItsSmallestToken) {
  const std::string json = R"({"version":"1.0","model":{"type":"BPE","merges":[],
      "vocab":{"b":0,"c":3,"a":0,"d":9,"c":7,"e":1000000}}})";
  const StatusOr<Tokenizer> tokenizer = Tokenizer::FromJson(json, "shared_ids.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  EXPECT_EQ(tokenizer->IdToToken(0), "a");
  EXPECT_EQ(tokenizer->IdToToken(3), std::nullopt);
  EXPECT_EQ(tokenizer->IdToToken(7), "c");
  EXPECT_EQ(tokenizer->IdToToken(9), "d");
  EXPECT_EQ(tokenizer->IdToToken(1000000), "e");
  EXPECT_EQ(tokenizer->IdToToken(-1), std::nullopt);
  EXPECT_EQ(tokenizer->vocab_size(), 1000001);
  const StatusOr<std::vector<int32_t>> ids = tokenizer->Encode("bacde", false);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_EQ(*ids, (std::vector<int32_t>{0, 0, 7, 9, 1000000}));
  EXPECT_EQ(tokenizer->Decode(*ids, false), "a a c d e");  // no decoder: joined by spaces
}

// As in the library, a Unigram piece listed twice encodes to its last id (whose score counts), and
// each id, the earlier one too, decodes to its own entry; the size counts both.
TEST(TokenizerLoadTest, AUnigramPieceListedTwiceKeepsBothIds) {
  const std::string json = R"({"version":"1.0","model":{"type":"Unigram","unk_id":0,
      "vocab":[["<unk>",0.0],["ab",-1.0],["a",-2.0],["b",-2.0],["ab",-5.0],["ab",-6.0],["c",-1.0]]}})";
  const StatusOr<Tokenizer> tokenizer = Tokenizer::FromJson(json, "relisted_pieces.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  EXPECT_EQ(tokenizer->TokenToId("ab"), 5);
  for (const int32_t id : {1, 4, 5}) EXPECT_EQ(tokenizer->IdToToken(id), "ab") << id;
  EXPECT_EQ(tokenizer->IdToToken(6), "c");
  EXPECT_EQ(tokenizer->IdToToken(7), std::nullopt);
  EXPECT_EQ(tokenizer->vocab_size(), 7);
  // "ab" scores -6 (its last entry): "a" + "b" at -4 wins.
  EXPECT_EQ(EncodeOrDie(*tokenizer, "abc", false), (std::vector<int32_t>{2, 3, 6}));
  EXPECT_EQ(tokenizer->Decode(std::vector<int32_t>{1, 4, 5, 6}, false), "ab ab ab c");
}

// The vocabulary's size (one past its largest id) is an int32 too: an id of 2^31 - 1 is refused,
// not wrapped into a negative size.
TEST(TokenizerLoadTest, AnIdWithNoRoomForTheVocabularySizeIsRefused) {
  const std::string json =
      R"({"version":"1.0","model":{"type":"BPE","vocab":{"a":2147483647},"merges":[]}})";
  const StatusOr<Tokenizer> refused = Tokenizer::FromJson(json, "huge_id.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("model: token id 2147483647 is too large"),
            std::string::npos)
      << refused.status().message();

  const std::string largest =
      R"({"version":"1.0","model":{"type":"BPE","vocab":{"a":2147483646},"merges":[]}})";
  const StatusOr<Tokenizer> tokenizer = Tokenizer::FromJson(largest, "largest_id.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  EXPECT_EQ(tokenizer->vocab_size(), 2147483647);
}

// nlohmann's parser keeps each level of "[[[[": a 40 MB tokenizer.json of them took 1.5 GB.
TEST(TokenizerLoadTest, NestingPastSixtyFourLevelsIsRefused) {
  const std::string json = R"({"version":"1.0","x":)" + std::string(1000, '[') +
                           std::string(1000, ']') +
                           R"(,"model":{"type":"BPE","vocab":{"a":0},"merges":[]}})";
  const StatusOr<Tokenizer> refused = Tokenizer::FromJson(json, "deep.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(),
            "deep.json: arrays and objects nested more than 64 levels deep");
}

// A hostile pattern fails the encode instead of hanging the trainer.
TEST(TokenizerLoadTest, CatastrophicRegexFailsFast) {
  const std::string json = R"({"version":"1.0",
    "pre_tokenizer":{"type":"Split","pattern":{"Regex":"(x+x+)+[yz]"},"behavior":"Isolated","invert":false},
    "model":{"type":"BPE","vocab":{"x":0},"merges":[]}})";
  const StatusOr<Tokenizer> tokenizer = Tokenizer::FromJson(json, "hostile.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  const StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(std::string(64, 'x'), false);
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), StatusCode::kResourceExhausted) << ids.status().ToString();
}

}  // namespace
}  // namespace llmctl
