// Content-addressed blobs in DATA/blobs/<sha256>: the files of the input trees the CLI uploads,
// kept until every agent that needs them has a copy. Also the trees a submission names
// (DATA/trees/<digest>.json).
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

#include "common/digest/digest.h"
#include "common/digest/verified_file.h"
#include "common/status.h"

namespace llmctl::controller {

// A blob received from an agent, whose sha256 comes only with its last chunk (a fetched
// artifact). Destroying it uncommitted removes what arrived. Not thread-safe.
class ReceivedBlob {
 public:
  ReceivedBlob(std::unique_ptr<digest::VerifiedFileWriter> writer, std::string checked_path,
               std::string blobs_dir);
  ~ReceivedBlob();
  ReceivedBlob(const ReceivedBlob&) = delete;
  ReceivedBlob& operator=(const ReceivedBlob&) = delete;

  // DataLoss once more bytes arrived than the announced size.
  Status Append(std::string_view data) { return writer_->Append(data); }
  // Checks the size and that the bytes hash to `sha256` (DataLoss otherwise), then publishes them
  // as blob `sha256`. InvalidArgument for a bad digest.
  Status Commit(std::string_view sha256);

 private:
  std::unique_ptr<digest::VerifiedFileWriter> writer_;
  const std::string checked_path_;  // where the writer publishes before the blob is named
  const std::string blobs_dir_;
};

// What a blob may not take of its filesystem: the store's database and the daemon's logs live
// beside the blobs and must still be written when a large checkpoint or upload is refused.
inline constexpr int64_t kBlobsKeepFreeBytes = int64_t{1} << 30;

class BlobStore {
 public:
  // Uses (and creates, mode 0700) `root`/blobs and `root`/trees, and removes the partial blobs a
  // crash left there. A blob that would leave less than `keep_free_bytes` available on their
  // filesystem is refused before its first byte (ResourceExhausted).
  static StatusOr<std::unique_ptr<BlobStore>> Open(const std::string& root,
                                                   int64_t keep_free_bytes = kBlobsKeepFreeBytes);

  bool Has(std::string_view sha256) const;
  std::string PathOf(std::string_view sha256) const;
  // The digests of `wanted` that are not stored, in the order given. InvalidArgument for a digest
  // that is not digest::IsSha256Hex.
  StatusOr<std::vector<std::string>> Missing(std::span<const std::string> wanted) const;
  // Receives blob `sha256` of `size` bytes; Commit(sha256) publishes it. InvalidArgument for a bad
  // digest or a negative size; ResourceExhausted when it does not fit.
  StatusOr<std::unique_ptr<digest::VerifiedFileWriter>> BeginWrite(std::string_view sha256,
                                                                   int64_t size) const;

  // Receives a blob of `size` bytes whose sha256 is named at its end (ReceivedBlob::Commit).
  // InvalidArgument for a negative size; ResourceExhausted when it does not fit.
  StatusOr<std::unique_ptr<ReceivedBlob>> BeginReceive(int64_t size) const;

  // Keeps a submitted tree (after digest::ValidateInputTree) so the dispatcher can send it to
  // agents. FailedPrecondition when the same digest was kept before as the other kind (a file vs a
  // directory of one file with the same name).
  Status PutTree(const digest::InputTree& tree) const;
  // NotFound when no tree with this digest was kept; DataLoss when its record is damaged.
  StatusOr<digest::InputTree> GetTree(std::string_view tree_digest) const;

 private:
  BlobStore(std::string root, int64_t keep_free_bytes)
      : root_(std::move(root)), keep_free_bytes_(keep_free_bytes) {}

  const std::string root_;  // constant after construction
  const int64_t keep_free_bytes_;
};

}  // namespace llmctl::controller

#endif  // LLMCTL_CONTROLLER_BLOB_STORE_H_
