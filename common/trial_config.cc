#include "common/trial_config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "common/byte_size.h"
#include "common/spelling.h"
#include "common/text.h"

namespace llmctl {
namespace {

using Json = nlohmann::json;

std::string Lower(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower;
}

std::string Join(const std::vector<std::string_view>& items, std::string_view separator) {
  std::string joined;
  for (std::string_view item : items) {
    if (!joined.empty()) joined += separator;
    joined += item;
  }
  return joined;
}

Status ValueError(const KeySpec& spec, std::string problem) {
  return InvalidArgumentError(std::string(spec.name) + ": " + problem);
}

Status UnknownKeyError(std::string_view key) {
  std::string message = "unknown key '" + std::string(key) + "'";
  const std::string nearest = NearestTrialKey(key);
  if (!nearest.empty()) message += " (did you mean '" + nearest + "'?)";
  return InvalidArgumentError(message);
}

std::optional<int64_t> ParseInt(std::string_view text) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

std::optional<double> ParseFloat(std::string_view text) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  if (!std::isfinite(value)) return std::nullopt;
  return value;
}

std::optional<bool> ParseBool(std::string_view text) {
  const std::string lower = Lower(text);
  if (lower == "true" || lower == "yes" || lower == "on") return true;
  if (lower == "false" || lower == "no" || lower == "off") return false;
  return std::nullopt;
}

// Splits "[a, b]" or "a, b" into trimmed items; quotes around an item are removed.
std::optional<std::vector<std::string>> SplitListText(std::string_view text) {
  text = Trim(text);
  if (!text.empty() && text.front() == '[') {
    if (text.back() != ']') return std::nullopt;
    text = Trim(text.substr(1, text.size() - 2));
  }
  std::vector<std::string> items;
  if (text.empty()) return items;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    std::string_view item = Trim(text.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (item.size() >= 2 && (item.front() == '"' || item.front() == '\'') &&
        item.back() == item.front()) {
      item = item.substr(1, item.size() - 2);
    }
    items.emplace_back(item);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return items;
}

// Parses one item of a list-typed key.
StatusOr<KeyValue> ParseScalar(const KeySpec& spec, KeyType type, std::string_view raw) {
  const std::string_view text = Trim(raw);
  const std::string quoted = "'" + std::string(raw) + "'";
  switch (type) {
    case KeyType::kString:
    case KeyType::kPath:
      if ((spec.type == KeyType::kPath || spec.name == "model") && IsNodePath(text) &&
          !text.substr(kNodePathPrefix.size()).starts_with('/')) {
        return ValueError(spec, quoted + ": a node path must be absolute (node:/data/train.jsonl)");
      }
      return KeyValue(std::string(text));
    case KeyType::kEnum: {
      if (std::find(spec.allowed.begin(), spec.allowed.end(), text) != spec.allowed.end()) {
        return KeyValue(std::string(text));
      }
      std::string message = quoted + " is not allowed; choose one of " + Join(spec.allowed, ", ");
      const std::string_view nearest = ClosestMatch(text, spec.allowed);
      if (!nearest.empty()) message += " (did you mean '" + std::string(nearest) + "'?)";
      return ValueError(spec, message);
    }
    case KeyType::kInt: {
      if (std::optional<int64_t> value = ParseInt(text)) return KeyValue(*value);
      return ValueError(spec, "expected an integer, got " + quoted);
    }
    case KeyType::kFloat: {
      if (std::optional<double> value = ParseFloat(text)) return KeyValue(*value);
      return ValueError(spec, "expected a number, got " + quoted);
    }
    case KeyType::kBool: {
      if (std::optional<bool> value = ParseBool(text)) return KeyValue(*value);
      return ValueError(spec, "expected true or false, got " + quoted);
    }
    case KeyType::kByteSize: {
      StatusOr<uint64_t> bytes = ParseByteSize(text);
      if (!bytes.ok()) return ValueError(spec, bytes.status().message());
      return KeyValue(std::string(text));
    }
    case KeyType::kFloatList:
    case KeyType::kStringList:
      break;
  }
  return InternalError(std::string(spec.name) + ": ParseScalar called for a list type");
}

[[noreturn]] void GetterMisuse(std::string_view key, std::string_view problem) {
  std::fprintf(stderr, "llmctl: TrialConfig getter misuse for key '%.*s': %.*s\n",
               static_cast<int>(key.size()), key.data(), static_cast<int>(problem.size()),
               problem.data());
  std::abort();
}

// Writes `value` at the dotted path `key` inside nested objects.
void PutNested(Json& root, std::string_view key, Json value) {
  Json* node = &root;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    if (dot == std::string_view::npos) {
      (*node)[std::string(key.substr(start))] = std::move(value);
      return;
    }
    node = &(*node)[std::string(key.substr(start, dot - start))];
    start = dot + 1;
  }
}

Json ValueToJson(const std::optional<KeyValue>& value) {
  if (!value) return nullptr;
  return std::visit([](const auto& v) { return Json(v); }, *value);
}

// Converts a JSON value into a KeyValue for `spec` (the inverse of ValueToJson).
StatusOr<KeyValue> ValueFromJson(const KeySpec& spec, const Json& json) {
  auto wrong_type = [&] {
    return ValueError(spec, "expected " + DescribeExpectedValue(spec) + ", got " + json.dump());
  };
  switch (spec.type) {
    case KeyType::kBool:
      if (!json.is_boolean()) return wrong_type();
      return KeyValue(json.get<bool>());
    case KeyType::kInt:
      if (!json.is_number_integer()) return wrong_type();
      if (json.is_number_unsigned() &&
          json.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return ValueError(spec, "value too large: " + json.dump());
      }
      return KeyValue(json.get<int64_t>());
    case KeyType::kFloat:
      if (!json.is_number()) return wrong_type();
      return KeyValue(json.get<double>());
    case KeyType::kByteSize:
      if (json.is_number_unsigned())
        return ParseKeyValue(spec, std::to_string(json.get<uint64_t>()));
      [[fallthrough]];
    case KeyType::kString:
    case KeyType::kEnum:
    case KeyType::kPath:
      if (!json.is_string()) return wrong_type();
      return ParseKeyValue(spec, json.get<std::string>());
    case KeyType::kFloatList: {
      if (!json.is_array()) return wrong_type();
      std::vector<double> values;
      for (const Json& item : json) {
        if (!item.is_number()) return wrong_type();
        values.push_back(item.get<double>());
      }
      return KeyValue(std::move(values));
    }
    case KeyType::kStringList: {
      if (!json.is_array()) return wrong_type();
      std::vector<std::string> values;
      for (const Json& item : json) {
        if (!item.is_string()) return wrong_type();
        values.push_back(item.get<std::string>());
      }
      return KeyValue(std::move(values));
    }
  }
  return wrong_type();
}

Status CollectJson(const Json& object, const std::string& prefix, TrialConfig& config) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    const std::string key = prefix + it.key();
    const KeySpec* spec = FindTrialKey(key);
    if (spec == nullptr) {
      if (it->is_object() && IsTrialKeyGroup(key)) {
        RETURN_IF_ERROR(CollectJson(*it, key + ".", config));
        continue;
      }
      return UnknownKeyError(key);
    }
    if (it->is_null()) {
      RETURN_IF_ERROR(config.SetFromText(key, ""));
      continue;
    }
    ASSIGN_OR_RETURN(KeyValue value, ValueFromJson(*spec, *it));
    RETURN_IF_ERROR(config.Set(key, std::move(value)));
  }
  return Status::Ok();
}

std::string Str(int64_t value) { return std::to_string(value); }

}  // namespace

StatusOr<KeyValue> ParseKeyValue(const KeySpec& spec, std::string_view text) {
  if (Trim(text).empty()) {
    return ValueError(spec, "a value is required (expected " + DescribeExpectedValue(spec) + ")");
  }
  if (spec.type == KeyType::kFloatList || spec.type == KeyType::kStringList) {
    std::optional<std::vector<std::string>> items = SplitListText(text);
    if (!items) {
      return ValueError(spec, "expected a list like [0.9, 0.95], got '" + std::string(text) + "'");
    }
    return ParseKeyValueList(spec, *items);
  }
  return ParseScalar(spec, spec.type, text);
}

StatusOr<KeyValue> ParseKeyValueList(const KeySpec& spec, const std::vector<std::string>& items) {
  if (spec.type == KeyType::kFloatList) {
    std::vector<double> values;
    for (const std::string& item : items) {
      std::optional<double> value = ParseFloat(Trim(item));
      if (!value) return ValueError(spec, "expected a number in the list, got '" + item + "'");
      values.push_back(*value);
    }
    return KeyValue(std::move(values));
  }
  if (spec.type == KeyType::kStringList) {
    std::vector<std::string> values;
    for (const std::string& item : items) values.emplace_back(Trim(item));
    return KeyValue(std::move(values));
  }
  return ValueError(spec, "expected " + std::string(KeyTypeName(spec.type)) + ", got a list");
}

std::string FormatKeyValue(const KeyValue& value) {
  struct Formatter {
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const {
      char buffer[64];
      const auto result = std::to_chars(buffer, buffer + sizeof(buffer), v);
      return std::string(buffer, result.ptr);
    }
    std::string operator()(const std::string& v) const { return v; }
    std::string operator()(const std::vector<double>& v) const {
      std::string text = "[";
      for (size_t i = 0; i < v.size(); ++i) text += (i ? ", " : "") + (*this)(v[i]);
      return text + "]";
    }
    std::string operator()(const std::vector<std::string>& v) const {
      std::string text = "[";
      for (size_t i = 0; i < v.size(); ++i) text += (i ? ", " : "") + v[i];
      return text + "]";
    }
  };
  return std::visit(Formatter{}, value);
}

TrialConfig::TrialConfig() {
  const std::vector<KeySpec>& keys = TrialKeys();
  entries_.resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].default_value.empty()) continue;
    StatusOr<KeyValue> value = ParseKeyValue(keys[i], keys[i].default_value);
    // The registry's defaults are constants checked by the tests; a bad one is a programming error.
    if (!value.ok()) GetterMisuse(keys[i].name, "invalid default: " + value.status().message());
    entries_[i].value = std::move(*value);
  }
}

const TrialConfig::Entry* TrialConfig::FindEntry(std::string_view key) const {
  const std::vector<KeySpec>& keys = TrialKeys();
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].name == key) return &entries_[i];
  }
  return nullptr;
}

Status TrialConfig::Set(std::string_view key, KeyValue value) {
  const KeySpec* spec = FindTrialKey(key);
  if (spec == nullptr) return UnknownKeyError(key);
  Entry& entry = entries_[static_cast<size_t>(spec - TrialKeys().data())];

  // Normalise the alternative to the key's type, and check the value the way the text parser would.
  switch (spec->type) {
    case KeyType::kBool:
      if (!std::holds_alternative<bool>(value)) return ValueError(*spec, "expected true or false");
      break;
    case KeyType::kInt:
      if (!std::holds_alternative<int64_t>(value)) return ValueError(*spec, "expected an integer");
      break;
    case KeyType::kFloat:
      if (std::holds_alternative<int64_t>(value)) {
        value = static_cast<double>(std::get<int64_t>(value));
      }
      if (!std::holds_alternative<double>(value)) return ValueError(*spec, "expected a number");
      if (!std::isfinite(std::get<double>(value)))
        return ValueError(*spec, "expected a finite number");
      break;
    case KeyType::kString:
    case KeyType::kEnum:
    case KeyType::kPath:
    case KeyType::kByteSize: {
      if (!std::holds_alternative<std::string>(value)) {
        return ValueError(*spec, "expected " + DescribeExpectedValue(*spec));
      }
      const std::string& text = std::get<std::string>(value);
      if (text.empty()) {
        if (!spec->default_value.empty()) {
          return ParseKeyValue(*spec, "").status();  // "a value is required (...)"
        }
        entry.value.reset();
        entry.explicitly_set = true;
        return Status::Ok();
      }
      ASSIGN_OR_RETURN(value, ParseScalar(*spec, spec->type, text));
      break;
    }
    case KeyType::kFloatList:
      if (!std::holds_alternative<std::vector<double>>(value)) {
        return ValueError(*spec, "expected a list of numbers");
      }
      for (double item : std::get<std::vector<double>>(value)) {
        if (!std::isfinite(item)) return ValueError(*spec, "expected finite numbers");
      }
      break;
    case KeyType::kStringList:
      if (!std::holds_alternative<std::vector<std::string>>(value)) {
        return ValueError(*spec, "expected a list of strings");
      }
      break;
  }
  entry.value = std::move(value);
  entry.explicitly_set = true;
  return Status::Ok();
}

Status TrialConfig::SetFromText(std::string_view key, std::string_view text) {
  const KeySpec* spec = FindTrialKey(key);
  if (spec == nullptr) return UnknownKeyError(key);
  if (Trim(text).empty() && spec->default_value.empty()) {
    Entry& entry = entries_[static_cast<size_t>(spec - TrialKeys().data())];
    entry.value.reset();
    entry.explicitly_set = true;
    return Status::Ok();
  }
  ASSIGN_OR_RETURN(KeyValue value, ParseKeyValue(*spec, text));
  return Set(key, std::move(value));
}

bool TrialConfig::IsSet(std::string_view key) const {
  const Entry* entry = FindEntry(key);
  return entry != nullptr && entry->explicitly_set;
}

std::optional<KeyValue> TrialConfig::Get(std::string_view key) const {
  const KeySpec* spec = FindTrialKey(key);
  if (spec == nullptr) return std::nullopt;
  const Entry& entry = entries_[static_cast<size_t>(spec - TrialKeys().data())];
  if (entry.value) return entry.value;
  if (!spec->default_from.empty()) return Get(spec->default_from);
  return std::nullopt;
}

const TrialConfig::Entry& TrialConfig::EntryForGetter(std::string_view key,
                                                      std::initializer_list<KeyType> types) const {
  const KeySpec* spec = FindTrialKey(key);
  if (spec == nullptr) GetterMisuse(key, "no such key in the registry");
  if (std::find(types.begin(), types.end(), spec->type) == types.end()) {
    GetterMisuse(key, "the key is of type " + std::string(KeyTypeName(spec->type)));
  }
  return entries_[static_cast<size_t>(spec - TrialKeys().data())];
}

std::string TrialConfig::GetString(std::string_view key) const {
  EntryForGetter(key, {KeyType::kString, KeyType::kEnum, KeyType::kPath, KeyType::kByteSize});
  std::optional<KeyValue> value = Get(key);
  return value ? std::get<std::string>(*value) : "";
}

int64_t TrialConfig::GetInt(std::string_view key) const {
  EntryForGetter(key, {KeyType::kInt});
  std::optional<KeyValue> value = Get(key);
  return value ? std::get<int64_t>(*value) : 0;
}

double TrialConfig::GetFloat(std::string_view key) const {
  EntryForGetter(key, {KeyType::kFloat});
  std::optional<KeyValue> value = Get(key);
  return value ? std::get<double>(*value) : 0.0;
}

bool TrialConfig::GetBool(std::string_view key) const {
  EntryForGetter(key, {KeyType::kBool});
  std::optional<KeyValue> value = Get(key);
  return value ? std::get<bool>(*value) : false;
}

std::vector<double> TrialConfig::GetFloatList(std::string_view key) const {
  EntryForGetter(key, {KeyType::kFloatList});
  std::optional<KeyValue> value = Get(key);
  return value ? std::get<std::vector<double>>(*value) : std::vector<double>();
}

std::vector<std::string> TrialConfig::GetStringList(std::string_view key) const {
  EntryForGetter(key, {KeyType::kStringList});
  std::optional<KeyValue> value = Get(key);
  return value ? std::get<std::vector<std::string>>(*value) : std::vector<std::string>();
}

std::optional<uint64_t> TrialConfig::GetByteSize(std::string_view key) const {
  EntryForGetter(key, {KeyType::kByteSize});
  std::optional<KeyValue> value = Get(key);
  if (!value) return std::nullopt;
  StatusOr<uint64_t> bytes = ParseByteSize(std::get<std::string>(*value));
  if (!bytes.ok()) GetterMisuse(key, "stored text is not a byte size");  // Set() checked it
  return *bytes;
}

nlohmann::json TrialConfig::ToJson() const {
  Json root = Json::object();
  const std::vector<KeySpec>& keys = TrialKeys();
  for (size_t i = 0; i < keys.size(); ++i) {
    if (entries_[i].explicitly_set) PutNested(root, keys[i].name, ValueToJson(entries_[i].value));
  }
  return root;
}

nlohmann::json TrialConfig::EffectiveJson() const {
  Json root = Json::object();
  for (const KeySpec& spec : TrialKeys()) PutNested(root, spec.name, ValueToJson(Get(spec.name)));
  return root;
}

StatusOr<TrialConfig> TrialConfig::FromJson(const nlohmann::json& json) {
  if (!json.is_object()) return InvalidArgumentError("trial config: expected a JSON object");
  TrialConfig config;
  try {
    RETURN_IF_ERROR(CollectJson(json, "", config));
  } catch (const Json::exception& error) {  // defensive: types are checked before every get<>
    return InvalidArgumentError(std::string("trial config: ") + error.what());
  }
  return config;
}

bool operator==(const TrialConfig& a, const TrialConfig& b) {
  for (const KeySpec& spec : TrialKeys()) {
    if (a.Get(spec.name) != b.Get(spec.name)) return false;
  }
  return true;
}

void ApplyLabSpellings(TrialConfig& config) {
  auto set = [&config](std::string_view key, std::string value) {
    Status status = config.Set(key, KeyValue(std::move(value)));
    if (!status.ok()) GetterMisuse(key, status.message());  // the values are registry constants
  };
  const std::string optimizer = config.GetString("optimizer");
  if (optimizer == "adam_8bit") set("optimizer", "adamw_8bit");
  if (config.GetString("strategy") == "deepspeed_stage_2_offload" &&
      (optimizer == "deepspeed_cpu" || optimizer == "adamw")) {
    set("optimizer", "adamw");
    set("offload", "optimizer");
    set("strategy", "auto");
  }
}

namespace {

// The memory-saving techniques' settings that cannot run together.
std::optional<ConfigProblem> FindTechniqueProblem(const TrialConfig& config) {
  auto problem = [](std::vector<std::string> keys, std::string message) {
    return std::optional<ConfigProblem>(ConfigProblem{std::move(keys), std::move(message)});
  };
  const std::string optimizer = config.GetString("optimizer");
  if (optimizer == "deepspeed_cpu") {
    return problem({"optimizer", "strategy"},
                   "optimizer deepspeed_cpu (DeepSpeedCPUAdam) runs only with strategy: "
                   "deepspeed_stage_2_offload; in llmctl's words: optimizer: adamw and offload: "
                   "optimizer");
  }
  if (config.GetString("strategy") == "deepspeed_stage_2_offload") {
    return problem({"strategy", "optimizer"},
                   "strategy deepspeed_stage_2_offload offloads AdamW's state, but optimizer is " +
                       optimizer + "; use optimizer: adamw (or deepspeed_cpu)");
  }
  const bool offload = config.GetString("offload") == "optimizer";
  if (offload && optimizer != "adamw") {
    return problem({"offload", "optimizer"},
                   "offload: optimizer keeps AdamW's fp32 state on the host, but optimizer is " +
                       optimizer + "; use optimizer: adamw or offload: none");
  }
  // Offload moves each gradient to the host as it is produced, where neither the global-norm clip
  // nor the loss scaler's unscale-and-check (both over the device .grad tensors) sees it.
  if (offload && config.GetFloat("train.grad_clip") > 0) {
    return problem({"offload", "train.grad_clip"},
                   "offload: optimizer moves gradients to the host as backward produces them, "
                   "where train.grad_clip does not reach; set train.grad_clip: 0 or offload: none");
  }
  if (offload && config.GetString("precision") == "16-mixed") {
    return problem({"offload", "precision"},
                   "offload: optimizer moves gradients to the host as backward produces them, "
                   "where 16-mixed loss scaling cannot check them for overflow; use bf16-mixed or "
                   "bf16-true");
  }
  // DDP all-reduces the gradients that backward accumulates in .grad; offload moves them to the
  // host and optimizer_in_backward consumes them before the other ranks' gradients are known.
  if (config.GetString("strategy") == "ddp" &&
      (offload || config.GetBool("optimizer_in_backward"))) {
    const std::string other = offload ? "offload" : "optimizer_in_backward";
    return problem({"strategy", other},
                   "strategy: ddp averages the gradients across ranks after backward, which " +
                       other + " does not wait for; use strategy: auto or turn " + other + " off");
  }
  // FSDP here shards every parameter as a trainable flat shard, reduces gradients in backward,
  // and clips over the ranks; what it does not build yet is refused by name.
  if (config.GetString("strategy") == "fsdp") {
    if (offload || config.GetBool("optimizer_in_backward")) {
      const std::string other = offload ? "offload" : "optimizer_in_backward";
      return problem({"strategy", other},
                     "strategy: fsdp reduce-scatters the gradients into shards after each unit's "
                     "backward; " +
                         other +
                         " is not built for shards here (no ZeRO-3 offload yet); use strategy: "
                         "auto or turn " +
                         other + " off");
    }
    if (config.GetString("peft.method") != "none") {
      return problem({"strategy", "peft.method"},
                     "strategy: fsdp shards trainable full parameters only; LoRA's frozen base "
                     "weights and QLoRA's NF4 shards are not built yet; use strategy: ddp or auto");
    }
    const std::string optimizer = config.GetString("optimizer");
    if (optimizer != "adamw" && optimizer != "sgd") {
      return problem({"strategy", "optimizer"},
                     "strategy: fsdp steps adamw or sgd on the shards; optimizer " + optimizer +
                         " is not built for flat shards yet");
    }
    if (config.GetString("precision") == "16-mixed") {
      return problem({"strategy", "precision"},
                     "strategy: fsdp has no sharded loss scaler for 16-mixed yet; use bf16-mixed, "
                     "bf16-true or 32-true");
    }
  }
  if (config.GetBool("optimizer_in_backward")) {
    const int64_t micro = config.GetInt("train.micro_batch_size");
    const int64_t global = config.GetInt("train.global_batch_size");
    const int64_t devices = config.GetInt("devices");
    if (global != micro * devices) {
      return problem(
          {"optimizer_in_backward", "train.global_batch_size"},
          "optimizer_in_backward updates each parameter while backward runs, so gradients "
          "cannot accumulate: train.global_batch_size (" +
              Str(global) + ") must equal train.micro_batch_size x devices (" +
              Str(micro * devices) + ")");
    }
    if (config.GetFloat("train.grad_clip") > 0) {
      return problem({"optimizer_in_backward", "train.grad_clip"},
                     "optimizer_in_backward updates each parameter before the other gradients "
                     "exist, so the global norm train.grad_clip needs is never known; set "
                     "train.grad_clip: 0");
    }
    if (config.GetString("precision") == "16-mixed") {
      return problem({"optimizer_in_backward", "precision"},
                     "optimizer_in_backward cannot skip a step whose gradients overflowed, which "
                     "16-mixed loss scaling needs; use bf16-mixed or bf16-true");
    }
    if (offload) {
      return problem({"optimizer_in_backward", "offload"},
                     "optimizer_in_backward and offload: optimizer cannot be combined; choose one");
    }
  }

  const std::string method = config.GetString("peft.method");
  if (method == "none") {
    for (std::string_view key : TrialKeysInGroup("peft")) {
      if (key != "peft.method" && config.IsSet(key)) {
        return problem({std::string(key), "peft.method"},
                       std::string(key) +
                           " applies to adapters, but peft.method is none; set peft.method: lora "
                           "or qlora, or remove " +
                           std::string(key));
      }
    }
    return std::nullopt;
  }
  if (config.GetInt("peft.r") < 1) {
    return problem({"peft.r"}, "peft.r must be at least 1, got " + Str(config.GetInt("peft.r")));
  }
  if (!(config.GetFloat("peft.alpha") > 0)) {
    return problem({"peft.alpha"}, "peft.alpha must be positive, got " +
                                       FormatKeyValue(config.GetFloat("peft.alpha")));
  }
  const double dropout = config.GetFloat("peft.dropout");
  if (dropout < 0 || dropout >= 1) {
    return problem({"peft.dropout"},
                   "peft.dropout must be in [0, 1), got " + FormatKeyValue(dropout));
  }
  const std::vector<std::string> targets = config.GetStringList("peft.targets");
  if (targets.empty()) {
    return problem({"peft.targets"},
                   "peft.targets is empty: name the projections that get adapters, e.g. [q_proj, "
                   "v_proj]");
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    if (std::find(kLoraTargets.begin(), kLoraTargets.end(), targets[i]) == kLoraTargets.end()) {
      std::string known;
      for (std::string_view name : kLoraTargets)
        known += (known.empty() ? "" : ", ") + std::string(name);
      return problem({"peft.targets"}, "peft.targets: unknown projection '" + targets[i] +
                                           "' (known: " + known + ")");
    }
    if (std::find(targets.begin(), targets.begin() + static_cast<std::ptrdiff_t>(i), targets[i]) !=
        targets.begin() + static_cast<std::ptrdiff_t>(i)) {
      return problem({"peft.targets"}, "peft.targets: '" + targets[i] + "' is listed twice");
    }
  }
  if (method == "qlora" && config.GetString("precision") == "16-mixed" &&
      config.GetString("peft.compute_dtype") == "bf16") {
    return problem({"peft.compute_dtype", "precision"},
                   "peft.compute_dtype bf16 with precision 16-mixed: fp16 autocast runs every "
                   "matmul in fp16, so each NF4 weight would be rounded to bf16 and then again to "
                   "fp16 (and 16-mixed is for devices without bf16); set peft.compute_dtype: fp32 "
                   "or use precision bf16-mixed");
  }
  if (method == "lora") {
    for (std::string_view key : {"peft.double_quant", "peft.compute_dtype"}) {
      if (config.IsSet(key)) {
        return problem({std::string(key), "peft.method"},
                       std::string(key) +
                           " applies to NF4 base weights, but peft.method is lora; use "
                           "peft.method: qlora or remove " +
                           std::string(key));
      }
    }
  }
  return std::nullopt;
}

// The profile group: its other keys only mean something with profile.steps, and the profiled
// steps must be steps the run takes.
std::optional<ConfigProblem> FindProfileProblem(const TrialConfig& config) {
  auto problem = [](std::vector<std::string> keys, std::string message) {
    return std::optional<ConfigProblem>(ConfigProblem{std::move(keys), std::move(message)});
  };
  const int64_t steps = config.GetInt("profile.steps");
  if (steps == 0) {
    for (std::string_view key : {"profile.first_step", "profile.memory_history"}) {
      if (config.IsSet(key)) {
        return problem({std::string(key)}, std::string(key) +
                                               " applies to profiled steps, but profile.steps is "
                                               "0; set profile.steps (e.g. 2) or remove " +
                                               std::string(key));
      }
    }
    return std::nullopt;
  }
  const int64_t first = config.GetInt("profile.first_step");
  const int64_t max_steps = config.GetInt("train.max_steps");
  if (max_steps > 0 && first + steps > max_steps) {
    return problem({"profile.first_step", "profile.steps", "train.max_steps"},
                   "profile: steps " + Str(first) + " to " + Str(first + steps - 1) +
                       " are profiled, but train.max_steps " + Str(max_steps) +
                       " ends the run after step " + Str(max_steps - 1));
  }
  return std::nullopt;
}

// data.format imagefolder (BLIP-2's captions) and the keys that only it takes.
std::optional<ConfigProblem> FindImageFolderProblem(const TrialConfig& config) {
  auto problem = [](std::vector<std::string> keys, std::string message) {
    return std::optional<ConfigProblem>(ConfigProblem{std::move(keys), std::move(message)});
  };
  const bool images = config.GetString("data.format") == "imagefolder";
  const std::vector<std::string> frozen = config.GetStringList("freeze");
  if (!images) {
    if (!frozen.empty()) {
      return problem({"freeze", "data.format"},
                     "freeze names BLIP-2's parts, which train on data.format imagefolder, but "
                     "data.format is " +
                         config.GetString("data.format") + "; remove freeze");
    }
    if (config.IsSet("data.caption_column")) {
      return problem({"data.caption_column", "data.format"},
                     "data.caption_column applies to data.format imagefolder, but data.format is " +
                         config.GetString("data.format") + "; remove data.caption_column");
    }
    return std::nullopt;
  }
  for (std::string_view key : {"data.template", "data.mask_prompt"}) {
    if (config.IsSet(key)) {
      return problem({std::string(key), "data.format"},
                     std::string(key) +
                         " shapes instruction records, and data.format imagefolder holds "
                         "captions: remove " +
                         std::string(key));
    }
  }
  if (config.GetString("data.caption_column").empty()) {
    return problem({"data.caption_column"},
                   "data.caption_column is empty: name the metadata column of the captions");
  }
  for (size_t i = 0; i < frozen.size(); ++i) {
    if (std::find(kBlip2Parts.begin(), kBlip2Parts.end(), frozen[i]) == kBlip2Parts.end()) {
      std::string known;
      for (std::string_view part : kBlip2Parts) known += (known.empty() ? "" : ", ") + std::string(part);
      return problem({"freeze"},
                     "freeze: unknown part '" + frozen[i] + "' (BLIP-2's parts: " + known + ")");
    }
  }
  if (frozen.size() == kBlip2Parts.size() && config.GetString("peft.method") == "none") {
    return problem({"freeze", "peft.method"},
                   "freeze lists every part of BLIP-2 and peft.method is none: nothing would train");
  }
  // Not built for BLIP-2 yet: each unit of FSDP's wrapping is a LLaMA decoder layer.
  if (config.GetString("strategy") == "fsdp") {
    return problem({"strategy", "data.format"},
                   "strategy fsdp is built for the LLaMA family's decoder layers, not yet for "
                   "BLIP-2 (data.format imagefolder); use strategy ddp or auto");
  }
  return std::nullopt;
}

}  // namespace

std::optional<ConfigProblem> FindConfigProblem(const TrialConfig& config,
                                               const ModelConfig* model) {
  auto problem = [](std::vector<std::string> keys, std::string message) {
    return std::optional<ConfigProblem>(ConfigProblem{std::move(keys), std::move(message)});
  };

  const std::string model_name = config.GetString("model");
  if (model_name.empty())
    return problem({"model"}, "model is required: a preset name or a model directory");
  if (config.GetString("data.path").empty()) {
    return problem({"data.path"},
                   "data.path is required: the training data, a JSON-lines file (e.g. data: {path: "
                   "train.jsonl})");
  }

  // Counts that must be at least 1, and those that may also be 0 (meaning "off" or "all").
  const std::pair<std::string_view, int64_t> at_least_one[] = {
      {"data.max_seq_length", 2},
      {"train.micro_batch_size", 1},
      {"train.global_batch_size", 1},
      {"train.epochs", 1},
      {"devices", 1},
      {"nodes", 1},
      {"log_every", 1},
  };
  for (const auto& [key, minimum] : at_least_one) {
    const int64_t value = config.GetInt(key);
    if (value < minimum) {
      std::string why =
          key == "data.max_seq_length" ? " (an input token and its next-token target)" : "";
      return problem({std::string(key)}, std::string(key) + " must be at least " + Str(minimum) +
                                             why + ", got " + Str(value));
    }
  }
  for (std::string_view key :
       {"data.samples", "train.warmup_steps", "train.max_steps", "seed", "snapshot_every",
        "checkpoint_every", "profile.steps", "profile.first_step"}) {
    const int64_t value = config.GetInt(key);
    if (value < 0) {
      return problem({std::string(key)},
                     std::string(key) + " must not be negative, got " + Str(value));
    }
  }
  if (std::optional<ConfigProblem> found = FindProfileProblem(config)) return found;

  // Nodes x devices ranks (Lightning's num_nodes x devices) need more than one process each:
  // only the data-parallel strategies start them.
  const int64_t nodes = config.GetInt("nodes");
  if (const std::string strategy = config.GetString("strategy");
      nodes > 1 && strategy != "ddp" && strategy != "fsdp") {
    return problem(
        {"nodes", "strategy"},
        "nodes: " + Str(nodes) + " runs " + Str(nodes) +
            " x devices ranks, which only strategy ddp or fsdp starts, but strategy is " +
            strategy + "; use strategy: ddp or fsdp, or nodes: 1");
  }

  const int64_t micro = config.GetInt("train.micro_batch_size");
  const int64_t global = config.GetInt("train.global_batch_size");
  const int64_t devices = config.GetInt("devices");
  // Every rank on every node takes micro-batches.
  const int64_t per_pass = micro * devices * nodes;
  if (global % per_pass != 0) {
    std::vector<std::string> keys = {"train.global_batch_size", "train.micro_batch_size"};
    if (devices > 1) keys.push_back("devices");
    if (nodes > 1) keys.push_back("nodes");
    std::string per_step = "train.micro_batch_size (" + Str(micro) + ")";
    if (devices > 1) per_step += " x devices (" + Str(devices) + ")";
    if (nodes > 1) per_step += " x nodes (" + Str(nodes) + ")";
    if (devices > 1 || nodes > 1) per_step += " = " + Str(per_pass);
    return problem(keys, "train.global_batch_size (" + Str(global) + ") must be a multiple of " +
                             per_step + ": each optimizer step accumulates whole micro-batches");
  }

  const double lr = config.GetFloat("train.lr");
  if (lr < 0)
    return problem({"train.lr"}, "train.lr must not be negative, got " + FormatKeyValue(lr));
  const std::vector<double> betas = config.GetFloatList("train.betas");
  if (betas.size() != 2) {
    return problem({"train.betas"}, "train.betas must be exactly two numbers [beta1, beta2], got " +
                                        FormatKeyValue(betas));
  }
  for (double beta : betas) {
    if (beta < 0 || beta >= 1) {
      return problem({"train.betas"},
                     "train.betas must each be in [0, 1), got " + FormatKeyValue(betas));
    }
  }
  if (!(config.GetFloat("train.eps") > 0)) {
    return problem({"train.eps"}, "train.eps must be positive, got " +
                                      FormatKeyValue(config.GetFloat("train.eps")));
  }
  for (std::string_view key : {"train.weight_decay", "train.grad_clip"}) {
    const double value = config.GetFloat(key);
    if (value < 0) {
      return problem({std::string(key)},
                     std::string(key) + " must not be negative, got " + FormatKeyValue(value));
    }
  }
  const double momentum = config.GetFloat("train.momentum");
  if (momentum < 0 || momentum >= 1) {
    return problem({"train.momentum"},
                   "train.momentum must be in [0, 1), got " + FormatKeyValue(momentum));
  }
  if (momentum != 0 && config.GetString("optimizer") != "sgd") {
    return problem({"train.momentum", "optimizer"},
                   "train.momentum applies only to optimizer sgd, but optimizer is " +
                       config.GetString("optimizer") +
                       "; remove train.momentum or set optimizer: sgd");
  }

  if (std::optional<ConfigProblem> found = FindTechniqueProblem(config)) return found;

  if (const std::optional<uint64_t> budget = config.GetByteSize("device_memory");
      budget && *budget == 0) {
    return problem({"device_memory"},
                   "device_memory must be more than 0 bytes (leave it unset for no "
                   "budget)");
  }

  if (std::optional<ConfigProblem> found = FindImageFolderProblem(config)) return found;

  if (config.GetString("data.format") == "text") {
    if (config.IsSet("data.template") && config.GetString("data.template") != "none") {
      return problem({"data.template", "data.format"},
                     "data.template " + config.GetString("data.template") +
                         " needs instruction records, but data.format is text; use data.template: "
                         "none or data.format: alpaca");
    }
    if (config.IsSet("data.mask_prompt") && config.GetBool("data.mask_prompt")) {
      return problem(
          {"data.mask_prompt", "data.format"},
          "data.mask_prompt: true needs a prompt to mask, but data.format text has none; "
          "remove data.mask_prompt or use data.format: alpaca");
    }
  }

  if (config.GetString("init") == "pretrained") {
    const ModelConfig* preset = FindPreset(model_name);
    if (preset != nullptr && preset->hf_repo_id.empty()) {
      return problem({"init", "model"}, "init: pretrained needs published weights, and model " +
                                            model_name + " has none; use init: random");
    }
  }

  if (model != nullptr) {
    const int64_t length = config.GetInt("data.max_seq_length");
    if (length > model->max_position_embeddings) {
      return problem({"data.max_seq_length", "model"},
                     "data.max_seq_length (" + Str(length) + ") exceeds the model's " +
                         "max_position_embeddings (" + Str(model->max_position_embeddings) + ")");
    }
  }
  return std::nullopt;
}

Status ValidateTrialConfig(const TrialConfig& config, const ModelConfig* model) {
  std::optional<ConfigProblem> problem = FindConfigProblem(config, model);
  if (!problem) return Status::Ok();
  return InvalidArgumentError(problem->message);
}

}  // namespace llmctl
