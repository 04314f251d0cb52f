// THE registry of trial keys: every setting an experiment file, `--set key=value` or a stored trial
// can carry.
//
// Everything that reads, validates, documents or suggests keys works from this one table, so adding
// a key here is all it takes for the parser, the CLI, the JSON mapping and the README table to know
// it. Keys are dotted names; in YAML, nested maps flatten to dots (`train: {lr: 1e-3}` is
// `train.lr: 1e-3`). The entries live in trial_keys.cc, what is asked of them (lookups, "did you
// mean", descriptions, the Markdown table) in trial_key_queries.cc.
#ifndef LLMCTL_COMMON_TRIAL_KEYS_H_
#define LLMCTL_COMMON_TRIAL_KEYS_H_

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace llmctl {

enum class KeyType {
  kString,
  kInt,
  kFloat,
  kBool,
  kEnum,        // a string from KeySpec::allowed
  kByteSize,    // "24GiB", see common/byte_size.h; kept as written, read with
                // TrialConfig::GetByteSize
  kFloatList,   // [0.9, 0.95]
  kStringList,  // [a, b]
  kPath,  // a file or directory; relative ones are resolved against the experiment file's folder
};

struct KeySpec {
  std::string_view name;  // dotted: "train.micro_batch_size"
  KeyType type;
  // The default as YAML scalar text ("2e-4", "[0.9, 0.95]", "true"); "" means the key has no value
  // unless set (see default_from).
  std::string_view default_value;
  std::vector<std::string_view> allowed;  // kEnum only
  std::string_view help;                  // one line, for the README table and `--help`
  // For a key without default_value: another key whose value it takes while unset
  // (train.global_batch_size defaults to train.micro_batch_size, i.e. no gradient accumulation).
  std::string_view default_from = {};
  // kInt only: the largest value taken (TrialConfig::Set refuses more). The bounds are far past any
  // real run, and keep the products the checks and estimates form of these keys (micro-batch x
  // devices x nodes, global batch x sequence length, ...) well inside int64_t.
  int64_t max_int = std::numeric_limits<int64_t>::max();
};

// Every key, in documentation order (groups kept together).
const std::vector<KeySpec>& TrialKeys();

// A path value (or `model`) written `node:/abs/path` names a file or directory on the node that
// runs the trial, such as a dataset or model already there: `llmctl submit` neither checks nor
// uploads it, and llm-train reads /abs/path (LocalizeNodePaths). It must be absolute
// (ParseKeyValue refuses it otherwise). Any other path value names something on the machine where
// the experiment file is, and must exist there when submitted.
inline constexpr std::string_view kNodePathPrefix = "node:";
bool IsNodePath(std::string_view value);

// The spec for a dotted name, or null when no such key exists. Exact, case-sensitive match.
const KeySpec* FindTrialKey(std::string_view dotted_name);

// True for a dotted prefix that groups keys ("train", "data"), which YAML may write as a nested
// map.
bool IsTrialKeyGroup(std::string_view prefix);

// The keys under a group, e.g. "train" -> {"train.micro_batch_size", ...}; empty for a non-group.
std::vector<std::string_view> TrialKeysInGroup(std::string_view group);

// The key (or group, for a name like "trian") a user most likely meant by `unknown`, for "did you
// mean" messages: compares the whole name and its last segment with every key's name and last
// segment (edit distance, common/spelling.h), and knows the names LitGPT and the labs use
// ("learning_rate", "num_train_samples", "out_dir", ...). Returns "" when nothing is close.
std::string NearestTrialKey(std::string_view unknown);

// "string", "integer", "number", "true/false", "one of", "byte size", "list of numbers", "list of
// strings", "path": how messages and the README name a type.
std::string_view KeyTypeName(KeyType type);

// What a value of `spec` looks like, for "expected ..." messages: "an integer", "a number", "true
// or false", "one of 32-true, bf16-true, ...", "a byte size such as 24GiB", "a list of numbers", "a
// path".
std::string DescribeExpectedValue(const KeySpec& spec);

// A Markdown table (key | type | default | allowed | help) of every key, generated for the README.
std::string TrialKeysMarkdownTable();

}  // namespace llmctl

#endif  // LLMCTL_COMMON_TRIAL_KEYS_H_
