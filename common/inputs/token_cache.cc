#include "common/inputs/token_cache.h"

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

#include "common/atomic_file.h"
#include "common/data/file_util.h"
#include "common/data/token_file.h"
#include "common/file_lock.h"
#include "common/files.h"
#include "common/home_directory.h"
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

// What every refusal of the cache ends with: how to point it elsewhere.
constexpr char kCacheAdvice[] =
    "set LLMCTL_CACHE_DIR to a directory of yours that only you can write";

// `problem` starts with the directory it is about.
Status CacheError(std::string_view problem) {
  return UnavailableError(
      std::string("cannot use the token cache ").append(problem).append("; ").append(kCacheAdvice));
}

// The cache's own directory: $LLMCTL_CACHE_DIR, else $XDG_CACHE_HOME/llmctl, else
// ~/.cache/llmctl, ~ the home directory by common/home_directory.h's rule (HOME, else the password
// database's). Never a shared place such as /tmp (where HOME unset once sent it): another local
// user could create it first and plant token files that runs would then train on.
StatusOr<fs::path> CacheBaseDir() {
  if (const char* dir = std::getenv("LLMCTL_CACHE_DIR"); dir != nullptr && *dir) return dir;
  // A relative XDG_CACHE_HOME is ignored, as the XDG base directory spec says.
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg == '/') {
    return fs::path(xdg) / "llmctl";
  }
  StatusOr<fs::path> home = HomeDirectoryOfThisProcess();
  if (!home.ok()) {
    return UnavailableError(std::string("no directory for the token cache: ")
                                .append(home.status().message())
                                .append("; ")
                                .append(kCacheAdvice));
  }
  return *home / ".cache" / "llmctl";
}

// The cache's tokens/ directory, made (0700) and checked: the base and tokens/ each a directory
// of this user's that no other user can write, or token files planted in it would be trained on,
// and not a link, which its owner could turn to such a directory after the check.
// The directories above the base are the user's (~/.cache) and made as usual.
StatusOr<fs::path> UsableTokenCacheDir() {
  ASSIGN_OR_RETURN(const fs::path base, CacheBaseDir());
  const fs::path tokens = base / "tokens";
  for (const fs::path& dir : {base, tokens}) {
    const Status made = EnsureOwnDirectory(dir.string(), 0700, OthersMay::kRead);
    if (!made.ok()) return CacheError(made.message());
  }
  return tokens;
}

std::string TokenFileName(const std::string& fingerprint) {
  std::ostringstream name;
  name << std::hex << std::setw(16) << std::setfill('0') << data::Fnv1a64(fingerprint) << ".tok";
  return name.str();
}

// PrepareTokens's work, the file placed by `place` (CachedTokenFile or
// CachedOrTemporaryTokenFile).
template <typename Place>
auto PrepareTokensWith(const TrialConfig& config, const Place& place)
    -> decltype(place(std::string(), std::function<Status(const std::string&)>())) {
  const std::string& data_path = config.settings().data.path;
  if (data_path.empty()) return InvalidArgumentError("data.path: no dataset given");
  // TrialInputsChecker has compared the tokenizer's vocabulary with the model's.
  ASSIGN_OR_RETURN(auto encoder, LoadTrialTokenizer(config));
  ASSIGN_OR_RETURN(data::PrepareOptions options, data::PrepareOptionsFor(config));
  ASSIGN_OR_RETURN(std::string fingerprint,
                   data::ExpectedFingerprint(data_path, *encoder, options));
  return place(fingerprint, [&](const std::string& path) {
    return data::PrepareTokenFile(data_path, *encoder, options, path).status();
  });
}

// Whether the cache holds a whole token file for `fingerprint` at `path` in `dir`.
StatusOr<bool> IsCached(const fs::path& dir, const std::string& path,
                        const std::string& fingerprint) {
  std::error_code error;
  // The directory comes from the environment: one the system cannot look into is a message.
  const bool exists = fs::exists(path, error);
  if (error) return CacheError(dir.string().append(": ").append(error.message()));
  if (!exists) return false;
  // Its contents checked too (one pass): a file corrupted since it was written is made again
  // here, not refused by every run that opens it.
  auto existing = data::TokenFile::Open(path);
  return existing.ok() && (*existing)->fingerprint() == fingerprint;
}

// CachedTokenFile's work in the cache's tokens/ directory `dir`, made and checked.
StatusOr<std::string> CachedTokenFileIn(
    const fs::path& dir, const std::string& fingerprint,
    const std::function<Status(const std::string& path)>& prepare) {
  const std::string path = (dir / TokenFileName(fingerprint)).string();
  ASSIGN_OR_RETURN(bool cached, IsCached(dir, path, fingerprint));
  if (cached) return path;
  // One process at a time prepares `path`, so the one holding <path>.lock may remove what a crashed
  // preparation left beside it (RemoveAtomicWriteLeftovers), which no other is writing then, and
  // the others find the file made.
  StatusOr<FileLock> lock = FileLock::Acquire(path + ".lock");
  if (!lock.ok()) return CacheError(lock.status().message());
  // Another process may have made it while this one waited for the lock.
  ASSIGN_OR_RETURN(cached, IsCached(dir, path, fingerprint));
  if (cached) return path;
  // A preparation killed midway left its temporary (as large as the file) and perhaps a scratch
  // file. One that cannot be removed costs only room, which the preparation checks for.
  (void)RemoveAtomicWriteLeftovers(path);
  RETURN_IF_ERROR(prepare(path));
  return path;
}

}  // namespace

StatusOr<std::string> TokenCacheLocation() {
  ASSIGN_OR_RETURN(const fs::path base, CacheBaseDir());
  return (base / "tokens").string();
}

StatusOr<std::string> CachedTokenFile(
    const std::string& fingerprint, const std::function<Status(const std::string& path)>& prepare) {
  ASSIGN_OR_RETURN(const fs::path dir, UsableTokenCacheDir());
  return CachedTokenFileIn(dir, fingerprint, prepare);
}

TokenFileRef::TokenFileRef(std::string path, std::string temporary_dir)
    : path_(std::move(path)), temporary_dir_(std::move(temporary_dir)) {}

TokenFileRef::TokenFileRef(TokenFileRef&& other) noexcept
    : path_(std::move(other.path_)), temporary_dir_(std::exchange(other.temporary_dir_, "")) {}

TokenFileRef::~TokenFileRef() {
  if (temporary_dir_.empty()) return;
  std::error_code ignored;
  fs::remove_all(temporary_dir_, ignored);
}

StatusOr<TokenFileRef> CachedOrTemporaryTokenFile(
    const std::string& fingerprint, const std::function<Status(const std::string& path)>& prepare) {
  StatusOr<fs::path> dir = UsableTokenCacheDir();
  if (dir.ok()) {
    ASSIGN_OR_RETURN(std::string path, CachedTokenFileIn(*dir, fingerprint, prepare));
    return TokenFileRef(std::move(path), "");
  }
  // Said once per process: an estimate of many trials would repeat it for each.
  static std::atomic<bool> noted{false};
  if (!noted.exchange(true)) {
    std::cerr << "note: tokenizing without the token cache, into a temporary directory each time: "
              << dir.status().message() << "\n";
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = (fs::path(tmp != nullptr && *tmp ? tmp : "/tmp") / "llmctl-tokens-XXXXXX");
  // mkdtemp: a new directory of this user's, mode 0700, whatever else is in the shared place.
  if (::mkdtemp(pattern.data()) == nullptr) {
    return UnavailableError(std::string("cannot create a temporary directory ")
                                .append(pattern)
                                .append(" for the tokens: ")
                                .append(std::strerror(errno)));
  }
  TokenFileRef file((fs::path(pattern) / TokenFileName(fingerprint)).string(), pattern);
  RETURN_IF_ERROR(prepare(file.path()));
  return file;
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
  return PrepareTokensWith(config, CachedTokenFile);
}

StatusOr<TokenFileRef> PrepareTokensToRead(const TrialConfig& config) {
  return PrepareTokensWith(config, CachedOrTemporaryTokenFile);
}

}  // namespace llmctl
