// How the streaming-RPC fuzz targets (controller_stream_fuzz.cc, agent_stream_fuzz.cc) read an
// input: the first byte chooses the RPC, the rest is a sequence of messages, each a two-byte
// little-endian length and that many bytes (fewer when the input ends first), parsed as the
// RPC's message type. A message protobuf refuses is left out of the call (gRPC would refuse it
// before any handler saw it); the others are played in order on one real call.
#ifndef LLMCTL_TESTS_FUZZ_STREAM_INPUT_H_
#define LLMCTL_TESTS_FUZZ_STREAM_INPUT_H_

#include <google/protobuf/stubs/logging.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tests/fuzz/rpc_checks.h"

namespace llmctl::rpc_fuzz {

// Every call's deadline. The client says all it has before it waits (WritesDone), so a handler
// still running at the deadline waits for nothing and has frozen: DEADLINE_EXCEEDED fails the
// check below. Well under the replay's 10 s hang limit.
inline constexpr std::chrono::seconds kCallDeadline(5);

inline void SetCallDeadline(grpc::ClientContext& context) {
  context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
}

// The messages of `data` (see above) that parse as `Message`.
template <typename Message>
std::vector<Message> StreamMessages(const uint8_t* data, size_t size) {
  std::vector<Message> messages;
  // Not valid UTF-8 in a string field: protobuf refuses the message, and need not say so.
  const google::protobuf::LogSilencer quiet;
  size_t at = 0;
  while (at + 2 <= size) {
    const size_t length = std::min<size_t>(data[at] | (data[at + 1] << 8), size - at - 2);
    Message message;
    if (message.ParseFromArray(data + at + 2, static_cast<int>(length))) {
      messages.push_back(std::move(message));
    }
    at += 2 + length;
  }
  return messages;
}

// A streaming call's end, as the caller sees it: CheckAnswer's, and never past its deadline.
inline void CheckStreamAnswer(const grpc::Status& status) {
  Check(status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED,
        "the handler ends once the caller has said everything (no freeze)");
  CheckAnswer(status);
}

// An UploadBlob call of `stub` (the controller's or the agent's) that writes `chunks`, all of them
// unless the server ends the call first, and its checked end.
template <typename Stub, typename Chunk, typename Response>
grpc::Status UploadChunks(Stub& stub, const std::vector<Chunk>& chunks, Response& response) {
  grpc::ClientContext context;
  SetCallDeadline(context);
  auto writer = stub.UploadBlob(&context, &response);
  for (const Chunk& chunk : chunks) {
    // False: the server ended the call (a refusal, or a blob it holds); Finish says which.
    if (!writer->Write(chunk)) break;
  }
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  CheckStreamAnswer(status);
  return status;
}

}  // namespace llmctl::rpc_fuzz

#endif  // LLMCTL_TESTS_FUZZ_STREAM_INPUT_H_
