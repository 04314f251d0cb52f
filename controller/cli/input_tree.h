// Input trees: files and directories on the user's machine (datasets, tokenizers, model and adapter
// directories), described by content so the controller stores each blob once and the agent's cache
// can key on the tree's digest. The digest rule is proto/llmctl/v1/common.proto's (InputTree).
//
// What a directory walk accepts, deliberately: regular files, subdirectories, and symbolic links to
// regular files inside the directory the user named, or, for a Hugging Face cache snapshot
// (.../models--ORG--NAME/snapshots/REV, a directory of links to ../../blobs/), to a regular file
// directly in its repo's blobs/, which must be a real directory there (not a link: blobs -> / would
// make every file "inside"). It refuses links that lead anywhere else (a planted
// data/x -> ~/.ssh/id_rsa would be uploaded), symbolic links to directories (they can loop, and the
// tree would silently grow), dangling links, and special files (sockets, FIFOs, devices), each with
// a message naming the path (and a link's target). It leaves out hidden files and directories
// (names starting with '.': .git, .env, .cache), and says which; one the user names itself is sent.
// A name the controller would refuse (digest::RelativePathProblem: a line break, a control
// character) or one that is not UTF-8 (a proto string cannot hold it) is refused here, naming the
// local path, before anything is uploaded.
// The path the user named may itself be a link; it is followed.
//
// Another process may change the tree while it is read. The walk holds each directory open and
// opens each file once, relative to it, without following a link (a file swapped for a link to a
// secret, or a directory swapped for a link elsewhere, is refused, and a FIFO is never waited on),
// and hashes what that descriptor reads; the upload opens the file again without following a link
// and sends it only when it is the same file (device, inode, size) that was hashed.
#ifndef LLMCTL_CONTROLLER_CLI_INPUT_TREE_H_
#define LLMCTL_CONTROLLER_CLI_INPUT_TREE_H_

#include <sys/stat.h>
#include <sys/types.h>

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "llmctl/v1/common.pb.h"

namespace llmctl::cli {

// Lowercase hex sha256 of a file's bytes, read in 1 MiB pieces. NotFound / PermissionDenied /
// Internal with the path in the message.
StatusOr<std::string> Sha256OfFile(const std::filesystem::path& path);

// A file the walk hashed, and how to find it again for the upload.
struct HashedFile {
  std::filesystem::path path;  // opened again without following a link in its last component
  dev_t device = 0;
  ino_t inode = 0;
  int64_t size = 0;  // the bytes hashed
};

// `file` opened again for its upload, its stat in `st`: FailedPrecondition naming the path when it
// is no longer the regular file that was hashed (a link, a FIFO, another file or another size now);
// errors of OpenRegularFile otherwise.
StatusOr<UniqueFd> OpenHashedFile(const HashedFile& file, struct stat& st);

// digest::TreeDigest of `tree.files`, in their order.
std::string InputTreeDigest(const v1::InputTree& tree);

// What a builder does with each file the walk accepts.
enum class FileContents {
  kHashed,      // its bytes hashed: the tree is what submit sends
  kWalkedOnly,  // its size taken, its bytes left unread, its sha256 empty (the tree's digest names
                // no content then): the walk's refusals alone, for a file that is only checked
                // (plan --write), where hashing a model's gigabytes would be paid again by the
                // submit that follows
};

// Builds trees and remembers every file it hashed, so a file shared by several trees (or named
// twice) is read once per builder; one builder per submit. Not thread-safe.
class InputTreeBuilder {
 public:
  explicit InputTreeBuilder(FileContents contents = FileContents::kHashed) : contents_(contents) {}

  // The tree for a file or a directory, files sorted by path (byte order). InvalidArgument for
  // what the walk refuses (see above) and for a directory with no files; NotFound when `path`
  // does not exist. `hidden`, when given, gets the hidden entries the walk left out, relative to
  // `path`, a directory's with a trailing '/'.
  StatusOr<v1::InputTree> Build(const std::filesystem::path& path,
                                std::vector<std::string>* hidden = nullptr);

  // Every blob of the trees built so far: sha256 → a local file with those bytes (none when
  // kWalkedOnly).
  const std::map<std::string, HashedFile>& blobs() const { return blobs_; }

 private:
  struct FileDigest {
    std::string sha256;
    int64_t size = 0;
  };
  // The digest of the open regular file `fd` (stat `st`), which the upload finds at `upload_path`;
  // `shown` names it in messages.
  StatusOr<FileDigest> Digest(int fd, const struct stat& st,
                              const std::filesystem::path& upload_path,
                              const std::filesystem::path& shown);
  // Where the links of the directory being walked may lead: canonical directories, held open.
  struct LinkRoots {
    std::filesystem::path named;  // the directory the user named
    int named_fd = -1;
    std::filesystem::path hf_blobs;  // a Hugging Face snapshot's repo's blobs/; empty otherwise
    int hf_blobs_fd = -1;
  };
  // Walks the open directory `dir_fd`, which is `dir` (for messages) and `relative` below the
  // directory the user named ("" for that one).
  Status Walk(int dir_fd, const std::filesystem::path& dir, const std::string& relative,
              const LinkRoots& roots, v1::InputTree& tree, std::vector<std::string>* hidden);
  // The open file of a symbolic link `path` the walk met, when it leads where links may lead.
  StatusOr<UniqueFd> OpenLinkTarget(const std::filesystem::path& path, const LinkRoots& roots,
                                    struct stat& st, std::filesystem::path& resolved);
  Status AddFile(int fd, const struct stat& st, const std::filesystem::path& upload_path,
                 const std::filesystem::path& shown, std::string relative_path,
                 v1::InputTree& tree);

  FileContents contents_;
  std::map<std::pair<dev_t, ino_t>, FileDigest> digests_;  // by the file's identity
  std::map<std::string, HashedFile> blobs_;
};

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_INPUT_TREE_H_
