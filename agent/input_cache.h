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
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace llmctl::agent {

// One file of an input tree (common.proto's TreeFile, as plain values).
struct TreeFile {
  std::string path;  // relative, '/'-separated, no "..", no leading '/'
  std::string sha256;
  int64_t size = 0;
};

struct InputTree {
  std::string digest;  // sha256 of "<sha256> <size> <path>\n" for each file in path order
  std::vector<TreeFile> files;
  bool is_file = false;  // the tree stands for its one file
};

// The digest InputTree::digest must have (files sorted by path, byte order).
std::string TreeDigest(std::vector<TreeFile> files);

// True for 64 lowercase hex digits.
bool IsSha256Hex(std::string_view text);

class BlobUpload;

class InputCache {
 public:
  // Creates the cache's directories under `cache_dir` when missing.
  static StatusOr<std::unique_ptr<InputCache>> Open(const std::string& cache_dir);

  // The digests of `sha256s` that are not in the cache, in the order given. InvalidArgument names
  // the first digest that is not 64 lowercase hex digits.
  StatusOr<std::vector<std::string>> MissingBlobs(const std::vector<std::string>& sha256s) const;

  bool HasBlob(const std::string& sha256) const;

  // Starts receiving a blob of `size` bytes whose sha256 is `sha256`. InvalidArgument for a bad
  // digest or a negative size.
  StatusOr<std::unique_ptr<BlobUpload>> BeginUpload(const std::string& sha256, int64_t size);

  // The tree's directory in the cache (or, for `is_file`, its one file), materialised on first
  // use. InvalidArgument for a digest that does not match the files, unsafe or duplicate paths;
  // FailedPrecondition naming the blobs that are not in the cache yet.
  StatusOr<std::string> Materialize(const InputTree& tree);

  // Moves `file`, a complete file on the cache's filesystem whose sha256 the caller has checked,
  // into the cache as blob `sha256` (read-only); a blob already there holds the same bytes and
  // is replaced atomically. On failure `file` is removed.
  Status AdoptBlob(const std::string& file, const std::string& sha256);

  std::string BlobPath(const std::string& sha256) const { return dir_ + "/blobs/" + sha256; }
  // A path under tmp/ that no other call of this process or another uses.
  std::string TempPath(std::string_view what);

  const std::string& dir() const { return dir_; }

 private:
  explicit InputCache(std::string dir) : dir_(std::move(dir)) {}

  const std::string dir_;  // constant after construction
};

// One blob arriving in pieces. Bytes go to a temporary file; Finish() checks size and sha256 and
// renames it into the cache. Destroying an unfinished upload removes the temporary file.
class BlobUpload {
 public:
  ~BlobUpload();
  BlobUpload(const BlobUpload&) = delete;
  BlobUpload& operator=(const BlobUpload&) = delete;

  // DataLoss once more bytes arrive than the size announced.
  Status Append(std::string_view data);
  // DataLoss when the size or the sha256 differ from the announced ones (nothing is kept).
  Status Finish();

 private:
  friend class InputCache;
  BlobUpload(std::string sha256, int64_t size, std::string temp_path, std::string final_path,
             int fd);

  const std::string sha256_;
  const int64_t size_;
  const std::string temp_path_;
  const std::string final_path_;
  int fd_;
  int64_t received_ = 0;
  struct Hasher;
  std::unique_ptr<Hasher> hasher_;
};

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_INPUT_CACHE_H_
