#include "controller/cli/input_tree.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include "common/digest/digest.h"
#include "common/files.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

constexpr size_t kReadPiece = 1 << 20;

}  // namespace

StatusOr<std::string> Sha256OfFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    const std::string reason = std::strerror(error);
    if (error == ENOENT) return NotFoundError(path.string() + ": " + reason);
    if (error == EACCES) {
      return Status(StatusCode::kPermissionDenied, path.string() + ": " + reason);
    }
    return InternalError(path.string() + ": cannot open: " + reason);
  }
  digest::Sha256 sha;
  std::vector<char> piece(kReadPiece);
  while (in) {
    in.read(piece.data(), static_cast<std::streamsize>(piece.size()));
    sha.Update(std::string_view(piece.data(), static_cast<size_t>(in.gcount())));
  }
  if (in.bad()) return InternalError(path.string() + ": read failed");
  return sha.HexDigest();
}

std::string InputTreeDigest(const v1::InputTree& tree) {
  std::vector<digest::TreeFile> files;
  files.reserve(static_cast<size_t>(tree.files_size()));
  for (const v1::TreeFile& file : tree.files()) {
    files.push_back({file.path(), file.sha256(), file.size()});
  }
  return digest::TreeDigest(files);
}

StatusOr<InputTreeBuilder::FileDigest> InputTreeBuilder::Digest(const fs::path& file) {
  std::error_code error;
  const fs::path canonical = fs::canonical(file, error);
  if (error) return NotFoundError(file.string() + ": " + error.message());
  if (auto it = digests_.find(canonical); it != digests_.end()) return it->second;
  const uintmax_t size = fs::file_size(canonical, error);
  if (error) return InternalError(file.string() + ": " + error.message());
  ASSIGN_OR_RETURN(std::string sha256, Sha256OfFile(canonical));
  FileDigest digest{std::move(sha256), static_cast<int64_t>(size)};
  blobs_.emplace(digest.sha256, canonical);
  digests_.emplace(canonical, digest);
  return digest;
}

Status InputTreeBuilder::AddFile(const fs::path& file, std::string relative_path,
                                 v1::InputTree& tree) {
  ASSIGN_OR_RETURN(FileDigest digest, Digest(file));
  v1::TreeFile* entry = tree.add_files();
  entry->set_path(std::move(relative_path));
  entry->set_sha256(digest.sha256);
  entry->set_size(digest.size);
  return Status::Ok();
}

Status InputTreeBuilder::Walk(const fs::path& root, const fs::path& dir, const LinkRoots& roots,
                              v1::InputTree& tree, std::vector<std::string>* hidden) {
  std::error_code error;
  fs::directory_iterator it(dir, error);
  if (error) return InvalidArgumentError(dir.string() + ": cannot list: " + error.message());
  for (; it != fs::directory_iterator(); it.increment(error)) {
    const fs::path& path = it->path();
    const fs::file_status own = fs::symlink_status(path, error);
    if (error) return InvalidArgumentError(path.string() + ": " + error.message());
    const std::string relative = path.lexically_relative(root).generic_string();
    if (path.filename().string().starts_with('.')) {
      if (hidden != nullptr) hidden->push_back(relative + (fs::is_directory(own) ? "/" : ""));
      continue;
    }
    if (fs::is_symlink(own)) {
      const fs::file_status target = fs::status(path, error);
      if (error || !fs::exists(target)) {
        return InvalidArgumentError(path.string() + ": a symbolic link to nothing");
      }
      if (fs::is_directory(target)) {
        return InvalidArgumentError(path.string() +
                                    ": a symbolic link to a directory inside an input; name "
                                    "that directory in the experiment file, or copy it here");
      }
      if (!fs::is_regular_file(target)) {
        return InvalidArgumentError(path.string() +
                                    ": a symbolic link to something that is not a regular file");
      }
      const fs::path resolved = fs::canonical(path, error);
      if (error) return InvalidArgumentError(path.string() + ": " + error.message());
      const bool inside = !PathInside(resolved.string(), roots.named.string()).empty() ||
                          (!roots.hf_blobs.empty() &&
                           !PathInside(resolved.string(), roots.hf_blobs.string()).empty());
      if (!inside) {
        return InvalidArgumentError(
            path.string() + ": a symbolic link to " + resolved.string() + ", outside " +
            roots.named.string() +
            "; only what lies inside an input directory is sent: copy the file in, or name it "
            "in the experiment file");
      }
      RETURN_IF_ERROR(AddFile(path, relative, tree));
    } else if (fs::is_directory(own)) {
      RETURN_IF_ERROR(Walk(root, path, roots, tree, hidden));
    } else if (fs::is_regular_file(own)) {
      RETURN_IF_ERROR(AddFile(path, relative, tree));
    } else {
      return InvalidArgumentError(path.string() +
                                  ": not a regular file or directory (a socket, FIFO or device)");
    }
  }
  if (error) return InvalidArgumentError(dir.string() + ": cannot list: " + error.message());
  return Status::Ok();
}

StatusOr<v1::InputTree> InputTreeBuilder::Build(const fs::path& path,
                                                std::vector<std::string>* hidden) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);  // follows a link the user named
  if (error || !fs::exists(status)) return NotFoundError(path.string() + ": no such file");
  v1::InputTree tree;
  if (fs::is_regular_file(status)) {
    tree.set_is_file(true);
    RETURN_IF_ERROR(AddFile(path, path.filename().string(), tree));
  } else if (fs::is_directory(status)) {
    LinkRoots roots;
    roots.named = fs::canonical(path, error);
    if (error) return NotFoundError(path.string() + ": " + error.message());
    // A Hugging Face cache snapshot, models--ORG--NAME/snapshots/REV, links to the repo's blobs/.
    const fs::path repo = roots.named.parent_path().parent_path();
    // A blobs/ the system cannot look into (a link loop) is no blobs root: links into it are
    // then outside the directory, as the walk says.
    std::error_code no_blobs;
    if (roots.named.parent_path().filename() == "snapshots" &&
        repo.filename().string().starts_with("models--") &&
        fs::is_directory(repo / "blobs", no_blobs)) {
      roots.hf_blobs = repo / "blobs";
    }
    RETURN_IF_ERROR(Walk(path, path, roots, tree, hidden));
    if (hidden != nullptr) std::sort(hidden->begin(), hidden->end());
    if (tree.files().empty()) {
      return InvalidArgumentError(path.string() + ": an empty directory; nothing to upload");
    }
    std::sort(tree.mutable_files()->begin(), tree.mutable_files()->end(),
              [](const v1::TreeFile& a, const v1::TreeFile& b) { return a.path() < b.path(); });
  } else {
    return InvalidArgumentError(path.string() +
                                ": not a regular file or directory (a socket, FIFO or device)");
  }
  tree.set_digest(InputTreeDigest(tree));
  return tree;
}

}  // namespace llmctl::cli
