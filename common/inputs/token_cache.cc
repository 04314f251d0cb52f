#include "common/inputs/token_cache.h"

#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "common/data/file_util.h"
#include "common/data/token_file.h"
#include "common/inputs/trial_inputs.h"
#include "common/tokenizer/tokenizer.h"

namespace llmctl {
namespace {

namespace fs = std::filesystem;

// The data pipeline's view of a tokenizer.json tokenizer; its fingerprint is the file's hash.
class TokenizerEncoder final : public data::TextEncoder {
 public:
  TokenizerEncoder(Tokenizer tokenizer, std::string fingerprint)
      : tokenizer_(std::move(tokenizer)), fingerprint_(std::move(fingerprint)) {}
  StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                        bool add_special_tokens) const override {
    return tokenizer_.Encode(text, add_special_tokens);
  }
  int32_t bos_id() const override { return tokenizer_.bos_id().value_or(-1); }
  int32_t eos_id() const override { return tokenizer_.eos_id().value_or(-1); }
  std::string fingerprint() const override { return fingerprint_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }

 private:
  Tokenizer tokenizer_;
  std::string fingerprint_;
};

// $LLMCTL_CACHE_DIR, else $XDG_CACHE_HOME/llmctl, else ~/.cache/llmctl; token files under tokens/.
fs::path TokenCacheDir() {
  if (const char* dir = std::getenv("LLMCTL_CACHE_DIR"); dir != nullptr && *dir) {
    return fs::path(dir) / "tokens";
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg) {
    return fs::path(xdg) / "llmctl" / "tokens";
  }
  const char* home = std::getenv("HOME");
  return fs::path(home != nullptr ? home : "/tmp") / ".cache" / "llmctl" / "tokens";
}

}  // namespace

StatusOr<std::string> CachedTokenFile(
    const std::string& fingerprint, const std::function<Status(const std::string& path)>& prepare) {
  const fs::path dir = TokenCacheDir();
  std::ostringstream name;
  name << std::hex << std::setw(16) << std::setfill('0') << data::Fnv1a64(fingerprint) << ".tok";
  const std::string path = (dir / name.str()).string();
  std::error_code error;
  // The directory comes from the environment: one the system cannot look into is a message.
  const bool cached = fs::exists(path, error);
  if (error) {
    return UnavailableError("cannot use the token cache " + dir.string() + ": " + error.message() +
                            " (set LLMCTL_CACHE_DIR to a usable directory)");
  }
  if (cached) {
    // Its contents checked too (one pass): a file corrupted since it was written is made again
    // here, not refused by every run that opens it.
    auto existing = data::TokenFile::Open(path);
    if (existing.ok() && (*existing)->fingerprint() == fingerprint) return path;
  }
  fs::create_directories(dir, error);
  if (error) {
    return UnavailableError("cannot create the token cache " + dir.string() + ": " +
                            error.message());
  }
  RETURN_IF_ERROR(prepare(path));
  return path;
}

StatusOr<std::unique_ptr<data::TextEncoder>> LoadTrialTokenizer(const TrialConfig& config) {
  ASSIGN_OR_RETURN(std::string path, TrialTokenizerPath(config));
  ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::Load(path));
  ASSIGN_OR_RETURN(uint64_t hash, data::Fnv1a64File(path));
  std::ostringstream fingerprint;
  fingerprint << "fnv1a64:" << std::hex << std::setw(16) << std::setfill('0') << hash;
  return std::unique_ptr<data::TextEncoder>(
      new TokenizerEncoder(std::move(tokenizer), fingerprint.str()));
}

StatusOr<std::string> PrepareTokens(const TrialConfig& config) {
  const std::string& data_path = config.settings().data.path;
  if (data_path.empty()) return InvalidArgumentError("data.path: no dataset given");
  // TrialInputsChecker has compared the tokenizer's vocabulary with the model's.
  ASSIGN_OR_RETURN(auto encoder, LoadTrialTokenizer(config));
  ASSIGN_OR_RETURN(data::PrepareOptions options, data::PrepareOptionsFor(config));
  ASSIGN_OR_RETURN(std::string fingerprint,
                   data::ExpectedFingerprint(data_path, *encoder, options));
  return CachedTokenFile(fingerprint, [&](const std::string& path) {
    return data::PrepareTokenFile(data_path, *encoder, options, path).status();
  });
}

}  // namespace llmctl
