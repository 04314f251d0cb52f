// The trial's tokenized dataset in the token cache, as llm-train trains on it: the tokenizer, the
// cache's file for a fingerprint, and the preparation `llm-train --prepare` does. No LibTorch: the
// trainer and `llmctl estimate` (which draws the micro-batches a run will see) share it.
#ifndef LLMCTL_COMMON_INPUTS_TOKEN_CACHE_H_
#define LLMCTL_COMMON_INPUTS_TOKEN_CACHE_H_

#include <functional>
#include <memory>
#include <string>

#include "common/data/text_encoder.h"
#include "common/status.h"
#include "common/trial_config.h"

namespace llmctl {

// Tokenizes the trial's dataset into the token cache if needed (what `llm-train --prepare` does)
// and returns the token file's path. The trial's inputs are checked first (TrialInputsChecker).
StatusOr<std::string> PrepareTokens(const TrialConfig& config);

// The token cache's file for tokens that `fingerprint` describes (what prepared them, from what),
// under $LLMCTL_CACHE_DIR, else $XDG_CACHE_HOME/llmctl, else ~/.cache/llmctl: `prepare(path)`
// writes it unless a whole file with that fingerprint is there already (its contents checked
// against its hash: a corrupt one is written again). Returns its path.
StatusOr<std::string> CachedTokenFile(
    const std::string& fingerprint, const std::function<Status(const std::string& path)>& prepare);

// The trial's tokenizer (TrialTokenizerPath) for the data pipeline; its fingerprint is
// "fnv1a64:<hash of tokenizer.json>".
StatusOr<std::unique_ptr<data::TextEncoder>> LoadTrialTokenizer(const TrialConfig& config);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_INPUTS_TOKEN_CACHE_H_
