// The rows of a caption set as llm-train frames them, and their longest, which `llmctl estimate`
// reads for a BLIP-2 trial: over experiments/cpu-lab-blip2.yaml's captions and tokenizers.
#include "common/inputs/captions.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "common/data/file_util.h"
#include "common/data/heap_watching_encoder.h"
#include "common/experiment.h"
#include "common/tokenizer/tokenizer.h"

namespace llmctl {
namespace {

// ctest runs in the source directory.
const std::string kExperiments = "experiments/";

// A row of experiments/cpu-lab-blip2.yaml, its paths resolved, and its model.
struct Row {
  TrialConfig config;
  Blip2Config model;
};

Row LoadRow(const std::string& name) {
  StatusOr<Experiment> experiment = LoadExperimentFile(kExperiments + "cpu-lab-blip2.yaml");
  EXPECT_TRUE(experiment.ok()) << experiment.status().message();
  for (Trial& trial : experiment->trials) {
    if (trial.name != name) continue;
    LocalizeNodePaths(trial.config);
    StatusOr<std::optional<Blip2Config>> model = ResolveBlip2Model(trial.config.GetString("model"));
    EXPECT_TRUE(model.ok() && model->has_value());
    return {trial.config, **model};
  }
  ADD_FAILURE() << "no row " << name;
  return {};
}

// OPT's rows: BOS, then the caption's ids, after the queries' placeholders (labels -100 there).
TEST(CaptionsTest, OptRowsAreTheQueriesThenBosAndTheCaption) {
  const Row row = LoadRow("reduced-batch");
  StatusOr<Tokenizer> tokenizer =
      Tokenizer::Load(kExperiments + "tokenizers/captions/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  const data::TokenizerTextEncoder<Tokenizer> encoder(*tokenizer, "");
  image::CaptionedImage entry;
  entry.file_name = "images/00000.png";
  entry.caption = "a large purple circle on a white background";
  StatusOr<data::TokenizedExample> example =
      CaptionExample(encoder, entry, row.model, /*max_length=*/50, "data/captions");
  ASSERT_TRUE(example.ok()) << example.status().message();
  StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(entry.caption, false);
  ASSERT_TRUE(ids.ok());
  const size_t queries = static_cast<size_t>(row.model.num_query_tokens);
  ASSERT_EQ(example->input_ids.size(), queries + 1 + ids->size());
  EXPECT_EQ(example->input_ids[queries], encoder.bos_id());
  EXPECT_EQ(example->labels[0], data::kIgnoreIndex);
  EXPECT_FALSE(example->truncated);
  // Cut to 4 with BOS kept: BOS and 3 of the caption's ids.
  example = CaptionExample(encoder, entry, row.model, /*max_length=*/4, "data/captions");
  ASSERT_TRUE(example.ok());
  EXPECT_EQ(example->input_ids.size(), queries + 4);
  EXPECT_TRUE(example->truncated);
}

// The longest row of the set: under data.max_seq_length 50 the OPT rows' captions are whole (BOS
// and at most 23 ids); the T5 rows' are cut at 12 with </s> kept; data.samples keeps the first
// rows.
TEST(CaptionsTest, LongestCaptionIsTheSetsLongestFramedRow) {
  Row opt = LoadRow("reduced-batch");
  StatusOr<int64_t> longest = LongestCaptionTokens(opt.config, opt.model);
  ASSERT_TRUE(longest.ok()) << longest.status().message();
  EXPECT_EQ(*longest, 24);

  Row t5 = LoadRow("even-larger");
  longest = LongestCaptionTokens(t5.config, t5.model);
  ASSERT_TRUE(longest.ok()) << longest.status().message();
  EXPECT_EQ(*longest, 12);

  ASSERT_TRUE(opt.config.SetFromText("data.samples", "1").ok());
  longest = LongestCaptionTokens(opt.config, opt.model);
  ASSERT_TRUE(longest.ok());
  StatusOr<Tokenizer> tokenizer =
      Tokenizer::Load(kExperiments + "tokenizers/captions/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok());
  StatusOr<std::vector<int32_t>> first =
      tokenizer->Encode("a large purple circle on a white background", false);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(*longest, 1 + static_cast<int64_t>(first->size()));
}

// The shortest row beside the longest: the T5 rows' captions (21 to 30 tokens with </s>) are all
// cut at 12, so every row is 12; the OPT rows' are whole, so they differ; one sample is both.
TEST(CaptionsTest, CaptionTokensSpanTheSetsShortestAndLongestRows) {
  Row t5 = LoadRow("even-larger");
  StatusOr<CaptionTokenSpan> span = CaptionTokens(t5.config, t5.model);
  ASSERT_TRUE(span.ok()) << span.status().message();
  EXPECT_EQ(span->shortest, 12);
  EXPECT_EQ(span->longest, 12);

  Row opt = LoadRow("reduced-batch");
  span = CaptionTokens(opt.config, opt.model);
  ASSERT_TRUE(span.ok()) << span.status().message();
  EXPECT_GT(span->shortest, 1);
  EXPECT_LT(span->shortest, span->longest);
  EXPECT_EQ(span->longest, 24);

  ASSERT_TRUE(opt.config.SetFromText("data.samples", "1").ok());
  span = CaptionTokens(opt.config, opt.model);
  ASSERT_TRUE(span.ok());
  EXPECT_EQ(span->shortest, span->longest);
}

// The lab's caption set is 128 PNGs of 256 x 256: every sampled header says so. A set of the
// first 3 samples reads those 3; a broken image among them is refused by its name in the set.
TEST(CaptionsTest, AnImageHasTheSetsMeanPixelsByFormat) {
  Row row = LoadRow("reduced-batch");
  StatusOr<ImagePixels> pixels = MeanImagePixels(row.config);
  ASSERT_TRUE(pixels.ok()) << pixels.status().message();
  EXPECT_EQ(pixels->jpeg, 0);
  EXPECT_EQ(pixels->png, 256.0 * 256);

  const std::filesystem::path folder = std::filesystem::path(testing::TempDir()) / "three";
  std::filesystem::create_directories(folder);
  for (const char* name : {"00000.png", "00001.png"}) {
    std::filesystem::copy_file(kExperiments + "data/captions/images/" + name, folder / name,
                               std::filesystem::copy_options::overwrite_existing);
  }
  std::ofstream(folder / "broken.png") << "not an image";
  std::ofstream(folder / "metadata.jsonl") << "{\"file_name\": \"00000.png\", \"text\": \"a\"}\n"
                                           << "{\"file_name\": \"00001.png\", \"text\": \"b\"}\n"
                                           << "{\"file_name\": \"broken.png\", \"text\": \"c\"}\n";
  ASSERT_TRUE(row.config.SetFromText("data.path", folder.string()).ok());
  ASSERT_TRUE(row.config.SetFromText("data.samples", "2").ok());
  pixels = MeanImagePixels(row.config);
  ASSERT_TRUE(pixels.ok()) << pixels.status().message();
  EXPECT_EQ(pixels->png, 256.0 * 256);
  ASSERT_TRUE(row.config.SetFromText("data.samples", "3").ok());
  pixels = MeanImagePixels(row.config);
  ASSERT_FALSE(pixels.ok());
  EXPECT_EQ(pixels.status().message(), folder.string() +
                                           "/broken.png: not a JPEG or PNG image (by its first "
                                           "bytes)");
}

// The token files of the lab's two framings (OPT: BOS first, whole captions; T5: EOS last, cut at
// 12) as they were written before the rows streamed to the writer: size and FNV-1a 64 of the bytes.
TEST(CaptionsTest, PreparesTheSameBytesAsBeforeItStreamed) {
  const std::filesystem::path cache = std::filesystem::path(testing::TempDir()) / "caption-cache";
  std::filesystem::remove_all(cache);
  std::filesystem::create_directories(cache);
  std::filesystem::permissions(cache, std::filesystem::perms::owner_all);
  setenv("LLMCTL_CACHE_DIR", cache.c_str(), 1);
  const struct {
    const char* row;
    size_t bytes;
    uint64_t hash;
  } kExpected[] = {{"reduced-batch", 17360, 0x339eeacb1be27489ULL},
                   {"even-larger", 14040, 0xa45ddf91f7774984ULL}};
  for (const auto& expected : kExpected) {
    Row row = LoadRow(expected.row);
    StatusOr<std::vector<image::CaptionedImage>> images = ReadTrialImages(row.config);
    ASSERT_TRUE(images.ok()) << images.status().message();
    StatusOr<TokenFileRef> file = PrepareCaptionTokensToRead(row.config, row.model, *images);
    ASSERT_TRUE(file.ok()) << file.status().message();
    std::ifstream in(file->path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(bytes.size(), expected.bytes) << expected.row;
    EXPECT_EQ(data::Fnv1a64(bytes), expected.hash) << expected.row;
  }
  unsetenv("LLMCTL_CACHE_DIR");
}

// Each row goes to the token file as it is made: what writing holds does not grow with the set.
// 20,000 captions of 200 bytes make rows of the queries and 201 tokens, about 40 MB of ids and
// labels if every row were held until the end.
TEST(CaptionsTest, WritingHoldsEachRowsOffsetNotItsTokens) {
  const Row opt = LoadRow("reduced-batch");
  std::vector<image::CaptionedImage> images(20000);
  for (size_t i = 0; i < images.size(); ++i) {
    images[i].file_name = std::to_string(i) + ".png";
    images[i].caption = std::string(200, static_cast<char>('a' + i % 26));
  }
  const std::string path = testing::TempDir() + "/rows.tok";
  data::HeapWatchingEncoder encoder;
  const size_t before = data::HeapWatchingEncoder::HeapInUse();
  const Status written =
      WriteCaptionTokens(encoder, images, opt.model, /*max_length=*/512, "captions", "fp", path);
  ASSERT_TRUE(written.ok()) << written.message();
  // The scratch buffers (1.25 MiB), the offsets (160 kB), one row.
  EXPECT_LT(encoder.peak_heap() - before, size_t{4} << 20);
}

// Rows of up to 2^40 tokens cannot fit anywhere: refused before the file is begun, naming its
// directory. Before, the one short row was written.
TEST(CaptionsTest, RowsTooLargeForTheDirectoryAreRefusedBeforeWriting) {
  const Row opt = LoadRow("reduced-batch");
  std::vector<image::CaptionedImage> images(1);
  images[0].file_name = "0.png";
  images[0].caption = "a circle";
  const std::filesystem::path dir = std::filesystem::path(testing::TempDir()) / "large-rows";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "rows.tok").string();
  const Status written = WriteCaptionTokens(data::ByteTextEncoder(), images, opt.model,
                                            int64_t{1} << 40, "captions", "fp", path);
  EXPECT_EQ(written.code(), StatusCode::kUnavailable) << written.message();
  EXPECT_NE(written.message().find("do not fit in " + dir.string() + ", whose filesystem has"),
            std::string::npos)
      << written.message();
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace llmctl
