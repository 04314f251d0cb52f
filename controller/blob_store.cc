#include "controller/blob_store.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/files.h"

namespace llmctl::controller {

struct Sha256::Context {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ~Context() { EVP_MD_CTX_free(ctx); }
};

Sha256::Sha256() : context_(std::make_unique<Context>()) {
  EVP_DigestInit_ex(context_->ctx, EVP_sha256(), nullptr);
}
Sha256::~Sha256() = default;

void Sha256::Update(std::string_view data) {
  EVP_DigestUpdate(context_->ctx, data.data(), data.size());
}

std::string Sha256::HexDigest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(context_->ctx, digest, &length);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 15]);
  }
  return hex;
}

std::string Sha256Hex(std::string_view data) {
  Sha256 hasher;
  hasher.Update(data);
  return hasher.HexDigest();
}

bool IsSha256Hex(std::string_view text) {
  if (text.size() != 64) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string TreeManifest(std::span<const TreeEntry> files) {
  std::string manifest;
  for (const TreeEntry& file : files) {
    manifest += file.sha256 + " " + std::to_string(file.size) + " " + file.path + "\n";
  }
  return manifest;
}

namespace {

// Empty when `path` is a clean relative path, else why not.
std::string RelativePathProblem(std::string_view path) {
  if (path.empty()) return "an empty path";
  if (path.front() == '/') return "an absolute path";
  if (path.find('\n') != std::string_view::npos) return "a path with a line break";
  size_t start = 0;
  while (true) {
    const size_t slash = path.find('/', start);
    const std::string_view segment = path.substr(start, slash - start);
    if (segment.empty() || segment == "." || segment == "..") {
      return "an empty, '.' or '..' segment";
    }
    if (slash == std::string_view::npos) return "";
    start = slash + 1;
  }
}

}  // namespace

Status ValidateInputTree(std::string_view where, const InputTreeSpec& tree) {
  const std::string prefix(where);
  if (tree.files.empty()) return InvalidArgumentError(prefix + ": the tree has no files");
  if (tree.is_file && tree.files.size() != 1) {
    return InvalidArgumentError(prefix + ": a file's tree must have exactly one entry, not " +
                                std::to_string(tree.files.size()));
  }
  for (size_t i = 0; i < tree.files.size(); ++i) {
    const TreeEntry& file = tree.files[i];
    if (std::string problem = RelativePathProblem(file.path); !problem.empty()) {
      return InvalidArgumentError(prefix + ": file '" + file.path + "' has " + problem);
    }
    if (i > 0 && !(tree.files[i - 1].path < file.path)) {
      return InvalidArgumentError(prefix + ": files must be in path order without repeats ('" +
                                  tree.files[i - 1].path + "' then '" + file.path + "')");
    }
    if (!IsSha256Hex(file.sha256)) {
      return InvalidArgumentError(prefix + ": file '" + file.path +
                                  "' has no valid sha256 (64 lowercase hex digits)");
    }
    if (file.size < 0) {
      return InvalidArgumentError(prefix + ": file '" + file.path + "' has a negative size");
    }
  }
  const std::string digest = Sha256Hex(TreeManifest(tree.files));
  if (digest != tree.digest) {
    return InvalidArgumentError(prefix + ": digest " + tree.digest +
                                " does not match its manifest (sha256 " + digest + ")");
  }
  return Status::Ok();
}

BlobWriter::BlobWriter(std::string final_path, std::string temp_path, int fd, std::string sha256,
                       int64_t size)
    : final_path_(std::move(final_path)),
      temp_path_(std::move(temp_path)),
      fd_(fd),
      sha256_(std::move(sha256)),
      size_(size) {}

BlobWriter::~BlobWriter() {
  if (fd_ >= 0) close(fd_);
  if (!committed_) unlink(temp_path_.c_str());
}

Status BlobWriter::Append(std::string_view data) {
  if (committed_ || fd_ < 0) return FailedPreconditionError("blob " + sha256_ + " is closed");
  if (received_ + static_cast<int64_t>(data.size()) > size_) {
    return OutOfRangeError("blob " + sha256_ + ": more than the declared " + std::to_string(size_) +
                           " bytes arrived");
  }
  RETURN_IF_ERROR(WriteAll(fd_, data.data(), data.size()));
  hasher_.Update(data);
  received_ += static_cast<int64_t>(data.size());
  return Status::Ok();
}

Status BlobWriter::Commit() {
  if (committed_ || fd_ < 0) return FailedPreconditionError("blob " + sha256_ + " is closed");
  if (received_ != size_) {
    return DataLossError("blob " + sha256_ + ": " + std::to_string(received_) + " bytes arrived, " +
                         std::to_string(size_) + " declared");
  }
  const std::string actual = hasher_.HexDigest();
  if (actual != sha256_) {
    return DataLossError("blob " + sha256_ + ": the bytes that arrived have sha256 " + actual);
  }
  const bool synced = fsync(fd_) == 0;
  close(fd_);
  fd_ = -1;
  if (!synced || rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    return InternalError("blob " + sha256_ + ": cannot store it in " + final_path_ + ": " +
                         std::strerror(errno));
  }
  committed_ = true;
  return Status::Ok();
}

StatusOr<std::unique_ptr<BlobStore>> BlobStore::Open(const std::string& root) {
  const std::vector<std::string> dirs = {root, root + "/blobs", root + "/trees"};
  for (const std::string& dir : dirs) {
    std::error_code error;
    std::filesystem::create_directories(dir, error);
    if (error || chmod(dir.c_str(), 0700) != 0) {
      return FailedPreconditionError("cannot create the directory " + dir + ": " +
                                     (error ? error.message() : std::strerror(errno)));
    }
  }
  return std::unique_ptr<BlobStore>(new BlobStore(root));
}

std::string BlobStore::PathOf(std::string_view sha256) const {
  return root_ + "/blobs/" + std::string(sha256);
}

bool BlobStore::Has(std::string_view sha256) const {
  struct stat info;
  return IsSha256Hex(sha256) && stat(PathOf(sha256).c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

StatusOr<std::vector<std::string>> BlobStore::Missing(std::span<const std::string> wanted) const {
  std::vector<std::string> missing;
  for (const std::string& sha256 : wanted) {
    if (!IsSha256Hex(sha256)) {
      return InvalidArgumentError("no sha256 (64 lowercase hex digits): " + sha256);
    }
    if (!Has(sha256)) missing.push_back(sha256);
  }
  return missing;
}

StatusOr<std::unique_ptr<BlobWriter>> BlobStore::BeginWrite(std::string_view sha256,
                                                            int64_t size) const {
  if (!IsSha256Hex(sha256)) {
    return InvalidArgumentError("upload: no sha256 (64 lowercase hex digits): " +
                                std::string(sha256));
  }
  if (size < 0) return InvalidArgumentError("upload of " + std::string(sha256) + ": negative size");
  std::string temp_path = root_ + "/blobs/.upload-XXXXXX";
  const int fd = mkstemp(temp_path.data());
  if (fd < 0) {
    return InternalError("cannot create a temporary file in " + root_ +
                         "/blobs: " + std::strerror(errno));
  }
  return std::unique_ptr<BlobWriter>(
      new BlobWriter(PathOf(sha256), std::move(temp_path), fd, std::string(sha256), size));
}

Status BlobStore::PutTree(const InputTreeSpec& tree) const {
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
  for (const TreeEntry& file : tree.files) {
    files.push_back({{"path", file.path}, {"sha256", file.sha256}, {"size", file.size}});
  }
  const std::string text =
      nlohmann::json{{"digest", tree.digest}, {"is_file", tree.is_file}, {"files", files}}.dump();
  return WriteFileAtomically(root_ + "/trees/" + tree.digest + ".json",
                             [&](int fd) { return WriteAll(fd, text.data(), text.size()); });
}

StatusOr<InputTreeSpec> BlobStore::GetTree(std::string_view digest) const {
  if (!IsSha256Hex(digest)) {
    return InvalidArgumentError("no tree digest: " + std::string(digest));
  }
  const std::string path = root_ + "/trees/" + std::string(digest) + ".json";
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  InputTreeSpec tree;
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
  Status valid = ValidateInputTree(path, tree);
  if (!valid.ok() || tree.digest != digest) {
    return DataLossError(path + ": damaged tree record" +
                         (valid.ok() ? std::string() : ": " + valid.message()));
  }
  return tree;
}

}  // namespace llmctl::controller
