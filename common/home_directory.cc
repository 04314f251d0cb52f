#include "common/home_directory.h"

#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <vector>

namespace llmctl {

StatusOr<std::filesystem::path> PasswordDatabaseHome(uid_t uid) {
  const std::string unset = "HOME is unset and the password database has ";
  std::vector<char> buffer(16384);
  struct passwd entry {};
  struct passwd* found = nullptr;
  int error = 0;
  // ERANGE: an entry larger than the buffer (long member lists from NSS back ends).
  while ((error = ::getpwuid_r(uid, &entry, buffer.data(), buffer.size(), &found)) == ERANGE &&
         buffer.size() < (size_t{1} << 20)) {
    buffer.resize(buffer.size() * 2);
  }
  if (error != 0 || found == nullptr || found->pw_dir == nullptr || *found->pw_dir == '\0') {
    return NotFoundError(
        std::string(unset).append("no home directory for uid ").append(std::to_string(uid)));
  }
  const std::filesystem::path home = found->pw_dir;
  if (!home.is_absolute()) {
    return NotFoundError(std::string(unset)
                             .append("'")
                             .append(home.string())
                             .append("', not an absolute path, as the home directory of uid ")
                             .append(std::to_string(uid)));
  }
  return home;
}

StatusOr<std::filesystem::path> HomeDirectory(const std::optional<std::string>& home) {
  if (!home || home->empty()) return PasswordDatabaseHome(::getuid());
  if (!std::filesystem::path(*home).is_absolute()) {
    return InvalidArgumentError(std::string("HOME='").append(*home).append(
        "' is not an absolute path (set it to your home directory, or unset it to use "
        "the password database's)"));
  }
  return std::filesystem::path(*home);
}

StatusOr<std::filesystem::path> HomeDirectoryOfThisProcess() {
  const char* home = std::getenv("HOME");
  return HomeDirectory(home != nullptr ? std::optional<std::string>(home) : std::nullopt);
}

}  // namespace llmctl
