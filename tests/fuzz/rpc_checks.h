// What the gRPC handler fuzz targets (controller_rpc_fuzz.cc, agent_rpc_fuzz.cc) check of each
// call: it returned (a crash, an exception or a hang is the harness's to report), a refusal has a
// code for the caller's mistake and says what it refuses, and nothing was written into the
// process's working directory, an empty one of the target's own, where a relative path from a
// request would land.
#ifndef LLMCTL_TESTS_FUZZ_RPC_CHECKS_H_
#define LLMCTL_TESTS_FUZZ_RPC_CHECKS_H_

#include <grpcpp/grpcpp.h>

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

}  // namespace llmctl::rpc_fuzz

#endif  // LLMCTL_TESTS_FUZZ_RPC_CHECKS_H_
