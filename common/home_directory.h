// The user's home directory: one rule for every llmctl program that keeps files under it (the
// CLI's data directory and config file, the token cache, clouds.yaml).
#ifndef LLMCTL_COMMON_HOME_DIRECTORY_H_
#define LLMCTL_COMMON_HOME_DIRECTORY_H_

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>

#include "common/status.h"

namespace llmctl {

// The home directory given HOME's value (`home`; nullopt when HOME is unset):
// - HOME when it is set and not empty; InvalidArgument naming HOME when it is not an absolute
//   path, which would put the user's files below whatever directory the command ran in;
// - when HOME is unset or empty (cron jobs, systemd units, `env -i`), the password database's
//   home for this process's real uid, as glibc's tilde expansion does (PasswordDatabaseHome).
StatusOr<std::filesystem::path> HomeDirectory(const std::optional<std::string>& home);

// HomeDirectory of this process's HOME.
StatusOr<std::filesystem::path> HomeDirectoryOfThisProcess();

// The home directory of `uid` in the password database (getpwuid_r). NotFound, saying HOME is
// unset, when it has no entry for `uid` or an entry whose home is not an absolute path: callers
// for whom a file under the home is optional (a config file) take NotFound as "there is none".
StatusOr<std::filesystem::path> PasswordDatabaseHome(uid_t uid);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_HOME_DIRECTORY_H_
