// What one StreamEventsResponse may carry (the agent's StreamEvents to the controller): the agent
// sends no more, and the controller refuses a message with more, which an agent of this project
// never sends; each refused or stored item costs the controller far more than its bytes on the
// wire (an empty event is 2 bytes there and a stored refused_line of about 100).
#ifndef LLMCTL_COMMON_EVENT_STREAM_H_
#define LLMCTL_COMMON_EVENT_STREAM_H_

#include <cstdint>

namespace llmctl::event_stream {

// Device samples in one message (a long backlog after a reconnect goes in several).
inline constexpr int kSamplesPerMessage = 1000;
// Event lines in one batch (StreamEventsRequest.batch_events), and their bytes: one more line
// (event_line::kMaxBytes) still fits the controller's 8 MiB message.
inline constexpr int kEventsPerMessage = 512;
inline constexpr int64_t kEventBytesPerMessage = int64_t{4} << 20;

}  // namespace llmctl::event_stream

#endif  // LLMCTL_COMMON_EVENT_STREAM_H_
