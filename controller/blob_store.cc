#include "controller/blob_store.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>

#include "common/atomic_file.h"
#include "common/files.h"

namespace llmctl::controller {

namespace {

// Whether `name` is a temporary of BeginWrite (.upload-XXXXXX) or BeginReceive (.receive-XXXXXX,
// and its .receive-XXXXXX.checked), as mkstemp makes them.
bool IsPartialBlob(std::string_view name) {
  for (const std::string_view prefix : {".upload-", ".receive-"}) {
    if (!name.starts_with(prefix)) continue;
    std::string_view rest = name.substr(prefix.size());
    if (prefix == ".receive-" && rest.ends_with(".checked")) {
      rest.remove_suffix(std::string_view(".checked").size());
    }
    return rest.size() == 6 &&
           rest.find_first_not_of(
               "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") ==
               std::string_view::npos;
  }
  return false;
}

}  // namespace

StatusOr<std::unique_ptr<BlobStore>> BlobStore::Open(const std::string& root,
                                                     int64_t keep_free_bytes,
                                                     FreeSpaceSource free_space) {
  const std::vector<std::string> dirs = {root, root + "/blobs", root + "/trees"};
  // One that is there already is refused, not narrowed: while it was open, another user could
  // have read the blobs or put blobs of theirs under the digests of the user's inputs.
  for (const std::string& dir : dirs) {
    if (const Status made = EnsureOwnDirectory(dir, 0700, OthersMay::kNothing); !made.ok()) {
      return FailedPreconditionError(
          std::string(made.message())
              .append("; the blob store keeps the inputs uploaded to it there, which no one else "
                      "may read"));
    }
  }
  // No write is in progress at Open (the daemon holds its data directory alone), so what is named
  // as a partial blob is one a crash left.
  if (StatusOr<int> removed = RemoveLeftoverFiles(root + "/blobs", IsPartialBlob); !removed.ok()) {
    spdlog::warn("blobs: partial blobs a crash left: {}", removed.status().ToString());
  } else if (*removed > 0) {
    spdlog::warn("blobs: removed {} partial blobs a crash left in {}/blobs", *removed, root);
  }
  if (free_space == nullptr) free_space = AvailableBytes;
  return std::unique_ptr<BlobStore>(new BlobStore(root, keep_free_bytes, std::move(free_space)));
}

SpaceReservation& SpaceReservation::operator=(SpaceReservation&& other) noexcept {
  if (this != &other) {
    Release();
    promises_ = std::move(other.promises_);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void SpaceReservation::Release() {
  if (promises_ == nullptr || bytes_ == 0) return;
  MutexLock lock(promises_->mutex);
  promises_->bytes -= bytes_;
  bytes_ = 0;
}

Status BlobWriter::Commit(std::string_view sha256) {
  const Status committed = writer_->Commit(sha256);
  // Written and renamed, or refused and removed: the free space now says what the blob takes.
  reservation_.Release();
  return committed;
}

StatusOr<SpaceReservation> BlobStore::Reserve(std::string_view what, int64_t size) const {
  const std::string dir = root_ + "/blobs";
  size = std::max<int64_t>(size, 0);
  // Checked and promised under one lock: two writers cannot both count the same room.
  MutexLock lock(promises_->mutex);
  ASSIGN_OR_RETURN(const uint64_t available, free_space_(what, dir));
  RETURN_IF_ERROR(CheckRoomIn(what, dir, available, size, keep_free_bytes_, promises_->bytes));
  promises_->bytes += size;
  return SpaceReservation(promises_, size);
}

std::string BlobStore::PathOf(std::string_view sha256) const {
  return root_ + "/blobs/" + std::string(sha256);
}

bool BlobStore::Has(std::string_view sha256) const { return HeldBytes(sha256).has_value(); }

std::optional<int64_t> BlobStore::HeldBytes(std::string_view sha256) const {
  struct stat info;
  if (!digest::IsSha256Hex(sha256) || stat(PathOf(sha256).c_str(), &info) != 0 ||
      !S_ISREG(info.st_mode)) {
    return std::nullopt;
  }
  return static_cast<int64_t>(info.st_size);
}

StatusOr<std::vector<std::string>> BlobStore::Missing(std::span<const std::string> wanted) const {
  std::vector<std::string> missing;
  for (const std::string& sha256 : wanted) {
    if (!digest::IsSha256Hex(sha256)) {
      return InvalidArgumentError("no sha256 (64 lowercase hex digits): " + sha256);
    }
    if (!Has(sha256)) missing.push_back(sha256);
  }
  return missing;
}

StatusOr<std::unique_ptr<BlobWriter>> BlobStore::BeginWrite(std::string_view sha256,
                                                            int64_t size) const {
  if (!digest::IsSha256Hex(sha256)) {
    return InvalidArgumentError("upload: no sha256 (64 lowercase hex digits): " +
                                std::string(sha256));
  }
  if (size < 0) return InvalidArgumentError("upload of " + std::string(sha256) + ": negative size");
  ASSIGN_OR_RETURN(SpaceReservation room, Reserve("upload of " + std::string(sha256), size));
  std::string temp_path = root_ + "/blobs/.upload-XXXXXX";
  const int fd = mkstemp(temp_path.data());
  if (fd < 0) {
    return InternalError("cannot create a temporary file in " + root_ +
                         "/blobs: " + std::strerror(errno));
  }
  return std::make_unique<BlobWriter>(
      std::make_unique<digest::VerifiedFileWriter>("upload of " + std::string(sha256), fd,
                                                   std::move(temp_path), PathOf(sha256), size),
      std::move(room));
}

ReceivedBlob::ReceivedBlob(std::unique_ptr<digest::VerifiedFileWriter> writer,
                           std::string checked_path, std::string blobs_dir,
                           SpaceReservation reservation)
    : writer_(std::move(writer)),
      checked_path_(std::move(checked_path)),
      blobs_dir_(std::move(blobs_dir)),
      reservation_(std::move(reservation)) {}

ReceivedBlob::~ReceivedBlob() { unlink(checked_path_.c_str()); }

Status ReceivedBlob::Commit(std::string_view sha256) {
  if (!digest::IsSha256Hex(sha256)) {
    return InvalidArgumentError("received blob: no sha256 (64 lowercase hex digits): " +
                                std::string(sha256));
  }
  // The writer checks the bytes against `sha256` before they appear at checked_path_; only then
  // do they take the blob's name. Written (or refused and removed), the blob's room is no longer
  // promised: the free space says what it takes.
  const Status committed = writer_->Commit(sha256);
  reservation_.Release();
  RETURN_IF_ERROR(committed);
  const std::string final_path = blobs_dir_ + "/" + std::string(sha256);
  if (::rename(checked_path_.c_str(), final_path.c_str()) != 0) {
    return InternalError("cannot rename " + checked_path_ + " to " + final_path + ": " +
                         std::strerror(errno));
  }
  // The writer's sync covered the checked name; this rename needs its own to outlast a power loss.
  return SyncDirectoryOf(final_path).WithContext("received blob");
}

StatusOr<std::unique_ptr<ReceivedBlob>> BlobStore::BeginReceive(int64_t size) const {
  if (size < 0) return InvalidArgumentError("received blob: negative size");
  ASSIGN_OR_RETURN(SpaceReservation room, Reserve("received blob", size));
  std::string temp_path = root_ + "/blobs/.receive-XXXXXX";
  const int fd = mkstemp(temp_path.data());
  if (fd < 0) {
    return InternalError("cannot create a temporary file in " + root_ +
                         "/blobs: " + std::strerror(errno));
  }
  std::string checked_path = temp_path + ".checked";
  auto writer = std::make_unique<digest::VerifiedFileWriter>("received blob", fd, temp_path,
                                                             checked_path, size);
  return std::make_unique<ReceivedBlob>(std::move(writer), std::move(checked_path),
                                        root_ + "/blobs", std::move(room));
}

Status BlobStore::PutTree(const digest::InputTree& tree) const {
  auto existing = GetTree(tree.digest);
  if (existing.ok()) {
    if (existing->is_file != tree.is_file) {
      return FailedPreconditionError("input tree " + tree.digest + " was uploaded before as a " +
                                     (existing->is_file ? "file" : "directory") +
                                     "; rename the file or directory");
    }
    return Status::Ok();
  }
  nlohmann::json files = nlohmann::json::array();
  for (const digest::TreeFile& file : tree.files) {
    files.push_back({{"path", file.path}, {"sha256", file.sha256}, {"size", file.size}});
  }
  const std::string text =
      nlohmann::json{{"digest", tree.digest}, {"is_file", tree.is_file}, {"files", files}}.dump();
  return WriteFileAtomically(root_ + "/trees/" + tree.digest + ".json",
                             [&](int fd) { return WriteAll(fd, text.data(), text.size()); });
}

StatusOr<digest::InputTree> BlobStore::GetTree(std::string_view tree_digest) const {
  if (!digest::IsSha256Hex(tree_digest)) {
    return InvalidArgumentError("no tree digest: " + std::string(tree_digest));
  }
  const std::string path = root_ + "/trees/" + std::string(tree_digest) + ".json";
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  digest::InputTree tree;
  try {
    const nlohmann::json json = nlohmann::json::parse(text);
    tree.digest = json.at("digest").get<std::string>();
    tree.is_file = json.at("is_file").get<bool>();
    for (const nlohmann::json& file : json.at("files")) {
      tree.files.push_back({file.at("path").get<std::string>(),
                            file.at("sha256").get<std::string>(), file.at("size").get<int64_t>()});
    }
  } catch (const nlohmann::json::exception& e) {
    return DataLossError(path + ": damaged tree record: " + e.what());
  }
  Status valid = digest::ValidateInputTree(path, tree);
  if (!valid.ok() || tree.digest != tree_digest) {
    return DataLossError(path + ": damaged tree record" +
                         (valid.ok() ? std::string() : ": " + valid.message()));
  }
  return tree;
}

}  // namespace llmctl::controller
