// A line of a run's samples.jsonl (agent/sample_recorder.h writes them): one device reading, as the
// agent writes it and reads it back, after a restart too, to send it on (StreamEvents). Apart from
// the recorder so that the parse can be tested on any bytes (tests/fuzz/run_files_fuzz.cc).
#ifndef LLMCTL_AGENT_SAMPLE_LINE_H_
#define LLMCTL_AGENT_SAMPLE_LINE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "agent/device_sampler.h"
#include "common/status.h"

namespace llmctl::agent {

struct TimedReading {
  int64_t unix_ms = 0;
  DeviceReading reading;
};

// One line of samples.jsonl, without its '\n'.
std::string FormatSampleLine(const TimedReading& reading);
// InvalidArgument when the line is not one FormatSampleLine wrote (a field missing or of the
// wrong type, a negative memory figure).
StatusOr<TimedReading> ParseSampleLine(std::string_view line);

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_SAMPLE_LINE_H_
