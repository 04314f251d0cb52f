#include "common/inputs/token_cache.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>

#include "common/atomic_file.h"
#include "common/data/token_file.h"
#include "common/data/token_file_testing.h"
#include "common/home_directory.h"

namespace llmctl {
namespace {

namespace fs = std::filesystem;

// A cached file whose contents were corrupted after it was written (a flipped byte in its tokens,
// which the header alone does not show) is written again, not handed to every run that then
// refuses it: llm-train --prepare's advice to run it again must work.
using ::testing::HasSubstr;

// Sets the cache's variables for one test and puts them back after it.
class CacheEnvironment {
 public:
  CacheEnvironment() {
    for (const char* name : kNames) {
      const char* value = std::getenv(name);
      saved_.emplace_back(name,
                          value != nullptr ? std::optional<std::string>(value) : std::nullopt);
      unsetenv(name);
    }
  }
  ~CacheEnvironment() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        setenv(name, value->c_str(), 1);
      } else {
        unsetenv(name);
      }
    }
  }

 private:
  static constexpr const char* kNames[] = {"LLMCTL_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

Status WriteThreeRows(const std::string& path, const std::string& fingerprint) {
  std::vector<data::TokenizedExample> examples(3);
  for (auto& example : examples) {
    example.input_ids = {5, 6, 7, 8};
    example.labels = {-100, 6, 7, 8};
  }
  return data::WriteTokenFile(path, fingerprint, 1, 2, examples);
}

fs::path FreshDir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / (name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  return dir;
}

// With HOME unset the cache is under the password database's home, never in a shared place such
// as /tmp/.cache that another user could create first and fill.
TEST(TokenCacheTest, WithoutHomeTheCacheIsUnderThePasswordDatabasesHome) {
  CacheEnvironment environment;
  const struct passwd* user = ::getpwuid(::getuid());
  ASSERT_NE(user, nullptr);
  StatusOr<std::string> location = TokenCacheLocation();
  ASSERT_TRUE(location.ok()) << location.status().ToString();
  EXPECT_EQ(*location, (fs::path(user->pw_dir) / ".cache" / "llmctl" / "tokens").string());

  setenv("HOME", "/home/someone", 1);
  EXPECT_EQ(*TokenCacheLocation(), "/home/someone/.cache/llmctl/tokens");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(*TokenCacheLocation(), "/xdg/llmctl/tokens");
  setenv("LLMCTL_CACHE_DIR", "/mine", 1);
  EXPECT_EQ(*TokenCacheLocation(), "/mine/tokens");
}

// The home directory by common/home_directory.h's rule, as llmctl's data directory and clouds.yaml
// take it: an empty HOME counts as unset, and a relative one is refused naming it and
// LLMCTL_CACHE_DIR, where the cache went below whatever directory llm-train ran in.
TEST(TokenCacheTest, AnEmptyHomeIsUnsetAndARelativeOneIsRefused) {
  CacheEnvironment environment;
  const StatusOr<fs::path> entry = PasswordDatabaseHome(::getuid());
  ASSERT_TRUE(entry.ok()) << entry.status().ToString();
  setenv("HOME", "", 1);
  EXPECT_EQ(*TokenCacheLocation(), (*entry / ".cache" / "llmctl" / "tokens").string());
  setenv("HOME", "home", 1);
  const Status refused = TokenCacheLocation().status();
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable);
  EXPECT_EQ(refused.message(),
            std::string("no directory for the token cache: ")
                .append(HomeDirectory("home").status().message())
                .append("; set LLMCTL_CACHE_DIR to a directory of yours that only you can write"));
  // A cache named otherwise needs no home.
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(*TokenCacheLocation(), "/xdg/llmctl/tokens");
}

// The XDG base directory spec: a relative XDG_CACHE_HOME is invalid and ignored, where the cache
// went below whatever directory llmctl or llm-train ran in.
TEST(TokenCacheTest, ARelativeXdgCacheHomeIsIgnored) {
  CacheEnvironment environment;
  setenv("HOME", "/home/someone", 1);
  setenv("XDG_CACHE_HOME", "cache", 1);
  EXPECT_EQ(*TokenCacheLocation(), "/home/someone/.cache/llmctl/tokens");
}

// The cache's directories are made owner-only, and one that another user could write (or owns) is
// refused, naming it and LLMCTL_CACHE_DIR: token files planted in it would be trained on.
TEST(TokenCacheTest, ACacheOtherUsersCanWriteIsRefused) {
  CacheEnvironment environment;
  const fs::path dir = FreshDir("token_cache_private");
  setenv("LLMCTL_CACHE_DIR", dir.c_str(), 1);
  const auto prepare = [](const std::string& path) { return WriteThreeRows(path, "f"); };
  ASSERT_TRUE(CachedTokenFile("f", prepare).ok());
  EXPECT_EQ(fs::status(dir).permissions(), fs::perms::owner_all);
  EXPECT_EQ(fs::status(dir / "tokens").permissions(), fs::perms::owner_all);

  ASSERT_EQ(::chmod((dir / "tokens").c_str(), 0777), 0);
  Status refused = CachedTokenFile("f", prepare).status();
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable);
  EXPECT_THAT(refused.message(), HasSubstr((dir / "tokens").string()));
  EXPECT_THAT(refused.message(), HasSubstr("writable by other users (mode 0777)"));
  EXPECT_THAT(refused.message(), HasSubstr("LLMCTL_CACHE_DIR"));
  ASSERT_EQ(::chmod((dir / "tokens").c_str(), 0700), 0);

  ASSERT_EQ(::chmod(dir.c_str(), 0703), 0);  // the base too: tokens/ could be swapped in it
  EXPECT_THAT(CachedTokenFile("f", prepare).status().message(), HasSubstr("writable by other"));
  ASSERT_EQ(::chmod(dir.c_str(), 0700), 0);

  if (::geteuid() == 0) {  // only root can give a directory away
    ASSERT_EQ(::chown((dir / "tokens").c_str(), 65534, 65534), 0);
    refused = CachedTokenFile("f", prepare).status();
    EXPECT_THAT(refused.message(), HasSubstr("owned by another user (uid 65534)"));
  }
  fs::remove_all(dir);
}

// A link in the place of the cache's directory or its tokens/ is refused, not followed, even to a
// private directory of the user's: a link in a shared place (LLMCTL_CACHE_DIR=/tmp/cache) is its
// owner's to turn, between the check and the use, to a directory of theirs with token files
// planted in it.
TEST(TokenCacheTest, ALinkInTheCachesPlaceIsRefused) {
  CacheEnvironment environment;
  const fs::path dir = FreshDir("token_cache_link");
  const fs::path real = dir / "real";
  fs::create_directories(real / "tokens");
  fs::permissions(dir, fs::perms::owner_all);
  fs::permissions(real, fs::perms::owner_all);
  fs::permissions(real / "tokens", fs::perms::owner_all);
  const auto prepare = [](const std::string& path) { return WriteThreeRows(path, "h"); };

  fs::create_directory_symlink(real, dir / "cache");
  setenv("LLMCTL_CACHE_DIR", (dir / "cache").c_str(), 1);
  Status refused = CachedTokenFile("h", prepare).status();
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable);
  EXPECT_THAT(refused.message(),
              HasSubstr("cannot use the token cache " + (dir / "cache").string() +
                        ": a symbolic link, not a directory; set LLMCTL_CACHE_DIR"));

  fs::create_directory(dir / "base");
  fs::permissions(dir / "base", fs::perms::owner_all);
  fs::create_directory_symlink(real / "tokens", dir / "base" / "tokens");
  setenv("LLMCTL_CACHE_DIR", (dir / "base").c_str(), 1);
  refused = CachedTokenFile("h", prepare).status();
  EXPECT_THAT(refused.message(),
              HasSubstr((dir / "base" / "tokens").string() + ": a symbolic link, not a directory"));
  EXPECT_TRUE(fs::is_empty(real / "tokens")) << "nothing written through either link";
  fs::remove_all(dir);
}

// A cache that cannot be used fails CachedTokenFile, with a message that says what to set; the
// estimate's reading (CachedOrTemporaryTokenFile) tokenizes into a private temporary directory
// instead, removed afterwards, and says so once.
TEST(TokenCacheTest, AnUnusableCacheIsSkippedByTheEstimateWithOneNote) {
  CacheEnvironment environment;
  const fs::path dir = FreshDir("token_cache_unusable");
  fs::create_directories(dir);
  std::ofstream(dir / "file") << "not a directory";
  setenv("LLMCTL_CACHE_DIR", (dir / "file" / "cache").c_str(), 1);
  const auto prepare = [](const std::string& path) { return WriteThreeRows(path, "g"); };
  const Status refused = CachedTokenFile("g", prepare).status();
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable);
  EXPECT_THAT(refused.message(),
              HasSubstr("cannot use the token cache " + (dir / "file" / "cache").string() +
                        ": cannot create: Not a directory; set LLMCTL_CACHE_DIR"));

  std::ostringstream err;
  std::streambuf* const saved = std::cerr.rdbuf(err.rdbuf());
  std::string first_path;
  {
    StatusOr<TokenFileRef> first = CachedOrTemporaryTokenFile("g", prepare);
    StatusOr<TokenFileRef> second = CachedOrTemporaryTokenFile("g", prepare);
    std::cerr.rdbuf(saved);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    ASSERT_TRUE(second.ok()) << second.status().ToString();
    EXPECT_FALSE(first->cached());
    first_path = first->path();
    EXPECT_NE(first_path, second->path());
    StatusOr<std::unique_ptr<data::TokenFile>> file = data::TokenFile::Open(first_path);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    EXPECT_EQ((*file)->num_examples(), 3);
    struct stat info {};
    ASSERT_EQ(::stat(fs::path(first_path).parent_path().c_str(), &info), 0);
    EXPECT_EQ(info.st_mode & 0777, 0700u);
  }
  std::cerr.rdbuf(saved);
  EXPECT_FALSE(fs::exists(fs::path(first_path).parent_path())) << "the temporary is removed";
  const std::string note = err.str();
  EXPECT_THAT(note, HasSubstr("note: tokenizing without the token cache"));
  EXPECT_THAT(note, HasSubstr("Not a directory"));
  EXPECT_EQ(note.find("note:"), note.rfind("note:")) << "said once: " << note;

  // A usable cache is used as before.
  setenv("LLMCTL_CACHE_DIR", (dir / "cache").c_str(), 1);
  StatusOr<TokenFileRef> cached = CachedOrTemporaryTokenFile("g", prepare);
  ASSERT_TRUE(cached.ok()) << cached.status().ToString();
  EXPECT_TRUE(cached->cached());
  EXPECT_EQ(fs::path(cached->path()).parent_path(), dir / "cache" / "tokens");
  fs::remove_all(dir);
}

TEST(TokenCacheTest, ACorruptCachedFileIsWrittenAgain) {
  const fs::path dir = fs::temp_directory_path() / ("token_cache_test_" + std::to_string(getpid()));
  fs::remove_all(dir);
  ASSERT_EQ(setenv("LLMCTL_CACHE_DIR", dir.c_str(), 1), 0);
  int prepared = 0;
  const auto prepare = [&prepared](const std::string& path) {
    ++prepared;
    std::vector<data::TokenizedExample> examples(3);
    for (auto& example : examples) {
      example.input_ids = {5, 6, 7, 8};
      example.labels = {-100, 6, 7, 8};
    }
    return data::WriteTokenFile(path, "fingerprint-a", 1, 2, examples);
  };
  StatusOr<std::string> path = CachedTokenFile("fingerprint-a", prepare);
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  EXPECT_EQ(prepared, 1);
  ASSERT_TRUE(CachedTokenFile("fingerprint-a", prepare).ok());
  EXPECT_EQ(prepared, 1) << "a whole file is used as it is";

  {
    // The first token id: after the 64-byte header, the fingerprint padded to 16 bytes and the 4
    // offsets (token_file.h's layout).
    constexpr std::streamoff kFirstId = 64 + 16 + 4 * 8;
    std::fstream file(*path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(kFirstId);
    const char id = static_cast<char>(file.get());
    file.seekp(kFirstId);
    file.put(static_cast<char>(id ^ 0x01));
  }
  EXPECT_FALSE(data::TokenFile::Open(*path).ok());
  ASSERT_TRUE(CachedTokenFile("fingerprint-a", prepare).ok());
  EXPECT_EQ(prepared, 2);
  EXPECT_TRUE(data::TokenFile::Open(*path).ok());
  fs::remove_all(dir);
}

// What a preparation killed midway left beside the token file (WriteFileAtomically's temporary, a
// scratch file not yet unlinked: both named by AtomicWriteTemporaryName) is removed when the file
// is prepared again; a file of another name is kept.
TEST(TokenCacheTest, WhatAKilledPreparationLeftIsRemovedWhenItIsPreparedAgain) {
  CacheEnvironment environment;
  const fs::path dir = FreshDir("token_cache_leftovers");
  ASSERT_EQ(setenv("LLMCTL_CACHE_DIR", dir.c_str(), 1), 0);
  int prepared = 0;
  // Prepared under <path>.lock, which no other process then holds: none is writing the leftovers'
  // names.
  const auto prepare = [&prepared](const std::string& path) {
    ++prepared;
    const int lock = ::open((path + ".lock").c_str(), O_RDONLY | O_CLOEXEC);
    EXPECT_GE(lock, 0);
    EXPECT_NE(::flock(lock, LOCK_EX | LOCK_NB), 0) << "<path>.lock is held while preparing";
    EXPECT_EQ(errno, EWOULDBLOCK);
    ::close(lock);
    return WriteThreeRows(path, "fingerprint-l");
  };
  StatusOr<std::string> path = CachedTokenFile("fingerprint-l", prepare);
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  fs::remove(*path);
  const std::string temporary = *path + ".tmp.4194302.0";
  const std::string scratch = AtomicWriteTemporaryName(*path);
  const std::string other = *path + ".notes";
  for (const std::string& name : {temporary, scratch, other}) std::ofstream(name) << "left";

  ASSERT_TRUE(CachedTokenFile("fingerprint-l", prepare).ok());
  EXPECT_EQ(prepared, 2);
  EXPECT_TRUE(data::TokenFile::Open(*path).ok());
  EXPECT_FALSE(fs::exists(temporary));
  EXPECT_FALSE(fs::exists(scratch));
  EXPECT_TRUE(fs::exists(other));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace llmctl
