#include "common/digest/verified_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "common/atomic_file.h"

namespace llmctl::digest {

VerifiedFileWriter::VerifiedFileWriter(std::string what, int fd, std::string temp_path,
                                       std::string final_path, int64_t size)
    : what_(std::move(what)),
      temp_path_(std::move(temp_path)),
      final_path_(std::move(final_path)),
      size_(size),
      fd_(fd) {}

VerifiedFileWriter::~VerifiedFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

Status VerifiedFileWriter::Append(std::string_view data) {
  if (committed_ || fd_ < 0) return FailedPreconditionError(what_ + " already finished");
  if (received_ + static_cast<int64_t>(data.size()) > size_) {
    return DataLossError(what_ + ": more than the announced " + std::to_string(size_) +
                         " bytes arrived");
  }
  RETURN_IF_ERROR(WriteAll(fd_, data.data(), data.size()).WithContext("writing " + temp_path_));
  hasher_.Update(data);
  received_ += static_cast<int64_t>(data.size());
  return Status::Ok();
}

Status VerifiedFileWriter::Commit(std::string_view sha256) {
  if (committed_ || fd_ < 0) return FailedPreconditionError(what_ + " already finished");
  const std::string actual = hasher_.HexDigest();
  if (received_ != size_ || actual != sha256) {
    ::close(std::exchange(fd_, -1));  // the hasher is spent: this file is done with
    return DataLossError(what_ + ": " + std::to_string(received_) + " bytes with sha256 " + actual +
                         " arrived, " + std::to_string(size_) + " bytes with sha256 " +
                         std::string(sha256) + " were announced");
  }
  const bool synced = ::fsync(fd_) == 0;
  const int sync_error = errno;
  ::close(std::exchange(fd_, -1));
  if (!synced) {
    return FailedPreconditionError(what_ + ": fsync " + temp_path_ + ": " +
                                   std::strerror(sync_error));
  }
  if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    return FailedPreconditionError(what_ + ": cannot move it to " + final_path_ + ": " +
                                   std::strerror(errno));
  }
  committed_ = true;
  // The new name lives in the directory: until that is synced, a power loss can take the file
  // away although Commit reported it in place, as for a checkpoint's rename.
  return SyncDirectoryOf(final_path_).WithContext(what_);
}

}  // namespace llmctl::digest
