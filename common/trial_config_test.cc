#include "common/trial_config.h"

#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>

namespace llmctl {
namespace {

// A config that passes validation with no model: only data.path is required.
TrialConfig Valid() {
  TrialConfig config;
  EXPECT_TRUE(config.SetFromText("data.path", "train.jsonl").ok());
  return config;
}

std::string ProblemMessage(const TrialConfig& config, const ModelConfig* model = nullptr) {
  Status status = ValidateTrialConfig(config, model);
  EXPECT_FALSE(status.ok());
  if (!status.ok()) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  }
  return status.message();
}

std::vector<std::string> ProblemKeys(const TrialConfig& config,
                                     const ModelConfig* model = nullptr) {
  std::optional<ConfigProblem> problem = FindConfigProblem(config, model);
  return problem ? problem->keys : std::vector<std::string>();
}

const KeySpec& Spec(std::string_view name) { return *FindTrialKey(name); }

TEST(ParseKeyValueTest, Scalars) {
  EXPECT_EQ(*ParseKeyValue(Spec("train.micro_batch_size"), "16"), KeyValue(int64_t{16}));
  EXPECT_EQ(*ParseKeyValue(Spec("train.micro_batch_size"), " +16 "), KeyValue(int64_t{16}));
  EXPECT_EQ(*ParseKeyValue(Spec("seed"), "-3"), KeyValue(int64_t{-3}));
  EXPECT_EQ(*ParseKeyValue(Spec("train.lr"), "2e-4"), KeyValue(2e-4));
  EXPECT_EQ(*ParseKeyValue(Spec("train.lr"), "1"), KeyValue(1.0));
  EXPECT_EQ(*ParseKeyValue(Spec("train.lr"), ".5"), KeyValue(0.5));
  EXPECT_EQ(*ParseKeyValue(Spec("precision"), "bf16-mixed"), KeyValue(std::string("bf16-mixed")));
  EXPECT_EQ(*ParseKeyValue(Spec("model"), "tinyllama-1.1b"),
            KeyValue(std::string("tinyllama-1.1b")));
  EXPECT_EQ(*ParseKeyValue(Spec("data.path"), "a b/c.jsonl"), KeyValue(std::string("a b/c.jsonl")));
  EXPECT_EQ(*ParseKeyValue(Spec("device_memory"), "24GiB"), KeyValue(std::string("24GiB")));
}

TEST(ParseKeyValueTest, Booleans) {
  for (std::string_view text : {"true", "True", "TRUE", "yes", "on"}) {
    EXPECT_EQ(*ParseKeyValue(Spec("activation_checkpointing"), text), KeyValue(true)) << text;
  }
  for (std::string_view text : {"false", "False", "no", "off"}) {
    EXPECT_EQ(*ParseKeyValue(Spec("activation_checkpointing"), text), KeyValue(false)) << text;
  }
  EXPECT_EQ(ParseKeyValue(Spec("activation_checkpointing"), "maybe").status().message(),
            "activation_checkpointing: expected true or false, got 'maybe'");
  EXPECT_FALSE(ParseKeyValue(Spec("activation_checkpointing"), "1").ok());
}

TEST(ParseKeyValueTest, Lists) {
  EXPECT_EQ(*ParseKeyValue(Spec("train.betas"), "[0.9, 0.999]"),
            KeyValue(std::vector<double>{0.9, 0.999}));
  EXPECT_EQ(*ParseKeyValue(Spec("train.betas"), "0.9,0.95"),
            KeyValue(std::vector<double>{0.9, 0.95}));
  EXPECT_EQ(*ParseKeyValue(Spec("train.betas"), "[]"), KeyValue(std::vector<double>{}));
  EXPECT_EQ(ParseKeyValue(Spec("train.betas"), "[0.9, x]").status().message(),
            "train.betas: expected a number in the list, got 'x'");
  EXPECT_FALSE(ParseKeyValue(Spec("train.betas"), "[0.9, 0.95").ok());
  EXPECT_EQ(*ParseKeyValueList(Spec("train.betas"), {"0.8", " 0.9 "}),
            KeyValue(std::vector<double>{0.8, 0.9}));
  EXPECT_FALSE(ParseKeyValueList(Spec("train.lr"), {"1"}).ok());
}

TEST(ParseKeyValueTest, StringListsThroughASyntheticKey) {
  // No registry key is a string list yet; the type is ready for the PEFT keys.
  const KeySpec targets{"lora.targets", KeyType::kStringList, "", {}, "LoRA targets"};
  EXPECT_EQ(*ParseKeyValue(targets, "[q_proj, 'v_proj']"),
            KeyValue(std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(*ParseKeyValueList(targets, {"q", " k "}),
            KeyValue(std::vector<std::string>{"q", "k"}));
  EXPECT_EQ(FormatKeyValue(*ParseKeyValue(targets, "a,b")), "[a, b]");
}

// A key or value given on a command line (llmctl plan's and llm-train's --set) may be any length:
// a 100,000-character one was quoted whole.
TEST(TrialConfigTest, ALongKeyOrValueIsQuotedAtMost200Bytes) {
  TrialConfig config;
  const std::string long_text(100'000, 'x');
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"train.lr", long_text},
                                                        {"train.micro_batch_size", long_text},
                                                        {"precision", long_text},
                                                        {"peft.targets", "[" + long_text},
                                                        {"train.betas", "[1, " + long_text + "]"},
                                                        {"train." + long_text, "1"}}) {
    const Status status = config.SetFromText(key, value);
    ASSERT_FALSE(status.ok()) << key.substr(0, 40);
    EXPECT_LT(status.message().size(), 600u) << status.message().substr(0, 600);
    EXPECT_NE(status.message().find("xxx…'"), std::string::npos) << status.message().substr(0, 600);
  }
}

TEST(ParseKeyValueTest, ErrorsNameKeyAndText) {
  EXPECT_EQ(ParseKeyValue(Spec("train.micro_batch_size"), "abc").status().message(),
            "train.micro_batch_size: expected an integer, got 'abc'");
  EXPECT_EQ(ParseKeyValue(Spec("train.micro_batch_size"), "1.5").status().message(),
            "train.micro_batch_size: expected an integer, got '1.5'");
  EXPECT_EQ(ParseKeyValue(Spec("train.lr"), "fast").status().message(),
            "train.lr: expected a number, got 'fast'");
  EXPECT_FALSE(ParseKeyValue(Spec("train.lr"), "inf").ok());
  EXPECT_FALSE(ParseKeyValue(Spec("train.lr"), "nan").ok());
  // A count past 64 bits is a number too large, not a word.
  EXPECT_EQ(
      ParseKeyValue(Spec("train.micro_batch_size"), "99999999999999999999").status().message(),
      "train.micro_batch_size: '99999999999999999999' is more than 1048576, the most llmctl "
      "takes");
  EXPECT_EQ(ParseKeyValue(Spec("train.lr"), "1e999").status().message(),
            "train.lr: '1e999' is past the range of a double (about 1e-308 to 1e308 from 0)");
  EXPECT_EQ(ParseKeyValue(Spec("seed"), "-99999999999999999999").status().message(),
            "seed: '-99999999999999999999' is less than any value it takes");
  EXPECT_EQ(
      ParseKeyValue(Spec("precision"), "bf16").status().message(),
      "precision: 'bf16' is not allowed; choose one of 32-true, bf16-true, bf16-mixed, 16-mixed");
  EXPECT_EQ(ParseKeyValue(Spec("precision"), "bf16-ture").status().message(),
            "precision: 'bf16-ture' is not allowed; choose one of 32-true, bf16-true, bf16-mixed, "
            "16-mixed (did you mean 'bf16-true'?)");
  EXPECT_NE(ParseKeyValue(Spec("device_memory"), "lots")
                .status()
                .message()
                .find("device_memory: invalid byte size 'lots'"),
            std::string::npos);
  EXPECT_EQ(ParseKeyValue(Spec("train.lr"), "").status().message(),
            "train.lr: a value is required (expected a number)");
}

TEST(FormatKeyValueTest, YamlFlowText) {
  EXPECT_EQ(FormatKeyValue(true), "true");
  EXPECT_EQ(FormatKeyValue(int64_t{16}), "16");
  EXPECT_EQ(FormatKeyValue(2e-4), "2e-04");  // the shortest text that reads back exactly
  EXPECT_EQ(FormatKeyValue(0.95), "0.95");
  EXPECT_EQ(FormatKeyValue(1e-8), "1e-08");
  EXPECT_EQ(FormatKeyValue(std::string("bf16-true")), "bf16-true");
  EXPECT_EQ(FormatKeyValue(std::vector<double>{0.9, 0.95}), "[0.9, 0.95]");
  EXPECT_EQ(FormatKeyValue(std::vector<std::string>{}), "[]");
}

TEST(TrialConfigTest, DefaultsForEveryKey) {
  const TrialConfig config;
  EXPECT_EQ(config.GetString("model"), "llmctl-demo");
  EXPECT_EQ(config.GetString("init"), "random");
  EXPECT_EQ(config.GetString("tokenizer"), "");
  EXPECT_EQ(config.GetString("data.path"), "");
  EXPECT_EQ(config.GetString("data.format"), "alpaca");
  EXPECT_EQ(config.GetString("data.template"), "alpaca");
  EXPECT_TRUE(config.GetBool("data.mask_prompt"));
  EXPECT_EQ(config.GetInt("data.samples"), 0);
  EXPECT_EQ(config.GetInt("data.max_seq_length"), 512);
  EXPECT_EQ(config.GetInt("train.micro_batch_size"), 1);
  EXPECT_EQ(config.GetInt("train.global_batch_size"), 1);
  EXPECT_DOUBLE_EQ(config.GetFloat("train.lr"), 2e-4);
  EXPECT_EQ(config.GetInt("train.warmup_steps"), 0);
  EXPECT_EQ(config.GetInt("train.max_steps"), 0);
  EXPECT_EQ(config.GetInt("train.epochs"), 1);
  EXPECT_EQ(config.GetFloatList("train.betas"), (std::vector<double>{0.9, 0.95}));
  EXPECT_DOUBLE_EQ(config.GetFloat("train.eps"), 1e-8);
  EXPECT_DOUBLE_EQ(config.GetFloat("train.weight_decay"), 0.0);
  EXPECT_DOUBLE_EQ(config.GetFloat("train.grad_clip"), 0.0);
  EXPECT_DOUBLE_EQ(config.GetFloat("train.momentum"), 0.0);
  EXPECT_EQ(config.GetString("precision"), "32-true");
  EXPECT_EQ(config.GetString("optimizer"), "adamw");
  EXPECT_FALSE(config.GetBool("activation_checkpointing"));
  EXPECT_EQ(config.GetString("device"), "cpu");
  EXPECT_EQ(config.GetInt("devices"), 1);
  EXPECT_FALSE(config.GetByteSize("device_memory").has_value());
  EXPECT_EQ(config.GetInt("seed"), 42);
  EXPECT_EQ(config.GetInt("snapshot_every"), 50);
  EXPECT_EQ(config.GetInt("log_every"), 1);
  EXPECT_EQ(config.GetString("output_dir"), "");
  EXPECT_EQ(config.GetInt("checkpoint_every"), 0);
  for (const KeySpec& spec : TrialKeys()) EXPECT_FALSE(config.IsSet(spec.name)) << spec.name;
}

TEST(TrialConfigTest, GlobalBatchFollowsMicroBatchUntilSet) {
  TrialConfig config;
  ASSERT_TRUE(config.SetFromText("train.micro_batch_size", "8").ok());
  EXPECT_EQ(config.GetInt("train.global_batch_size"), 8);
  EXPECT_FALSE(config.IsSet("train.global_batch_size"));
  ASSERT_TRUE(config.SetFromText("train.global_batch_size", "32").ok());
  EXPECT_EQ(config.GetInt("train.global_batch_size"), 32);
  ASSERT_TRUE(config.SetFromText("train.micro_batch_size", "4").ok());
  EXPECT_EQ(config.GetInt("train.global_batch_size"), 32);
  ASSERT_TRUE(config.SetFromText("train.global_batch_size", "").ok());  // back to following
  EXPECT_EQ(config.GetInt("train.global_batch_size"), 4);
}

TEST(TrialConfigTest, RanksAreDevicesPerNodeOnlyUnderDataParallelStrategies) {
  TrialConfig config;
  ASSERT_TRUE(config.SetFromText("devices", "4").ok());
  ASSERT_TRUE(config.SetFromText("nodes", "3").ok());
  // No strategy: one process, whatever the devices.
  EXPECT_EQ(RanksPerNode(config), 1);
  EXPECT_EQ(DataParallelRanks(config), 1);
  for (const char* strategy : {"ddp", "fsdp"}) {
    ASSERT_TRUE(config.SetFromText("strategy", strategy).ok());
    EXPECT_EQ(RanksPerNode(config), 4) << strategy;
    EXPECT_EQ(DataParallelRanks(config), 12) << strategy;
  }
}

TEST(TrialConfigTest, SetFromTextAndIsSet) {
  TrialConfig config;
  ASSERT_TRUE(config.SetFromText("precision", "bf16-true").ok());
  EXPECT_EQ(config.GetString("precision"), "bf16-true");
  EXPECT_TRUE(config.IsSet("precision"));
  ASSERT_TRUE(config.SetFromText("seed", "42").ok());  // set, even though equal to the default
  EXPECT_TRUE(config.IsSet("seed"));
  ASSERT_TRUE(config.SetFromText("device_memory", "1.5GiB").ok());
  EXPECT_EQ(config.GetByteSize("device_memory"), uint64_t{1610612736});
  EXPECT_EQ(config.GetString("device_memory"), "1.5GiB");
  ASSERT_TRUE(config.SetFromText("device_memory", "").ok());
  EXPECT_FALSE(config.GetByteSize("device_memory").has_value());
  ASSERT_TRUE(config.SetFromText("train.betas", "[0.8, 0.99]").ok());
  EXPECT_EQ(config.GetFloatList("train.betas"), (std::vector<double>{0.8, 0.99}));
  EXPECT_FALSE(config.IsSet("nonexistent.key"));
}

TEST(TrialConfigTest, SetFromTextErrors) {
  TrialConfig config;
  EXPECT_EQ(config.SetFromText("trian.lr", "1e-3").message(),
            "unknown key 'trian.lr' (did you mean 'train.lr'?)");
  EXPECT_EQ(config.SetFromText("learning_rate", "1e-3").message(),
            "unknown key 'learning_rate' (did you mean 'train.lr'?)");
  EXPECT_EQ(config.SetFromText("bananas", "1").message(), "unknown key 'bananas'");
  EXPECT_EQ(config.SetFromText("train.micro_batch_size", "many").message(),
            "train.micro_batch_size: expected an integer, got 'many'");
  EXPECT_EQ(config.SetFromText("model", "").message(),
            "model: a value is required (expected a string)");
  EXPECT_EQ(config.SetFromText("train", "1").code(), StatusCode::kInvalidArgument);
  // A failed set leaves the value alone.
  EXPECT_EQ(config.GetInt("train.micro_batch_size"), 1);
  EXPECT_FALSE(config.IsSet("train.micro_batch_size"));
}

TEST(TrialConfigTest, SetChecksTypes) {
  TrialConfig config;
  EXPECT_TRUE(config.Set("train.lr", int64_t{1}).ok());  // an integer is a number
  EXPECT_DOUBLE_EQ(config.GetFloat("train.lr"), 1.0);
  EXPECT_EQ(config.Set("train.micro_batch_size", 2.5).message(),
            "train.micro_batch_size: expected an integer");
  EXPECT_FALSE(config.Set("precision", std::string("fp8")).ok());
  EXPECT_FALSE(config.Set("precision", true).ok());
  EXPECT_FALSE(config.Set("device_memory", std::string("huge")).ok());
  EXPECT_FALSE(config.Set("train.betas", std::vector<std::string>{"a"}).ok());
  EXPECT_FALSE(config.Set("train.lr", std::numeric_limits<double>::infinity()).ok());
  EXPECT_FALSE(config.Set("no.such.key", true).ok());
  EXPECT_TRUE(config.Set("activation_checkpointing", true).ok());
  EXPECT_TRUE(config.GetBool("activation_checkpointing"));
  EXPECT_TRUE(config.Set("tokenizer", std::string("")).ok());
  EXPECT_FALSE(config.Set("model", std::string("")).ok());
}

TEST(TrialConfigTest, GenericGet) {
  TrialConfig config;
  EXPECT_EQ(config.Get("train.lr"), KeyValue(2e-4));
  EXPECT_EQ(config.Get("train.global_batch_size"), KeyValue(int64_t{1}));
  EXPECT_FALSE(config.Get("tokenizer").has_value());
  EXPECT_FALSE(config.Get("nope").has_value());
}

TEST(TrialConfigDeathTest, GetterMisuseAborts) {
  const TrialConfig config;
  EXPECT_DEATH((void)config.GetInt("train.lr"), "train.lr");
  EXPECT_DEATH((void)config.GetString("no.such.key"), "no such key");
}

TEST(TrialConfigTest, ToJsonCarriesExactlyTheSetKeys) {
  TrialConfig config;
  ASSERT_TRUE(config.SetFromText("train.micro_batch_size", "16").ok());
  ASSERT_TRUE(config.SetFromText("precision", "32-true").ok());  // set to its default: still set
  ASSERT_TRUE(config.SetFromText("device_memory", "").ok());     // set to "no value"
  EXPECT_EQ(config.ToJson(), nlohmann::json::parse(R"({"train": {"micro_batch_size": 16},
                                                       "precision": "32-true",
                                                       "device_memory": null})"));
  EXPECT_EQ(TrialConfig().ToJson(), nlohmann::json::object());
}

TEST(TrialConfigTest, EffectiveJsonIsNestedAndComplete) {
  TrialConfig config;
  ASSERT_TRUE(config.SetFromText("train.micro_batch_size", "16").ok());
  ASSERT_TRUE(config.SetFromText("device_memory", "24GiB").ok());
  const nlohmann::json json = config.EffectiveJson();
  EXPECT_EQ(json["model"], "llmctl-demo");
  EXPECT_EQ(json["train"]["micro_batch_size"], 16);
  EXPECT_EQ(json["train"]["global_batch_size"], 16);
  EXPECT_DOUBLE_EQ(json["train"]["lr"].get<double>(), 2e-4);
  EXPECT_EQ(json["train"]["betas"], nlohmann::json::array({0.9, 0.95}));
  EXPECT_EQ(json["data"]["mask_prompt"], true);
  EXPECT_TRUE(json["data"]["path"].is_null());
  EXPECT_EQ(json["device_memory"], "24GiB");
  EXPECT_TRUE(json.contains("checkpoint_every"));
  size_t leaves = 0;
  for (const auto& [key, value] : json.items()) leaves += value.is_object() ? value.size() : 1;
  EXPECT_EQ(leaves, TrialKeys().size());
}

TEST(TrialConfigTest, JsonRoundTrip) {
  TrialConfig config = Valid();
  ASSERT_TRUE(config.SetFromText("precision", "bf16-mixed").ok());
  ASSERT_TRUE(config.SetFromText("train.betas", "[0.9, 0.999]").ok());
  ASSERT_TRUE(config.SetFromText("train.global_batch_size", "8").ok());
  ASSERT_TRUE(config.SetFromText("device_memory", "2GB").ok());
  ASSERT_TRUE(config.SetFromText("peft.method", "none").ok());  // its default, set explicitly
  StatusOr<TrialConfig> back = TrialConfig::FromJson(config.ToJson());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, config);
  EXPECT_EQ(back->ToJson(), config.ToJson());
  for (const KeySpec& spec : TrialKeys()) {
    EXPECT_EQ(back->IsSet(spec.name), config.IsSet(spec.name)) << spec.name;
  }
  EXPECT_TRUE(ValidateTrialConfig(*back, nullptr).ok());
}

TEST(TrialConfigTest, FromJsonAcceptsDottedSubsets) {
  StatusOr<TrialConfig> config = TrialConfig::FromJson(nlohmann::json::parse(
      R"({"train.lr": 0.001, "data": {"path": "x.jsonl"}, "device_memory": 1024})"));
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_DOUBLE_EQ(config->GetFloat("train.lr"), 1e-3);
  EXPECT_EQ(config->GetString("data.path"), "x.jsonl");
  EXPECT_EQ(config->GetByteSize("device_memory"), uint64_t{1024});
  EXPECT_TRUE(config->IsSet("train.lr"));
  EXPECT_FALSE(config->IsSet("seed"));
}

TEST(TrialConfigTest, FromJsonErrors) {
  EXPECT_EQ(
      TrialConfig::FromJson(nlohmann::json::parse(R"({"trian": {"lr": 1}})")).status().message(),
      "unknown key 'trian' (did you mean 'train'?)");
  EXPECT_NE(TrialConfig::FromJson(nlohmann::json::parse(R"({"train": {"micro_batch_size": "8"}})"))
                .status()
                .message()
                .find("train.micro_batch_size: expected an integer, got \"8\""),
            std::string::npos);
  EXPECT_FALSE(TrialConfig::FromJson(nlohmann::json::parse(R"({"precision": "fp8"})")).ok());
  EXPECT_FALSE(
      TrialConfig::FromJson(nlohmann::json::parse(R"({"train": {"betas": [0.9, "x"]}})")).ok());
  EXPECT_FALSE(TrialConfig::FromJson(nlohmann::json::parse(R"({"seed": null})")).ok());
  EXPECT_FALSE(TrialConfig::FromJson(nlohmann::json::parse("[1]")).ok());
  EXPECT_FALSE(TrialConfig::FromJson(nlohmann::json::parse(R"({"train": 5})")).ok());
}

TEST(TrialConfigTest, EqualityIgnoresWhetherAValueWasDefaulted) {
  TrialConfig a;
  TrialConfig b;
  EXPECT_EQ(a, b);
  ASSERT_TRUE(b.SetFromText("precision", "32-true").ok());
  EXPECT_EQ(a, b);
  ASSERT_TRUE(b.SetFromText("precision", "bf16-true").ok());
  EXPECT_FALSE(a == b);
}

TEST(ValidateTrialConfigTest, AcceptsDefaultsWithData) {
  EXPECT_TRUE(ValidateTrialConfig(Valid(), nullptr).ok());
  EXPECT_TRUE(ValidateTrialConfig(Valid(), FindPreset("llmctl-demo")).ok());
}

TEST(ValidateTrialConfigTest, DataPathIsRequired) {
  const std::string message = ProblemMessage(TrialConfig());
  EXPECT_EQ(message.rfind("data.path is required", 0), 0u) << message;
  EXPECT_EQ(ProblemKeys(TrialConfig()), std::vector<std::string>{"data.path"});
}

TEST(ValidateTrialConfigTest, GlobalBatchMustBeAMultipleOfMicroBatch) {
  TrialConfig config = Valid();
  ASSERT_TRUE(config.SetFromText("train.micro_batch_size", "4").ok());
  ASSERT_TRUE(config.SetFromText("train.global_batch_size", "10").ok());
  EXPECT_EQ(ProblemMessage(config),
            "train.global_batch_size (10) must be a multiple of train.micro_batch_size (4): each "
            "optimizer step accumulates whole micro-batches");
  EXPECT_EQ(ProblemKeys(config),
            (std::vector<std::string>{"train.global_batch_size", "train.micro_batch_size"}));
  ASSERT_TRUE(config.SetFromText("train.global_batch_size", "12").ok());
  EXPECT_TRUE(ValidateTrialConfig(config, nullptr).ok());
  ASSERT_TRUE(config.SetFromText("devices", "2").ok());
  EXPECT_NE(ProblemMessage(config).find("train.micro_batch_size (4) x devices (2) = 8"),
            std::string::npos);
  EXPECT_EQ(ProblemKeys(config).back(), "devices");
}

// nodes x devices ranks (Lightning's num_nodes x devices): only the data-parallel strategies
// start more than one process, and every rank on every node takes micro-batches.
TEST(ValidateTrialConfigTest, NodesNeedDdpOrFsdpAndCountInTheGlobalBatch) {
  TrialConfig config = Valid();
  EXPECT_EQ(config.GetInt("nodes"), 1);
  ASSERT_TRUE(config.SetFromText("train.micro_batch_size", "2").ok());
  ASSERT_TRUE(config.SetFromText("train.global_batch_size", "8").ok());
  ASSERT_TRUE(config.SetFromText("devices", "2").ok());
  ASSERT_TRUE(config.SetFromText("nodes", "2").ok());
  EXPECT_EQ(ProblemMessage(config),
            "nodes: 2 runs 2 x devices ranks, which only strategy ddp or fsdp starts, but strategy "
            "is auto; use strategy: ddp or fsdp, or nodes: 1");
  EXPECT_EQ(ProblemKeys(config), (std::vector<std::string>{"nodes", "strategy"}));
  for (const char* strategy : {"ddp", "fsdp"}) {
    ASSERT_TRUE(config.SetFromText("strategy", strategy).ok());
    EXPECT_TRUE(ValidateTrialConfig(config, nullptr).ok()) << strategy;
  }
  ASSERT_TRUE(config.SetFromText("train.global_batch_size", "4").ok());
  EXPECT_NE(ProblemMessage(config).find(
                "train.micro_batch_size (2) x devices (2) x nodes (2) = 8: each optimizer step"),
            std::string::npos)
      << ProblemMessage(config);
  EXPECT_EQ(ProblemKeys(config).back(), "nodes");
  // One device per node: the product still counts the nodes.
  ASSERT_TRUE(config.SetFromText("devices", "1").ok());
  EXPECT_TRUE(ValidateTrialConfig(config, nullptr).ok());
  ASSERT_TRUE(config.SetFromText("train.global_batch_size", "6").ok());
  EXPECT_NE(ProblemMessage(config).find("train.micro_batch_size (2) x nodes (2) = 4"),
            std::string::npos)
      << ProblemMessage(config);
  // nodes 1 is any strategy's.
  TrialConfig single = Valid();
  ASSERT_TRUE(single.SetFromText("nodes", "1").ok());
  EXPECT_TRUE(ValidateTrialConfig(single, nullptr).ok());
}

TEST(ValidateTrialConfigTest, SeqLengthWithinTheModelsContext) {
  TrialConfig config = Valid();
  ASSERT_TRUE(config.SetFromText("data.max_seq_length", "4096").ok());
  EXPECT_TRUE(ValidateTrialConfig(config, nullptr).ok());  // no model, no check
  EXPECT_EQ(ProblemMessage(config, FindPreset("tinyllama-1.1b")),
            "data.max_seq_length (4096) exceeds the model's max_position_embeddings (2048)");
  ASSERT_TRUE(config.SetFromText("data.max_seq_length", "1").ok());
  EXPECT_NE(ProblemMessage(config).find("data.max_seq_length must be at least 2"),
            std::string::npos);
}

TEST(ValidateTrialConfigTest, PositiveSizesAndCounts) {
  const std::pair<std::string_view, std::string_view> bad[] = {
      {"train.micro_batch_size", "0"},
      {"train.global_batch_size", "0"},
      {"train.epochs", "0"},
      {"devices", "0"},
      {"nodes", "0"},
      {"log_every", "0"},
      {"data.samples", "-1"},
      {"train.warmup_steps", "-1"},
      {"train.max_steps", "-5"},
      {"seed", "-1"},
      {"snapshot_every", "-1"},
      {"checkpoint_every", "-1"},
      {"profile.steps", "-1"},
      {"profile.first_step", "-1"},
  };
  for (const auto& [key, value] : bad) {
    TrialConfig config = Valid();
    ASSERT_TRUE(config.SetFromText(key, value).ok()) << key;
    const std::string message = ProblemMessage(config);
    EXPECT_EQ(message.rfind(std::string(key), 0), 0u) << key << ": " << message;
    EXPECT_EQ(ProblemKeys(config).front(), key);
  }
}

// Reproduced from issue 37: 2^32 for each of micro-batch, devices and global batch made
// micro x devices x nodes wrap to 0, and the multiple-of check's `global % 0` killed the process
// (SIGFPE: `llmctl estimate` exited 136, and llmctld's Submit runs the same check). The counts are
// bounded where a value enters a config, by every route: text (files, --set) and JSON (the store,
// the agent's trial file).
TEST(ValidateTrialConfigTest, CountsPastTheirBoundAreRefusedWhereTheyEnter) {
  TrialConfig config = Valid();
  EXPECT_EQ(config.SetFromText("devices", "4294967296").message(),
            "devices: 4294967296 is more than 4096, the most llmctl takes");
  EXPECT_EQ(config.SetFromText("train.micro_batch_size", "4294967296").message(),
            "train.micro_batch_size: 4294967296 is more than 1048576, the most llmctl takes");
  EXPECT_EQ(config.Set("train.global_batch_size", int64_t{4294967296}).message(),
            "train.global_batch_size: 4294967296 is more than 1073741824, the most llmctl takes");
  EXPECT_FALSE(TrialConfig::FromJson(nlohmann::json::parse(
                                         R"({"data": {"path": "t.jsonl"}, "devices": 4294967296,
                                             "train": {"micro_batch_size": 4294967296}})"))
                   .ok());
  // At the bounds, the products fit and the check answers.
  ASSERT_TRUE(config.SetFromText("devices", "4096").ok());
  ASSERT_TRUE(config.SetFromText("nodes", "65536").ok());
  ASSERT_TRUE(config.SetFromText("strategy", "ddp").ok());
  ASSERT_TRUE(config.SetFromText("train.micro_batch_size", "1048576").ok());
  ASSERT_TRUE(config.SetFromText("train.global_batch_size", "1073741824").ok());
  EXPECT_EQ(ProblemKeys(config),
            (std::vector<std::string>{"train.global_batch_size", "train.micro_batch_size",
                                      "devices", "nodes"}));
}

// Every integer key with a bound takes the bound and refuses one more, whose message names the key.
TEST(ValidateTrialConfigTest, EveryBoundedIntegerKeyTakesItsBoundAndNoMore) {
  int bounded = 0;
  for (const KeySpec& spec : TrialKeys()) {
    if (spec.type != KeyType::kInt || spec.max_int == std::numeric_limits<int64_t>::max()) continue;
    ++bounded;
    TrialConfig config;
    EXPECT_TRUE(config.Set(spec.name, spec.max_int).ok()) << spec.name;
    const Status refused = config.Set(spec.name, spec.max_int + 1);
    EXPECT_EQ(refused.message().rfind(std::string(spec.name) + ": ", 0), 0u) << refused.message();
    EXPECT_EQ(config.GetInt(spec.name), spec.max_int) << "a refused set leaves the value alone";
  }
  EXPECT_EQ(bounded, 15);
}

TEST(ValidateTrialConfigTest, ProfileKeys) {
  TrialConfig unprofiled = Valid();
  ASSERT_TRUE(unprofiled.SetFromText("profile.first_step", "3").ok());
  EXPECT_EQ(ProblemMessage(unprofiled),
            "profile.first_step applies to profiled steps, but profile.steps is 0; set "
            "profile.steps (e.g. 2) or remove profile.first_step");
  TrialConfig no_history = Valid();
  ASSERT_TRUE(no_history.SetFromText("profile.memory_history", "false").ok());
  EXPECT_EQ(ProblemKeys(no_history).front(), "profile.memory_history");

  TrialConfig past_the_end = Valid();
  ASSERT_TRUE(past_the_end.SetFromText("train.max_steps", "4").ok());
  ASSERT_TRUE(past_the_end.SetFromText("profile.steps", "2").ok());
  ASSERT_TRUE(past_the_end.SetFromText("profile.first_step", "3").ok());
  EXPECT_EQ(ProblemMessage(past_the_end),
            "profile: steps 3 to 4 are profiled, but train.max_steps 4 ends the run after step 3");
  ASSERT_TRUE(past_the_end.SetFromText("profile.first_step", "2").ok());
  EXPECT_TRUE(ValidateTrialConfig(past_the_end, nullptr).ok());
}

TEST(ValidateTrialConfigTest, OptimizerSettings) {
  auto problem_with = [](std::string_view key, std::string_view value) {
    TrialConfig config = Valid();
    EXPECT_TRUE(config.SetFromText(key, value).ok()) << key;
    return ProblemMessage(config);
  };
  EXPECT_EQ(problem_with("train.lr", "-1e-3"), "train.lr must not be negative, got -0.001");
  EXPECT_NE(problem_with("train.betas", "[0.9]").find("exactly two"), std::string::npos);
  EXPECT_NE(problem_with("train.betas", "[0.9, 0.95, 0.99]").find("exactly two"),
            std::string::npos);
  EXPECT_NE(problem_with("train.betas", "[0.9, 1.0]").find("in [0, 1)"), std::string::npos);
  EXPECT_NE(problem_with("train.betas", "[-0.1, 0.9]").find("in [0, 1)"), std::string::npos);
  EXPECT_NE(problem_with("train.eps", "0").find("train.eps must be positive"), std::string::npos);
  EXPECT_NE(problem_with("train.weight_decay", "-0.1").find("must not be negative"),
            std::string::npos);
  EXPECT_NE(problem_with("train.grad_clip", "-1").find("must not be negative"), std::string::npos);
  EXPECT_NE(problem_with("train.momentum", "1.0").find("in [0, 1)"), std::string::npos);
  EXPECT_EQ(problem_with("train.momentum", "0.9"),
            "train.momentum applies only to optimizer sgd, but optimizer is adamw; remove "
            "train.momentum or set optimizer: sgd");

  TrialConfig sgd = Valid();
  ASSERT_TRUE(sgd.SetFromText("optimizer", "sgd").ok());
  ASSERT_TRUE(sgd.SetFromText("train.momentum", "0.9").ok());
  EXPECT_TRUE(ValidateTrialConfig(sgd, nullptr).ok());
  TrialConfig zero_lr = Valid();
  ASSERT_TRUE(zero_lr.SetFromText("train.lr", "0").ok());
  EXPECT_TRUE(ValidateTrialConfig(zero_lr, nullptr).ok());
}

// DDP averages the gradients in .grad after backward; offload and optimizer_in_backward take them
// before that.
TEST(ValidateTrialConfigTest, DdpRefusesTechniquesThatTakeTheGradientsEarly) {
  TrialConfig ddp = Valid();
  ASSERT_TRUE(ddp.SetFromText("strategy", "ddp").ok());
  ASSERT_TRUE(ddp.SetFromText("devices", "2").ok());
  ASSERT_TRUE(ddp.SetFromText("train.global_batch_size", "2").ok());
  EXPECT_TRUE(ValidateTrialConfig(ddp, nullptr).ok());
  TrialConfig offload = ddp;
  ASSERT_TRUE(offload.SetFromText("offload", "optimizer").ok());
  EXPECT_NE(ProblemMessage(offload).find("strategy: ddp averages the gradients"),
            std::string::npos);
  TrialConfig in_backward = ddp;
  ASSERT_TRUE(in_backward.SetFromText("optimizer_in_backward", "true").ok());
  EXPECT_NE(ProblemMessage(in_backward).find("which optimizer_in_backward does not wait for"),
            std::string::npos);
}

// What strategy fsdp does not build yet (a host copy of the shards beside them, the optimizer in
// backward, fp16 loss scaling over shards) is refused naming both keys; LoRA, QLoRA and 8-bit AdamW
// run on shards, but merging the adapter from shards is not built.
TEST(ValidateTrialConfigTest, FsdpRefusesWhatItDoesNotBuild) {
  TrialConfig fsdp = Valid();
  ASSERT_TRUE(fsdp.SetFromText("strategy", "fsdp").ok());
  ASSERT_TRUE(fsdp.SetFromText("devices", "2").ok());
  ASSERT_TRUE(fsdp.SetFromText("train.global_batch_size", "2").ok());
  EXPECT_TRUE(ValidateTrialConfig(fsdp, nullptr).ok());
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"offload", "optimizer"}, {"optimizer_in_backward", "true"}, {"precision", "16-mixed"}};
  for (const auto& [key, value] : refused) {
    TrialConfig other = fsdp;
    ASSERT_TRUE(other.SetFromText(key, value).ok()) << key;
    EXPECT_EQ(ProblemKeys(other), (std::vector<std::string>{"strategy", key})) << key;
    EXPECT_NE(ProblemMessage(other).find("strategy: fsdp"), std::string::npos) << key;
  }
  TrialConfig qlora = fsdp;
  ASSERT_TRUE(qlora.SetFromText("peft.method", "qlora").ok());
  EXPECT_TRUE(ValidateTrialConfig(qlora, nullptr).ok());
  TrialConfig eight_bit = fsdp;
  ASSERT_TRUE(eight_bit.SetFromText("optimizer", "adamw_8bit").ok());
  EXPECT_TRUE(ValidateTrialConfig(eight_bit, nullptr).ok());
  TrialConfig lora = fsdp;
  ASSERT_TRUE(lora.SetFromText("peft.method", "lora").ok());
  EXPECT_TRUE(ValidateTrialConfig(lora, nullptr).ok());
  ASSERT_TRUE(lora.SetFromText("peft.save_merged", "true").ok());
  EXPECT_EQ(ProblemKeys(lora), (std::vector<std::string>{"strategy", "peft.save_merged"}));
}

// offload: full is fsdp's: the shards, their gradients and AdamW's state on the host. Without
// shards (one device, ddp, fsdp on one device) it is refused, naming both keys.
TEST(ValidateTrialConfigTest, FullOffloadNeedsFsdpShards) {
  TrialConfig fsdp = Valid();
  ASSERT_TRUE(fsdp.SetFromText("strategy", "fsdp").ok());
  ASSERT_TRUE(fsdp.SetFromText("devices", "2").ok());
  ASSERT_TRUE(fsdp.SetFromText("train.global_batch_size", "2").ok());
  ASSERT_TRUE(fsdp.SetFromText("offload", "full").ok());
  EXPECT_TRUE(ValidateTrialConfig(fsdp, nullptr).ok());
  // The global norm is the shards' (on the host), so clipping stays available.
  ASSERT_TRUE(fsdp.SetFromText("train.grad_clip", "1.0").ok());
  EXPECT_TRUE(ValidateTrialConfig(fsdp, nullptr).ok());
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"strategy", "auto"}, {"strategy", "ddp"}, {"devices", "1"}}) {
    TrialConfig other = fsdp;
    ASSERT_TRUE(other.SetFromText(key, value).ok()) << key;
    if (key == "devices") {
      ASSERT_TRUE(other.SetFromText("train.global_batch_size", "1").ok());
    }
    EXPECT_EQ(ProblemKeys(other), (std::vector<std::string>{"offload", "strategy"})) << value;
    EXPECT_NE(ProblemMessage(other).find("offload: full"), std::string::npos) << value;
  }
}

// A list that is not one says what a list of its kind looks like.
TEST(ParseKeyValueTest, ABrokenListShowsAListOfItsKind) {
  TrialConfig config;
  Status strings = config.SetFromText("peft.targets", "[q_proj,");
  EXPECT_NE(strings.message().find("expected a list like [q_proj, v_proj]"), std::string::npos)
      << strings.message();
  Status numbers = config.SetFromText("train.betas", "[0.9, 0.95");
  EXPECT_NE(numbers.message().find("expected a list like [0.9, 0.95]"), std::string::npos)
      << numbers.message();
}

TEST(ApplyLabSpellingsTest, DeepSpeedStage3OffloadIsFsdpWithFullOffload) {
  TrialConfig zero3 = Valid();
  ASSERT_TRUE(zero3.SetFromText("optimizer", "deepspeed_cpu").ok());
  ASSERT_TRUE(zero3.SetFromText("strategy", "deepspeed_stage_3_offload").ok());
  ASSERT_TRUE(zero3.SetFromText("devices", "2").ok());
  ASSERT_TRUE(zero3.SetFromText("train.global_batch_size", "2").ok());
  ApplyLabSpellings(zero3);
  EXPECT_EQ(zero3.GetString("optimizer"), "adamw");
  EXPECT_EQ(zero3.GetString("offload"), "full");
  EXPECT_EQ(zero3.GetString("strategy"), "fsdp");
  EXPECT_TRUE(ValidateTrialConfig(zero3, nullptr).ok());

  TrialConfig sgd = Valid();
  ASSERT_TRUE(sgd.SetFromText("optimizer", "sgd").ok());
  ASSERT_TRUE(sgd.SetFromText("strategy", "deepspeed_stage_3_offload").ok());
  ApplyLabSpellings(sgd);
  EXPECT_EQ(ProblemKeys(sgd), (std::vector<std::string>{"strategy", "optimizer"}));
}

TEST(ApplyLabSpellingsTest, LabOptimizerNamesBecomeLlmctls) {
  TrialConfig eight_bit = Valid();
  ASSERT_TRUE(eight_bit.SetFromText("optimizer", "adam_8bit").ok());
  ApplyLabSpellings(eight_bit);
  EXPECT_EQ(eight_bit.GetString("optimizer"), "adamw_8bit");
  EXPECT_TRUE(ValidateTrialConfig(eight_bit, nullptr).ok());

  TrialConfig offload = Valid();
  ASSERT_TRUE(offload.SetFromText("optimizer", "deepspeed_cpu").ok());
  ASSERT_TRUE(offload.SetFromText("strategy", "deepspeed_stage_2_offload").ok());
  ApplyLabSpellings(offload);
  EXPECT_EQ(offload.GetString("optimizer"), "adamw");
  EXPECT_EQ(offload.GetString("offload"), "optimizer");
  EXPECT_EQ(offload.GetString("strategy"), "auto");
  EXPECT_TRUE(ValidateTrialConfig(offload, nullptr).ok());

  TrialConfig alone = Valid();
  ASSERT_TRUE(alone.SetFromText("optimizer", "deepspeed_cpu").ok());
  ApplyLabSpellings(alone);
  EXPECT_EQ(ProblemKeys(alone), (std::vector<std::string>{"optimizer", "strategy"}));
  EXPECT_NE(ProblemMessage(alone).find("offload: optimizer"), std::string::npos);

  TrialConfig sgd_offload = Valid();
  ASSERT_TRUE(sgd_offload.SetFromText("optimizer", "sgd").ok());
  ASSERT_TRUE(sgd_offload.SetFromText("strategy", "deepspeed_stage_2_offload").ok());
  ApplyLabSpellings(sgd_offload);
  EXPECT_EQ(ProblemKeys(sgd_offload).front(), "strategy");
}

TEST(ValidateTrialConfigTest, TechniquesThatCannotRunTogether) {
  auto problem_with = [](std::vector<std::pair<std::string, std::string>> settings) {
    TrialConfig config = Valid();
    for (const auto& [key, value] : settings)
      EXPECT_TRUE(config.SetFromText(key, value).ok()) << key;
    return ProblemMessage(config);
  };
  EXPECT_EQ(problem_with({{"offload", "optimizer"}, {"optimizer", "sgd"}}),
            "offload: optimizer keeps AdamW's fp32 state on the host, but optimizer is sgd; use "
            "optimizer: adamw or offload: none");
  EXPECT_NE(problem_with({{"offload", "optimizer"}, {"train.grad_clip", "1.0"}})
                .find("set train.grad_clip: 0 or offload: none"),
            std::string::npos);
  EXPECT_NE(problem_with({{"offload", "optimizer"}, {"precision", "16-mixed"}})
                .find("16-mixed loss scaling"),
            std::string::npos);
  EXPECT_NE(problem_with({{"optimizer_in_backward", "true"},
                          {"train.micro_batch_size", "2"},
                          {"train.global_batch_size", "4"}})
                .find("gradients cannot accumulate"),
            std::string::npos);
  EXPECT_NE(problem_with({{"optimizer_in_backward", "true"}, {"train.grad_clip", "1.0"}})
                .find("train.grad_clip: 0"),
            std::string::npos);
  EXPECT_NE(problem_with({{"optimizer_in_backward", "true"}, {"precision", "16-mixed"}})
                .find("loss scaling"),
            std::string::npos);

  TrialConfig in_backward = Valid();
  ASSERT_TRUE(in_backward.SetFromText("optimizer_in_backward", "true").ok());
  ASSERT_TRUE(in_backward.SetFromText("loss", "chunked_ce").ok());
  EXPECT_TRUE(ValidateTrialConfig(in_backward, nullptr).ok());
}

TEST(ValidateTrialConfigTest, AdapterSettings) {
  auto problem_with = [](std::vector<std::pair<std::string, std::string>> settings) {
    TrialConfig config = Valid();
    for (const auto& [key, value] : settings)
      EXPECT_TRUE(config.SetFromText(key, value).ok()) << key;
    return ProblemMessage(config);
  };
  EXPECT_EQ(problem_with({{"peft.r", "16"}}),
            "peft.r applies to adapters, but peft.method is none; set peft.method: lora or qlora, "
            "or remove peft.r");
  EXPECT_EQ(problem_with({{"peft.adapter", "adapters/run-1"}}),
            "peft.adapter applies to adapters, but peft.method is none; set peft.method: lora or "
            "qlora, or remove peft.adapter");
  EXPECT_EQ(problem_with({{"peft.method", "lora"}, {"peft.r", "0"}}),
            "peft.r must be at least 1, got 0");
  EXPECT_NE(problem_with({{"peft.method", "lora"}, {"peft.alpha", "0"}}).find("positive"),
            std::string::npos);
  EXPECT_NE(problem_with({{"peft.method", "lora"}, {"peft.dropout", "1"}}).find("[0, 1)"),
            std::string::npos);
  EXPECT_EQ(problem_with({{"peft.method", "lora"}, {"peft.targets", "[q_proj, query]"}}),
            "peft.targets: unknown projection 'query' (known: q_proj, k_proj, v_proj, o_proj, "
            "out_proj, gate_proj, up_proj, down_proj, fc1, fc2, q, k, v, o, wi_0, wi_1, wi, wo, "
            "lm_head)");
  EXPECT_EQ(problem_with({{"peft.method", "lora"}, {"peft.targets", "[q_proj, q_proj]"}}),
            "peft.targets: 'q_proj' is listed twice");
  EXPECT_NE(problem_with({{"peft.method", "lora"}, {"peft.double_quant", "false"}})
                .find("peft.method: qlora"),
            std::string::npos);

  TrialConfig qlora = Valid();
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"peft.method", "qlora"},
           {"peft.r", "32"},
           {"peft.alpha", "16"},
           {"peft.dropout", "0.05"},
           {"peft.targets",
            "[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head]"},
           {"peft.double_quant", "true"},
           {"peft.compute_dtype", "fp32"}}) {
    ASSERT_TRUE(qlora.SetFromText(key, value).ok()) << key;
  }
  EXPECT_TRUE(ValidateTrialConfig(qlora, nullptr).ok());
  ASSERT_TRUE(qlora.SetFromText("precision", "16-mixed").ok());
  EXPECT_TRUE(ValidateTrialConfig(qlora, nullptr).ok());  // compute_dtype fp32
  ASSERT_TRUE(qlora.SetFromText("peft.compute_dtype", "bf16").ok());
  EXPECT_NE(ProblemMessage(qlora).find("peft.compute_dtype bf16 with precision 16-mixed"),
            std::string::npos);
}

TEST(ValidateTrialConfigTest, DeviceMemoryMustBePositive) {
  TrialConfig config = Valid();
  ASSERT_TRUE(config.SetFromText("device_memory", "0").ok());
  EXPECT_NE(ProblemMessage(config).find("device_memory must be more than 0"), std::string::npos);
  ASSERT_TRUE(config.SetFromText("device_memory", "64MiB").ok());
  EXPECT_TRUE(ValidateTrialConfig(config, nullptr).ok());
}

TEST(ValidateTrialConfigTest, PretrainedNeedsPublishedWeights) {
  TrialConfig config = Valid();
  ASSERT_TRUE(config.SetFromText("init", "pretrained").ok());
  EXPECT_EQ(
      ProblemMessage(config),
      "init: pretrained needs published weights, and model llmctl-demo has none; use init: random");
  EXPECT_EQ(ProblemKeys(config), (std::vector<std::string>{"init", "model"}));
  ASSERT_TRUE(config.SetFromText("model", "tinyllama-1.1b").ok());
  EXPECT_TRUE(ValidateTrialConfig(config, FindPreset("tinyllama-1.1b")).ok());
  ASSERT_TRUE(config.SetFromText("model", "/models/some-dir").ok());  // weights are the directory's
  EXPECT_TRUE(ValidateTrialConfig(config, nullptr).ok());
}

TEST(ValidateTrialConfigTest, TextDataHasNoPrompt) {
  TrialConfig config = Valid();
  ASSERT_TRUE(config.SetFromText("data.format", "text").ok());
  EXPECT_TRUE(ValidateTrialConfig(config, nullptr).ok());  // defaults do not count against it
  ASSERT_TRUE(config.SetFromText("data.template", "alpaca").ok());
  EXPECT_NE(ProblemMessage(config).find("data.template alpaca needs instruction records"),
            std::string::npos);
  ASSERT_TRUE(config.SetFromText("data.template", "none").ok());
  ASSERT_TRUE(config.SetFromText("data.mask_prompt", "true").ok());
  EXPECT_NE(ProblemMessage(config).find("data.mask_prompt: true needs a prompt"),
            std::string::npos);
  ASSERT_TRUE(config.SetFromText("data.mask_prompt", "false").ok());
  EXPECT_TRUE(ValidateTrialConfig(config, nullptr).ok());
}

}  // namespace
}  // namespace llmctl
