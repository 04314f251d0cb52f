#include "common/trial_settings.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <utility>

#include "common/byte_size.h"
#include "common/trial_config.h"

namespace llmctl {
namespace {

// A binding the registry and this table disagree on is a programming error the tests catch.
[[noreturn]] void BindingMisuse(std::string_view key, std::string_view problem) {
  std::fprintf(stderr, "llmctl: trial setting '%.*s': %.*s\n", static_cast<int>(key.size()),
               key.data(), static_cast<int>(problem.size()), problem.data());
  std::abort();
}

// The key each enum holds the values of.
template <typename E>
constexpr std::string_view kEnumKey = {};
template <>
constexpr std::string_view kEnumKey<trial::Init> = "init";
template <>
constexpr std::string_view kEnumKey<trial::DataFormat> = "data.format";
template <>
constexpr std::string_view kEnumKey<trial::PromptTemplate> = "data.template";
template <>
constexpr std::string_view kEnumKey<trial::Precision> = "precision";
template <>
constexpr std::string_view kEnumKey<trial::Optimizer> = "optimizer";
template <>
constexpr std::string_view kEnumKey<trial::Offload> = "offload";
template <>
constexpr std::string_view kEnumKey<trial::Strategy> = "strategy";
template <>
constexpr std::string_view kEnumKey<trial::Loss> = "loss";
template <>
constexpr std::string_view kEnumKey<trial::Kernels> = "kernels";
template <>
constexpr std::string_view kEnumKey<trial::PeftMethod> = "peft.method";
template <>
constexpr std::string_view kEnumKey<trial::ComputeDtype> = "peft.compute_dtype";
template <>
constexpr std::string_view kEnumKey<trial::Device> = "device";

template <typename E>
std::string_view EnumName(E value) {
  const KeySpec* spec = FindTrialKey(kEnumKey<E>);
  const auto index = static_cast<size_t>(value);
  if (spec == nullptr || index >= spec->allowed.size()) {
    BindingMisuse(kEnumKey<E>, "enum value " + std::to_string(index) + " has no allowed name");
  }
  return spec->allowed[index];
}

// A field's value from the key's (nullopt: the key has no value), and back. The TrialConfig
// checked the alternative against the key's type, so std::get cannot throw.
template <typename T>
T ReadField(const std::optional<KeyValue>& value, const KeySpec& spec) {
  if constexpr (std::is_enum_v<T>) {
    const std::string& text = std::get<std::string>(value.value());
    const auto it = std::find(spec.allowed.begin(), spec.allowed.end(), text);
    if (it == spec.allowed.end()) BindingMisuse(spec.name, "'" + text + "' is not allowed");
    return static_cast<T>(it - spec.allowed.begin());
  } else if constexpr (std::is_same_v<T, ByteSizeSetting>) {
    const std::string& text = std::get<std::string>(value.value());
    StatusOr<uint64_t> bytes = ParseByteSize(text);
    if (!bytes.ok()) BindingMisuse(spec.name, bytes.status().message());
    return ByteSizeSetting{*bytes, text};
  } else if constexpr (std::is_same_v<T, std::optional<ByteSizeSetting>>) {
    if (!value) return std::nullopt;
    return ReadField<ByteSizeSetting>(value, spec);
  } else {
    if (!value) return T{};  // a string, path or list key with no value
    return std::get<T>(*value);
  }
}

template <typename T>
std::optional<KeyValue> WriteField(const T& field) {
  if constexpr (std::is_enum_v<T>) {
    return KeyValue(std::string(Name(field)));
  } else if constexpr (std::is_same_v<T, ByteSizeSetting>) {
    return KeyValue(field.text);
  } else if constexpr (std::is_same_v<T, std::optional<ByteSizeSetting>>) {
    if (!field) return std::nullopt;
    return KeyValue(field->text);
  } else {
    return KeyValue(field);
  }
}

struct Binding {
  TrialSettingBinding binding;
  void (*assign)(const std::optional<KeyValue>& value, const KeySpec& spec,
                 TrialSettings& settings);
};

// `key`'s binding to settings.*Group.*Member.
template <auto Group, auto Member>
Binding Bind(std::string_view key) {
  return {
      {key, [](const TrialSettings& settings) -> const void* { return &(settings.*Group.*Member); },
       [](const TrialSettings& settings) -> std::string {
         const std::optional<KeyValue> value = WriteField(settings.*Group.*Member);
         return value ? FormatKeyValue(*value) : "";
       }},
      [](const std::optional<KeyValue>& value, const KeySpec& spec, TrialSettings& settings) {
        auto& field = settings.*Group.*Member;
        field = ReadField<std::remove_reference_t<decltype(field)>>(value, spec);
      }};
}

using S = TrialSettings;

// In the registry's order (TrialKeys()); ParseTrialSettings checks it.
const std::vector<Binding>* BuildBindings() {
  return new std::vector<Binding>{
      Bind<&S::model, &ModelSettings::name>("model"),
      Bind<&S::model, &ModelSettings::init>("init"),
      Bind<&S::model, &ModelSettings::tokenizer>("tokenizer"),
      Bind<&S::data, &DataSettings::path>("data.path"),
      Bind<&S::data, &DataSettings::format>("data.format"),
      Bind<&S::data, &DataSettings::caption_column>("data.caption_column"),
      Bind<&S::data, &DataSettings::prompt_template>("data.template"),
      Bind<&S::data, &DataSettings::mask_prompt>("data.mask_prompt"),
      Bind<&S::data, &DataSettings::samples>("data.samples"),
      Bind<&S::data, &DataSettings::max_seq_length>("data.max_seq_length"),
      Bind<&S::train, &TrainSettings::micro_batch_size>("train.micro_batch_size"),
      Bind<&S::train, &TrainSettings::global_batch_size>("train.global_batch_size"),
      Bind<&S::train, &TrainSettings::lr>("train.lr"),
      Bind<&S::train, &TrainSettings::warmup_steps>("train.warmup_steps"),
      Bind<&S::train, &TrainSettings::max_steps>("train.max_steps"),
      Bind<&S::train, &TrainSettings::epochs>("train.epochs"),
      Bind<&S::train, &TrainSettings::betas>("train.betas"),
      Bind<&S::train, &TrainSettings::eps>("train.eps"),
      Bind<&S::train, &TrainSettings::weight_decay>("train.weight_decay"),
      Bind<&S::train, &TrainSettings::grad_clip>("train.grad_clip"),
      Bind<&S::train, &TrainSettings::momentum>("train.momentum"),
      Bind<&S::memory, &MemorySettings::precision>("precision"),
      Bind<&S::train, &TrainSettings::optimizer>("optimizer"),
      Bind<&S::memory, &MemorySettings::offload>("offload"),
      Bind<&S::parallel, &ParallelSettings::strategy>("strategy"),
      Bind<&S::memory, &MemorySettings::optimizer_in_backward>("optimizer_in_backward"),
      Bind<&S::memory, &MemorySettings::loss>("loss"),
      Bind<&S::memory, &MemorySettings::kernels>("kernels"),
      Bind<&S::peft, &PeftSettings::method>("peft.method"),
      Bind<&S::peft, &PeftSettings::r>("peft.r"),
      Bind<&S::peft, &PeftSettings::alpha>("peft.alpha"),
      Bind<&S::peft, &PeftSettings::dropout>("peft.dropout"),
      Bind<&S::peft, &PeftSettings::targets>("peft.targets"),
      Bind<&S::peft, &PeftSettings::double_quant>("peft.double_quant"),
      Bind<&S::peft, &PeftSettings::compute_dtype>("peft.compute_dtype"),
      Bind<&S::peft, &PeftSettings::save_merged>("peft.save_merged"),
      Bind<&S::peft, &PeftSettings::adapter>("peft.adapter"),
      Bind<&S::peft, &PeftSettings::freeze>("freeze"),
      Bind<&S::memory, &MemorySettings::activation_checkpointing>("activation_checkpointing"),
      Bind<&S::device, &DeviceSettings::kind>("device"),
      Bind<&S::device, &DeviceSettings::count>("devices"),
      Bind<&S::parallel, &ParallelSettings::nodes>("nodes"),
      Bind<&S::parallel, &ParallelSettings::ddp_bucket_size>("ddp.bucket_size"),
      Bind<&S::parallel, &ParallelSettings::fsdp_reshard_after_forward>(
          "fsdp.reshard_after_forward"),
      Bind<&S::device, &DeviceSettings::memory>("device_memory"),
      Bind<&S::train, &TrainSettings::seed>("seed"),
      Bind<&S::output, &OutputSettings::snapshot_every>("snapshot_every"),
      Bind<&S::profile, &ProfileSettings::steps>("profile.steps"),
      Bind<&S::profile, &ProfileSettings::first_step>("profile.first_step"),
      Bind<&S::profile, &ProfileSettings::memory_history>("profile.memory_history"),
      Bind<&S::output, &OutputSettings::log_every>("log_every"),
      Bind<&S::output, &OutputSettings::dir>("output_dir"),
      Bind<&S::output, &OutputSettings::checkpoint_every>("checkpoint_every"),
  };
}

const std::vector<Binding>& Bindings() {
  static const std::vector<Binding>* const bindings = BuildBindings();
  return *bindings;
}

}  // namespace

std::string_view Name(trial::Init value) { return EnumName(value); }
std::string_view Name(trial::DataFormat value) { return EnumName(value); }
std::string_view Name(trial::PromptTemplate value) { return EnumName(value); }
std::string_view Name(trial::Precision value) { return EnumName(value); }
std::string_view Name(trial::Optimizer value) { return EnumName(value); }
std::string_view Name(trial::Offload value) { return EnumName(value); }
std::string_view Name(trial::Strategy value) { return EnumName(value); }
std::string_view Name(trial::Loss value) { return EnumName(value); }
std::string_view Name(trial::Kernels value) { return EnumName(value); }
std::string_view Name(trial::PeftMethod value) { return EnumName(value); }
std::string_view Name(trial::ComputeDtype value) { return EnumName(value); }
std::string_view Name(trial::Device value) { return EnumName(value); }

TrialSettings ParseTrialSettings(const TrialConfig& config) {
  const std::vector<KeySpec>& keys = TrialKeys();
  const std::vector<Binding>& bindings = Bindings();
  if (bindings.size() != keys.size()) {
    BindingMisuse("", std::to_string(keys.size()) + " keys but " + std::to_string(bindings.size()) +
                          " bindings");
  }
  TrialSettings settings;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (bindings[i].binding.key != keys[i].name) {
      BindingMisuse(keys[i].name, "bound out of the registry's order");
    }
    bindings[i].assign(config.Get(keys[i].name), keys[i], settings);
  }
  return settings;
}

const std::vector<TrialSettingBinding>& TrialSettingBindings() {
  static const std::vector<TrialSettingBinding>* const bindings = [] {
    auto* list = new std::vector<TrialSettingBinding>;
    for (const Binding& binding : Bindings()) list->push_back(binding.binding);
    return list;
  }();
  return *bindings;
}

}  // namespace llmctl
