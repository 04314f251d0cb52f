#include "common/blip2_config.h"

#include <gtest/gtest.h>

namespace llmctl {
namespace {

TEST(Blip2ConfigTest, DefaultsAreTransformersForWhatAFileLeavesOut) {
  // The hub's blip2-opt-2.7b states OPT's shape in part; the rest are OPTConfig's defaults.
  const auto config = ParseBlip2Config(
      nlohmann::json::parse(R"({"model_type": "blip-2", "num_query_tokens": 32,
        "text_config": {"model_type": "opt", "hidden_size": 2560, "ffn_dim": 10240,
                        "num_hidden_layers": 32, "num_attention_heads": 32},
        "image_token_index": 50265})"),
      "config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->vision.hidden_size, 1408);
  EXPECT_EQ(config->vision.num_hidden_layers, 39);
  EXPECT_EQ(config->qformer.encoder_hidden_size, 1408);
  EXPECT_EQ(config->qformer.num_hidden_layers, 12);
  EXPECT_EQ(config->opt.vocab_size, 50272);
  EXPECT_EQ(config->opt.hidden_size, 2560);
  EXPECT_EQ(config->image_token_index, 50265);
}

TEST(Blip2ConfigTest, WrongValuesAreNamedBySectionAndField) {
  auto parse = [](const char* text) {
    return ParseBlip2Config(nlohmann::json::parse(text), "m/config.json").status();
  };
  EXPECT_EQ(parse(R"({"model_type": "llama"})").message(),
            "m/config.json: model_type llama, expected blip-2");
  const Status t5 = parse(R"({"model_type": "blip-2", "text_config": {"model_type": "t5"}})");
  EXPECT_EQ(t5.code(), StatusCode::kUnimplemented);
  EXPECT_NE(t5.message().find("text_config.model_type t5"), std::string::npos);
  EXPECT_EQ(parse(R"({"model_type": "blip-2", "vision_config": {"patch_size": 0}})").message(),
            "m/config.json: vision_config.patch_size: expected a positive integer, got 0");
  EXPECT_EQ(
      parse(R"({"model_type": "blip-2", "qformer_config": {"encoder_hidden_size": 1024}})").message(),
      "m/config.json: qformer_config.encoder_hidden_size 1024 differs from "
      "vision_config.hidden_size 1408");
  EXPECT_EQ(parse(R"({"model_type": "blip-2", "text_config": {"word_embed_proj_dim": 512}})").code(),
            StatusCode::kUnimplemented);
}

// transformers 5.23's Blip2ForConditionalGeneration built on the meta device with each preset's
// config counts these parameters (sum of numel over model.parameters(), the tied head once); the lab
// says blip2-opt-2.7b's take close to 14 GB in fp32: 3,744,761,856 x 4 B = 13.95 GiB.
TEST(Blip2ConfigTest, PresetsHaveThePublishedModelsParameterCounts) {
  const auto opt_2_7b = Blip2Preset("blip2-opt-2.7b");
  ASSERT_TRUE(opt_2_7b.has_value());
  const Blip2ParameterCounts small = CountBlip2Parameters(*opt_2_7b);
  EXPECT_EQ(small.vision, 985'952'256);
  EXPECT_EQ(small.qformer, 105'137'664 + 32 * 768);
  EXPECT_EQ(small.projection, 1'968'640);
  EXPECT_EQ(small.language_model, 2'651'678'720);
  EXPECT_EQ(small.total(), 3'744'761'856);
  const auto opt_6_7b = Blip2Preset("blip2-opt-6.7b");
  ASSERT_TRUE(opt_6_7b.has_value());
  EXPECT_EQ(CountBlip2Parameters(*opt_6_7b).total(), 7'752'869'376);
  EXPECT_FALSE(Blip2Preset("blip2-flan-t5-xxl").has_value());  // T5 is not built yet
}

TEST(Blip2ConfigTest, TheTinyFixturesConfigCountsWhatItsCheckpointHolds) {
  // tests/fixtures/blip2/opt-tiny's config: the sum of its model.safetensors' tensors, 81,736
  // values (make_blip2_fixtures.py's model, the tied head once).
  const auto config = ParseBlip2Config(
      nlohmann::json::parse(R"({"model_type": "blip-2", "num_query_tokens": 4, "image_token_index": 119,
        "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                          "num_attention_heads": 4, "image_size": 28, "patch_size": 14},
        "qformer_config": {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3,
                           "num_attention_heads": 4, "encoder_hidden_size": 32},
        "text_config": {"model_type": "opt", "vocab_size": 120, "hidden_size": 24, "ffn_dim": 40,
                        "num_hidden_layers": 2, "num_attention_heads": 4,
                        "max_position_embeddings": 64}})"),
      "config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(CountBlip2Parameters(*config).total(), 81'736);
}

}  // namespace
}  // namespace llmctl
