#include "common/blip2_config.h"

#include <gtest/gtest.h>

namespace llmctl {
namespace {

TEST(Blip2ConfigTest, DefaultsAreTransformersForWhatAFileLeavesOut) {
  // The hub's blip2-opt-2.7b states OPT's shape in part; the rest are OPTConfig's defaults.
  const auto config =
      ParseBlip2Config(nlohmann::json::parse(R"({"model_type": "blip-2", "num_query_tokens": 32,
        "text_config": {"model_type": "opt", "hidden_size": 2560, "ffn_dim": 10240,
                        "num_hidden_layers": 32, "num_attention_heads": 32},
        "image_token_index": 50265})"),
                       "config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->vision.hidden_size, 1408);
  EXPECT_EQ(config->vision.num_hidden_layers, 39);
  EXPECT_EQ(config->qformer.encoder_hidden_size, 1408);
  EXPECT_EQ(config->qformer.num_hidden_layers, 12);
  ASSERT_NE(config->opt(), nullptr);
  EXPECT_EQ(config->opt()->vocab_size, 50272);
  EXPECT_EQ(config->opt()->hidden_size, 2560);
  EXPECT_EQ(config->image_token_index, 50265);
}

TEST(Blip2ConfigTest, WrongValuesAreNamedBySectionAndField) {
  auto parse = [](const char* text) {
    return ParseBlip2Config(nlohmann::json::parse(text), "m/config.json").status();
  };
  EXPECT_EQ(parse(R"({"model_type": "llama"})").message(),
            "m/config.json: model_type llama, expected blip-2");
  const Status bart = parse(R"({"model_type": "blip-2", "text_config": {"model_type": "bart"}})");
  EXPECT_EQ(bart.code(), StatusCode::kUnimplemented);
  EXPECT_NE(bart.message().find("text_config.model_type bart"), std::string::npos);
  const Status silu = parse(
      R"({"model_type": "blip-2", "text_config": {"model_type": "t5", "feed_forward_proj": "gated-silu"}})");
  EXPECT_EQ(silu.code(), StatusCode::kUnimplemented);
  EXPECT_NE(silu.message().find("text_config.feed_forward_proj: \"gated-silu\""),
            std::string::npos);
  EXPECT_EQ(parse(R"({"model_type": "blip-2", "text_config": {"model_type": "t5", "d_kv": -1}})")
                .message(),
            "m/config.json: text_config.d_kv: expected a positive integer up to 262144, got -1");
  EXPECT_EQ(
      parse(R"({"model_type": "blip-2", "text_config": {"model_type": "t5", "pad_token_id": "x"}})")
          .message(),
      "m/config.json: text_config.pad_token_id: expected a token id, got \"x\"");
  EXPECT_EQ(
      parse(R"({"model_type": "blip-2", "vision_config": {"patch_size": 0}})").message(),
      "m/config.json: vision_config.patch_size: expected a positive integer up to 65536, got 0");
  EXPECT_EQ(parse(R"({"model_type": "blip-2", "qformer_config": {"encoder_hidden_size": 1024}})")
                .message(),
            "m/config.json: qformer_config.encoder_hidden_size 1024 differs from "
            "vision_config.hidden_size 1408");
  EXPECT_EQ(
      parse(R"({"model_type": "blip-2", "text_config": {"word_embed_proj_dim": 512}})").code(),
      StatusCode::kUnimplemented);
  // Members of another type are refused by name, never thrown (nlohmann's typed reads throw).
  EXPECT_EQ(parse(R"({"model_type": 5})").message(),
            "m/config.json: model_type 5, expected blip-2");
  EXPECT_EQ(parse(R"({})").message(), "m/config.json: model_type (none), expected blip-2");
  EXPECT_EQ(parse(R"({"model_type": "blip-2", "text_config": {"model_type": ["opt"]}})").message(),
            "m/config.json: text_config.model_type: expected a string, got [\"opt\"]");
  EXPECT_EQ(
      parse(
          R"({"model_type": "blip-2", "text_config": {"model_type": "t5", "feed_forward_proj": 7}})")
          .message(),
      "m/config.json: text_config.feed_forward_proj: expected a string, got 7");
  // Shapes past any model's, whose counts would not fit in 64 bits (or take 2^63 layers to count).
  EXPECT_EQ(
      parse(
          R"({"model_type": "blip-2", "qformer_config": {"num_hidden_layers": 9223372036854775807}})")
          .message(),
      "m/config.json: qformer_config.num_hidden_layers: expected a positive integer up to 1024, "
      "got "
      "9223372036854775807");
}

// transformers 5.23's Blip2ForConditionalGeneration built on the meta device with each preset's
// config counts these parameters (sum of numel over model.parameters(), the tied head once); the
// lab says blip2-opt-2.7b's take close to 14 GB in fp32: 3,744,761,856 x 4 B = 13.95 GiB.
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
}

// The same count for Flan-T5's (transformers 5.23 ties T5's head whatever the config says, so its
// count lacks lm_head's 32,128 x C; the published checkpoints hold it, and google/flan-t5-xxl's
// 11,135,332,352 parameters include it).
TEST(Blip2ConfigTest, FlanT5PresetsCountTheirOwnHead) {
  const auto xxl = Blip2Preset("blip2-flan-t5-xxl");
  ASSERT_TRUE(xxl.has_value());
  ASSERT_NE(xxl->t5(), nullptr);
  const Blip2ParameterCounts counts = CountBlip2Parameters(*xxl);
  EXPECT_EQ(counts.vision, 985'952'256);
  EXPECT_EQ(counts.qformer, 105'162'240);
  EXPECT_EQ(counts.projection, 3'149'824);
  EXPECT_EQ(counts.language_model, 11'003'736'064 + 32'128 * 4096);
  EXPECT_EQ(counts.language_model, 11'135'332'352);
  EXPECT_EQ(counts.total(), 12'229'596'672);
  EXPECT_EQ(xxl->image_token_index, 32100);
  const auto xl = Blip2Preset("blip2-flan-t5-xl");
  ASSERT_TRUE(xl.has_value());
  EXPECT_EQ(CountBlip2Parameters(*xl).total(), 3'942'446'592);
  EXPECT_FALSE(Blip2Preset("blip2-flan-t5-base").has_value());
}

TEST(Blip2ConfigTest, T5FieldsFollowT5Config) {
  // A v1.0-style file: relu, and no tie_word_embeddings (PretrainedConfig's default: tied).
  const auto v10 =
      ParseBlip2Config(nlohmann::json::parse(R"({"model_type": "blip-2", "image_token_index": 5,
        "text_config": {"model_type": "t5", "d_model": 64, "num_layers": 3, "vocab_size": 100}})"),
                       "config.json");
  ASSERT_TRUE(v10.ok()) << v10.status().ToString();
  ASSERT_NE(v10->t5(), nullptr);
  EXPECT_FALSE(v10->t5()->gated_gelu);
  EXPECT_TRUE(v10->t5()->tie_word_embeddings);
  EXPECT_EQ(v10->t5()->num_decoder_layers, 3);  // as many as the encoder when left out
  EXPECT_EQ(v10->text_hidden_size(), 64);
  EXPECT_EQ(v10->text_vocab_size(), 100);
  const auto flan =
      ParseBlip2Config(nlohmann::json::parse(R"({"model_type": "blip-2", "image_token_index": 32100,
        "text_config": {"model_type": "t5", "feed_forward_proj": "gated-gelu",
                        "tie_word_embeddings": false, "num_layers": 2, "num_decoder_layers": 4,
                        "dropout_rate": 0.2}})"),
                       "config.json");
  ASSERT_TRUE(flan.ok()) << flan.status().ToString();
  EXPECT_TRUE(flan->t5()->gated_gelu);
  EXPECT_FALSE(flan->t5()->tie_word_embeddings);
  EXPECT_EQ(flan->t5()->num_decoder_layers, 4);
  EXPECT_EQ(flan->t5()->dropout_rate, 0.2);
}

// What a merged model is saved with parses back to the same shapes, for both language models.
TEST(Blip2ConfigTest, WrittenConfigParsesBackToTheSameModel) {
  for (const char* preset : {"blip2-opt-2.7b", "blip2-flan-t5-xxl"}) {
    SCOPED_TRACE(preset);
    Blip2Config config = *Blip2Preset(preset);
    config.qformer.hidden_dropout_prob = 0.25;  // away from the defaults, so each must be written
    config.vision.attention_dropout = 0.125;
    const auto back = ParseBlip2Config(ToHfConfigJson(config), "merged/config.json");
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(ToHfConfigJson(*back), ToHfConfigJson(config));
    EXPECT_EQ(CountBlip2Parameters(*back).total(), CountBlip2Parameters(config).total());
    EXPECT_EQ(back->qformer.hidden_dropout_prob, 0.25);
    EXPECT_EQ(back->vision.attention_dropout, 0.125);
    EXPECT_EQ(back->t5() != nullptr, config.t5() != nullptr);
    if (config.t5()) {
      EXPECT_FALSE(back->t5()->tie_word_embeddings);
    }
  }
}

TEST(Blip2ConfigTest, TheTinyFixturesConfigCountsWhatItsCheckpointHolds) {
  // tests/fixtures/blip2/opt-tiny's config: the sum of its model.safetensors' tensors, 81,736
  // values (make_blip2_fixtures.py's model, the tied head once).
  const auto config = ParseBlip2Config(
      nlohmann::json::parse(
          R"({"model_type": "blip-2", "num_query_tokens": 4, "image_token_index": 119,
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
