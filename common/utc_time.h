// Times written in UTC, whatever TZ says: lease dates for Blazar and the lease table, the
// controller's lease notices, a rate probe's date. One formatter, so that each of them reads a
// time the same way (gmtime_r, never the local zone) and only the form differs.
#ifndef LLMCTL_COMMON_UTC_TIME_H_
#define LLMCTL_COMMON_UTC_TIME_H_

#include <chrono>
#include <string>

namespace llmctl {

// `time` in UTC by strftime's `format`, to the second (a fraction of one is dropped): e.g.
// "%Y-%m-%d %H:%M" for Blazar's dates, "%Y-%m-%dT%H:%M:%SZ" for ISO 8601, "%Y-%m-%d %H:%M UTC"
// for a notice a person reads. An output past 63 bytes comes back empty (every form here is
// about 20).
std::string FormatUtc(std::chrono::system_clock::time_point time, const char* format);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_UTC_TIME_H_
