// What the gRPC handler fuzz targets (controller_rpc_fuzz.cc, agent_rpc_fuzz.cc) check of each
// call: it returned (a crash, an exception or a hang is the harness's to report), a refusal has a
// code for the caller's mistake and says what it refuses, and nothing was written into the
// process's working directory, an empty one of the target's own, where a relative path from a
// request would land.
#ifndef LLMCTL_TESTS_FUZZ_RPC_CHECKS_H_
#define LLMCTL_TESTS_FUZZ_RPC_CHECKS_H_

#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

namespace llmctl::rpc_fuzz {

inline void Check(bool condition, const char* what) {
  if (condition) return;
  std::cerr << "rpc fuzz: check failed: " << what << std::endl;
  std::abort();
}

// A status from a handler: OK, or a refusal with a message and a code that says what the caller
// did wrong: not UNKNOWN (an exception gRPC caught) nor INTERNAL (the controller's answer to an
// exception its handler let out, and no answer to a request the target's healthy store and disk
// serve).
inline void CheckAnswer(const grpc::Status& status) {
  if (status.ok()) return;
  Check(status.error_code() != grpc::StatusCode::UNKNOWN, "a refusal's code is not UNKNOWN");
  Check(status.error_code() != grpc::StatusCode::INTERNAL, "a refusal's code is not INTERNAL");
  Check(!status.error_message().empty(), "a refusal has a message");
}

// Makes `dir` (empty) the working directory, for CheckWorkingDirectoryEmpty.
inline void EnterEmptyDirectory(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  std::filesystem::current_path(dir);
}

inline void CheckWorkingDirectoryEmpty() {
  Check(std::filesystem::is_empty(std::filesystem::current_path()),
        "nothing is written to the working directory");
}

// A target's temporary directory, NAME_XXXXXX under the system's, with its empty working directory
// cwd/ entered; left and removed at exit. A fixture's first member, so that it goes last, after the
// daemons that write in it.
class TargetRoot {
 public:
  explicit TargetRoot(const std::string& name) {
    std::string pattern = (std::filesystem::temp_directory_path() / (name + "_XXXXXX")).string();
    Check(mkdtemp(pattern.data()) != nullptr, "a temporary directory");
    path_ = pattern;
    EnterEmptyDirectory(path_ / "cwd");
  }
  TargetRoot(const TargetRoot&) = delete;
  TargetRoot& operator=(const TargetRoot&) = delete;
  ~TargetRoot() {
    std::error_code ignored;
    std::filesystem::current_path(path_.parent_path(), ignored);
    std::filesystem::remove_all(path_, ignored);
  }

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace llmctl::rpc_fuzz

#endif  // LLMCTL_TESTS_FUZZ_RPC_CHECKS_H_
