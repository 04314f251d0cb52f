#include "common/trial_keys.h"

#include <gtest/gtest.h>

#include <set>

#include "common/trial_config.h"

namespace llmctl {
namespace {

TEST(TrialKeysTest, NamesAreUniqueAndWellFormed) {
  std::set<std::string_view> names;
  for (const KeySpec& spec : TrialKeys()) {
    EXPECT_TRUE(names.insert(spec.name).second) << "duplicate key " << spec.name;
    EXPECT_FALSE(spec.name.empty());
    EXPECT_NE(spec.name.front(), '.') << spec.name;
    EXPECT_NE(spec.name.back(), '.') << spec.name;
    for (char c : spec.name) {
      EXPECT_TRUE(std::islower(static_cast<unsigned char>(c)) ||
                  std::isdigit(static_cast<unsigned char>(c)) || c == '_' || c == '.')
          << spec.name;
    }
    EXPECT_FALSE(spec.help.empty()) << spec.name;
    EXPECT_EQ(spec.help.find('\n'), std::string_view::npos)
        << spec.name << ": help must be one line";
    // A key may not also be a group ("train" and "train.lr" cannot both exist).
    EXPECT_FALSE(IsTrialKeyGroup(spec.name)) << spec.name;
  }
}

TEST(TrialKeysTest, DefaultsParseAsTheirType) {
  for (const KeySpec& spec : TrialKeys()) {
    if (spec.default_value.empty()) continue;
    StatusOr<KeyValue> value = ParseKeyValue(spec, spec.default_value);
    EXPECT_TRUE(value.ok()) << spec.name << ": " << value.status().ToString();
  }
}

TEST(TrialKeysTest, EnumsListTheirValuesAndOthersDoNot) {
  for (const KeySpec& spec : TrialKeys()) {
    if (spec.type == KeyType::kEnum) {
      EXPECT_GE(spec.allowed.size(), 2u) << spec.name;
      if (!spec.default_value.empty()) {
        EXPECT_NE(std::find(spec.allowed.begin(), spec.allowed.end(), spec.default_value),
                  spec.allowed.end())
            << spec.name;
      }
    } else {
      EXPECT_TRUE(spec.allowed.empty()) << spec.name;
    }
  }
}

TEST(TrialKeysTest, DefaultFromNamesAKeyOfTheSameType) {
  for (const KeySpec& spec : TrialKeys()) {
    if (spec.default_from.empty()) continue;
    EXPECT_TRUE(spec.default_value.empty()) << spec.name;
    const KeySpec* source = FindTrialKey(spec.default_from);
    ASSERT_NE(source, nullptr) << spec.name;
    EXPECT_EQ(source->type, spec.type) << spec.name;
    EXPECT_TRUE(source->default_from.empty()) << spec.name << ": no chains";
  }
}

TEST(TrialKeysTest, TheKeysTheTrainerNeeds) {
  struct Expected {
    std::string_view name;
    KeyType type;
    std::string_view default_value;
  };
  const Expected expected[] = {
      {"model", KeyType::kString, "llmctl-demo"},
      {"init", KeyType::kEnum, "random"},
      {"tokenizer", KeyType::kPath, ""},
      {"data.path", KeyType::kPath, ""},
      {"data.format", KeyType::kEnum, "alpaca"},
      {"data.caption_column", KeyType::kString, "text"},
      {"data.template", KeyType::kEnum, "alpaca"},
      {"data.mask_prompt", KeyType::kBool, "true"},
      {"data.samples", KeyType::kInt, "0"},
      {"data.max_seq_length", KeyType::kInt, "512"},
      {"train.micro_batch_size", KeyType::kInt, "1"},
      {"train.global_batch_size", KeyType::kInt, ""},
      {"train.lr", KeyType::kFloat, "2e-4"},
      {"train.warmup_steps", KeyType::kInt, "0"},
      {"train.max_steps", KeyType::kInt, "0"},
      {"train.epochs", KeyType::kInt, "1"},
      {"train.betas", KeyType::kFloatList, "[0.9, 0.95]"},
      {"train.eps", KeyType::kFloat, "1e-8"},
      {"train.weight_decay", KeyType::kFloat, "0.0"},
      {"train.grad_clip", KeyType::kFloat, "0.0"},
      {"train.momentum", KeyType::kFloat, "0.0"},
      {"precision", KeyType::kEnum, "32-true"},
      {"optimizer", KeyType::kEnum, "adamw"},
      {"offload", KeyType::kEnum, "none"},
      {"strategy", KeyType::kEnum, "auto"},
      {"optimizer_in_backward", KeyType::kBool, "false"},
      {"loss", KeyType::kEnum, "auto"},
      {"kernels", KeyType::kEnum, "fused"},
      {"peft.method", KeyType::kEnum, "none"},
      {"peft.r", KeyType::kInt, "8"},
      {"peft.alpha", KeyType::kFloat, "8"},
      {"peft.dropout", KeyType::kFloat, "0.0"},
      {"peft.targets", KeyType::kStringList, "[q_proj, v_proj]"},
      {"peft.double_quant", KeyType::kBool, "true"},
      {"peft.compute_dtype", KeyType::kEnum, "bf16"},
      {"peft.save_merged", KeyType::kBool, "false"},
      {"peft.adapter", KeyType::kPath, ""},
      {"freeze", KeyType::kStringList, "[]"},
      {"activation_checkpointing", KeyType::kBool, "false"},
      {"device", KeyType::kEnum, "cpu"},
      {"devices", KeyType::kInt, "1"},
      {"nodes", KeyType::kInt, "1"},
      {"ddp.bucket_size", KeyType::kByteSize, "25MiB"},
      {"fsdp.reshard_after_forward", KeyType::kBool, "true"},
      {"device_memory", KeyType::kByteSize, ""},
      {"seed", KeyType::kInt, "42"},
      {"snapshot_every", KeyType::kInt, "50"},
      {"profile.steps", KeyType::kInt, "0"},
      {"profile.first_step", KeyType::kInt, "2"},
      {"profile.memory_history", KeyType::kBool, "true"},
      {"log_every", KeyType::kInt, "1"},
      {"output_dir", KeyType::kPath, ""},
      {"checkpoint_every", KeyType::kInt, "0"},
  };
  for (const Expected& key : expected) {
    const KeySpec* spec = FindTrialKey(key.name);
    ASSERT_NE(spec, nullptr) << key.name;
    EXPECT_EQ(spec->type, key.type) << key.name;
    EXPECT_EQ(spec->default_value, key.default_value) << key.name;
  }
  EXPECT_EQ(TrialKeys().size(), std::size(expected));
  EXPECT_EQ(FindTrialKey("precision")->allowed,
            (std::vector<std::string_view>{"32-true", "bf16-true", "bf16-mixed", "16-mixed"}));
  EXPECT_EQ(FindTrialKey("train.global_batch_size")->default_from, "train.micro_batch_size");
}

TEST(FindTrialKeyTest, ExactMatchOnly) {
  EXPECT_NE(FindTrialKey("train.lr"), nullptr);
  EXPECT_EQ(FindTrialKey("train.lr")->name, "train.lr");
  EXPECT_EQ(FindTrialKey("Train.lr"), nullptr);
  EXPECT_EQ(FindTrialKey("lr"), nullptr);
  EXPECT_EQ(FindTrialKey("train"), nullptr);
  EXPECT_EQ(FindTrialKey(""), nullptr);
}

TEST(IsTrialKeyGroupTest, Groups) {
  EXPECT_TRUE(IsTrialKeyGroup("train"));
  EXPECT_TRUE(IsTrialKeyGroup("data"));
  EXPECT_TRUE(IsTrialKeyGroup("profile"));
  EXPECT_FALSE(IsTrialKeyGroup("tra"));  // a prefix of a segment is not a group
  EXPECT_FALSE(IsTrialKeyGroup("model"));
  EXPECT_FALSE(IsTrialKeyGroup(""));
  EXPECT_FALSE(IsTrialKeyGroup("train.lr"));
}

TEST(TrialKeysInGroupTest, ListsMembersInRegistryOrder) {
  const std::vector<std::string_view> data = TrialKeysInGroup("data");
  ASSERT_FALSE(data.empty());
  EXPECT_EQ(data.front(), "data.path");
  for (std::string_view name : data) EXPECT_EQ(name.substr(0, 5), "data.");
  EXPECT_TRUE(TrialKeysInGroup("model").empty());
  EXPECT_TRUE(TrialKeysInGroup("").empty());
}

TEST(NearestTrialKeyTest, Typos) {
  EXPECT_EQ(NearestTrialKey("trian.micro_batch_size"), "train.micro_batch_size");
  EXPECT_EQ(NearestTrialKey("train.mirco_batch_size"), "train.micro_batch_size");
  EXPECT_EQ(NearestTrialKey("precison"), "precision");
  EXPECT_EQ(NearestTrialKey("optimiser"), "optimizer");
  EXPECT_EQ(NearestTrialKey("lora_r"), "peft.r");
  EXPECT_EQ(NearestTrialKey("target_modules"), "peft.targets");
  EXPECT_EQ(NearestTrialKey("seeds"), "seed");
  EXPECT_EQ(NearestTrialKey("data.pth"), "data.path");
  EXPECT_EQ(NearestTrialKey("mdoel"), "model");
}

TEST(NearestTrialKeyTest, LastSegmentFindsTheRightGroup) {
  EXPECT_EQ(NearestTrialKey("micro_batch_size"), "train.micro_batch_size");
  EXPECT_EQ(NearestTrialKey("lr"), "train.lr");
  EXPECT_EQ(NearestTrialKey("data.lr"), "train.lr");
  EXPECT_EQ(NearestTrialKey("max_seq_length"), "data.max_seq_length");
  EXPECT_EQ(NearestTrialKey("epoch"), "train.epochs");
}

TEST(NearestTrialKeyTest, GroupNames) {
  EXPECT_EQ(NearestTrialKey("trian"), "train");
  EXPECT_EQ(NearestTrialKey("dat"), "data");
}

TEST(NearestTrialKeyTest, NamesFromOtherTools) {
  EXPECT_EQ(NearestTrialKey("learning_rate"), "train.lr");
  EXPECT_EQ(NearestTrialKey("train.learning_rate"), "train.lr");
  EXPECT_EQ(NearestTrialKey("num_train_samples"), "data.samples");
  EXPECT_EQ(NearestTrialKey("out_dir"), "output_dir");
  EXPECT_EQ(NearestTrialKey("gradient_checkpointing"), "activation_checkpointing");
  EXPECT_EQ(NearestTrialKey("lr_warmup_steps"), "train.warmup_steps");
}

TEST(NearestTrialKeyTest, NothingCloseGivesEmpty) {
  EXPECT_EQ(NearestTrialKey("banana_split"), "");
  EXPECT_EQ(NearestTrialKey("xyz"), "");
  EXPECT_EQ(NearestTrialKey(""), "");
}

TEST(KeyTypeNameTest, EveryTypeHasAName) {
  for (KeyType type :
       {KeyType::kString, KeyType::kInt, KeyType::kFloat, KeyType::kBool, KeyType::kEnum,
        KeyType::kByteSize, KeyType::kFloatList, KeyType::kStringList, KeyType::kPath}) {
    EXPECT_FALSE(KeyTypeName(type).empty());
  }
  EXPECT_EQ(KeyTypeName(KeyType::kInt), "integer");
}

TEST(TrialKeysMarkdownTableTest, OneRowPerKey) {
  const std::string table = TrialKeysMarkdownTable();
  EXPECT_EQ(table.rfind("| key | type | default | allowed | help |\n|---|---|---|---|---|\n", 0),
            0u);
  const size_t lines = static_cast<size_t>(std::count(table.begin(), table.end(), '\n'));
  EXPECT_EQ(lines, TrialKeys().size() + 2);
  EXPECT_NE(table.find("| `precision` | enum | `32-true` | `32-true`, `bf16-true`, `bf16-mixed`, "
                       "`16-mixed` |"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("| `train.global_batch_size` | integer | = `train.micro_batch_size` |"),
            std::string::npos);
  EXPECT_NE(table.find("| `device_memory` | byte size | (none) |"), std::string::npos);
  // Every row has exactly five cells.
  size_t start = 0;
  while (start < table.size()) {
    const size_t end = table.find('\n', start);
    const std::string line = table.substr(start, end - start);
    size_t pipes = 0;
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '|' && (i == 0 || line[i - 1] != '\\')) ++pipes;
    }
    EXPECT_EQ(pipes, 6u) << line;
    start = end + 1;
  }
}

}  // namespace
}  // namespace llmctl
