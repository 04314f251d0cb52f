// Every file a trial reads, checked the way llm-train reads it but without LibTorch and without
// reading weights: the dataset's records parsed, rendered through the prompt template and counted
// against one micro-batch; the tokenizer loaded and compared with the model's vocabulary; a model
// directory's config.json and its safetensors headers against the tensors the model needs; a PEFT
// adapter's config and header. llm-train runs it before anything loads and `llmctl submit` before
// anything is stored or sent, so a bad input costs seconds on the user's machine, not lease time
// on a GPU node, and both say the same thing about it.
#ifndef LLMCTL_COMMON_INPUTS_TRIAL_INPUTS_H_
#define LLMCTL_COMMON_INPUTS_TRIAL_INPUTS_H_

#include <cstdint>
#include <map>
#include <string>

#include "common/model_config.h"
#include "common/safetensors/safetensors.h"
#include "common/status.h"
#include "common/trial_config.h"

namespace llmctl {

// A PEFT adapter directory's files (PEFT's names).
inline constexpr const char* kAdapterConfigFile = "adapter_config.json";
inline constexpr const char* kAdapterWeightsFile = "adapter_model.safetensors";
inline constexpr size_t kMaxAdapterConfigBytes = 1 << 20;

// The tokenizer.json a trial reads: `tokenizer` (a file, or a directory holding tokenizer.json),
// else the model directory's. InvalidArgument for a preset model without `tokenizer` (presets have
// no files).
StatusOr<std::string> TrialTokenizerPath(const TrialConfig& config);

// The checkpoint in `source` (a model directory, for messages) holds exactly the tensors
// CheckpointTensors(model) names, with their shapes and a floating-point dtype; lm_head.weight of a
// tied model and rotary tables are tolerated, as transformers does. DataLoss naming the tensor.
Status CheckCheckpointTensors(const safetensors::ShardedCheckpoint& checkpoint,
                              const ModelConfig& model, const std::string& source);

struct TrialInputsSummary {
  int64_t records = 0;             // dataset records the trial trains on (after data.samples)
  std::string tokenizer_path;      // the tokenizer.json read; "" when not checked
  int64_t tokenizer_vocab = 0;     // its vocabulary size
  int64_t checkpoint_tensors = 0;  // tensors whose headers were checked; 0 for init: random
};

// Checks every input of `config` that names something here. `model` is the trial's shape (null when
// it is taken on trust, such as a hub model only an agent downloads: then the checks that need it
// are skipped). Values that are node paths (IsNodePath) are left alone: they are read on the node.
// Repeated calls with the same files do the work once (`cache` may be shared across trials; null
// for no sharing). Errors name the path as `config` holds it, with the line where there is one
// ("data.jsonl:17: missing field 'output'"), prefixed by the key ("data.path: ...").
class TrialInputsChecker {
 public:
  StatusOr<TrialInputsSummary> Check(const TrialConfig& config, const ModelConfig* model);

 private:
  StatusOr<int64_t> CheckData(const TrialConfig& config);
  StatusOr<int64_t> CheckTokenizer(const std::string& path);
  StatusOr<int64_t> CheckCheckpoint(const std::string& dir, const ModelConfig& model);
  Status CheckAdapter(const std::string& dir);

  std::map<std::string, StatusOr<int64_t>> done_;  // what was already checked → its answer
};

}  // namespace llmctl

#endif  // LLMCTL_COMMON_INPUTS_TRIAL_INPUTS_H_
