// A file that arrives in pieces with an announced size and is checked against its sha256 before it
// appears under its name: the bytes go to a temporary file, Commit checks size and sha256, syncs
// and renames it into place, and syncs the directory. So a content-addressed store (the
// controller's blobs, the agent's cache) or a download (the CLI's artifacts) never shows wrong or
// half-written bytes.
#ifndef LLMCTL_COMMON_DIGEST_VERIFIED_FILE_H_
#define LLMCTL_COMMON_DIGEST_VERIFIED_FILE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "common/digest/digest.h"
#include "common/status.h"

namespace llmctl::digest {

// One file being received. Destroying it uncommitted removes the temporary file. Not thread-safe.
class VerifiedFileWriter {
 public:
  // Takes `fd`, open for writing on `temp_path` (which the caller created, on the same filesystem
  // as `final_path`). Every message starts with `what` (e.g. "upload of <sha256>").
  VerifiedFileWriter(std::string what, int fd, std::string temp_path, std::string final_path,
                     int64_t size);
  ~VerifiedFileWriter();
  VerifiedFileWriter(const VerifiedFileWriter&) = delete;
  VerifiedFileWriter& operator=(const VerifiedFileWriter&) = delete;

  // DataLoss once more bytes arrived than the announced size; FailedPrecondition after Commit.
  Status Append(std::string_view data);
  // Publishes the file under its final name. DataLoss when the size or the sha256 of what arrived
  // differ from the announced size and `sha256` (nothing is published); FailedPrecondition when the
  // file cannot be synced or renamed, and after a Commit that succeeded; Unavailable when its
  // directory cannot be synced after the rename (the file is then under its name, and stays).
  Status Commit(std::string_view sha256);

 private:
  const std::string what_;
  const std::string temp_path_;
  const std::string final_path_;
  const int64_t size_;
  int fd_;  // -1 once closed
  int64_t received_ = 0;
  Sha256 hasher_;
  bool committed_ = false;
};

}  // namespace llmctl::digest

#endif  // LLMCTL_COMMON_DIGEST_VERIFIED_FILE_H_
