#include "agent/input_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "common/files.h"

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;

std::atomic<uint64_t> g_temp_counter{0};

std::string Errno() { return std::strerror(errno); }

}  // namespace

StatusOr<std::unique_ptr<InputCache>> InputCache::Open(const std::string& cache_dir,
                                                       int64_t keep_free_bytes) {
  // 0700 whatever the umask, and refused when others may write it: llm-train keeps its token
  // files here (LLMCTL_CACHE_DIR) and refuses a cache where others could plant tokens.
  RETURN_IF_ERROR(EnsureOwnDirectory(cache_dir, 0700, OthersMay::kRead));
  for (const char* sub : {"blobs", "trees", "tmp"}) {
    RETURN_IF_ERROR(EnsureOwnDirectory(cache_dir + "/" + sub, 0700, OthersMay::kRead));
  }
  // Whatever an earlier process left half-done is of no use now.
  std::error_code ignored;
  for (fs::directory_iterator it(cache_dir + "/tmp", ignored), end; !ignored && it != end;
       it.increment(ignored)) {
    std::error_code kept;
    fs::remove_all(it->path(), kept);
  }
  return std::unique_ptr<InputCache>(new InputCache(cache_dir, keep_free_bytes));
}

Status InputCache::CheckRoom(std::string_view what, int64_t bytes) const {
  return CheckRoomFor(what, dir_ + "/tmp", bytes, keep_free_bytes_);
}

bool InputCache::HasBlob(const std::string& sha256) const {
  return HeldBlobBytes(sha256).has_value();
}

std::optional<int64_t> InputCache::HeldBlobBytes(const std::string& sha256) const {
  struct stat info;
  if (::stat(BlobPath(sha256).c_str(), &info) != 0 || !S_ISREG(info.st_mode)) return std::nullopt;
  return static_cast<int64_t>(info.st_size);
}

StatusOr<std::vector<std::string>> InputCache::MissingBlobs(
    const std::vector<std::string>& sha256s) const {
  std::vector<std::string> missing;
  for (const std::string& sha256 : sha256s) {
    if (!digest::IsSha256Hex(sha256)) {
      return InvalidArgumentError("'" + sha256 + "' is not a sha256 (64 lowercase hex digits)");
    }
    if (!HasBlob(sha256)) missing.push_back(sha256);
  }
  return missing;
}

Status InputCache::AdoptBlob(const std::string& file, const std::string& sha256) {
  if (!digest::IsSha256Hex(sha256)) return InvalidArgumentError("'" + sha256 + "' is not a sha256");
  if (::chmod(file.c_str(), 0444) != 0) return UnavailableError("chmod " + file + ": " + Errno());
  if (::rename(file.c_str(), BlobPath(sha256).c_str()) != 0) {
    const std::string message = "cannot move " + file + " into the cache: " + Errno();
    ::unlink(file.c_str());
    return UnavailableError(message);
  }
  return Status::Ok();
}

std::string InputCache::TempPath(std::string_view what) {
  return dir_ + "/tmp/" + std::string(what) + "." + std::to_string(::getpid()) + "." +
         std::to_string(g_temp_counter.fetch_add(1));
}

StatusOr<std::unique_ptr<digest::VerifiedFileWriter>> InputCache::BeginUpload(
    const std::string& sha256, int64_t size) {
  if (!digest::IsSha256Hex(sha256)) {
    return InvalidArgumentError("upload: '" + sha256 +
                                "' is not a sha256 (64 lowercase hex digits)");
  }
  if (size < 0) return InvalidArgumentError("upload of " + sha256 + ": negative size");
  RETURN_IF_ERROR(CheckRoom("upload of " + sha256, size));
  const std::string temp = TempPath(sha256);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
  if (fd < 0) return UnavailableError("cannot create " + temp + ": " + Errno());
  return std::make_unique<digest::VerifiedFileWriter>("upload of " + sha256, fd, temp,
                                                      BlobPath(sha256), size);
}

StatusOr<std::string> InputCache::Materialize(const digest::InputTree& tree) {
  RETURN_IF_ERROR(digest::ValidateInputTree("input tree " + tree.digest, tree));
  // A file that is also a directory of another ("a" and "a/b") cannot be laid out.
  std::set<std::string> paths;
  for (const digest::TreeFile& file : tree.files) paths.insert(file.path);
  for (const std::string& path : paths) {
    const auto first_below = paths.lower_bound(path + "/");
    if (first_below != paths.end() && first_below->rfind(path + "/", 0) == 0) {
      return InvalidArgumentError("input tree " + tree.digest + ": '" + path +
                                  "' is both a file and a directory");
    }
  }
  std::vector<std::string> missing;
  for (const digest::TreeFile& file : tree.files) {
    if (!HasBlob(file.sha256)) missing.push_back(file.sha256 + " (" + file.path + ")");
  }
  if (!missing.empty()) {
    std::string list;
    for (const std::string& m : missing) list += (list.empty() ? "" : ", ") + m;
    return FailedPreconditionError("input tree " + tree.digest +
                                   " is incomplete; missing blobs: " + list);
  }
  const std::string final_dir = dir_ + "/trees/" + tree.digest;
  const std::string result = tree.is_file ? final_dir + "/" + tree.files.front().path : final_dir;
  std::error_code error;
  if (fs::is_directory(final_dir, error)) return result;
  if (error && error != std::errc::no_such_file_or_directory) {
    return UnavailableError("input tree " + tree.digest + ": " + error.message());
  }
  error.clear();
  const std::string staging = TempPath("tree-" + tree.digest);
  for (const digest::TreeFile& file : tree.files) {
    const fs::path target = fs::path(staging) / file.path;
    fs::create_directories(target.parent_path(), error);
    if (!error) fs::create_hard_link(BlobPath(file.sha256), target, error);
    if (error) {
      fs::remove_all(staging, error);
      return UnavailableError("cannot lay out input tree " + tree.digest + " (" + file.path +
                              "): " + error.message());
    }
  }
  if (::rename(staging.c_str(), final_dir.c_str()) != 0) {
    const int rename_error = errno;
    fs::remove_all(staging, error);
    // Another call materialised the same tree first: theirs is identical.
    if (rename_error != EEXIST && rename_error != ENOTEMPTY) {
      return UnavailableError("cannot move input tree " + tree.digest +
                              " into place: " + std::strerror(rename_error));
    }
  }
  return result;
}

}  // namespace llmctl::agent
