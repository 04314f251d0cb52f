#include "agent/stream_events.h"

#include <iostream>
#include <string>
#include <utility>

#include "agent/sample_line.h"
#include "common/event_line.h"
#include "common/event_stream.h"
#include "common/logging.h"
#include "rpc/grpc_status.h"

namespace llmctl::agent {
namespace {

using event_stream::kEventBytesPerMessage;
using event_stream::kEventsPerMessage;
using event_stream::kSamplesPerMessage;

void ToProto(int64_t seq, const TimedReading& timed, v1::DeviceSample* out) {
  const DeviceReading& reading = timed.reading;
  out->set_seq(seq);
  out->set_unix_ms(timed.unix_ms);
  out->set_device(reading.device);
  if (reading.utilization_percent) out->set_utilization_percent(*reading.utilization_percent);
  out->set_memory_used_bytes(reading.memory_used_bytes);
  out->set_memory_total_bytes(reading.memory_total_bytes);
  if (reading.power_watts) out->set_power_watts(*reading.power_watts);
  if (reading.temperature_celsius) out->set_temperature_celsius(*reading.temperature_celsius);
}

}  // namespace

grpc::Status SendEventLines(const RunKey& key, int first_rank,
                            const std::vector<std::unique_ptr<EventReader>>& readers,
                            const std::vector<int64_t>& from_seqs, bool batch, bool& any_lines,
                            bool& all_read, grpc::ServerWriter<v1::StreamEventsResponse>* writer) {
  v1::StreamEventsResponse batched;
  int64_t batched_bytes = 0;
  const auto flush = [&batched, &batched_bytes, writer] {
    if (batched.events().events_size() == 0) return true;
    const bool written = writer->Write(batched);
    batched.Clear();
    batched_bytes = 0;
    return written;
  };
  for (size_t i = 0; i < readers.size(); ++i) {
    EventReader& reader = *readers[i];
    auto lines = reader.ReadNewLines();
    if (!lines.ok()) return rpc::ToGrpcStatus(lines.status());
    any_lines = any_lines || !lines->empty();
    all_read = all_read && reader.at_end();
    int64_t seq = reader.lines_read() - static_cast<int64_t>(lines->size());
    const int rank = first_rank + static_cast<int>(i);
    for (EventLine& line : *lines) {
      if (++seq < from_seqs[i]) continue;
      // A line that breaks the rule goes on as its refused_line replacement, under its own
      // seq: the controller's numbers stay contiguous and the run's end still comes. (The
      // controller checks the line again: TrialEvent.json is bytes, so even bad UTF-8 reaches
      // it.)
      event_line::Accepted accepted = event_line::Accept(std::move(line.text), line.bytes);
      if (!accepted.refusal.empty()) {
        std::cerr << LogLinePrefix(LogLevel::kWarning) << "llm-agent: " << DescribeRunKey(key)
                  << ", rank " << rank << ": event line " << seq << " refused (" << accepted.refusal
                  << "); sent as a " << event_line::kRefusedType << " event" << std::endl;
      }
      v1::TrialEvent event;
      event.set_seq(seq);
      event.set_rank(rank);
      event.set_type(std::move(accepted.type));
      event.set_json(std::move(accepted.json));
      bool written = true;  // false: the client went away
      if (!batch) {
        v1::StreamEventsResponse item;
        *item.mutable_event() = std::move(event);
        written = writer->Write(item);
      } else {
        const int64_t bytes = static_cast<int64_t>(event.json().size());
        if (batched_bytes + bytes > kEventBytesPerMessage) written = flush();
        batched_bytes += bytes;
        *batched.mutable_events()->add_events() = std::move(event);
        if (written && batched.events().events_size() == kEventsPerMessage) written = flush();
      }
      if (!written) return grpc::Status::CANCELLED;
    }
    // A batch holds one rank's lines.
    if (!flush()) return grpc::Status::CANCELLED;
  }
  return grpc::Status::OK;
}

bool SendSamples(const std::vector<EventLine>& lines, int64_t lines_read, int64_t from_seq,
                 grpc::ServerWriter<v1::StreamEventsResponse>* writer) {
  int64_t seq = lines_read - static_cast<int64_t>(lines.size());
  v1::StreamEventsResponse item;
  for (const EventLine& line : lines) {
    if (++seq < from_seq) continue;
    auto timed = ParseSampleLine(line.text);
    if (!timed.ok()) continue;
    ToProto(seq, *timed, item.mutable_samples()->add_samples());
    if (item.samples().samples_size() == kSamplesPerMessage) {
      if (!writer->Write(item)) return false;
      item.Clear();
    }
  }
  return !item.has_samples() || writer->Write(item);
}

}  // namespace llmctl::agent
