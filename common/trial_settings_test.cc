// TrialSettings against the key registry: every key bound to exactly one field and every field to a
// key, and every key's value, default or set, read into its field unchanged.
#include "common/trial_settings.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "common/trial_config.h"

namespace llmctl {
namespace {

// The address of every field of every group. Each structured binding names all of its group's
// fields, so a field added to a group stops this file from compiling until it is listed here,
// and then EveryFieldHasExactlyOneKey asks for its key.
std::vector<const void*> AllFieldAddresses(const TrialSettings& settings) {
  const auto& [model, data, train, memory, peft, parallel, device, profile, output] = settings;
  const auto& [m1, m2, m3] = model;
  const auto& [d1, d2, d3, d4, d5, d6, d7] = data;
  const auto& [t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13] = train;
  const auto& [x1, x2, x3, x4, x5, x6] = memory;
  const auto& [p1, p2, p3, p4, p5, p6, p7, p8, p9, p10] = peft;
  const auto& [l1, l2, l3, l4] = parallel;
  const auto& [v1, v2, v3] = device;
  const auto& [f1, f2, f3] = profile;
  const auto& [o1, o2, o3, o4] = output;
  return {&m1, &m2, &m3, &d1, &d2, &d3,  &d4,  &d5,  &d6,  &d7, &t1,  &t2, &t3, &t4,
          &t5, &t6, &t7, &t8, &t9, &t10, &t11, &t12, &t13, &x1, &x2,  &x3, &x4, &x5,
          &x6, &p1, &p2, &p3, &p4, &p5,  &p6,  &p7,  &p8,  &p9, &p10, &l1, &l2, &l3,
          &l4, &v1, &v2, &v3, &f1, &f2,  &f3,  &o1,  &o2,  &o3, &o4};
}

// What the registry says `key` holds in `config`, as the bindings format it.
std::string RegistryText(const TrialConfig& config, std::string_view key) {
  const std::optional<KeyValue> value = config.Get(key);
  return value ? FormatKeyValue(*value) : "";
}

// A valid value of `spec` other than its default, as `--set` text.
std::string OtherValue(const KeySpec& spec) {
  const std::string default_text(spec.default_value);
  switch (spec.type) {
    case KeyType::kInt:
      return std::to_string(default_text.empty() ? 6 : std::stoll(default_text) + 1);
    case KeyType::kFloat:
      return default_text == "0.375" ? "0.625" : "0.375";
    case KeyType::kBool:
      return default_text == "true" ? "false" : "true";
    case KeyType::kEnum:
      return std::string(spec.allowed.front() == spec.default_value ? spec.allowed.back()
                                                                    : spec.allowed.front());
    case KeyType::kString:
    case KeyType::kPath:
      return "/tmp/settings-" + std::string(spec.name);
    case KeyType::kByteSize:
      return "3MiB";
    case KeyType::kFloatList:
      return "[0.5, 0.25]";
    case KeyType::kStringList:
      return "[q_proj, wo]";
  }
  return "";
}

TEST(TrialSettingsTest, BindingsFollowTheRegistryKeyForKey) {
  const std::vector<KeySpec>& keys = TrialKeys();
  const std::vector<TrialSettingBinding>& bindings = TrialSettingBindings();
  ASSERT_EQ(bindings.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(bindings[i].key, keys[i].name);
}

TEST(TrialSettingsTest, EveryFieldHasExactlyOneKey) {
  const TrialSettings settings;
  const std::vector<const void*> fields = AllFieldAddresses(settings);
  std::set<const void*> bound;
  for (const TrialSettingBinding& binding : TrialSettingBindings()) {
    const void* field = binding.field(settings);
    EXPECT_TRUE(bound.insert(field).second) << binding.key << " shares a field with another key";
    EXPECT_NE(std::find(fields.begin(), fields.end(), field), fields.end())
        << binding.key << " is bound outside the listed fields";
  }
  EXPECT_EQ(bound.size(), fields.size()) << "a field of TrialSettings has no key";
}

TEST(TrialSettingsTest, DefaultsReadIntoTheirFields) {
  const TrialConfig config;
  const TrialSettings& settings = config.settings();
  for (const TrialSettingBinding& binding : TrialSettingBindings()) {
    EXPECT_EQ(binding.format(settings), RegistryText(config, binding.key)) << binding.key;
  }
  EXPECT_EQ(settings.model.name, "llmctl-demo");
  EXPECT_EQ(settings.train.micro_batch_size, 1);
  EXPECT_EQ(settings.train.global_batch_size, 1);  // default_from train.micro_batch_size
  EXPECT_EQ(settings.train.betas, (std::vector<double>{0.9, 0.95}));
  EXPECT_EQ(settings.memory.precision, trial::Precision::k32True);
  EXPECT_TRUE(settings.data.mask_prompt);
  EXPECT_EQ(settings.parallel.ddp_bucket_size.bytes, uint64_t{25} << 20);
  EXPECT_EQ(settings.parallel.ddp_bucket_size.text, "25MiB");
  EXPECT_FALSE(settings.device.memory.has_value());
  EXPECT_EQ(settings.data.path, "");
}

// Each key set alone to a value other than its default changes its own field to that value and
// no other field (but train.global_batch_size, which follows train.micro_batch_size while unset).
TEST(TrialSettingsTest, EachSetValueReadsIntoItsFieldOnly) {
  const TrialConfig defaults;
  for (const KeySpec& spec : TrialKeys()) {
    TrialConfig config;
    const std::string text = OtherValue(spec);
    ASSERT_TRUE(config.SetFromText(spec.name, text).ok()) << spec.name << " = " << text;
    for (const TrialSettingBinding& binding : TrialSettingBindings()) {
      const std::string field = binding.format(config.settings());
      EXPECT_EQ(field, RegistryText(config, binding.key)) << spec.name << " set, " << binding.key;
      const bool follows =
          binding.key == "train.global_batch_size" && spec.name == "train.micro_batch_size";
      if (binding.key == spec.name || follows) {
        EXPECT_NE(field, binding.format(defaults.settings())) << spec.name << " did not change";
      } else {
        EXPECT_EQ(field, binding.format(defaults.settings()))
            << spec.name << " changed " << binding.key;
      }
    }
  }
}

TEST(TrialSettingsTest, EveryEnumValueReadsBackToItsName) {
  for (const KeySpec& spec : TrialKeys()) {
    if (spec.type != KeyType::kEnum) continue;
    for (std::string_view allowed : spec.allowed) {
      TrialConfig config;
      ASSERT_TRUE(config.SetFromText(spec.name, allowed).ok()) << spec.name << " = " << allowed;
      for (const TrialSettingBinding& binding : TrialSettingBindings()) {
        if (binding.key == spec.name) {
          EXPECT_EQ(binding.format(config.settings()), allowed);
        }
      }
    }
  }
  EXPECT_EQ(Name(trial::Precision::kBf16Mixed), "bf16-mixed");
  EXPECT_EQ(Name(trial::Strategy::kDeepspeedStage3Offload), "deepspeed_stage_3_offload");
  EXPECT_EQ(Name(trial::Device::kCuda), "cuda");
}

TEST(TrialSettingsTest, SettingsFollowEverySet) {
  TrialConfig config;
  ASSERT_TRUE(config.SetFromText("device_memory", "1.5GiB").ok());
  ASSERT_TRUE(config.settings().device.memory.has_value());
  EXPECT_EQ(config.settings().device.memory->bytes, uint64_t{3} << 29);
  EXPECT_EQ(config.settings().device.memory->text, "1.5GiB");
  ASSERT_TRUE(config.SetFromText("device_memory", "").ok());  // clears the budget
  EXPECT_FALSE(config.settings().device.memory.has_value());

  ASSERT_TRUE(config.Set("train.micro_batch_size", int64_t{4}).ok());
  EXPECT_EQ(config.settings().train.global_batch_size, 4);
  ASSERT_TRUE(config.Set("train.global_batch_size", int64_t{16}).ok());
  ASSERT_TRUE(config.Set("train.micro_batch_size", int64_t{2}).ok());
  EXPECT_EQ(config.settings().train.global_batch_size, 16);

  // A refused value leaves the settings as they were.
  EXPECT_FALSE(config.SetFromText("precision", "fp8").ok());
  EXPECT_EQ(config.settings().memory.precision, trial::Precision::k32True);

  StatusOr<TrialConfig> from_json =
      TrialConfig::FromJson(nlohmann::json::parse(R"({"peft": {"method": "qlora", "r": 4}})"));
  ASSERT_TRUE(from_json.ok());
  EXPECT_EQ(from_json->settings().peft.method, trial::PeftMethod::kQlora);
  EXPECT_EQ(from_json->settings().peft.r, 4);
}

}  // namespace
}  // namespace llmctl
