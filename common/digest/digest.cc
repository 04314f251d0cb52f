#include "common/digest/digest.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstdlib>

namespace llmctl::digest {

struct Hasher::Context {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ~Context() { EVP_MD_CTX_free(ctx); }
};

Hasher::Hasher(Algorithm algorithm) : context_(std::make_unique<Context>()) {
  const EVP_MD* md = algorithm == Algorithm::kSha256 ? EVP_sha256() : EVP_sha1();
  // Only fails when OpenSSL cannot allocate; nothing sensible can continue then.
  if (context_->ctx == nullptr || EVP_DigestInit_ex(context_->ctx, md, nullptr) != 1) {
    std::abort();
  }
}

Hasher::~Hasher() = default;

void Hasher::Update(std::string_view data) {
  EVP_DigestUpdate(context_->ctx, data.data(), data.size());
}

std::string Hasher::HexDigest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(context_->ctx, digest, &length);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 15]);
  }
  return hex;
}

GitBlobId::GitBlobId(uint64_t size) : Hasher(Algorithm::kSha1) {
  Update("blob " + std::to_string(size) + std::string(1, '\0'));
}

std::string Sha256Hex(std::string_view data) {
  Sha256 hasher;
  hasher.Update(data);
  return hasher.HexDigest();
}

bool IsSha256Hex(std::string_view text) {
  return text.size() == 64 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::string TreeManifest(std::span<const TreeFile> files) {
  std::string manifest;
  for (const TreeFile& file : files) {
    manifest += file.sha256 + " " + std::to_string(file.size) + " " + file.path + "\n";
  }
  return manifest;
}

std::string TreeDigest(std::span<const TreeFile> files) { return Sha256Hex(TreeManifest(files)); }

std::string RelativePathProblem(std::string_view path) {
  if (path.empty()) return "an empty path";
  if (path.front() == '/') return "an absolute path";
  if (path.find('\n') != std::string_view::npos) return "a path with a line break";
  if (path.find('\0') != std::string_view::npos) return "a path with a NUL byte";
  // Another process's name becomes a file's on the user's disk and appears in messages.
  if (std::any_of(path.begin(), path.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
    return "a path with a control character";
  }
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

std::string RunArtifactPathProblem(std::string_view path) {
  if (std::string problem = RelativePathProblem(path); !problem.empty()) return problem;
  // The fetch writes each file as NAME.part first: an artifact of that name would be one of them.
  if (path.ends_with(".part")) return "a name ending in .part (the fetch's partial files)";
  if (path.starts_with("output/")) return "";
  if (path.find('/') != std::string_view::npos) return "a path outside the run's output/ directory";
  // The run's own files (its logs, events, trial.yaml): none is hidden, and a name such as .bashrc
  // fetched into a home directory would replace the user's.
  if (path.front() == '.') return "a hidden name beside the run's own files";
  return "";
}

Status ValidateInputTree(std::string_view where, const InputTree& tree) {
  const std::string prefix(where);
  if (tree.files.empty()) return InvalidArgumentError(prefix + ": the tree has no files");
  if (tree.is_file && tree.files.size() != 1) {
    return InvalidArgumentError(prefix + ": a file's tree must have exactly one entry, not " +
                                std::to_string(tree.files.size()));
  }
  for (size_t i = 0; i < tree.files.size(); ++i) {
    const TreeFile& file = tree.files[i];
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
  const std::string digest = TreeDigest(tree.files);
  if (digest != tree.digest) {
    return InvalidArgumentError(prefix + ": digest " + tree.digest +
                                " does not match its manifest (sha256 " + digest + ")");
  }
  return Status::Ok();
}

}  // namespace llmctl::digest
