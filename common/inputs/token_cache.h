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

// Where the token cache's files go: $LLMCTL_CACHE_DIR/tokens, else $XDG_CACHE_HOME/llmctl/tokens,
// else ~/.cache/llmctl/tokens, ~ the home directory by common/home_directory.h's rule (HOME, else
// the password database's; never a shared place such as /tmp). Unavailable, naming
// LLMCTL_CACHE_DIR, when there is none or HOME is relative. Nothing is created.
StatusOr<std::string> TokenCacheLocation();

// The token cache's file for tokens that `fingerprint` describes (what prepared them, from what),
// under TokenCacheLocation(): `prepare(path)` writes it unless a whole file with that fingerprint
// is there already (its contents checked against its hash: a corrupt one is written again).
// `prepare` runs under an exclusive flock on <path>.lock (a second process waits, then finds the
// file made), after what a killed preparation left beside it is removed
// (RemoveAtomicWriteLeftovers). Returns its path. The cache's directories are made 0700;
// Unavailable, naming the directory and LLMCTL_CACHE_DIR, when one cannot be made or is not a
// directory of this user's that only they can write (another user could plant token files in it).
StatusOr<std::string> CachedTokenFile(
    const std::string& fingerprint, const std::function<Status(const std::string& path)>& prepare);

// A token file to read while this object lives: the cache's, or one in a private temporary
// directory that is removed with it.
class TokenFileRef {
 public:
  TokenFileRef(std::string path, std::string temporary_dir);
  TokenFileRef(TokenFileRef&& other) noexcept;
  TokenFileRef& operator=(TokenFileRef&&) = delete;
  TokenFileRef(const TokenFileRef&) = delete;
  TokenFileRef& operator=(const TokenFileRef&) = delete;
  ~TokenFileRef();

  const std::string& path() const { return path_; }
  bool cached() const { return temporary_dir_.empty(); }

 private:
  std::string path_;
  std::string temporary_dir_;  // removed on destruction; "" for the cache's file
};

// CachedTokenFile, except that a cache that cannot be used (as CachedTokenFile refuses it) is not
// an error: the file is written into a new private directory ($TMPDIR or /tmp, mkdtemp) and a note
// saying why goes to stderr once per process. For `llmctl estimate`, which reads the file once and
// should not fail for want of a cache; llm-train keeps its tokens in the cache.
StatusOr<TokenFileRef> CachedOrTemporaryTokenFile(
    const std::string& fingerprint, const std::function<Status(const std::string& path)>& prepare);

// PrepareTokens through CachedOrTemporaryTokenFile.
StatusOr<TokenFileRef> PrepareTokensToRead(const TrialConfig& config);

// The trial's tokenizer (TrialTokenizerPath) for the data pipeline; its fingerprint is
// "fnv1a64:<hash of tokenizer.json>".
StatusOr<std::unique_ptr<data::TextEncoder>> LoadTrialTokenizer(const TrialConfig& config);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_INPUTS_TOKEN_CACHE_H_
