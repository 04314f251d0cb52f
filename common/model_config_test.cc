#include "common/model_config.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "tests/support/shell_command.h"

namespace llmctl {
namespace {

namespace fs = std::filesystem;

// The published config.json of TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T (fields as on
// the hub).
constexpr std::string_view kTinyLlamaJson = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 5632,
  "max_position_embeddings": 2048,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 22,
  "num_key_value_heads": 4,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "float32",
  "transformers_version": "4.31.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

// Llama 3.2 1B's shape: llama3 rope scaling, tied embeddings, several EOS ids (as the instruct
// model has).
constexpr std::string_view kLlama32Json = R"({
  "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
  "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
  "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "tie_word_embeddings": true, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
  "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": false, "mlp_bias": false
})";

// Qwen2-0.5B's shape: q/k/v biases that config.json does not mention.
constexpr std::string_view kQwen2Json = R"({
  "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
  "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
  "max_position_embeddings": 131072, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "tie_word_embeddings": true, "bos_token_id": 151643, "eos_token_id": 151643,
  "sliding_window": 131072, "use_sliding_window": false, "torch_dtype": "bfloat16",
  "hidden_act": "silu"
})";

std::string Minimal(std::string_view extra_fields = "") {
  std::string json = R"({"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
                         "num_hidden_layers": 2, "num_attention_heads": 4)";
  if (!extra_fields.empty()) json += std::string(", ") + std::string(extra_fields);
  return json + "}";
}

std::string ParseError(std::string_view json) {
  StatusOr<ModelConfig> config = ParseHfConfigJson(json, "config.json");
  EXPECT_FALSE(config.ok()) << json;
  if (config.ok()) return "";
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  return config.status().message();
}

// A fresh directory under the system temp dir, removed when the test ends.
class TempDir {
 public:
  TempDir() {
    std::mt19937_64 random(std::chrono::steady_clock::now().time_since_epoch().count());
    path_ = fs::temp_directory_path() / ("llmctl-model-config-test-" + std::to_string(random()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }
  void Write(const std::string& name, std::string_view text) const {
    fs::create_directories((path_ / name).parent_path());
    std::ofstream(path_ / name) << text;
  }

 private:
  fs::path path_;
};

TEST(ParseHfConfigJsonTest, TinyLlama) {
  StatusOr<ModelConfig> config = ParseHfConfigJson(kTinyLlamaJson, "config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->model_type, "llama");
  EXPECT_EQ(config->vocab_size, 32000);
  EXPECT_EQ(config->hidden_size, 2048);
  EXPECT_EQ(config->intermediate_size, 5632);
  EXPECT_EQ(config->num_hidden_layers, 22);
  EXPECT_EQ(config->num_attention_heads, 32);
  EXPECT_EQ(config->num_key_value_heads, 4);
  EXPECT_EQ(config->head_dim, 64);
  EXPECT_EQ(config->max_position_embeddings, 2048);
  EXPECT_DOUBLE_EQ(config->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(config->rope_theta, 10000.0);
  EXPECT_FALSE(config->rope_scaling.has_value());
  EXPECT_FALSE(config->tie_word_embeddings);
  EXPECT_FALSE(config->attention_qkv_bias);
  EXPECT_FALSE(config->attention_output_bias);
  EXPECT_FALSE(config->mlp_bias);
  EXPECT_EQ(config->bos_token_id, 1);
  EXPECT_EQ(config->eos_token_id, 2);
  EXPECT_EQ(config->eos_token_ids, std::vector<int64_t>{2});
  EXPECT_EQ(config->torch_dtype, "float32");
  EXPECT_EQ(config->hidden_act, "silu");
  EXPECT_FALSE(config->sliding_window.has_value());
  EXPECT_EQ(ParameterCount(*config), 1100048384u);
}

TEST(ParseHfConfigJsonTest, MatchesTheTinyLlamaPreset) {
  StatusOr<ModelConfig> parsed = ParseHfConfigJson(kTinyLlamaJson, "config.json");
  ASSERT_TRUE(parsed.ok());
  ModelConfig preset = *FindPreset("tinyllama-1.1b");
  preset.hf_repo_id.clear();  // the only thing config.json cannot say
  EXPECT_EQ(*parsed, preset);
}

TEST(ParseHfConfigJsonTest, Llama3RopeScalingTiedEmbeddingsAndEosList) {
  StatusOr<ModelConfig> config = ParseHfConfigJson(kLlama32Json, "config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_TRUE(config->rope_scaling.has_value());
  EXPECT_EQ(config->rope_scaling->rope_type, "llama3");
  EXPECT_DOUBLE_EQ(config->rope_scaling->factor, 32.0);
  EXPECT_DOUBLE_EQ(config->rope_scaling->low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(config->rope_scaling->high_freq_factor, 4.0);
  EXPECT_EQ(config->rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(config->rope_theta, 500000.0);
  EXPECT_TRUE(config->tie_word_embeddings);
  EXPECT_EQ(config->eos_token_id, 128001);
  EXPECT_EQ(config->eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(config->bos_token_id, 128000);
  // Llama 3.2 1B has 1,235,814,400 parameters (tied embeddings counted once).
  EXPECT_EQ(ParameterCount(*config), 1235814400u);
}

// bench/models/llama-3.2-1b, the GPU peer's second model (deploy/gpu-check), is the published shape
// above: the base model's config.json, whose only EOS id is 128001.
TEST(ParseHfConfigJsonTest, BenchLlama32IsThePublishedShape) {
  const std::filesystem::path source_dir = testing::SourceDir();
  StatusOr<ModelConfig> bench = LoadHfConfig((source_dir / "bench/models/llama-3.2-1b").string());
  ASSERT_TRUE(bench.ok()) << bench.status().ToString();
  StatusOr<ModelConfig> published = ParseHfConfigJson(kLlama32Json, "config.json");
  ASSERT_TRUE(published.ok()) << published.status().ToString();
  published->eos_token_ids = {128001};
  EXPECT_EQ(ToHfConfigJson(*bench).dump(1), ToHfConfigJson(*published).dump(1));
  EXPECT_EQ(ParameterCount(*bench), 1235814400u);

  // Its CPU stand-in keeps what makes the shape differ from TinyLlama's: the vocabulary, the tying
  // and the rope scaling.
  StatusOr<ModelConfig> tiny = LoadHfConfig((source_dir / "bench/models/llama-3.2-tiny").string());
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  EXPECT_EQ(tiny->vocab_size, bench->vocab_size);
  EXPECT_TRUE(tiny->tie_word_embeddings);
  EXPECT_EQ(tiny->rope_scaling, bench->rope_scaling);
  EXPECT_DOUBLE_EQ(tiny->rope_theta, bench->rope_theta);
}

TEST(ParseHfConfigJsonTest, RopeScalingAcceptsTheOlderTypeKey) {
  StatusOr<ModelConfig> config = ParseHfConfigJson(
      Minimal(R"("rope_scaling": {"type": "llama3", "factor": 8, "low_freq_factor": 1,
                 "high_freq_factor": 4, "original_max_position_embeddings": 8192})"),
      "config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_TRUE(config->rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(config->rope_scaling->factor, 8.0);
}

TEST(ParseHfConfigJsonTest, RopeScalingDefaultTypeMeansNone) {
  StatusOr<ModelConfig> config =
      ParseHfConfigJson(Minimal(R"("rope_scaling": {"rope_type": "default"})"), "config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_FALSE(config->rope_scaling.has_value());
}

TEST(ParseHfConfigJsonTest, RopeParametersFromTransformers5) {
  // transformers 5 moves rope_theta into "rope_parameters", with rope_type "default" when unscaled.
  StatusOr<ModelConfig> config = ParseHfConfigJson(
      Minimal(R"("rope_parameters": {"rope_type": "default", "rope_theta": 500000.0})"),
      "config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_DOUBLE_EQ(config->rope_theta, 500000.0);
  EXPECT_FALSE(config->rope_scaling.has_value());

  config = ParseHfConfigJson(
      Minimal(R"("rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192})"),
      "config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_DOUBLE_EQ(config->rope_theta, 500000.0);
  ASSERT_TRUE(config->rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(config->rope_scaling->factor, 32.0);

  EXPECT_NE(ParseError(Minimal(R"("rope_parameters": {"rope_type": "yarn", "factor": 4.0})"))
                .find("'rope_parameters.rope_type' is 'yarn'"),
            std::string::npos);
}

TEST(ParseHfConfigJsonTest, RejectsUnsupportedRopeScaling) {
  const std::string message =
      ParseError(Minimal(R"("rope_scaling": {"type": "linear", "factor": 2.0})"));
  EXPECT_NE(message.find("config.json: field 'rope_scaling.rope_type' is 'linear'"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("supported: llama3"), std::string::npos) << message;
  EXPECT_NE(
      ParseError(Minimal(R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0})")).find("yarn"),
      std::string::npos);
}

TEST(ParseHfConfigJsonTest, RejectsIncompleteLlama3Scaling) {
  EXPECT_NE(ParseError(Minimal(R"("rope_scaling": {"rope_type": "llama3", "factor": 8})"))
                .find("missing required field 'rope_scaling.low_freq_factor'"),
            std::string::npos);
  EXPECT_NE(
      ParseError(Minimal(R"("rope_scaling": {"factor": 8})")).find("'rope_scaling.rope_type'"),
      std::string::npos);
  EXPECT_NE(ParseError(Minimal(R"("rope_scaling": {"rope_type": "llama3", "factor": 8,
                                  "low_freq_factor": 4, "high_freq_factor": 1,
                                  "original_max_position_embeddings": 8192})"))
                .find("rope_scaling.high_freq_factor"),
            std::string::npos);
  EXPECT_NE(ParseError(Minimal(R"("rope_scaling": "llama3")")).find("rope_scaling"),
            std::string::npos);
}

TEST(ParseHfConfigJsonTest, Qwen2HasQkvBiasButNoOutputBias) {
  StatusOr<ModelConfig> config = ParseHfConfigJson(kQwen2Json, "config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->model_type, "qwen2");
  EXPECT_TRUE(config->attention_qkv_bias);
  EXPECT_FALSE(config->attention_output_bias);
  EXPECT_EQ(config->head_dim, 64);
  EXPECT_FALSE(config->sliding_window.has_value());  // use_sliding_window is false
  // Qwen2-0.5B: 494,032,768 parameters.
  EXPECT_EQ(ParameterCount(*config), 494032768u);
}

TEST(ParseHfConfigJsonTest, AttentionBiasAppliesToAllFourProjections) {
  StatusOr<ModelConfig> config = ParseHfConfigJson(Minimal(R"("attention_bias": true)"), "c.json");
  ASSERT_TRUE(config.ok());
  EXPECT_TRUE(config->attention_qkv_bias);
  EXPECT_TRUE(config->attention_output_bias);
}

TEST(ParseHfConfigJsonTest, MistralSlidingWindow) {
  StatusOr<ModelConfig> config = ParseHfConfigJson(
      Minimal(R"("model_type": "mistral", "sliding_window": 4096)"), "config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->sliding_window, 4096);
  config =
      ParseHfConfigJson(Minimal(R"("model_type": "mistral", "sliding_window": null)"), "c.json");
  ASSERT_TRUE(config.ok());
  EXPECT_FALSE(config->sliding_window.has_value());
}

TEST(ParseHfConfigJsonTest, DefaultsFollowTransformers) {
  StatusOr<ModelConfig> config = ParseHfConfigJson(Minimal(), "config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->model_type, "llama");
  EXPECT_EQ(config->num_key_value_heads, 4);
  EXPECT_EQ(config->head_dim, 16);
  EXPECT_EQ(config->max_position_embeddings, 2048);
  EXPECT_DOUBLE_EQ(config->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(config->rope_theta, 10000.0);
  EXPECT_FALSE(config->tie_word_embeddings);
  EXPECT_FALSE(config->attention_qkv_bias);
  EXPECT_FALSE(config->mlp_bias);
  EXPECT_FALSE(config->bos_token_id.has_value());
  EXPECT_FALSE(config->eos_token_id.has_value());
  EXPECT_TRUE(config->eos_token_ids.empty());
  EXPECT_EQ(config->torch_dtype, "");
  EXPECT_EQ(config->hidden_act, "silu");
}

TEST(ParseHfConfigJsonTest, NullMeansDefault) {
  StatusOr<ModelConfig> config = ParseHfConfigJson(
      Minimal(R"("head_dim": null, "num_key_value_heads": null, "bos_token_id": null)"),
      "config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->head_dim, 16);
  EXPECT_EQ(config->num_key_value_heads, 4);
}

TEST(ParseHfConfigJsonTest, ExplicitHeadDimNeedNotDivideHidden) {
  // Mistral Nemo: hidden 5120, 32 heads, head_dim 128 (not 160).
  StatusOr<ModelConfig> config = ParseHfConfigJson(
      R"({"vocab_size": 131072, "hidden_size": 5120, "intermediate_size": 14336,
          "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
          "head_dim": 128, "model_type": "mistral"})",
      "config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->head_dim, 128);
}

TEST(ParseHfConfigJsonTest, NewerDtypeKey) {
  StatusOr<ModelConfig> config =
      ParseHfConfigJson(Minimal(R"("dtype": "bfloat16")"), "config.json");
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->torch_dtype, "bfloat16");
}

TEST(ParseHfConfigJsonTest, MissingRequiredFieldNamesFileAndField) {
  EXPECT_EQ(ParseError(R"({"vocab_size": 100, "intermediate_size": 128, "num_hidden_layers": 2,
                           "num_attention_heads": 4})"),
            "config.json: missing required field 'hidden_size'");
  for (std::string_view field : {"vocab_size", "hidden_size", "intermediate_size",
                                 "num_hidden_layers", "num_attention_heads"}) {
    nlohmann::json json = nlohmann::json::parse(Minimal());
    json.erase(std::string(field));
    EXPECT_EQ(ParseError(json.dump()),
              "config.json: missing required field '" + std::string(field) + "'");
  }
}

TEST(ParseHfConfigJsonTest, WrongTypes) {
  EXPECT_NE(
      ParseError(Minimal(R"("num_key_value_heads": "4")"))
          .find("config.json: field 'num_key_value_heads' must be an integer, got a string \"4\""),
      std::string::npos);
  EXPECT_NE(ParseError(R"({"vocab_size": 100, "hidden_size": 64.5, "intermediate_size": 128,
                           "num_hidden_layers": 2, "num_attention_heads": 4})")
                .find("field 'hidden_size' must be an integer"),
            std::string::npos);
  EXPECT_NE(ParseError(Minimal(R"("tie_word_embeddings": "yes")"))
                .find("'tie_word_embeddings' must be true"),
            std::string::npos);
  EXPECT_NE(
      ParseError(Minimal(R"("rms_norm_eps": "1e-5")")).find("'rms_norm_eps' must be a number"),
      std::string::npos);
  EXPECT_NE(
      ParseError(Minimal(R"("eos_token_id": [2, "x"])")).find("'eos_token_id' must be an integer"),
      std::string::npos);
  EXPECT_NE(ParseError(Minimal(R"("model_type": 7)")).find("'model_type' must be a string"),
            std::string::npos);
  EXPECT_NE(ParseError(Minimal(R"("vocab_size": 99999999999999999999)")).find("vocab_size"),
            std::string::npos);
}

// A config.json is another party's (a hub repository's): the values an error quotes are shown on
// one line, so that printing the error cannot move the cursor or forge a line of llmctl's.
TEST(ParseHfConfigJsonTest, QuotedValuesAreShownOnOneLine) {
  const std::string message =
      ParseError(Minimal(R"("model_type": "llama\u001b]0;T\u0007\r\nllmctl: FORGED")"));
  EXPECT_NE(message.find("is 'llama ]0;T   llmctl: FORGED', which llmctl cannot train"),
            std::string::npos)
      << message;
  EXPECT_NE(ParseError(Minimal(R"("hidden_act": "gelu\u202e\u009b2J")"))
                .find("is 'gelu  2J'; LLaMA-family MLPs use 'silu'"),
            std::string::npos);
  EXPECT_NE(
      ParseError(Minimal(R"("model_type": ")" + std::string(100, 'x') + "\"")).find("xx\u2026'"),
      std::string::npos);
}

TEST(ParseHfConfigJsonTest, NonPositiveSizes) {
  EXPECT_EQ(ParseError(R"({"vocab_size": 0, "hidden_size": 64, "intermediate_size": 128,
                           "num_hidden_layers": 2, "num_attention_heads": 4})"),
            "config.json: field 'vocab_size' must be positive, got 0");
  EXPECT_NE(ParseError(Minimal(R"("num_key_value_heads": -2)"))
                .find("'num_key_value_heads' must be positive"),
            std::string::npos);
  EXPECT_NE(ParseError(Minimal(R"("max_position_embeddings": 0)")).find("max_position_embeddings"),
            std::string::npos);
  EXPECT_NE(ParseError(Minimal(R"("rms_norm_eps": 0)")).find("rms_norm_eps"), std::string::npos);
}

// A config.json of widths 1 and 2 with 4e13 layers kept the estimate allocating and looping per
// layer until it ran out of memory; a shape past any published model's is refused by name.
TEST(ParseHfConfigJsonTest, SizesPastAnyPublishedModelsAreRefusedByField) {
  EXPECT_NE(ParseError(Minimal(R"("num_hidden_layers": 40000000000000)"))
                .find("config.json: field 'num_hidden_layers' is 40000000000000, more than 1024, "
                      "far past any published model's"),
            std::string::npos);
  EXPECT_NE(ParseError(Minimal(R"("vocab_size": 16777217)")).find("'vocab_size' is 16777217"),
            std::string::npos);
  EXPECT_NE(ParseError(Minimal(R"("intermediate_size": 262145)"))
                .find("'intermediate_size' is 262145, more than 262144"),
            std::string::npos);
  // The bounds themselves are taken.
  EXPECT_TRUE(ParseHfConfigJson(Minimal(R"("num_hidden_layers": 1024)"), "config.json").ok());
}

TEST(ParseHfConfigJsonTest, HeadCountsMustDivide) {
  EXPECT_NE(ParseError(R"({"vocab_size": 100, "hidden_size": 100, "intermediate_size": 128,
                           "num_hidden_layers": 2, "num_attention_heads": 3})")
                .find("config.json: field 'hidden_size' (100) is not divisible by "
                      "'num_attention_heads' (3)"),
            std::string::npos);
  EXPECT_NE(ParseError(Minimal(R"("num_key_value_heads": 3)"))
                .find("config.json: field 'num_attention_heads' (4) is not divisible by "
                      "'num_key_value_heads' (3)"),
            std::string::npos);
  EXPECT_NE(ParseError(Minimal(R"("head_dim": 15)")).find("'head_dim' (15) must be even"),
            std::string::npos);
}

TEST(ParseHfConfigJsonTest, OnlySiluAndLlamaFamilyModels) {
  EXPECT_NE(ParseError(Minimal(R"("hidden_act": "gelu")")).find("'hidden_act' is 'gelu'"),
            std::string::npos);
  const std::string message = ParseError(Minimal(R"("model_type": "gpt2")"));
  EXPECT_NE(message.find("'model_type' is 'gpt2'"), std::string::npos) << message;
  EXPECT_NE(message.find("llama, mistral, qwen2"), std::string::npos) << message;
}

TEST(ParseHfConfigJsonTest, MalformedJson) {
  const std::string message = ParseError(R"({"vocab_size": 100,)");
  EXPECT_EQ(message.rfind("config.json: invalid JSON: ", 0), 0u) << message;
  EXPECT_EQ(message.find("[json.exception"), std::string::npos) << message;
  EXPECT_NE(ParseError("[1, 2]").find("expected a JSON object"), std::string::npos);
  EXPECT_NE(ParseError("").find("invalid JSON"), std::string::npos);
}

// Found by tests/fuzz/hf_config_fuzz.cc: nlohmann throws out_of_range, not parse_error, for a
// number too large for a double, and that escaped as an uncaught exception.
TEST(ParseHfConfigJsonTest, NumberTooLargeForADoubleIsInvalidJson) {
  const std::string message = ParseError(Minimal(R"("rms_norm_eps": 1e999)"));
  EXPECT_EQ(message.rfind("config.json: invalid JSON: ", 0), 0u) << message;
  EXPECT_NE(message.find("1e999"), std::string::npos) << message;
  EXPECT_EQ(message.find("[json.exception"), std::string::npos) << message;
}

// Found while fuzzing (tests/fuzz/hf_config_fuzz.cc, by hand: inputs this deep exceed -max_len):
// quoting a deeply nested wrong-typed value in the message overflowed the stack.
TEST(ParseHfConfigJsonTest, DeeplyNestedWrongTypeIsAnError) {
  const std::string nested = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_EQ(ParseError(R"({"vocab_size": )" + nested + "}"),
            "config.json: field 'vocab_size' must be an integer, got a list [...]");
  EXPECT_NE(ParseError(Minimal(R"("eos_token_id": [[1, 2]])")).find("got a list [1,2]"),
            std::string::npos);
}

TEST(ToHfConfigJsonTest, RoundTrips) {
  for (std::string_view json : {kTinyLlamaJson, kLlama32Json, kQwen2Json}) {
    StatusOr<ModelConfig> config = ParseHfConfigJson(json, "config.json");
    ASSERT_TRUE(config.ok());
    StatusOr<ModelConfig> again = ParseHfConfigJson(ToHfConfigJson(*config).dump(), "written.json");
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(*again, *config) << ToHfConfigJson(*config).dump(2);
  }
  for (const std::string& name : PresetNames()) {
    ModelConfig preset = *FindPreset(name);
    preset.hf_repo_id.clear();
    StatusOr<ModelConfig> again = ParseHfConfigJson(ToHfConfigJson(preset).dump(), "written.json");
    ASSERT_TRUE(again.ok()) << name << ": " << again.status().ToString();
    EXPECT_EQ(*again, preset) << name;
  }
}

TEST(ToHfConfigJsonTest, WritesTheArchitecture) {
  const nlohmann::json json = ToHfConfigJson(*FindPreset("llmctl-demo"));
  EXPECT_EQ(json["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(json["tie_word_embeddings"], true);
  EXPECT_EQ(json["num_key_value_heads"], 2);
}

TEST(PresetTest, PublishedShapes) {
  const ModelConfig* tiny = FindPreset("tinyllama-1.1b");
  ASSERT_NE(tiny, nullptr);
  EXPECT_EQ(tiny->num_key_value_heads, 4);
  EXPECT_EQ(tiny->hf_repo_id, "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T");

  const ModelConfig* open3b = FindPreset("open_llama_3b");
  ASSERT_NE(open3b, nullptr);
  EXPECT_EQ(open3b->hidden_size, 3200);
  EXPECT_EQ(open3b->intermediate_size, 8640);
  EXPECT_EQ(open3b->num_hidden_layers, 26);
  EXPECT_EQ(open3b->num_attention_heads, 32);
  EXPECT_EQ(open3b->head_dim, 100);
  EXPECT_DOUBLE_EQ(open3b->rms_norm_eps, 1e-6);

  const ModelConfig* open13b = FindPreset("open_llama_13b");
  ASSERT_NE(open13b, nullptr);
  EXPECT_EQ(open13b->hidden_size, 5120);
  EXPECT_EQ(open13b->intermediate_size, 13824);
  EXPECT_EQ(open13b->num_hidden_layers, 40);
  EXPECT_EQ(open13b->num_attention_heads, 40);

  const ModelConfig* demo = FindPreset("llmctl-demo");
  ASSERT_NE(demo, nullptr);
  EXPECT_EQ(demo->vocab_size, 2048);
  EXPECT_EQ(demo->hidden_size, 128);
  EXPECT_EQ(demo->intermediate_size, 352);
  EXPECT_EQ(demo->num_hidden_layers, 4);
  EXPECT_EQ(demo->num_attention_heads, 4);
  EXPECT_EQ(demo->num_key_value_heads, 2);
  EXPECT_EQ(demo->head_dim, 32);
  EXPECT_EQ(demo->max_position_embeddings, 512);
  EXPECT_TRUE(demo->tie_word_embeddings);
  EXPECT_DOUBLE_EQ(demo->rms_norm_eps, 1e-5);
  EXPECT_EQ(demo->hf_repo_id, "");  // no pretrained weights
}

TEST(PresetTest, ParameterCounts) {
  EXPECT_EQ(ParameterCount(*FindPreset("tinyllama-1.1b")), 1100048384u);
  EXPECT_EQ(ParameterCount(*FindPreset("open_llama_7b")), 6738415616u);    // LLaMA-7B
  EXPECT_EQ(ParameterCount(*FindPreset("open_llama_13b")), 13015864320u);  // LLaMA-13B
  EXPECT_EQ(ParameterCount(*FindPreset("open_llama_3b")), 3426473600u);
  // Demo: 2048*128 embedding (tied) + 4 layers * (attention 128*(128+2*64+128) + MLP 3*128*352 +
  // 2*128)
  // + final norm 128.
  EXPECT_EQ(ParameterCount(*FindPreset("llmctl-demo")),
            2048u * 128 + 4u * (128u * 384 + 3u * 128 * 352 + 256) + 128);
}

TEST(ParameterCountTest, CountsBiases) {
  ModelConfig config = *FindPreset("llmctl-demo");
  const uint64_t without = ParameterCount(config);
  config.attention_qkv_bias = true;
  EXPECT_EQ(ParameterCount(config), without + 4u * (128 + 2 * 64));
  config.attention_output_bias = true;
  EXPECT_EQ(ParameterCount(config), without + 4u * (128 + 2 * 64 + 128));
  config.mlp_bias = true;
  EXPECT_EQ(ParameterCount(config), without + 4u * (128 + 2 * 64 + 128 + 2 * 352 + 128));
  config.tie_word_embeddings = false;
  EXPECT_EQ(ParameterCount(config),
            without + 4u * (128 + 2 * 64 + 128 + 2 * 352 + 128) + 2048u * 128);
}

// Found by tests/fuzz/hf_config_fuzz.cc: heads x head_dim overflowed int64_t (undefined behaviour)
// for sizes a config.json may state; counts too large for uint64_t now saturate.
TEST(ParameterCountTest, HugeSizesSaturate) {
  // A config.json of such sizes is refused (SizesPastAnyPublishedModelsAreRefusedByField); a
  // config made in code is counted all the same, and saturates.
  ModelConfig huge = *FindPreset("llmctl-demo");
  huge.vocab_size = std::numeric_limits<int64_t>::max();
  huge.hidden_size = std::numeric_limits<int64_t>::max() - 1;
  huge.intermediate_size = std::numeric_limits<int64_t>::max();
  huge.num_hidden_layers = std::numeric_limits<int64_t>::max();
  huge.num_attention_heads = 2;
  huge.num_key_value_heads = 2;
  huge.head_dim = int64_t{1} << 62;
  EXPECT_EQ(ParameterCount(huge), std::numeric_limits<uint64_t>::max());
  ModelConfig wide = *FindPreset("llmctl-demo");
  wide.num_attention_heads = 1 << 20;
  wide.num_key_value_heads = 1 << 20;
  wide.head_dim = int64_t{1} << 44;
  EXPECT_EQ(ParameterCount(wide), std::numeric_limits<uint64_t>::max());
}

TEST(PresetTest, EveryPresetIsValid) {
  const std::vector<std::string> names = PresetNames();
  EXPECT_EQ(names, (std::vector<std::string>{"tinyllama-1.1b", "open_llama_3b", "open_llama_7b",
                                             "open_llama_13b", "llmctl-demo"}));
  for (const std::string& name : names) {
    const ModelConfig* preset = FindPreset(name);
    ASSERT_NE(preset, nullptr) << name;
    EXPECT_TRUE(ValidateModelConfig(*preset).ok()) << name;
    EXPECT_EQ(CanonicalPresetName(name), name);
  }
}

TEST(PresetTest, AliasesAndCase) {
  EXPECT_EQ(FindPreset("TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T"),
            FindPreset("tinyllama-1.1b"));
  EXPECT_EQ(FindPreset("openlm-research/open_llama_3b"), FindPreset("open_llama_3b"));
  EXPECT_EQ(FindPreset("openlm-research/open_llama_7b"), FindPreset("open_llama_7b"));
  EXPECT_EQ(FindPreset("openlm-research/open_llama_13b"), FindPreset("open_llama_13b"));
  EXPECT_EQ(FindPreset("TinyLlama/TinyLlama-1.1B-Chat-v1.0"), nullptr);  // other weights
  EXPECT_EQ(FindPreset("TINYLLAMA-1.1B"), FindPreset("tinyllama-1.1b"));
  EXPECT_EQ(CanonicalPresetName("openlm-research/open_llama_7b"), "open_llama_7b");
  EXPECT_EQ(CanonicalPresetName("gpt2"), "");
  EXPECT_EQ(FindPreset(""), nullptr);
}

TEST(LoadHfConfigTest, ReadsConfigJsonFromADirectory) {
  TempDir dir;
  dir.Write("config.json", kTinyLlamaJson);
  StatusOr<ModelConfig> config = LoadHfConfig(dir.path().string());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->hidden_size, 2048);
}

TEST(LoadHfConfigTest, MissingFileIsNotFound) {
  TempDir dir;
  StatusOr<ModelConfig> config = LoadHfConfig(dir.path().string());
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), StatusCode::kNotFound);
  EXPECT_NE(config.status().message().find("config.json"), std::string::npos);
}

TEST(LoadHfConfigTest, ErrorsNameTheFullPath) {
  TempDir dir;
  dir.Write("config.json", R"({"vocab_size": 10})");
  StatusOr<ModelConfig> config = LoadHfConfig(dir.path().string());
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().message(),
            (dir.path() / "config.json").string() + ": missing required field 'hidden_size'");
}

TEST(ResolveModelTest, PresetsDirectoriesAndConfigFiles) {
  StatusOr<ModelConfig> preset = ResolveModel("open_llama_7b");
  ASSERT_TRUE(preset.ok());
  EXPECT_EQ(preset->hidden_size, 4096);

  TempDir dir;
  dir.Write("tiny/config.json", kQwen2Json);
  StatusOr<ModelConfig> from_dir = ResolveModel((dir.path() / "tiny").string());
  ASSERT_TRUE(from_dir.ok()) << from_dir.status().ToString();
  EXPECT_EQ(from_dir->model_type, "qwen2");
  StatusOr<ModelConfig> from_file = ResolveModel((dir.path() / "tiny" / "config.json").string());
  ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
  EXPECT_EQ(*from_file, *from_dir);
}

TEST(ResolveModelTest, UnknownModelSuggestsAPreset) {
  StatusOr<ModelConfig> model = ResolveModel("tinylama-1.1b");
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kNotFound);
  const std::string& message = model.status().message();
  EXPECT_NE(message.find("unknown model 'tinylama-1.1b' (did you mean 'tinyllama-1.1b'?)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("llmctl-demo"), std::string::npos) << message;
  EXPECT_EQ(ResolveModel("meta-llama/Llama-2-7b-hf").status().message().find("did you mean"),
            std::string::npos);
  EXPECT_FALSE(ResolveModel("").ok());
}

TEST(ResolveModelTest, DirectoryWithoutConfigJson) {
  TempDir dir;
  StatusOr<ModelConfig> model = ResolveModel(dir.path().string());
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("has no config.json"), std::string::npos);
}

}  // namespace
}  // namespace llmctl

namespace llmctl {
namespace {

TEST(HubModelRefTest, ParsesRepoAndRevision) {
  StatusOr<HubModelRef> ref = ParseHubModelRef("hf:TinyLlama/TinyLlama_v1.1");
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  EXPECT_EQ(*ref, (HubModelRef{"TinyLlama/TinyLlama_v1.1", "main"}));
  ref = ParseHubModelRef("hf:openlm-research/open_llama_3b@refs/pr/1");
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  EXPECT_EQ(*ref, (HubModelRef{"openlm-research/open_llama_3b", "refs/pr/1"}));
  EXPECT_EQ(HubModelRefText(*ref), "hf:openlm-research/open_llama_3b@refs/pr/1");
}

TEST(HubModelRefTest, RefusesMalformedReferences) {
  for (const char* bad : {"hf:", "hf:name-only", "hf:a/b/c", "hf:a/b@", "hf:a/../b", "hf:a/b@../x",
                          "hf:a/b@/main", "hf:a b/c", "hf:org/na--me", "hf:a/b@x y"}) {
    StatusOr<HubModelRef> ref = ParseHubModelRef(bad);
    EXPECT_FALSE(ref.ok()) << bad;
    EXPECT_EQ(ref.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(ref.status().message().find(std::string("model ") + bad), std::string::npos)
        << ref.status().message();
  }
  EXPECT_FALSE(MakeHubModelRef("org/name", "a..b").ok());
  EXPECT_TRUE(MakeHubModelRef("org/name", "").ok());
}

TEST(HubModelRefTest, ResolveModelSaysOnlyAnAgentDownloads) {
  StatusOr<ModelConfig> model = ResolveModel("hf:TinyLlama/TinyLlama_v1.1@main");
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(model.status().message().find("submit the experiment with llmctl"), std::string::npos);
  EXPECT_NE(model.status().message().find("huggingface-cli download TinyLlama/TinyLlama_v1.1 "
                                          "--revision main"),
            std::string::npos)
      << model.status().message();
  EXPECT_EQ(ResolveModel("hf:bad").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace llmctl
