// A run's event and sample lines as StreamEvents messages (server.cc's StreamEvents reads the files
// and waits; this sends what it read). Internal to agent/.
#ifndef LLMCTL_AGENT_STREAM_EVENTS_H_
#define LLMCTL_AGENT_STREAM_EVENTS_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "agent/event_reader.h"
#include "agent/runs.h"
#include "llmctl/v1/agent.grpc.pb.h"

namespace llmctl::agent {

// Reads the new lines of each rank's event file (`readers[i]` is rank `first_rank` + i) and sends
// those from `from_seqs[i]` on, one a message or (`batch`) up to event_stream.h's limits a message.
// Sets `any_lines` when a file had new lines and clears `all_read` when one was not read to its
// end. A line that breaks the event-line rule goes as its refused_line replacement, logged.
// CANCELLED when the client went away.
grpc::Status SendEventLines(const RunKey& key, int first_rank,
                            const std::vector<std::unique_ptr<EventReader>>& readers,
                            const std::vector<int64_t>& from_seqs, bool batch, bool& any_lines,
                            bool& all_read, grpc::ServerWriter<v1::StreamEventsResponse>* writer);

// Sends the sample lines from `from_seq` on (`lines_read`: the number of the last line) in
// messages of up to kSamplesPerMessage; a line that does not parse is skipped, its number
// unused. False when the client went away.
bool SendSamples(const std::vector<EventLine>& lines, int64_t lines_read, int64_t from_seq,
                 grpc::ServerWriter<v1::StreamEventsResponse>* writer);

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_STREAM_EVENTS_H_
