#include "common/utc_time.h"

#include <time.h>

#include <ctime>

namespace llmctl {

std::string FormatUtc(std::chrono::system_clock::time_point time, const char* format) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(time);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buffer[64];
  const size_t length = std::strftime(buffer, sizeof buffer, format, &tm);
  return std::string(buffer, length);
}

}  // namespace llmctl
