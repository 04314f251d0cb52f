#include "common/trial_config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <variant>

#include "common/byte_size.h"
#include "common/checked_math.h"
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

// A key or value is quoted at most this long in a message: one given on a command line (--set)
// may be any length.
constexpr size_t kMaxQuotedBytes = 200;

Status ValueError(const KeySpec& spec, std::string problem) {
  return InvalidArgumentError(std::string(spec.name) + ": " + problem);
}

Status UnknownKeyError(std::string_view key) {
  std::string message = "unknown key '" + OnOneLine(key, kMaxQuotedBytes) + "'";
  const std::string nearest = NearestTrialKey(key);
  if (!nearest.empty()) message += " (did you mean '" + nearest + "'?)";
  return InvalidArgumentError(message);
}

// A whole number; std::errc::result_out_of_range for one past 64 bits (so that its message can say
// it is too large rather than not a number), std::errc::invalid_argument for anything else.
std::variant<int64_t, std::errc> ParseInt(std::string_view text) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || end != text.data() + text.size()) return std::errc::invalid_argument;
  if (error != std::errc()) return error;
  return value;
}

// A finite number; std::errc::result_out_of_range for one past a double's range (1e999, 1e-999),
// std::errc::invalid_argument for anything else (words, inf, nan).
std::variant<double, std::errc> ParseFloat(std::string_view text) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || end != text.data() + text.size()) return std::errc::invalid_argument;
  if (error != std::errc()) return error;
  if (!std::isfinite(value)) return std::errc::invalid_argument;
  return value;
}

// Why `quoted` is not a number ParseFloat takes.
std::string NotANumber(std::errc error, const std::string& quoted) {
  if (error == std::errc::result_out_of_range) {
    return quoted + " is past the range of a double (about 1e-308 to 1e308 from 0)";
  }
  return "expected a number, got " + quoted;
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
  // Appended piece by piece: GCC 12 at -O3 reports a false -Wrestrict for "'" + std::string(raw).
  std::string quoted(1, '\'');
  quoted.append(OnOneLine(raw, kMaxQuotedBytes));
  quoted.push_back('\'');
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
      const std::variant<int64_t, std::errc> value = ParseInt(text);
      if (const int64_t* parsed = std::get_if<int64_t>(&value)) return KeyValue(*parsed);
      if (std::get<std::errc>(value) == std::errc::result_out_of_range) {
        if (text.starts_with('-'))
          return ValueError(spec, quoted + " is less than any value it takes");
        return ValueError(spec, quoted + " is more than " + std::to_string(spec.max_int) +
                                    ", the most llmctl takes");
      }
      return ValueError(spec, "expected an integer, got " + quoted);
    }
    case KeyType::kFloat: {
      const std::variant<double, std::errc> value = ParseFloat(text);
      if (const double* parsed = std::get_if<double>(&value)) return KeyValue(*parsed);
      return ValueError(spec, NotANumber(std::get<std::errc>(value), quoted));
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

bool IsDataParallel(const TrialSettings& s) {
  return s.parallel.strategy == trial::Strategy::kDdp ||
         s.parallel.strategy == trial::Strategy::kFsdp;
}

}  // namespace

StatusOr<KeyValue> ParseKeyValue(const KeySpec& spec, std::string_view text) {
  if (Trim(text).empty()) {
    return ValueError(spec, "a value is required (expected " + DescribeExpectedValue(spec) + ")");
  }
  if (spec.type == KeyType::kFloatList || spec.type == KeyType::kStringList) {
    std::optional<std::vector<std::string>> items = SplitListText(text);
    if (!items) {
      const char* example = spec.type == KeyType::kFloatList ? "[0.9, 0.95]" : "[q_proj, v_proj]";
      return ValueError(spec, std::string("expected a list like ") + example + ", got '" +
                                  OnOneLine(text, kMaxQuotedBytes) + "'");
    }
    return ParseKeyValueList(spec, *items);
  }
  return ParseScalar(spec, spec.type, text);
}

StatusOr<KeyValue> ParseKeyValueList(const KeySpec& spec, const std::vector<std::string>& items) {
  if (spec.type == KeyType::kFloatList) {
    std::vector<double> values;
    for (const std::string& item : items) {
      const std::variant<double, std::errc> value = ParseFloat(Trim(item));
      if (const double* parsed = std::get_if<double>(&value)) {
        values.push_back(*parsed);
        continue;
      }
      const std::string quoted = "'" + OnOneLine(item, kMaxQuotedBytes) + "'";
      if (std::get<std::errc>(value) == std::errc::result_out_of_range) {
        return ValueError(spec, NotANumber(std::errc::result_out_of_range, quoted));
      }
      return ValueError(spec, "expected a number in the list, got " + quoted);
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
  settings_ = ParseTrialSettings(*this);
}

const TrialConfig::Entry* TrialConfig::FindEntry(std::string_view key) const {
  const std::vector<KeySpec>& keys = TrialKeys();
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].name == key) return &entries_[i];
  }
  return nullptr;
}

Status TrialConfig::Set(std::string_view key, KeyValue value) {
  RETURN_IF_ERROR(SetEntry(key, std::move(value)));
  settings_ = ParseTrialSettings(*this);
  return Status::Ok();
}

Status TrialConfig::SetFromText(std::string_view key, std::string_view text) {
  RETURN_IF_ERROR(SetEntryFromText(key, text));
  settings_ = ParseTrialSettings(*this);
  return Status::Ok();
}

Status TrialConfig::SetEntry(std::string_view key, KeyValue value) {
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
      if (std::get<int64_t>(value) > spec->max_int) {
        return ValueError(*spec, std::to_string(std::get<int64_t>(value)) + " is more than " +
                                     std::to_string(spec->max_int) + ", the most llmctl takes");
      }
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

Status TrialConfig::SetEntryFromText(std::string_view key, std::string_view text) {
  const KeySpec* spec = FindTrialKey(key);
  if (spec == nullptr) return UnknownKeyError(key);
  if (Trim(text).empty() && spec->default_value.empty()) {
    Entry& entry = entries_[static_cast<size_t>(spec - TrialKeys().data())];
    entry.value.reset();
    entry.explicitly_set = true;
    return Status::Ok();
  }
  ASSIGN_OR_RETURN(KeyValue value, ParseKeyValue(*spec, text));
  return SetEntry(key, std::move(value));
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

bool UsesChunkedLoss(const TrialConfig& config) {
  const MemorySettings& memory = config.settings().memory;
  return memory.loss == trial::Loss::kChunkedCe ||
         (memory.loss == trial::Loss::kAuto && memory.kernels == trial::Kernels::kFused);
}

bool UsesSwiGluLinear(const TrialConfig& config, const ModelConfig& model) {
  const TrialSettings& s = config.settings();
  const trial::Precision precision = s.memory.precision;
  const bool autocast_casts =
      (precision == trial::Precision::kBf16Mixed || precision == trial::Precision::k16Mixed) &&
      s.parallel.strategy != trial::Strategy::kFsdp;
  return s.memory.kernels == trial::Kernels::kFused && s.peft.method == trial::PeftMethod::kNone &&
         !model.mlp_bias && !autocast_casts;
}

int64_t RanksPerNode(const TrialConfig& config) {
  const TrialSettings& s = config.settings();
  // A config checked by FindConfigProblem has devices >= 1; one that was not still gets one rank.
  return IsDataParallel(s) ? std::max<int64_t>(1, s.device.count) : 1;
}

int64_t DataParallelRanks(const TrialConfig& config) {
  const TrialSettings& s = config.settings();
  if (!IsDataParallel(s)) return 1;
  // Each key is bounded (trial_keys.cc), so the product fits; saturating keeps it so regardless.
  return SaturatingMul(RanksPerNode(config), s.parallel.nodes);
}

void ApplyLabSpellings(TrialConfig& config) {
  auto set = [&config](std::string_view key, std::string value) {
    Status status = config.Set(key, KeyValue(std::move(value)));
    if (!status.ok()) GetterMisuse(key, status.message());  // the values are registry constants
  };
  // settings() follows each set below; `optimizer` is the value as written.
  const trial::Optimizer optimizer = config.settings().train.optimizer;
  const bool adamw_for_deepspeed =
      optimizer == trial::Optimizer::kDeepspeedCpu || optimizer == trial::Optimizer::kAdamw;
  if (optimizer == trial::Optimizer::kAdam8bit) set("optimizer", "adamw_8bit");
  if (config.settings().parallel.strategy == trial::Strategy::kDeepspeedStage2Offload &&
      adamw_for_deepspeed) {
    set("optimizer", "adamw");
    set("offload", "optimizer");
    set("strategy", "auto");
  }
  // ZeRO-3 with offload_optimizer and offload_param, as Lightning's strategy of that name sets it.
  if (config.settings().parallel.strategy == trial::Strategy::kDeepspeedStage3Offload &&
      adamw_for_deepspeed) {
    set("optimizer", "adamw");
    set("offload", "full");
    set("strategy", "fsdp");
  }
}

}  // namespace llmctl
