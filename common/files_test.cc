// MappedFile: a file that shrinks under its mapping ends the process naming it.
// ReadFileInPieces: a file in bounded pieces. CheckRoomFor: what fits on a filesystem, with what
// llmctl keeps free of it and what writes in progress were promised. EnsureOwnDirectory: a
// directory of this user's, made or checked and never changed.
#include "common/files.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace llmctl {
namespace {

TEST(CheckRoomForTest, WhatFitsBesideWhatIsKeptFreeIsAccepted) {
  const std::string dir = testing::TempDir();
  EXPECT_TRUE(CheckRoomFor("a file", dir, 0).ok());
  EXPECT_TRUE(CheckRoomFor("a file", dir, 1, 1).ok());
  // A negative size (a field no one checked) counts as nothing, not as room gained.
  EXPECT_TRUE(CheckRoomFor("a file", dir, -5, 0).ok());
}

TEST(CheckRoomForTest, MoreThanTheFilesystemHasIsRefusedWithBothFigures) {
  const std::string dir = testing::TempDir();
  struct statvfs filesystem {};
  ASSERT_EQ(::statvfs(dir.c_str(), &filesystem), 0);
  const uint64_t available = static_cast<uint64_t>(filesystem.f_bavail) * filesystem.f_frsize;
  ASSERT_LT(available, uint64_t{1} << 62) << "no test filesystem has 4 EiB";

  const Status too_large = CheckRoomFor("checkpoint.safetensors", dir, int64_t{1} << 62);
  EXPECT_EQ(too_large.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(too_large.message().rfind("checkpoint.safetensors: 4194304.00 TiB do not fit in " +
                                          dir + ", whose filesystem has ",
                                      0),
            0u)
      << too_large.message();
  EXPECT_EQ(too_large.message().find("keeps"), std::string::npos) << too_large.message();

  // Small enough to fit, but not beside what is kept free; the sum cannot overflow.
  const Status kept = CheckRoomFor("upload", dir, 1, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(kept.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(kept.message().find("available, of which llmctl keeps "), std::string::npos)
      << kept.message();
}

TEST(CheckRoomForTest, RoomPromisedToWritesInProgressIsNotFree) {
  EXPECT_TRUE(CheckRoomIn("upload", "/blobs", 100, 40, 50, 10).ok());
  const Status promised = CheckRoomIn("upload", "/blobs", 100, 40, 50, 11);
  EXPECT_EQ(promised.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(promised.message(),
            "upload: 40 B do not fit in /blobs, whose filesystem has 100 B available, of which "
            "llmctl keeps 50 B free and 11 B are promised to writes in progress");
  EXPECT_EQ(CheckRoomIn("upload", "/blobs", 100, 40, 0, 70).message(),
            "upload: 40 B do not fit in /blobs, whose filesystem has 100 B available, of which "
            "70 B are promised to writes in progress");
  // The sum cannot overflow.
  EXPECT_EQ(CheckRoomIn("upload", "/blobs", 100, 1, 1, std::numeric_limits<int64_t>::max()).code(),
            StatusCode::kResourceExhausted);
}

TEST(CheckRoomForTest, AMissingDirectoryIsNotFound) {
  const Status missing = CheckRoomFor("upload", testing::TempDir() + "/no/such/dir", 1);
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("upload: cannot read the free space of "), std::string::npos)
      << missing.message();
}

// A trial's output_dir may not exist before its first checkpoint: its nearest existing ancestor's
// filesystem is the one it will be made on.
TEST(CheckRoomForTest, ADirectoryYetToBeMadeHasItsNearestExistingAncestorsRoom) {
  const std::string missing = testing::TempDir() + "/no/such/dir";
  EXPECT_EQ(AvailableBytes("checkpoint", missing).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(AvailableBytesForNewPath("checkpoint", missing).ok());
  EXPECT_TRUE(AvailableBytesForNewPath("checkpoint", "no/such/relative/dir").ok());
}

TEST(ReadFileInPiecesTest, PiecesAreTheFileInOrderAndBounded) {
  const std::string path = testing::TempDir() + "/pieces.bin";
  std::string content;
  for (size_t i = 0; i < 2 * kFilePieceBytes + 17; ++i) content += static_cast<char>('a' + i % 26);
  std::ofstream(path, std::ios::binary) << content;

  std::string joined;
  std::vector<size_t> sizes;
  ASSERT_TRUE(ReadFileInPieces(path, [&](std::string_view piece) {
                joined.append(piece);
                sizes.push_back(piece.size());
                return Status::Ok();
              }).ok());
  EXPECT_EQ(joined, content);
  EXPECT_GE(sizes.size(), 3u);
  for (size_t size : sizes) EXPECT_LE(size, kFilePieceBytes);
  EXPECT_EQ(*ReadFileToString(path), content);
}

// The string is sized once, from the file's size: grown by appending, a 3 MB file's string held
// 4 MiB (twice the file at the moment it grew), and a tokenizer.json of 37 MiB peaked at 102 MiB.
// A file over the limit is refused before it is read.
TEST(ReadFileToStringTest, TheStringIsTheFilesSizeAndALargerFileIsRefusedUnread) {
  const std::string path = testing::TempDir() + "/sized.bin";
  const std::string content(3'000'000, 'x');
  { std::ofstream(path, std::ios::binary) << content; }
  StatusOr<std::string> read = ReadFileToString(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, content);
  EXPECT_LT(read->capacity(), content.size() + kFilePieceBytes);
  const StatusOr<std::string> refused = ReadFileToString(path, content.size() - 1);
  EXPECT_EQ(refused.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(refused.status().message(), path + " is larger than 2999999 bytes");
  EXPECT_TRUE(ReadFileToString(path, content.size()).ok());
}

TEST(ReadFileInPiecesTest, AnErrorFromThePieceEndsTheReading) {
  const std::string path = testing::TempDir() + "/pieces-stop.bin";
  std::ofstream(path, std::ios::binary) << std::string(3 * kFilePieceBytes, 'x');
  int pieces = 0;
  const Status status = ReadFileInPieces(path, [&](std::string_view) {
    ++pieces;
    return InvalidArgumentError("enough");
  });
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pieces, 1);
  EXPECT_EQ(ReadFileInPieces(testing::TempDir() + "/no-such-file",
                             [](std::string_view) { return Status::Ok(); })
                .code(),
            StatusCode::kNotFound);
}

// A write cut short (RLIMIT_FSIZE here, a full disk elsewhere) leaves no part of a line behind, and
// lines appended once there is room again start a line of their own.
TEST(AppendWholeLinesTest, APartlyWrittenAppendIsCutOffAndTheNextStartsALine) {
  const std::string path = testing::TempDir() + "/whole-lines.jsonl";
  std::remove(path.c_str());
  const std::string first = "{\"n\":1}\n";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Writes past 20 bytes more than the first line fail with EFBIG (not the signal).
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{first.size() + 20, first.size() + 20};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) std::_Exit(2);
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) std::_Exit(3);
    bool cut_off = false;
    if (!AppendWholeLines(fd, first, cut_off).ok()) std::_Exit(4);
    const Status cut = AppendWholeLines(fd, "{\"n\":2,\"x\":\"" + std::string(100, 'x') + "\"}\n",
                                        cut_off);  // 20 bytes of it fit
    if (cut.code() != StatusCode::kUnavailable || !cut_off) std::_Exit(5);
    if (!AppendWholeLines(fd, "{\"n\":3}\n", cut_off).ok()) std::_Exit(6);  // fits in the 20
    std::_Exit(0);
  }
  int wait_status = 0;
  ASSERT_EQ(::waitpid(child, &wait_status, 0), child);
  ASSERT_TRUE(WIFEXITED(wait_status)) << wait_status;
  ASSERT_EQ(WEXITSTATUS(wait_status), 0);
  StatusOr<std::string> kept = ReadFileToString(path);
  ASSERT_TRUE(kept.ok()) << kept.status().message();
  EXPECT_EQ(*kept, first + "{\"n\":3}\n");
}

// A file of `size` bytes of 'x' at `path`.
void WriteBytes(const std::string& path, size_t size) {
  std::ofstream(path, std::ios::binary) << std::string(size, 'x');
}

// What another process does when it writes over the file in place (cp, curl -o): the mapping's
// pages past the new end are gone, and touching one raises SIGBUS.
TEST(MappedFileTest, AFileThatShrankUnderItsMappingEndsTheProcessWithAMessageNamingIt) {
  const std::string path = testing::TempDir() + "/shrinking-weights";
  WriteBytes(path, 3 * 4096);
  EXPECT_EXIT(
      {
        ReportShrunkMappedFiles("llm-train", 6);
        StatusOr<std::unique_ptr<MappedFile>> file = MappedFile::Open(path);
        if (!file.ok()) std::_Exit(100);
        ::truncate(path.c_str(), 4096);
        volatile std::byte last = (*file)->bytes().back();
        (void)last;
        std::_Exit(101);
      },
      ::testing::ExitedWithCode(6),
      "^llm-train: " + path +
          " shrank while llm-train read it: another process truncated it or wrote over it in "
          "place; run again once it is whole\n$");
}

// What a reader that took the size before another process truncated the file gets: an error
// naming the file, where a mapping's page past the new end would have been SIGBUS.
TEST(ReadFileRangeTest, BytesPastAShrunkFilesEndAreDataLoss) {
  const std::string path = testing::TempDir() + "/shrinking-header";
  std::ofstream(path, std::ios::binary) << "0123456789";
  struct stat st {};
  StatusOr<UniqueFd> fd = OpenRegularFile(path, st);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  StatusOr<std::string> middle = ReadFileRange(fd->get(), path, 2, 5);
  ASSERT_TRUE(middle.ok()) << middle.status().ToString();
  EXPECT_EQ(*middle, "23456");
  ASSERT_EQ(::truncate(path.c_str(), 4), 0);
  StatusOr<std::string> gone = ReadFileRange(fd->get(), path, 2, 5);
  EXPECT_EQ(gone.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(gone.status().message(),
            path +
                " ends at byte 4, before the 5 bytes from byte 2: it shrank while being read "
                "(another process truncated it or is writing over it in place)");
}

// A read the disk fails (EIO; here /proc/self/mem at address 0, which nothing maps) names the file
// and the system's reason, and is not Unavailable, which its readers take for "try again" (llmctl
// asked whether the controller was running, exit 3).
TEST(ReadFileToStringTest, AReadTheSystemFailsIsNotUnavailable) {
  const StatusOr<std::string> read = ReadFileToString("/proc/self/mem");
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kUnknown) << read.status().ToString();
  EXPECT_EQ(read.status().message(), "cannot read /proc/self/mem: Input/output error");
}

TEST(MappedFileTest, ABusErrorOutsideEveryMappingStillKillsTheProcess) {
  const std::string path = testing::TempDir() + "/mapped-beside";
  WriteBytes(path, 4096);
  EXPECT_EXIT(
      {
        ReportShrunkMappedFiles("llm-train", 6);
        StatusOr<std::unique_ptr<MappedFile>> file = MappedFile::Open(path);
        if (!file.ok()) std::_Exit(100);
        ::raise(SIGBUS);
        std::_Exit(101);
      },
      ::testing::KilledBySignal(SIGBUS), "^$");
}

// A fresh, empty directory of this test's under the process's temporary one.
std::string FreshDir(const std::string& name) {
  const std::string dir = testing::TempDir() + "/" + name;
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(std::filesystem::create_directory(dir));
  return dir;
}

mode_t ModeOf(const std::string& path) {
  struct stat info {};
  EXPECT_EQ(::lstat(path.c_str(), &info), 0) << path;
  return info.st_mode & 07777;
}

TEST(EnsureOwnDirectoryTest, AMissingOneIsMadeWithItsModeWhateverTheUmask) {
  const std::string dir = FreshDir("own_made") + "/above/dir";
  const mode_t umask = ::umask(0077);  // would make it 0700
  const Status made = EnsureOwnDirectory(dir, 0750, OthersMay::kAnything);
  ::umask(umask);
  ASSERT_TRUE(made.ok()) << made.ToString();
  EXPECT_EQ(ModeOf(dir), 0750u);
  EXPECT_TRUE(std::filesystem::is_directory(std::filesystem::path(dir).parent_path()));

  const std::string private_dir = FreshDir("own_made") + "/private";
  ASSERT_TRUE(EnsureOwnDirectory(private_dir, 0700, OthersMay::kNothing).ok());
  EXPECT_EQ(ModeOf(private_dir), 0700u);
}

// A path ending in a slash (llmctld --data-dir /x/) names the same directory: it is made with its
// mode, and a symbolic link there is refused, not followed as lstat follows "link/".
TEST(EnsureOwnDirectoryTest, APathEndingInASlashIsTheDirectoryItNames) {
  const std::string base = FreshDir("own_slash");
  const std::string dir = base + "/above/dir";
  const mode_t umask = ::umask(0022);
  const Status made = EnsureOwnDirectory(dir + "//", 0770, OthersMay::kAnything);
  ::umask(umask);
  ASSERT_TRUE(made.ok()) << made.ToString();
  EXPECT_EQ(ModeOf(dir), 0770u);

  const std::string target = base + "/target";
  ASSERT_EQ(::mkdir(target.c_str(), 0700), 0);
  const std::string link = base + "/link";
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  EXPECT_EQ(EnsureOwnDirectory(link + "/", 0700, OthersMay::kAnything).message(),
            link + ": a symbolic link, not a directory");
}

// One that is there is accepted as `others` allows and never changed, mode and all.
TEST(EnsureOwnDirectoryTest, AnExistingOneIsCheckedAndLeftAsItIs) {
  const std::string dir = FreshDir("own_existing");
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  EXPECT_TRUE(EnsureOwnDirectory(dir, 0700, OthersMay::kAnything).ok());
  EXPECT_TRUE(EnsureOwnDirectory(dir, 0700, OthersMay::kRead).ok());
  const Status refused = EnsureOwnDirectory(dir, 0700, OthersMay::kNothing);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.message(), dir + ": open to other users (mode 0755)");
  EXPECT_EQ(ModeOf(dir), 0755u);

  ASSERT_EQ(::chmod(dir.c_str(), 01777), 0);  // /tmp
  EXPECT_TRUE(EnsureOwnDirectory(dir, 0700, OthersMay::kAnything).ok());
  EXPECT_EQ(EnsureOwnDirectory(dir, 0700, OthersMay::kRead).message(),
            dir + ": writable by other users (mode 1777)");
  EXPECT_EQ(ModeOf(dir), 01777u);

  if (::geteuid() == 0) {  // only root can give a directory away
    ASSERT_EQ(::chmod(dir.c_str(), 0700), 0);
    ASSERT_EQ(::chown(dir.c_str(), 65534, 65534), 0);
    const Status foreign = EnsureOwnDirectory(dir, 0700, OthersMay::kAnything);
    EXPECT_EQ(foreign.code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(foreign.message(), dir + ": owned by another user (uid 65534)");
  }
}

// A link is refused, not followed: the directory it leads to (another user's, or one whose mode
// passes when the link's place does not) is never checked in its place, nor written into.
TEST(EnsureOwnDirectoryTest, ASymbolicLinkIsRefused) {
  const std::string dir = FreshDir("own_link");
  const std::string target = dir + "/target";
  ASSERT_EQ(::mkdir(target.c_str(), 0700), 0);
  const std::string link = dir + "/link";
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  const Status refused = EnsureOwnDirectory(link, 0700, OthersMay::kAnything);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.message(), link + ": a symbolic link, not a directory");

  // A dangling one is not made into a directory at its target either.
  const std::string dangling = dir + "/dangling";
  ASSERT_EQ(::symlink((dir + "/nowhere").c_str(), dangling.c_str()), 0);
  EXPECT_EQ(EnsureOwnDirectory(dangling, 0700, OthersMay::kAnything).message(),
            dangling + ": a symbolic link, not a directory");
  EXPECT_FALSE(std::filesystem::exists(dir + "/nowhere"));
}

TEST(EnsureOwnDirectoryTest, ARegularFileIsRefused) {
  const std::string dir = FreshDir("own_file");
  const std::string file = dir + "/file";
  std::ofstream(file) << "not a directory";
  const Status refused = EnsureOwnDirectory(file, 0700, OthersMay::kAnything);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.message(), file + ": a regular file, not a directory");

  // Nor can a directory be made below one.
  const Status below = EnsureOwnDirectory(file + "/a/b", 0700, OthersMay::kAnything);
  EXPECT_EQ(below.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(below.message().rfind(file + "/a/b: cannot create: ", 0), 0u) << below.message();
}

// A group may not enter a private directory at all, nor write one that others may only read,
// unless it is the user's private group (root's own group "root" may be one here, so the test
// gives the directory to nogroup).
TEST(EnsureOwnDirectoryTest, AGroupWritableOneIsRefusedWhenPrivate) {
  const std::string dir = FreshDir("own_group");
  ASSERT_EQ(::chmod(dir.c_str(), 0770), 0);
  const Status refused = EnsureOwnDirectory(dir, 0700, OthersMay::kNothing);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.message(), dir + ": open to other users (mode 0770)");
  ASSERT_EQ(::chmod(dir.c_str(), 0750), 0);
  EXPECT_EQ(EnsureOwnDirectory(dir, 0700, OthersMay::kNothing).message(),
            dir + ": open to other users (mode 0750)");
  EXPECT_TRUE(EnsureOwnDirectory(dir, 0700, OthersMay::kRead).ok());
  EXPECT_EQ(ModeOf(dir), 0750u);

  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(dir.c_str(), 0, 65534), 0);
    ASSERT_EQ(::chmod(dir.c_str(), 0770), 0);
    EXPECT_EQ(EnsureOwnDirectory(dir, 0700, OthersMay::kRead).message(),
              dir + ": writable by other users (mode 0770)");
    EXPECT_TRUE(EnsureOwnDirectory(dir, 0700, OthersMay::kAnything).ok());
  }
}

}  // namespace
}  // namespace llmctl
