// Content-addressed blobs in DATA/blobs/<sha256>: the files of the input trees the CLI uploads,
// kept until every agent that needs them has a copy. Also the trees a submission names
// (DATA/trees/<digest>.json).
//
// Thread-safe: writers work on their own temporary files and publish with rename(2).
#ifndef LLMCTL_CONTROLLER_BLOB_STORE_H_
#define LLMCTL_CONTROLLER_BLOB_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/digest/digest.h"
#include "common/digest/verified_file.h"
#include "common/mutex.h"
#include "common/status.h"

namespace llmctl::controller {

// Room promised to one blob being written: counted against the free space every other blob of the
// same BlobStore is checked against, from before the write's first byte until Release (or
// destruction: the write committed or was abandoned). Without it, writes that start together each
// find the same room free and together fill the disk. Move-only.
class SpaceReservation {
 public:
  // What a BlobStore's writes in progress were promised, shared with their reservations (which
  // may outlive it).
  struct Promises {
    Mutex mutex;
    int64_t bytes LLMCTL_GUARDED_BY(mutex) = 0;
  };

  SpaceReservation() = default;
  // Takes `bytes`, already added to `promises`.
  SpaceReservation(std::shared_ptr<Promises> promises, int64_t bytes)
      : promises_(std::move(promises)), bytes_(bytes) {}
  ~SpaceReservation() { Release(); }
  SpaceReservation(SpaceReservation&& other) noexcept
      : promises_(std::move(other.promises_)), bytes_(std::exchange(other.bytes_, 0)) {}
  SpaceReservation& operator=(SpaceReservation&& other) noexcept;
  SpaceReservation(const SpaceReservation&) = delete;
  SpaceReservation& operator=(const SpaceReservation&) = delete;

  // No longer promised; again and again is fine.
  void Release();

 private:
  std::shared_ptr<Promises> promises_;
  int64_t bytes_ = 0;
};

// A blob being received under the sha256 it was announced with (BlobStore::BeginWrite).
// Destroying it uncommitted removes what arrived. Not thread-safe.
class BlobWriter {
 public:
  BlobWriter(std::unique_ptr<digest::VerifiedFileWriter> writer, SpaceReservation reservation)
      : writer_(std::move(writer)), reservation_(std::move(reservation)) {}

  // VerifiedFileWriter's.
  Status Append(std::string_view data) { return writer_->Append(data); }
  // VerifiedFileWriter's; the room is no longer promised after it, whatever it returns.
  Status Commit(std::string_view sha256);
  // The file being written, for rpc::ReceiveBlob; its room stays promised until this BlobWriter
  // is destroyed.
  digest::VerifiedFileWriter& file() { return *writer_; }

 private:
  std::unique_ptr<digest::VerifiedFileWriter> writer_;
  SpaceReservation reservation_;
};

// A blob received from an agent, whose sha256 comes only with its last chunk (a fetched
// artifact). Destroying it uncommitted removes what arrived. Not thread-safe.
class ReceivedBlob {
 public:
  ReceivedBlob(std::unique_ptr<digest::VerifiedFileWriter> writer, std::string checked_path,
               std::string blobs_dir, SpaceReservation reservation = {});
  ~ReceivedBlob();
  ReceivedBlob(const ReceivedBlob&) = delete;
  ReceivedBlob& operator=(const ReceivedBlob&) = delete;

  // DataLoss once more bytes arrived than the announced size.
  Status Append(std::string_view data) { return writer_->Append(data); }
  // Checks the size and that the bytes hash to `sha256` (DataLoss otherwise), then publishes them
  // as blob `sha256`. InvalidArgument for a bad digest. The room is no longer promised after it.
  Status Commit(std::string_view sha256);

 private:
  std::unique_ptr<digest::VerifiedFileWriter> writer_;
  const std::string checked_path_;  // where the writer publishes before the blob is named
  const std::string blobs_dir_;
  SpaceReservation reservation_;
};

// Where a BlobStore learns what its filesystem has available (AvailableBytes, common/files.h;
// tests give fixed figures).
using FreeSpaceSource =
    std::function<StatusOr<uint64_t>(std::string_view what, const std::string& dir)>;

// What a blob may not take of its filesystem: the store's database and the daemon's logs live
// beside the blobs and must still be written when a large checkpoint or upload is refused.
inline constexpr int64_t kBlobsKeepFreeBytes = int64_t{1} << 30;

class BlobStore {
 public:
  // Uses (and creates, mode 0700) `root`, `root`/blobs and `root`/trees, and removes the partial
  // blobs a crash left there. FailedPrecondition when one is there but not a directory of this
  // user's that no one else may enter (EnsureOwnDirectory, OthersMay::kNothing: never narrowed). A
  // blob that would leave less than `keep_free_bytes` available on their filesystem (`free_space`'s
  // figure; null: AvailableBytes), once the blobs being written now have their announced sizes, is
  // refused before its first byte (ResourceExhausted). A write in progress counts its whole size
  // until it ends, though what it wrote already lowers the free space too: a blob is refused a
  // little early rather than the disk filled.
  static StatusOr<std::unique_ptr<BlobStore>> Open(const std::string& root,
                                                   int64_t keep_free_bytes = kBlobsKeepFreeBytes,
                                                   FreeSpaceSource free_space = nullptr);

  bool Has(std::string_view sha256) const;
  // The size of blob `sha256` when it is stored; none otherwise (Has's answer, from the same stat).
  std::optional<int64_t> HeldBytes(std::string_view sha256) const;
  std::string PathOf(std::string_view sha256) const;
  // The digests of `wanted` that are not stored, in the order given. InvalidArgument for a digest
  // that is not digest::IsSha256Hex.
  StatusOr<std::vector<std::string>> Missing(std::span<const std::string> wanted) const;
  // Receives blob `sha256` of `size` bytes; Commit(sha256) publishes it. InvalidArgument for a bad
  // digest or a negative size; ResourceExhausted when it does not fit.
  StatusOr<std::unique_ptr<BlobWriter>> BeginWrite(std::string_view sha256, int64_t size) const;

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
  BlobStore(std::string root, int64_t keep_free_bytes, FreeSpaceSource free_space)
      : root_(std::move(root)),
        keep_free_bytes_(keep_free_bytes),
        free_space_(std::move(free_space)) {}

  // Room for `size` more bytes in the blobs directory, promised until the reservation ends;
  // ResourceExhausted (starting with `what`) when it does not fit beside what is kept free and
  // what the writes in progress were promised.
  StatusOr<SpaceReservation> Reserve(std::string_view what, int64_t size) const;

  const std::string root_;  // constant after construction
  const int64_t keep_free_bytes_;
  const FreeSpaceSource free_space_;
  const std::shared_ptr<SpaceReservation::Promises> promises_ =
      std::make_shared<SpaceReservation::Promises>();
};

}  // namespace llmctl::controller

#endif  // LLMCTL_CONTROLLER_BLOB_STORE_H_
