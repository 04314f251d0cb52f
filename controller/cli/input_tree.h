// Input trees: files and directories on the user's machine (datasets, tokenizers, model and adapter
// directories), described by content so the controller stores each blob once and the agent's cache
// can key on the tree's digest. The digest rule is proto/llmctl/v1/common.proto's (InputTree).
//
// What a directory walk accepts, deliberately: regular files, subdirectories, and symbolic links to
// regular files inside the directory the user named, or, for a Hugging Face cache snapshot
// (.../models--ORG--NAME/snapshots/REV, a directory of links to ../../blobs/), inside its repo's
// blobs/. It refuses links that lead anywhere else (a planted data/x -> ~/.ssh/id_rsa would be
// uploaded), symbolic links to directories (they can loop, and the tree would silently grow),
// dangling links, and special files (sockets, FIFOs, devices), each with a message naming the path
// (and a link's target). It leaves out hidden files and directories (names starting with '.':
// .git, .env, .cache), and says which; one the user names itself is sent. The path the user named
// may itself be a link; it is followed.
#ifndef LLMCTL_CONTROLLER_CLI_INPUT_TREE_H_
#define LLMCTL_CONTROLLER_CLI_INPUT_TREE_H_

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "llmctl/v1/common.pb.h"

namespace llmctl::cli {

// Lowercase hex sha256 of a file's bytes, read in 1 MiB pieces. NotFound / PermissionDenied /
// Internal with the path in the message.
StatusOr<std::string> Sha256OfFile(const std::filesystem::path& path);

// digest::TreeDigest of `tree.files`, in their order.
std::string InputTreeDigest(const v1::InputTree& tree);

// Builds trees and remembers every file it hashed, so a file shared by several trees (or named
// twice) is read once per builder; one builder per submit. Not thread-safe.
class InputTreeBuilder {
 public:
  // The tree for a file or a directory, files sorted by path (byte order). InvalidArgument for
  // what the walk refuses (see above) and for a directory with no files; NotFound when `path`
  // does not exist. `hidden`, when given, gets the hidden entries the walk left out, relative to
  // `path`, a directory's with a trailing '/'.
  StatusOr<v1::InputTree> Build(const std::filesystem::path& path,
                                std::vector<std::string>* hidden = nullptr);

  // Every blob of the trees built so far: sha256 → a local file with those bytes.
  const std::map<std::string, std::filesystem::path>& blobs() const { return blobs_; }

 private:
  struct FileDigest {
    std::string sha256;
    int64_t size = 0;
  };
  StatusOr<FileDigest> Digest(const std::filesystem::path& file);
  // Where the links of the directory being walked may lead (canonical directories).
  struct LinkRoots {
    std::filesystem::path named;     // the directory the user named
    std::filesystem::path hf_blobs;  // a Hugging Face snapshot's repo's blobs/; empty otherwise
  };
  Status Walk(const std::filesystem::path& root, const std::filesystem::path& dir,
              const LinkRoots& roots, v1::InputTree& tree, std::vector<std::string>* hidden);
  Status AddFile(const std::filesystem::path& file, std::string relative_path, v1::InputTree& tree);

  std::map<std::filesystem::path, FileDigest> digests_;  // by canonical path
  std::map<std::string, std::filesystem::path> blobs_;
};

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_INPUT_TREE_H_
