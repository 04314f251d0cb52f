// ReadFileInPieces: a file in bounded pieces. CheckRoomFor: what fits on a filesystem, with what
// llmctl keeps free of it and what writes in progress were promised.
#include "common/files.h"

#include <gtest/gtest.h>
#include <sys/statvfs.h>

#include <cstdint>
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

}  // namespace
}  // namespace llmctl
