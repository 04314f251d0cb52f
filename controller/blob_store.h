// Content-addressed blobs in DATA/blobs/<sha256>: the files of the input trees the CLI uploads,
// kept until every agent that needs them has a copy. Also the input trees' manifests (the rule in
// proto/llmctl/v1/common.proto) and the trees a submission names (DATA/trees/<digest>.json).
//
// Thread-safe: writers work on their own temporary files and publish with rename(2).
#ifndef LLMCTL_CONTROLLER_BLOB_STORE_H_
#define LLMCTL_CONTROLLER_BLOB_STORE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace llmctl::controller {

// Streaming SHA-256 (OpenSSL).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(std::string_view data);
  std::string HexDigest();  // lowercase hex; ends the computation

 private:
  struct Context;
  std::unique_ptr<Context> context_;
};

std::string Sha256Hex(std::string_view data);
bool IsSha256Hex(std::string_view text);  // 64 lowercase hex digits

struct TreeEntry {
  std::string path;  // relative, '/'-separated
  std::string sha256;
  int64_t size = 0;
};

// An input tree as a submission names it: a file or a directory from the user's machine.
struct InputTreeSpec {
  std::string digest;
  std::vector<TreeEntry> files;  // in path order
  bool is_file = false;
};

// "<sha256> <size> <path>\n" for each file, in the order given.
std::string TreeManifest(std::span<const TreeEntry> files);

// Checks a tree as it arrived: at least one file; paths relative, without "." or ".." segments or
// empty segments, strictly increasing (path order, so no duplicates); each sha256 IsSha256Hex and
// size >= 0; a file tree has exactly one entry; and `digest` equals the sha256 of TreeManifest.
// InvalidArgument messages start with `where` (e.g. "input 'data/x.jsonl'").
Status ValidateInputTree(std::string_view where, const InputTreeSpec& tree);

class BlobStore;

// One blob being received. Append the bytes, then Commit; destroying it uncommitted removes the
// temporary file.
class BlobWriter {
 public:
  ~BlobWriter();
  BlobWriter(const BlobWriter&) = delete;
  BlobWriter& operator=(const BlobWriter&) = delete;

  // OutOfRange once more bytes arrived than the declared size.
  Status Append(std::string_view data);
  // Publishes the blob under its digest. DataLoss when the size or the sha256 of what arrived
  // differs from what was declared (nothing is published).
  Status Commit();

 private:
  friend class BlobStore;
  BlobWriter(std::string final_path, std::string temp_path, int fd, std::string sha256,
             int64_t size);

  const std::string final_path_;
  const std::string temp_path_;
  int fd_;
  const std::string sha256_;
  const int64_t size_;
  int64_t received_ = 0;
  Sha256 hasher_;
  bool committed_ = false;
};

class BlobStore {
 public:
  // Uses (and creates, mode 0700) `root`/blobs and `root`/trees.
  static StatusOr<std::unique_ptr<BlobStore>> Open(const std::string& root);

  bool Has(std::string_view sha256) const;
  std::string PathOf(std::string_view sha256) const;
  // The digests of `wanted` that are not stored, in the order given. InvalidArgument for a digest
  // that is not IsSha256Hex.
  StatusOr<std::vector<std::string>> Missing(std::span<const std::string> wanted) const;
  // InvalidArgument for a bad digest or a negative size.
  StatusOr<std::unique_ptr<BlobWriter>> BeginWrite(std::string_view sha256, int64_t size) const;

  // Keeps a submitted tree (after ValidateInputTree) so the dispatcher can send it to agents.
  // FailedPrecondition when the same digest was kept before as the other kind (a file vs a
  // directory of one file with the same name).
  Status PutTree(const InputTreeSpec& tree) const;
  // NotFound when no tree with this digest was kept; DataLoss when its record is damaged.
  StatusOr<InputTreeSpec> GetTree(std::string_view digest) const;

 private:
  explicit BlobStore(std::string root) : root_(std::move(root)) {}
  const std::string root_;  // constant after construction
};

}  // namespace llmctl::controller

#endif  // LLMCTL_CONTROLLER_BLOB_STORE_H_
