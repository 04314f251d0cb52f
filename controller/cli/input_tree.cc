#include "controller/cli/input_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "common/digest/digest.h"
#include "common/files.h"
#include "common/text.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

constexpr size_t kReadPiece = 1 << 20;

struct Sha256AndSize {
  std::string sha256;
  int64_t size = 0;
};

// OK when `relative`, a file's path in its tree, is one the controller takes and a proto string can
// hold; else InvalidArgument naming the local `path`. Checked during the walk, so a bad name fails
// the submit before any upload rather than at the controller after all of them.
Status CheckTreePath(const std::string& relative, const fs::path& path) {
  std::string problem = digest::RelativePathProblem(relative);
  if (problem.empty() && FirstInvalidUtf8(relative) != std::string::npos) {
    problem = "a name that is not valid UTF-8";
  }
  if (problem.empty()) return Status::Ok();
  return InvalidArgumentError(OnOneLine(path.string())
                                  .append(": ")
                                  .append(problem)
                                  .append(", which an input's file may not have; rename it"));
}

// The sha256 and length of what `fd` reads from its current offset to its end.
StatusOr<Sha256AndSize> HashDescriptor(int fd, const fs::path& shown) {
  digest::Sha256 sha;
  std::vector<char> piece(kReadPiece);
  int64_t size = 0;
  while (true) {
    const ssize_t n = ::read(fd, piece.data(), piece.size());
    if (n < 0) {
      const int error = errno;
      if (error == EINTR) continue;
      return InternalError(shown.string() + ": read failed: " + std::strerror(error));
    }
    if (n == 0) break;
    sha.Update(std::string_view(piece.data(), static_cast<size_t>(n)));
    size += n;
  }
  return Sha256AndSize{sha.HexDigest(), size};
}

// A directory opened without following a link in its last component: what the walk lists is what
// it checked, not where a link swapped in meanwhile leads.
StatusOr<UniqueFd> OpenDirectoryAt(int dir_fd, const std::string& name, const fs::path& shown) {
  UniqueFd fd(::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    const int error = errno;
    if (error == ELOOP || error == ENOTDIR) {
      return InvalidArgumentError(shown.string() +
                                  ": no longer a directory (it changed while it was read)");
    }
    return InvalidArgumentError(shown.string() + ": cannot open: " + std::strerror(error));
  }
  return fd;
}

// The regular file `relative` (no link in it, as a canonical path's part is) below the open
// directory `dir_fd`, each of its parts opened without following a link.
StatusOr<UniqueFd> OpenBeneath(int dir_fd, const fs::path& relative, const fs::path& shown,
                               struct stat& st) {
  UniqueFd held;
  int at = dir_fd;
  std::vector<std::string> parts;
  for (const fs::path& part : relative) parts.push_back(part.string());
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    ASSIGN_OR_RETURN(held, OpenDirectoryAt(at, parts[i], shown));
    at = held.get();
  }
  if (parts.empty()) return InvalidArgumentError(shown.string() + ": an empty path");
  return OpenRegularFileAt(at, parts.back(), shown.string(), st);
}

}  // namespace

StatusOr<std::string> Sha256OfFile(const fs::path& path) {
  struct stat st {};
  ASSIGN_OR_RETURN(const UniqueFd fd, OpenRegularFile(path.string(), st));
  ASSIGN_OR_RETURN(Sha256AndSize hashed, HashDescriptor(fd.get(), path));
  return hashed.sha256;
}

StatusOr<UniqueFd> OpenHashedFile(const HashedFile& file, struct stat& st) {
  StatusOr<UniqueFd> fd = OpenRegularFile(file.path.string(), st, /*follow_links=*/false);
  if (!fd.ok()) {
    if (fd.status().code() == StatusCode::kInvalidArgument) {  // a link or special file now
      return FailedPreconditionError(
          std::string(fd.status().message())
              .append(" (it changed since it was hashed; submit again)"));
    }
    return fd.status();
  }
  if (st.st_dev != file.device || st.st_ino != file.inode) {
    return FailedPreconditionError(file.path.string() +
                                   ": replaced by another file since it was hashed; submit again");
  }
  if (static_cast<int64_t>(st.st_size) != file.size) {
    return FailedPreconditionError(file.path.string() + ": " + std::to_string(st.st_size) +
                                   " bytes now, " + std::to_string(file.size) +
                                   " when it was hashed; submit again");
  }
  return fd;
}

std::string InputTreeDigest(const v1::InputTree& tree) {
  std::vector<digest::TreeFile> files;
  files.reserve(static_cast<size_t>(tree.files_size()));
  for (const v1::TreeFile& file : tree.files()) {
    files.push_back({file.path(), file.sha256(), file.size()});
  }
  return digest::TreeDigest(files);
}

StatusOr<InputTreeBuilder::FileDigest> InputTreeBuilder::Digest(int fd, const struct stat& st,
                                                                const fs::path& upload_path,
                                                                const fs::path& shown) {
  if (contents_ == FileContents::kWalkedOnly)
    return FileDigest{"", static_cast<int64_t>(st.st_size)};
  const std::pair<dev_t, ino_t> identity{st.st_dev, st.st_ino};
  if (auto it = digests_.find(identity); it != digests_.end()) return it->second;
  ASSIGN_OR_RETURN(Sha256AndSize hashed, HashDescriptor(fd, shown));
  FileDigest digest{std::move(hashed.sha256), hashed.size};
  blobs_.emplace(digest.sha256, HashedFile{upload_path, st.st_dev, st.st_ino, digest.size});
  digests_.emplace(identity, digest);
  return digest;
}

Status InputTreeBuilder::AddFile(int fd, const struct stat& st, const fs::path& upload_path,
                                 const fs::path& shown, std::string relative_path,
                                 v1::InputTree& tree) {
  ASSIGN_OR_RETURN(FileDigest digest, Digest(fd, st, upload_path, shown));
  v1::TreeFile* entry = tree.add_files();
  entry->set_path(std::move(relative_path));
  entry->set_sha256(digest.sha256);
  entry->set_size(digest.size);
  return Status::Ok();
}

StatusOr<UniqueFd> InputTreeBuilder::OpenLinkTarget(const fs::path& path, const LinkRoots& roots,
                                                    struct stat& st, fs::path& resolved) {
  std::error_code error;
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
  resolved = fs::canonical(path, error);
  if (error) return InvalidArgumentError(path.string() + ": " + error.message());
  // Both roots are canonical and so is `resolved`: compared part by part, no link can stand in
  // for a part. What was resolved is then opened part by part without following a link, so a
  // link swapped in after the resolution is refused rather than followed.
  const fs::path inside = resolved.lexically_relative(roots.named);
  if (!inside.empty() && inside != "." && *inside.begin() != "..") {
    return OpenBeneath(roots.named_fd, inside, path, st);
  }
  // A snapshot's links lead to files directly in blobs/, named by their digest.
  if (!roots.hf_blobs.empty() && resolved.parent_path() == roots.hf_blobs) {
    return OpenRegularFileAt(roots.hf_blobs_fd, resolved.filename().string(), path.string(), st);
  }
  std::string message = path.string() + ": a symbolic link to " + resolved.string() + ", outside " +
                        roots.named.string();
  if (!roots.hf_blobs.empty())
    message.append(" and not directly in ").append(roots.hf_blobs.string());
  return InvalidArgumentError(message.append(
      "; only what lies inside an input directory is sent: copy the file in, or name it in the "
      "experiment file"));
}

Status InputTreeBuilder::Walk(int dir_fd, const fs::path& dir, const std::string& relative,
                              const LinkRoots& roots, v1::InputTree& tree,
                              std::vector<std::string>* hidden) {
  // fdopendir takes the descriptor it is given; the caller keeps `dir_fd`.
  const int listed = ::dup(dir_fd);
  if (listed < 0) {
    return InvalidArgumentError(dir.string() + ": cannot list: " + std::strerror(errno));
  }
  std::unique_ptr<DIR, int (*)(DIR*)> stream(::fdopendir(listed), &::closedir);
  if (stream == nullptr) {
    const int error = errno;
    ::close(listed);
    return InvalidArgumentError(dir.string() + ": cannot list: " + std::strerror(error));
  }
  std::vector<std::string> names;
  while (true) {
    errno = 0;
    const dirent* entry = ::readdir(stream.get());
    if (entry == nullptr) {
      if (errno != 0) {
        return InvalidArgumentError(dir.string() + ": cannot list: " + std::strerror(errno));
      }
      break;
    }
    const std::string_view name = entry->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
  for (const std::string& name : names) {
    const fs::path path = dir / name;
    const std::string entry_relative = relative.empty() ? name : relative + "/" + name;
    struct stat own {};
    if (::fstatat(dir_fd, name.c_str(), &own, AT_SYMLINK_NOFOLLOW) != 0) {
      return InvalidArgumentError(path.string() + ": " + std::strerror(errno));
    }
    if (name.starts_with('.')) {
      if (hidden != nullptr) hidden->push_back(entry_relative + (S_ISDIR(own.st_mode) ? "/" : ""));
      continue;
    }
    RETURN_IF_ERROR(CheckTreePath(entry_relative, path));
    if (S_ISLNK(own.st_mode)) {
      struct stat st {};
      fs::path resolved;
      ASSIGN_OR_RETURN(const UniqueFd fd, OpenLinkTarget(path, roots, st, resolved));
      RETURN_IF_ERROR(AddFile(fd.get(), st, resolved, path, entry_relative, tree));
    } else if (S_ISDIR(own.st_mode)) {
      ASSIGN_OR_RETURN(const UniqueFd sub, OpenDirectoryAt(dir_fd, name, path));
      RETURN_IF_ERROR(Walk(sub.get(), path, entry_relative, roots, tree, hidden));
    } else if (S_ISREG(own.st_mode)) {
      struct stat st {};
      ASSIGN_OR_RETURN(const UniqueFd fd, OpenRegularFileAt(dir_fd, name, path.string(), st));
      RETURN_IF_ERROR(
          AddFile(fd.get(), st, roots.named / entry_relative, path, entry_relative, tree));
    } else {
      return InvalidArgumentError(path.string() +
                                  ": not a regular file or directory (a socket, FIFO or device)");
    }
  }
  return Status::Ok();
}

StatusOr<v1::InputTree> InputTreeBuilder::Build(const fs::path& path,
                                                std::vector<std::string>* hidden) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);  // follows a link the user named
  if (error || !fs::exists(status)) return NotFoundError(path.string() + ": no such file");
  v1::InputTree tree;
  if (fs::is_regular_file(status) || fs::is_directory(status)) {
    // The link the user named, followed once: what is opened below is this, without links.
    const fs::path canonical = fs::canonical(path, error);
    if (error) return NotFoundError(path.string() + ": " + error.message());
    if (fs::is_regular_file(status)) {
      tree.set_is_file(true);
      RETURN_IF_ERROR(CheckTreePath(path.filename().string(), path));
      struct stat st {};
      StatusOr<UniqueFd> fd = OpenRegularFile(canonical.string(), st, /*follow_links=*/false);
      if (!fd.ok()) return Status(fd.status().code(), path.string() + ": " + fd.status().message());
      RETURN_IF_ERROR(AddFile(fd->get(), st, canonical, path, path.filename().string(), tree));
      tree.set_digest(InputTreeDigest(tree));
      return tree;
    }
    LinkRoots roots;
    roots.named = canonical;
    ASSIGN_OR_RETURN(const UniqueFd named_fd, OpenDirectoryAt(AT_FDCWD, canonical.string(), path));
    roots.named_fd = named_fd.get();
    // A Hugging Face cache snapshot, models--ORG--NAME/snapshots/REV, links to the repo's blobs/.
    // That blobs/ must be a directory itself, not a link (blobs -> / or ../.. would put every
    // file inside it), and is held open so its files are opened where it was checked. Anything
    // else is no blobs root: links into it are then outside the directory, as the walk says.
    const fs::path repo = roots.named.parent_path().parent_path();
    UniqueFd blobs_fd;
    if (roots.named.parent_path().filename() == "snapshots" &&
        repo.filename().string().starts_with("models--")) {
      const fs::path blobs = repo / "blobs";
      std::error_code no_blobs;
      StatusOr<UniqueFd> opened = OpenDirectoryAt(AT_FDCWD, blobs.string(), blobs);
      if (fs::is_directory(fs::symlink_status(blobs, no_blobs)) && !no_blobs &&
          fs::canonical(blobs, no_blobs) == blobs && !no_blobs && opened.ok()) {
        blobs_fd = std::move(*opened);
        roots.hf_blobs = blobs;
        roots.hf_blobs_fd = blobs_fd.get();
      }
    }
    RETURN_IF_ERROR(Walk(named_fd.get(), path, "", roots, tree, hidden));
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
