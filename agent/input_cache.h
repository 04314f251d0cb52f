// The node's content-addressed input cache: blobs named by their sha256, and trees (a dataset, a
// tokenizer, a model directory uploaded from the user's machine) materialised from them with hard
// links.
//
//   DATA/cache/blobs/<sha256>          one file's bytes, read-only
//   DATA/cache/trees/<digest>/<path>   hard links to the blobs, laid out as on the user's machine
//   DATA/cache/tmp/                    uploads and trees being assembled
//   DATA/cache/hub/                    models from the Hugging Face hub (agent/hub.h)
//
// Nothing half-written is ever visible under blobs/ or trees/: both are assembled in tmp/ and
// renamed into place. Thread-safe.
#ifndef LLMCTL_AGENT_INPUT_CACHE_H_
#define LLMCTL_AGENT_INPUT_CACHE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/digest/digest.h"
#include "common/digest/verified_file.h"
#include "common/status.h"

namespace llmctl::agent {

// What the cache may not take of its filesystem: the runs' event files, logs and checkpoints are
// written beside it, and must still fit when a large input or model is refused.
inline constexpr int64_t kCacheKeepFreeBytes = int64_t{1} << 30;

class InputCache {
 public:
  // Creates the cache's directories under `cache_dir` when missing, 0700 whatever the umask;
  // FailedPrecondition when one is there and other users may write it. A blob or download that
  // would leave less than `keep_free_bytes` available on its filesystem is refused before its first
  // byte (ResourceExhausted; CheckRoom).
  static StatusOr<std::unique_ptr<InputCache>> Open(const std::string& cache_dir,
                                                    int64_t keep_free_bytes = kCacheKeepFreeBytes);

  // The digests of `sha256s` that are not in the cache, in the order given. InvalidArgument names
  // the first digest that is not 64 lowercase hex digits.
  StatusOr<std::vector<std::string>> MissingBlobs(const std::vector<std::string>& sha256s) const;

  bool HasBlob(const std::string& sha256) const;
  // The size of blob `sha256` when it is cached; none otherwise (HasBlob's answer, one stat).
  std::optional<int64_t> HeldBlobBytes(const std::string& sha256) const;

  // Starts receiving a blob of `size` bytes whose sha256 is `sha256`; Commit(sha256) moves it into
  // the cache. InvalidArgument for a bad digest or a negative size; ResourceExhausted when it does
  // not fit.
  StatusOr<std::unique_ptr<digest::VerifiedFileWriter>> BeginUpload(const std::string& sha256,
                                                                    int64_t size);

  // The tree's directory in the cache (or, for `is_file`, its one file), materialised on first
  // use. InvalidArgument for a tree digest::ValidateInputTree refuses and for a path that is both a
  // file and a directory; FailedPrecondition naming the blobs that are not in the cache yet.
  StatusOr<std::string> Materialize(const digest::InputTree& tree);

  // Moves `file`, a complete file on the cache's filesystem whose sha256 the caller has checked,
  // into the cache as blob `sha256` (read-only); a blob already there holds the same bytes and
  // is replaced atomically. On failure `file` is removed.
  Status AdoptBlob(const std::string& file, const std::string& sha256);

  // OK when `bytes` more fit in the cache with its keep_free_bytes to spare; ResourceExhausted
  // starting with `what` otherwise.
  Status CheckRoom(std::string_view what, int64_t bytes) const;

  std::string BlobPath(const std::string& sha256) const { return dir_ + "/blobs/" + sha256; }
  // A path under tmp/ that no other call of this process or another uses.
  std::string TempPath(std::string_view what);

  const std::string& dir() const { return dir_; }

 private:
  InputCache(std::string dir, int64_t keep_free_bytes)
      : dir_(std::move(dir)), keep_free_bytes_(keep_free_bytes) {}

  const std::string dir_;  // constant after construction
  const int64_t keep_free_bytes_;
};

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_INPUT_CACHE_H_
