#include "common/home_directory.h"

#include <gtest/gtest.h>
#include <pwd.h>
#include <stdlib.h>
#include <unistd.h>

#include <optional>
#include <string>

namespace llmctl {
namespace {

namespace fs = std::filesystem;

fs::path ThisUsersEntry() {
  const struct passwd* user = ::getpwuid(::getuid());
  return user != nullptr && user->pw_dir != nullptr ? fs::path(user->pw_dir) : fs::path();
}

TEST(HomeDirectoryTest, HomeWhenSetAndAbsolute) {
  EXPECT_EQ(*HomeDirectory("/home/someone"), fs::path("/home/someone"));
  EXPECT_EQ(*HomeDirectory("/"), fs::path("/"));
}

// cron jobs, systemd units and `env -i` run without HOME; an empty HOME counts as unset, as in
// glibc's tilde expansion and for every other variable llmctl reads.
TEST(HomeDirectoryTest, ThePasswordDatabasesWhenHomeIsUnsetOrEmpty) {
  const fs::path entry = ThisUsersEntry();
  ASSERT_TRUE(entry.is_absolute()) << "this user has no home in the password database";
  EXPECT_EQ(*HomeDirectory(std::nullopt), entry);
  EXPECT_EQ(*HomeDirectory(""), entry);
  EXPECT_EQ(*PasswordDatabaseHome(::getuid()), entry);
}

// A relative HOME would put the user's files below whatever directory the command ran in.
TEST(HomeDirectoryTest, ARelativeHomeIsRefusedNamingHome) {
  for (const char* relative : {"home", "./home", "~"}) {
    const Status refused = HomeDirectory(relative).status();
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << relative;
    EXPECT_EQ(refused.message(), std::string("HOME='") + relative +
                                     "' is not an absolute path (set it to your home directory, "
                                     "or unset it to use the password database's)");
  }
}

TEST(HomeDirectoryTest, AUidWithoutAnEntryHasNoHome) {
  constexpr uid_t kUnknown = 3'999'999'999u;
  if (::getpwuid(kUnknown) != nullptr) GTEST_SKIP() << "uid " << kUnknown << " has an entry here";
  const Status none = PasswordDatabaseHome(kUnknown).status();
  EXPECT_EQ(none.code(), StatusCode::kNotFound);
  EXPECT_EQ(none.message(),
            "HOME is unset and the password database has no home directory for uid 3999999999");
}

TEST(HomeDirectoryTest, OfThisProcessReadsItsHome) {
  const char* saved = std::getenv("HOME");
  const std::optional<std::string> kept = saved ? std::optional<std::string>(saved) : std::nullopt;
  ::setenv("HOME", "/home/someone", 1);
  const StatusOr<fs::path> set = HomeDirectoryOfThisProcess();
  ::setenv("HOME", "relative", 1);
  const StatusOr<fs::path> relative = HomeDirectoryOfThisProcess();
  ::unsetenv("HOME");
  const StatusOr<fs::path> unset = HomeDirectoryOfThisProcess();
  if (kept) ::setenv("HOME", kept->c_str(), 1);

  EXPECT_EQ(set.ok() ? *set : fs::path(), fs::path("/home/someone"));
  EXPECT_EQ(relative.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(unset.ok() ? *unset : fs::path(), ThisUsersEntry());
}

}  // namespace
}  // namespace llmctl
