#include "agent/input_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "agent/sha256.h"
#include "common/atomic_file.h"

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;

std::atomic<uint64_t> g_temp_counter{0};

std::string Errno() { return std::strerror(errno); }

// A path inside a tree: relative, '/'-separated, every component a real name.
Status CheckTreePath(const std::string& path) {
  if (path.empty()) return InvalidArgumentError("a tree file has an empty path");
  if (path.front() == '/') return InvalidArgumentError("tree path '" + path + "' is absolute");
  if (path.find('\0') != std::string::npos) {
    return InvalidArgumentError("tree path '" + path + "' contains a NUL byte");
  }
  size_t start = 0;
  while (start <= path.size()) {
    const size_t end = std::min(path.find('/', start), path.size());
    const std::string_view component(path.data() + start, end - start);
    if (component.empty() || component == "." || component == "..") {
      return InvalidArgumentError("tree path '" + path +
                                  "' must not contain '..', '.' or empty components");
    }
    start = end + 1;
  }
  return Status::Ok();
}

}  // namespace

bool IsSha256Hex(std::string_view text) {
  return text.size() == 64 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::string TreeDigest(std::vector<TreeFile> files) {
  std::sort(files.begin(), files.end(),
            [](const TreeFile& a, const TreeFile& b) { return a.path < b.path; });
  Sha256 hasher;
  for (const TreeFile& file : files) {
    hasher.Update(file.sha256 + " " + std::to_string(file.size) + " " + file.path + "\n");
  }
  return hasher.HexDigest();
}

StatusOr<std::unique_ptr<InputCache>> InputCache::Open(const std::string& cache_dir) {
  for (const char* sub : {"blobs", "trees", "tmp"}) {
    std::error_code error;
    fs::create_directories(cache_dir + "/" + sub, error);
    if (error) {
      return UnavailableError("cannot create " + cache_dir + "/" + sub + ": " + error.message());
    }
  }
  // Whatever an earlier process left half-done is of no use now.
  std::error_code ignored;
  for (const auto& entry : fs::directory_iterator(cache_dir + "/tmp", ignored)) {
    fs::remove_all(entry.path(), ignored);
  }
  return std::unique_ptr<InputCache>(new InputCache(cache_dir));
}

bool InputCache::HasBlob(const std::string& sha256) const {
  struct stat info;
  return ::stat(BlobPath(sha256).c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

StatusOr<std::vector<std::string>> InputCache::MissingBlobs(
    const std::vector<std::string>& sha256s) const {
  std::vector<std::string> missing;
  for (const std::string& sha256 : sha256s) {
    if (!IsSha256Hex(sha256)) {
      return InvalidArgumentError("'" + sha256 + "' is not a sha256 (64 lowercase hex digits)");
    }
    if (!HasBlob(sha256)) missing.push_back(sha256);
  }
  return missing;
}

Status InputCache::AdoptBlob(const std::string& file, const std::string& sha256) {
  if (!IsSha256Hex(sha256)) return InvalidArgumentError("'" + sha256 + "' is not a sha256");
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

StatusOr<std::unique_ptr<BlobUpload>> InputCache::BeginUpload(const std::string& sha256,
                                                              int64_t size) {
  if (!IsSha256Hex(sha256)) {
    return InvalidArgumentError("upload: '" + sha256 +
                                "' is not a sha256 (64 lowercase hex digits)");
  }
  if (size < 0) return InvalidArgumentError("upload of " + sha256 + ": negative size");
  const std::string temp = TempPath(sha256);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
  if (fd < 0) return UnavailableError("cannot create " + temp + ": " + Errno());
  return std::unique_ptr<BlobUpload>(new BlobUpload(sha256, size, temp, BlobPath(sha256), fd));
}

StatusOr<std::string> InputCache::Materialize(const InputTree& tree) {
  if (!IsSha256Hex(tree.digest)) {
    return InvalidArgumentError("input tree digest '" + tree.digest + "' is not a sha256");
  }
  if (tree.files.empty())
    return InvalidArgumentError("input tree " + tree.digest + " has no files");
  if (tree.is_file && tree.files.size() != 1) {
    return InvalidArgumentError("input tree " + tree.digest + " is a file but lists " +
                                std::to_string(tree.files.size()) + " files");
  }
  std::set<std::string> paths;
  for (const TreeFile& file : tree.files) {
    Status path_ok = CheckTreePath(file.path);
    if (!path_ok.ok()) return path_ok.WithContext("input tree " + tree.digest);
    if (!IsSha256Hex(file.sha256) || file.size < 0) {
      return InvalidArgumentError("input tree " + tree.digest + ": file '" + file.path +
                                  "' needs a sha256 of 64 lowercase hex digits and a size >= 0");
    }
    if (!paths.insert(file.path).second) {
      return InvalidArgumentError("input tree " + tree.digest + " lists '" + file.path + "' twice");
    }
  }
  // A file that is also a directory of another ("a" and "a/b") cannot be laid out.
  for (const std::string& path : paths) {
    const auto first_below = paths.lower_bound(path + "/");
    if (first_below != paths.end() && first_below->rfind(path + "/", 0) == 0) {
      return InvalidArgumentError("input tree " + tree.digest + ": '" + path +
                                  "' is both a file and a directory");
    }
  }
  const std::string digest = TreeDigest(tree.files);
  if (digest != tree.digest) {
    return InvalidArgumentError("input tree " + tree.digest +
                                ": the digest does not match its files (their manifest hashes to " +
                                digest + ")");
  }
  std::vector<std::string> missing;
  for (const TreeFile& file : tree.files) {
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
  if (fs::is_directory(final_dir)) return result;
  const std::string staging = TempPath("tree-" + tree.digest);
  std::error_code error;
  for (const TreeFile& file : tree.files) {
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

struct BlobUpload::Hasher {
  Sha256 sha256;
};

BlobUpload::BlobUpload(std::string sha256, int64_t size, std::string temp_path,
                       std::string final_path, int fd)
    : sha256_(std::move(sha256)),
      size_(size),
      temp_path_(std::move(temp_path)),
      final_path_(std::move(final_path)),
      fd_(fd),
      hasher_(std::make_unique<Hasher>()) {}

BlobUpload::~BlobUpload() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temp_path_.c_str());
  }
}

Status BlobUpload::Append(std::string_view data) {
  if (fd_ < 0) return FailedPreconditionError("upload of " + sha256_ + " already finished");
  if (received_ + static_cast<int64_t>(data.size()) > size_) {
    return DataLossError("upload of " + sha256_ + ": more than the announced " +
                         std::to_string(size_) + " bytes arrived");
  }
  RETURN_IF_ERROR(WriteAll(fd_, data.data(), data.size()).WithContext("writing " + temp_path_));
  hasher_->sha256.Update(data);
  received_ += static_cast<int64_t>(data.size());
  return Status::Ok();
}

Status BlobUpload::Finish() {
  if (fd_ < 0) return FailedPreconditionError("upload of " + sha256_ + " already finished");
  if (received_ != size_) {
    return DataLossError("upload of " + sha256_ + ": " + std::to_string(received_) +
                         " bytes arrived, " + std::to_string(size_) + " were announced");
  }
  const std::string actual = hasher_->sha256.HexDigest();
  if (actual != sha256_) {
    return DataLossError("upload of " + sha256_ + ": the bytes that arrived hash to " + actual);
  }
  if (::fsync(fd_) != 0) return UnavailableError("fsync " + temp_path_ + ": " + Errno());
  ::close(fd_);
  fd_ = -1;
  if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    const std::string message = "cannot move " + temp_path_ + " into the cache: " + Errno();
    ::unlink(temp_path_.c_str());
    return UnavailableError(message);
  }
  return Status::Ok();
}

}  // namespace llmctl::agent
