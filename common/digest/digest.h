// The project's one way to hash: streaming SHA-256 as lowercase hex (blobs, downloads, artifacts),
// git's blob ids (the Hugging Face hub lists them for files outside LFS), and the digest of an
// input tree, whose rule proto/llmctl/v1/common.proto states (InputTree). OpenSSL's EVP underneath;
// plain values only, so the agent, the controller and the CLI share it without protobuf.
#ifndef LLMCTL_COMMON_DIGEST_DIGEST_H_
#define LLMCTL_COMMON_DIGEST_DIGEST_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace llmctl::digest {

// A digest computed piece by piece, for data too large to hold at once. Not thread-safe.
class Hasher {
 public:
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  void Update(std::string_view data);
  // Lowercase hex of everything updated so far; the hasher is spent afterwards.
  std::string HexDigest();

 protected:
  enum class Algorithm { kSha1, kSha256 };
  explicit Hasher(Algorithm algorithm);

 private:
  struct Context;
  std::unique_ptr<Context> context_;
};

class Sha256 : public Hasher {
 public:
  Sha256() : Hasher(Algorithm::kSha256) {}
};

// git's object id of a blob of `size` bytes: sha1 of "blob <size>\0" and then the bytes.
class GitBlobId : public Hasher {
 public:
  explicit GitBlobId(uint64_t size);
};

std::string Sha256Hex(std::string_view data);

// True for 64 lowercase hex digits.
bool IsSha256Hex(std::string_view text);

// One file of an input tree (common.proto's TreeFile, as plain values).
struct TreeFile {
  std::string path;  // relative, '/'-separated
  std::string sha256;
  int64_t size = 0;
};

// A file or directory from the user's machine (common.proto's InputTree, as plain values).
struct InputTree {
  std::string digest;
  std::vector<TreeFile> files;  // in path order
  bool is_file = false;         // the tree stands for its one file
};

// "<sha256> <size> <path>\n" for each file, in the order given.
std::string TreeManifest(std::span<const TreeFile> files);
// The sha256 of TreeManifest: a tree's digest when `files` are in path order.
std::string TreeDigest(std::span<const TreeFile> files);

// Empty when `path` is relative, '/'-separated, with no empty, "." or ".." segment and no control
// character (a path inside an input tree or a trial's artifacts); else why not, e.g. "an absolute
// path".
std::string RelativePathProblem(std::string_view path);

// Empty when `path` may name one of a run's artifacts as FetchArtifacts lists a whole run: a path
// without a RelativePathProblem, not ending in ".part" (the fetch's partial files), that lies
// under "output/" or is a file of the run's directory itself (its logs, "stdout.log"; never a
// hidden name); else why not. The controller and `llmctl fetch` refuse any other
// name an agent or a controller sends, so a download stays inside its destination's output/ and
// its few top-level files.
std::string RunArtifactPathProblem(std::string_view path);

// Checks a tree as it arrived: at least one file; each path without a RelativePathProblem, strictly
// increasing (path order, so no duplicates); each sha256 IsSha256Hex and size >= 0; a file tree has
// exactly one entry; and `digest` equals TreeDigest. InvalidArgument messages start with `where`
// (e.g. "input 'data/x.jsonl'").
Status ValidateInputTree(std::string_view where, const InputTree& tree);

}  // namespace llmctl::digest

#endif  // LLMCTL_COMMON_DIGEST_DIGEST_H_
