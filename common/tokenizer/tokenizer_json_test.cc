// Reading tokenizer.json (tokenizer_json.h), through Tokenizer::FromJson: model.vocab and
// model.merges read as the parse streams past them, their errors, and the memory a load holds.
#include <gtest/gtest.h>
#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"

namespace llmctl {
namespace {

// Every operator new and delete of this test binary, counted by the size malloc gave: the heap in
// use and the most at once.
std::atomic<size_t> heap_in_use{0};
std::atomic<size_t> heap_peak{0};

void CountAllocation(size_t bytes) {
  const size_t now = heap_in_use.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  size_t peak = heap_peak.load(std::memory_order_relaxed);
  while (now > peak && !heap_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void CountFree(size_t bytes) { heap_in_use.fetch_sub(bytes, std::memory_order_relaxed); }

std::vector<int32_t> EncodeOrDie(const Tokenizer& tokenizer, std::string_view text) {
  StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(text, /*add_special_tokens=*/false);
  EXPECT_TRUE(ids.ok()) << ids.status().ToString();
  return ids.ok() ? *ids : std::vector<int32_t>();
}

struct MalformedCase {
  const char* model;  // the "model" object's text
  const char* message;
};

// The messages are the ones a whole-document parse gave before the vocabulary and merges were
// streamed.
TEST(TokenizerJsonTest, MalformedVocabularyOrMergesAreRefusedNamingTheEntry) {
  const MalformedCase cases[] = {
      {R"({"type":"BPE","merges":[]})", "model.vocab: missing required field"},
      {R"({"type":"BPE","vocab":null,"merges":[]})", "model.vocab: missing required field"},
      {R"({"type":"BPE","vocab":[],"merges":[]})",
       "model.vocab: expected an object mapping tokens to ids"},
      {R"({"type":"BPE","vocab":"a","merges":[]})",
       "model.vocab: expected an object mapping tokens to ids"},
      {R"({"type":"BPE","vocab":{"a":0,"b":"1"},"merges":[]})",
       "model.vocab.b: expected a token id (a non-negative integer)"},
      {R"({"type":"BPE","vocab":{"a":0,"b":[1]},"merges":[]})",
       "model.vocab.b: expected a token id (a non-negative integer)"},
      {R"({"type":"BPE","vocab":{"a":1.0},"merges":[]})",
       "model.vocab.a: expected a token id (a non-negative integer)"},
      {R"({"type":"BPE","vocab":{"a":-1},"merges":[]})",
       "model.vocab.a: token id must not be negative"},
      {R"({"type":"BPE","vocab":{"a":4294967296},"merges":[]})",
       "model.vocab.a: token id 4294967296 is out of range"},
      {R"({"type":"BPE","vocab":{"a":0}})", "model.merges: missing required field"},
      {R"({"type":"BPE","vocab":{"a":0},"merges":{}})", "model.merges: expected an array"},
      {R"({"type":"BPE","vocab":{"a":0},"merges":"a a"})", "model.merges: expected an array"},
      {R"({"type":"BPE","vocab":{"a":0,"aa":1},"merges":["a a","aa"]})",
       R"(model.merges[1]: expected "left right" with exactly one space, got "aa")"},
      {R"({"type":"BPE","vocab":{"a":0,"aa":1},"merges":["a a","a a a"]})",
       R"(model.merges[1]: expected "left right" with exactly one space, got "a a a")"},
      {R"({"type":"BPE","vocab":{"a":0,"aa":1},"merges":[["a","a"],7]})",
       R"(model.merges[1]: expected "left right" or ["left", "right"])"},
      {R"({"type":"BPE","vocab":{"a":0,"aa":1},"merges":[["a","a","a"]]})",
       R"(model.merges[0]: expected "left right" or ["left", "right"])"},
      {R"({"type":"BPE","vocab":{"a":0,"aa":1},"merges":[["a",["a"]]]})",
       R"(model.merges[0]: expected "left right" or ["left", "right"])"},
      {R"({"type":"BPE","vocab":{"a":0,"aa":1},"merges":[{"a":"a"}]})",
       R"(model.merges[0]: expected "left right" or ["left", "right"])"},
      {R"({"type":"BPE","vocab":{"a":0},"merges":[["a","b"]]})",
       R"(model: merges[0]: token "b" is not in the vocab)"},
      {R"({"type":"Unigram","unk_id":0})", "model.vocab: missing required field"},
      {R"({"type":"Unigram","vocab":{"a":0}})", "model.vocab: expected an array of [piece, score]"},
      {R"({"type":"Unigram","vocab":[["a",-1.0],["b",-2.0,3]]})",
       "model.vocab[1]: expected [piece, score]"},
      {R"({"type":"Unigram","vocab":[["a",-1.0],{"b":-2.0}]})",
       "model.vocab[1]: expected [piece, score]"},
      {R"({"type":"Unigram","vocab":[["a","-1.0"]]})", "model.vocab[0]: expected [piece, score]"},
      {R"({"type":"Unigram","vocab":[[["a"],-1.0]]})", "model.vocab[0]: expected [piece, score]"},
      {R"({"type":"Unigram","vocab":["a"]})", "model.vocab[0]: expected [piece, score]"},
      {R"({"type":"Unigram","unk_id":1,"vocab":[["a",-1.0]]})",
       "model.unk_id: unk_id 1 is not in the vocabulary of 1 pieces"},
  };
  for (const MalformedCase& c : cases) {
    const std::string json = std::string(R"({"version":"1.0","model":)") + c.model + "}";
    const StatusOr<Tokenizer> tokenizer = Tokenizer::FromJson(json, "bad.json");
    ASSERT_FALSE(tokenizer.ok()) << json;
    EXPECT_EQ(tokenizer.status().code(), StatusCode::kInvalidArgument) << json;
    EXPECT_EQ(tokenizer.status().message(), std::string("bad.json: ") + c.message) << json;
  }
}

// A JSON object's members come in any order, and a member given twice counts as its last.
TEST(TokenizerJsonTest, VocabularyAndMergesAreReadInAnyOrderAndTheLastModelCounts) {
  const StatusOr<Tokenizer> merges_first = Tokenizer::FromJson(
      R"({"model":{"merges":["a b",["ab","c"]],"vocab":{"a":0,"b":1,"ab":2,"c":3,"abc":4}}})",
      "untagged.json");
  ASSERT_TRUE(merges_first.ok()) << merges_first.status().ToString();
  EXPECT_EQ(EncodeOrDie(*merges_first, "abcab"), (std::vector<int32_t>{4, 2}));

  const StatusOr<Tokenizer> twice = Tokenizer::FromJson(
      R"({"model":{"type":"BPE","vocab":{"x":0},"merges":["x y"]},
          "model":{"vocab":{"a":0,"b":1},"vocab":{"b":0,"a":1},"type":"BPE","merges":[]}})",
      "twice.json");
  ASSERT_TRUE(twice.ok()) << twice.status().ToString();
  EXPECT_EQ(EncodeOrDie(*twice, "ab"), (std::vector<int32_t>{1, 0}));

  const StatusOr<Tokenizer> unigram = Tokenizer::FromJson(
      R"({"model":{"vocab":[["a",-1.0],["b",-2],["ab",-2.5]],"type":"Unigram","unk_id":null}})",
      "unigram.json");
  ASSERT_TRUE(unigram.ok()) << unigram.status().ToString();
  EXPECT_EQ(EncodeOrDie(*unigram, "abb"), (std::vector<int32_t>{2, 1}));
}

// "[],[],...": one more empty array than kMaxKeptJsonValues.
std::string ArraysPastTheLimit() {
  std::string arrays;
  for (size_t i = 0; i < (size_t{1} << 20) + 1; ++i) arrays += "[],";
  arrays.pop_back();
  return arrays;
}

// A hostile file's "[]," takes about 70 bytes as JSON for 3 of text: outside the vocabulary and
// merges, which go into the model's tables, at most kMaxKeptJsonValues values are kept.
TEST(TokenizerJsonTest, MoreThanAMillionValuesOutsideTheVocabularyAndMergesAreRefused) {
  const std::string arrays = ArraysPastTheLimit();
  const std::string json =
      R"({"added_tokens":[)" + arrays + R"(],"model":{"type":"BPE","vocab":{"a":0},"merges":[]}})";
  const StatusOr<Tokenizer> refused = Tokenizer::FromJson(json, "hostile.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(),
            "hostile.json: more than 1048576 values outside model.vocab and model.merges");

  // As many values in the vocabulary are no matter.
  std::string vocab;
  for (size_t i = 0; i < (size_t{1} << 20) + 1; ++i) {
    vocab.append("\"t").append(std::to_string(i)).append("\":").append(std::to_string(i)) += ',';
  }
  vocab.pop_back();
  const StatusOr<Tokenizer> large = Tokenizer::FromJson(
      R"({"model":{"type":"BPE","vocab":{)" + vocab + R"(},"merges":[]}})", "large.json");
  ASSERT_TRUE(large.ok()) << large.status().ToString();
  EXPECT_EQ(large->vocab_size(), (1 << 20) + 1);
}

// tokenizer_config.json is read as tokenizer.json is (it has no model), under the same limit.
TEST(TokenizerJsonTest, ATokenizerConfigIsHeldToTheSameLimit) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "config_limit";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json")
      << R"({"model":{"type":"BPE","vocab":{"<s>":0,"a":1},"merges":[]}})";
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"bos_token":"a","chat_template":[)" + ArraysPastTheLimit() + "]}";
  const StatusOr<Tokenizer> refused = Tokenizer::Load(dir.string());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(),
            (dir / "tokenizer_config.json").string() +
                ": more than 1048576 values outside model.vocab and model.merges");

  std::ofstream(dir / "tokenizer_config.json") << R"({"bos_token":"a","chat_template":[[],[]]})";
  const StatusOr<Tokenizer> tokenizer = Tokenizer::Load(dir.string());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  EXPECT_EQ(tokenizer->bos_id(), 1);
}

// A BPE tokenizer.json of `count` tokens: "a" to "j" for the digits 0-9, then each number's digits
// as letters, made by merging the number / 10 with its last digit (in both merge forms).
std::string CountingBpeJson(int count) {
  const auto letters = [](int n) {
    std::string digits = std::to_string(n);
    for (char& c : digits) c = static_cast<char>('a' + (c - '0'));
    return digits;
  };
  std::string json = R"({"version":"1.0","model":{"type":"BPE","vocab":{)";
  for (int i = 0; i < count; ++i) {
    json.append("\"").append(letters(i)).append("\":").append(std::to_string(i)) += ',';
  }
  json.back() = '}';
  json += R"(,"merges":[)";
  for (int i = 10; i < count; ++i) {
    if (i % 2 == 0) {
      json.append("\"").append(letters(i / 10)).append(" ").append(letters(i % 10)).append("\",");
    } else {
      json.append("[\"").append(letters(i / 10)).append("\",\"").append(letters(i % 10));
      json.append("\"],");
    }
  }
  json.back() = ']';
  return json + "}}";
}

// As one JSON document a tokenizer.json took 5 to 24 times its size (a value 16 bytes, a string,
// array or object a heap block more) while it loaded; now the vocabulary and merges go straight
// into the model's tables, and all the load holds besides them is the merges' text and where each
// ends (here 6.2 MB for 5.3 MB of text, where a whole document held 53 MB).
TEST(TokenizerJsonTest, LoadingHoldsLittleBesidesTheModelsTables) {
  const std::string json = CountingBpeJson(200000);
  const size_t before = heap_in_use.load();
  heap_peak = before;
  StatusOr<Tokenizer> tokenizer = Tokenizer::FromJson(json, "counting.json");
  const size_t peak = heap_peak.load();
  const size_t tables = heap_in_use.load() - before;
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  EXPECT_EQ(EncodeOrDie(*tokenizer, "bcdef"), (std::vector<int32_t>{12, 345}));
  EXPECT_LE(peak - before - tables, 2 * json.size())
      << "text " << json.size() << " bytes, tables " << tables << ", peak " << peak - before;
}

// A BPE vocabulary held each token twice (a map from token to id and one from id to token): 3.1 MB
// for 1,000 tokens of 1,000 bytes, where the tokens' bytes are 1 MB; now 1.04 MB.
TEST(TokenizerJsonTest, ABpeVocabularyHoldsEachTokensBytesOnce) {
  constexpr int kTokens = 1000;
  constexpr size_t kTokenBytes = 1000;
  std::string json = R"({"model":{"type":"BPE","merges":[],"vocab":{)";
  for (int i = 0; i < kTokens; ++i) {
    const std::string number = std::to_string(i);
    json.append("\"").append(kTokenBytes - number.size(), 'x').append(number);
    json.append("\":").append(number) += ',';
  }
  json.back() = '}';
  json += "}}";
  const size_t before = heap_in_use.load();
  StatusOr<Tokenizer> tokenizer = Tokenizer::FromJson(json, "long_tokens.json");
  const size_t tables = heap_in_use.load() - before;
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  EXPECT_EQ(tokenizer->IdToToken(7), std::string(kTokenBytes - 1, 'x') + "7");
  EXPECT_EQ(tokenizer->TokenToId(std::string(kTokenBytes - 3, 'x') + "999"), 999);
  EXPECT_LE(tables, kTokens * kTokenBytes * 5 / 4) << "tokens' bytes " << kTokens * kTokenBytes;
}

// A Unigram vocabulary (T5's) held each piece twice, in a vector by id and a map from piece to id:
// 3.14 MB for 1,000 pieces of 1,000 bytes; now the pieces' bytes once, 1.1 MB with the scores and
// the trie. The pieces share their prefix, so the trie over them stays small.
TEST(TokenizerJsonTest, AUnigramVocabularyHoldsEachPiecesBytesOnce) {
  constexpr int kPieces = 1000;
  constexpr size_t kPieceBytes = 1000;
  std::string json = R"({"model":{"type":"Unigram","vocab":[)";
  for (int i = 0; i < kPieces; ++i) {
    const std::string number = std::to_string(i);
    json.append("[\"").append(kPieceBytes - number.size(), 'x').append(number);
    json.append("\",-").append(number) += "],";
  }
  json.back() = ']';
  json += "}}";
  const size_t before = heap_in_use.load();
  StatusOr<Tokenizer> tokenizer = Tokenizer::FromJson(json, "long_pieces.json");
  const size_t tables = heap_in_use.load() - before;
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  EXPECT_EQ(tokenizer->IdToToken(7), std::string(kPieceBytes - 1, 'x') + "7");
  EXPECT_EQ(tokenizer->TokenToId(std::string(kPieceBytes - 3, 'x') + "999"), 999);
  EXPECT_LE(tables, kPieces * kPieceBytes * 3 / 2) << "pieces' bytes " << kPieces * kPieceBytes;
}

// The parser's list of a Unigram vocabulary's pieces grew by doubling, reserving up to twice what
// it held, and each piece kept the lexer's buffer, which the score before it had grown to 31 bytes
// or more: for 200,000 pieces of a few letters, scored with 17 digits, the load peaked 16.4 MB
// above the tables it kept (10.5 MB of list for 8.0 of pieces, 6.2 MB of those buffers). Now the
// list grows a block at a time and a piece takes a copy of its text: 8.1 MB above them. Each piece
// keeps its id, its place in the list.
TEST(TokenizerJsonTest, AUnigramVocabularysListNeitherDoublesNorKeepsTheLexersBuffers) {
  constexpr int kPieces = 200000;
  const auto piece = [](int i) {
    std::string text = "p";
    for (int n = i; n > 0; n /= 26) text += static_cast<char>('a' + n % 26);
    return text;
  };
  std::string json = R"({"model":{"type":"Unigram","unk_id":0,"vocab":[["<unk>",0],)";
  for (int i = 1; i < kPieces; ++i) {
    // Scores as a SentencePiece model's print, past 15 digits.
    json.append("[\"").append(piece(i)).append("\",-").append(std::to_string(i));
    json += ".0123456789012345],";
  }
  json.back() = ']';
  json += "}}";
  const size_t before = heap_in_use.load();
  heap_peak = before;
  StatusOr<Tokenizer> tokenizer = Tokenizer::FromJson(json, "short_pieces.json");
  const size_t peak = heap_peak.load();
  const size_t tables = heap_in_use.load() - before;
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  for (int i = 1; i < kPieces; ++i) {
    ASSERT_EQ(tokenizer->TokenToId(piece(i)), i) << piece(i);
    ASSERT_EQ(tokenizer->IdToToken(i), piece(i)) << i;
  }
  EXPECT_EQ(EncodeOrDie(*tokenizer, piece(4321) + piece(17)), (std::vector<int32_t>{4321, 17}));
  EXPECT_LE(peak - before - tables, size_t{60} * kPieces)
      << "tables " << tables << ", peak " << peak - before;
}

// `count` Unigram pieces of `bytes` letters each, drawn so that they share little beyond their
// first few letters: a trie over them has about count * bytes nodes.
std::vector<std::string> UnsharedPieces(int count, size_t bytes) {
  std::vector<std::string> pieces;
  uint64_t state = 1;
  for (int i = 0; i < count; ++i) {
    std::string& piece = pieces.emplace_back();
    for (size_t b = 0; b < bytes; ++b) {
      state = state * 6364136223846793005u + 1442695040888963407u;  // Knuth's MMIX generator
      piece += static_cast<char>('a' + (state >> 33) % 26);
    }
  }
  return pieces;
}

// A Unigram model kept its trie as a hash node per edge beside a vector of nodes, about 42 bytes a
// node (T5's 32,100 pieces make 135,443 nodes), and built it while the parser's list of pieces was
// still held. Here, for 10,000 pieces of 48 letters (480,000 bytes, 458,177 trie nodes), the tables
// took 19.8 MB and the load peaked 2.3 MB above them; now the trie is 9 bytes a node in flat arrays
// (the tables 5.1 MB) and the list is freed before the trie is built (0.4 MB above them).
TEST(TokenizerJsonTest, AUnigramTrieTakesFewBytesANodeAndIsBuiltWithoutTheParsedPieces) {
  constexpr int kPieces = 10000;
  constexpr size_t kPieceBytes = 48;
  const std::vector<std::string> pieces = UnsharedPieces(kPieces, kPieceBytes);
  std::string json = R"({"model":{"type":"Unigram","unk_id":0,"vocab":[["<unk>",0],)";
  for (const std::string& piece : pieces) json.append("[\"").append(piece) += "\",-1.5],";
  json.back() = ']';
  json += "}}";
  const size_t before = heap_in_use.load();
  heap_peak = before;
  StatusOr<Tokenizer> tokenizer = Tokenizer::FromJson(json, "unshared_pieces.json");
  const size_t peak = heap_peak.load();
  const size_t tables = heap_in_use.load() - before;
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  EXPECT_EQ(EncodeOrDie(*tokenizer, pieces[1234] + pieces[7]), (std::vector<int32_t>{1235, 8}));
  const size_t piece_bytes = kPieces * kPieceBytes;
  EXPECT_LE(tables, 14 * piece_bytes) << "pieces' bytes " << piece_bytes;
  EXPECT_LE(peak - before - tables, 2 * piece_bytes)
      << "pieces' bytes " << piece_bytes << ", tables " << tables << ", peak " << peak - before;
}

// Tokenizer::Load held the file's text until the model's tables were built, so its peak was
// FromJson's (whose caller holds the text) with the text on top; now the text is freed once read
// through. Unigram pieces that share little make the trie's build the peak, above what reading the
// text holds; `from_json_peak` counts the same allocations but for the text. Here Load peaked at
// 6.06 MB, FromJson's 5.48 MB and the 0.58 MB of text.
TEST(TokenizerJsonTest, LoadingAFileFreesItsTextBeforeTheTablesAreBuilt) {
  const std::vector<std::string> pieces = UnsharedPieces(10000, 48);
  std::string json = R"({"model":{"type":"Unigram","unk_id":0,"vocab":[["<unk>",0],)";
  for (const std::string& piece : pieces) json.append("[\"").append(piece) += "\",-1.5],";
  json.back() = ']';
  json += "}}";
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "load_frees_text";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << json;

  size_t before = heap_in_use.load();
  heap_peak = before;
  const StatusOr<Tokenizer> from_json = Tokenizer::FromJson(json, "unshared_pieces.json");
  const size_t from_json_peak = heap_peak.load() - before;
  ASSERT_TRUE(from_json.ok()) << from_json.status().ToString();

  before = heap_in_use.load();
  heap_peak = before;
  const StatusOr<Tokenizer> loaded = Tokenizer::Load(dir.string());
  const size_t load_peak = heap_peak.load() - before;
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(EncodeOrDie(*loaded, pieces[1234] + pieces[7]), (std::vector<int32_t>{1235, 8}));
  EXPECT_LE(load_peak, from_json_peak + json.size() / 2)
      << "text " << json.size() << " bytes, FromJson's peak " << from_json_peak;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace llmctl

void* operator new(std::size_t size) {
  void* block = std::malloc(size == 0 ? 1 : size);
  if (block == nullptr) throw std::bad_alloc();
  llmctl::CountAllocation(malloc_usable_size(block));
  return block;
}

void operator delete(void* block) noexcept {
  if (block == nullptr) return;
  llmctl::CountFree(malloc_usable_size(block));
  std::free(block);
}

void operator delete(void* block, std::size_t /*size*/) noexcept { operator delete(block); }
