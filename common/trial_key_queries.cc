// What the rest of llmctl asks of the key registry (its entries: trial_keys.cc): a key or group by
// name, the key a misspelt name meant, how a type and a value are described, the Markdown table.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/spelling.h"
#include "common/trial_keys.h"

namespace llmctl {
namespace {

// Names other tools use for the same settings, so a user arriving from LitGPT or the labs is told
// ours.
constexpr std::pair<std::string_view, std::string_view> kForeignNames[] = {
    {"learning_rate", "train.lr"},
    {"lr_warmup_steps", "train.warmup_steps"},
    {"warmup", "train.warmup_steps"},
    {"num_train_samples", "data.samples"},
    {"max_seq_len", "data.max_seq_length"},
    {"block_size", "data.max_seq_length"},
    {"batch_size", "train.micro_batch_size"},
    {"out_dir", "output_dir"},
    {"gradient_checkpointing", "activation_checkpointing"},
    {"grad_checkpointing", "activation_checkpointing"},
    {"accelerator", "device"},
    {"optim", "optimizer"},
    {"checkpoint_dir", "model"},
    {"lora_r", "peft.r"},
    {"lora_alpha", "peft.alpha"},
    {"lora_dropout", "peft.dropout"},
    {"target_modules", "peft.targets"},
    {"bnb_4bit_use_double_quant", "peft.double_quant"},
    {"bnb_4bit_compute_dtype", "peft.compute_dtype"},
};

std::string_view LastSegment(std::string_view name) {
  const size_t dot = name.rfind('.');
  return dot == std::string_view::npos ? name : name.substr(dot + 1);
}

std::vector<std::string_view> GroupNames() {
  std::vector<std::string_view> groups;
  for (const KeySpec& spec : TrialKeys()) {
    const size_t dot = spec.name.find('.');
    if (dot == std::string_view::npos) continue;
    const std::string_view group = spec.name.substr(0, dot);
    if (std::find(groups.begin(), groups.end(), group) == groups.end()) groups.push_back(group);
  }
  return groups;
}

std::string EscapeMarkdownCell(std::string_view text) {
  std::string escaped;
  for (char c : text) {
    if (c == '|') escaped += '\\';
    escaped += c;
  }
  return escaped;
}

}  // namespace

const KeySpec* FindTrialKey(std::string_view dotted_name) {
  for (const KeySpec& spec : TrialKeys()) {
    if (spec.name == dotted_name) return &spec;
  }
  return nullptr;
}

bool IsTrialKeyGroup(std::string_view prefix) {
  if (prefix.empty()) return false;
  for (const KeySpec& spec : TrialKeys()) {
    if (spec.name.size() > prefix.size() && spec.name.substr(0, prefix.size()) == prefix &&
        spec.name[prefix.size()] == '.') {
      return true;
    }
  }
  return false;
}

std::vector<std::string_view> TrialKeysInGroup(std::string_view group) {
  std::vector<std::string_view> names;
  if (group.empty()) return names;
  for (const KeySpec& spec : TrialKeys()) {
    if (spec.name.size() > group.size() && spec.name.substr(0, group.size()) == group &&
        spec.name[group.size()] == '.') {
      names.push_back(spec.name);
    }
  }
  return names;
}

std::string NearestTrialKey(std::string_view unknown) {
  if (unknown.empty()) return "";
  const std::string_view unknown_last = LastSegment(unknown);
  for (const auto& [foreign, ours] : kForeignNames) {
    if (unknown == foreign || unknown_last == foreign) return std::string(ours);
  }

  // Candidates in registry order so ties go to the earlier (more commonly used) key; groups last.
  std::vector<std::string_view> full_names;
  std::vector<std::string_view> last_segments;
  for (const KeySpec& spec : TrialKeys()) {
    full_names.push_back(spec.name);
    last_segments.push_back(LastSegment(spec.name));
  }
  const std::vector<std::string_view> groups = GroupNames();

  size_t best_distance = SIZE_MAX;
  std::string_view best;
  auto consider = [&](std::string_view typed, std::string_view candidate, std::string_view answer) {
    const size_t distance = EditDistance(typed, candidate);
    if (distance <= MaxTypoDistance(typed) && distance < best_distance) {
      best_distance = distance;
      best = answer;
    }
  };
  for (size_t i = 0; i < full_names.size(); ++i) consider(unknown, full_names[i], full_names[i]);
  // "micro_batch_size" at the top level, or "data.micro_batch_size": the right key under another
  // group.
  for (size_t i = 0; i < full_names.size(); ++i) {
    consider(unknown_last, last_segments[i], full_names[i]);
  }
  for (std::string_view group : groups) consider(unknown, group, group);
  return std::string(best);
}

std::string_view KeyTypeName(KeyType type) {
  switch (type) {
    case KeyType::kString:
      return "string";
    case KeyType::kInt:
      return "integer";
    case KeyType::kFloat:
      return "number";
    case KeyType::kBool:
      return "true/false";
    case KeyType::kEnum:
      return "one of";
    case KeyType::kByteSize:
      return "byte size";
    case KeyType::kFloatList:
      return "list of numbers";
    case KeyType::kStringList:
      return "list of strings";
    case KeyType::kPath:
      return "path";
  }
  return "value";
}

bool IsNodePath(std::string_view value) { return value.starts_with(kNodePathPrefix); }

std::string DescribeExpectedValue(const KeySpec& spec) {
  switch (spec.type) {
    case KeyType::kString:
      return "a string";
    case KeyType::kInt:
      return "an integer";
    case KeyType::kFloat:
      return "a number";
    case KeyType::kBool:
      return "true or false";
    case KeyType::kEnum: {
      std::string text = "one of ";
      for (size_t i = 0; i < spec.allowed.size(); ++i) {
        if (i > 0) text.append(", ");
        text.append(spec.allowed[i]);
      }
      return text;
    }
    case KeyType::kByteSize:
      return "a byte size such as 24GiB";
    case KeyType::kFloatList:
      return "a list of numbers";
    case KeyType::kStringList:
      return "a list of strings";
    case KeyType::kPath:
      return "a path";
  }
  return "a value";
}

std::string TrialKeysMarkdownTable() {
  // Built with append() only: GCC 12 reports a false -Wrestrict on `"literal" + std::string`
  // chains.
  auto code = [](std::string_view text) {
    std::string quoted;
    quoted.append("`").append(text).append("`");
    return quoted;
  };
  std::string table = "| key | type | default | allowed | help |\n|---|---|---|---|---|\n";
  for (const KeySpec& spec : TrialKeys()) {
    std::string default_cell;
    if (!spec.default_value.empty()) {
      default_cell = code(spec.default_value);
    } else if (!spec.default_from.empty()) {
      default_cell.append("= ").append(code(spec.default_from));
    } else {
      default_cell = "(none)";
    }
    std::string allowed_cell;
    for (std::string_view value : spec.allowed) {
      if (!allowed_cell.empty()) allowed_cell.append(", ");
      allowed_cell.append(code(value));
    }
    if (spec.type == KeyType::kInt && spec.max_int != std::numeric_limits<int64_t>::max()) {
      allowed_cell.append("at most ").append(std::to_string(spec.max_int));
    }
    const std::string_view type_name =
        spec.type == KeyType::kEnum ? "enum" : KeyTypeName(spec.type);
    table.append("| ")
        .append(code(spec.name))
        .append(" | ")
        .append(type_name)
        .append(" | ")
        .append(EscapeMarkdownCell(default_cell))
        .append(" | ")
        .append(EscapeMarkdownCell(allowed_cell))
        .append(" | ")
        .append(EscapeMarkdownCell(spec.help))
        .append(" |\n");
  }
  return table;
}

}  // namespace llmctl
