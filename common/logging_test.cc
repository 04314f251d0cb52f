#include "common/logging.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <time.h>

#include <chrono>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <utility>

namespace llmctl {
namespace {

// A zone 5 h 30 min east of UTC that needs no tz database: a local time would read 05:30 later.
void SetTimeZoneAwayFromUtc() {
  ASSERT_EQ(::setenv("TZ", "IST-5:30", 1), 0);
  ::tzset();
}

// A line at a fixed instant (not the clock's: the test reads no wall time) prints that instant in
// UTC, with its milliseconds and a Z, then the level and the message as spdlog's default does.
TEST(LoggingTest, ALinePrintsItsTimeInUtcWithAZ) {
  SetTimeZoneAwayFromUtc();
  // 2023-11-14T22:13:20.123Z; 2023-11-15 03:43:20.123 in TZ.
  const spdlog::log_clock::time_point at{std::chrono::milliseconds(1'700'000'000'123)};
  const spdlog::details::log_msg line(at, spdlog::source_loc{}, "", spdlog::level::warn,
                                      "node n1: unreachable");
  spdlog::memory_buf_t formatted;
  LogLineFormatter()->format(line, formatted);
  EXPECT_EQ(std::string(formatted.data(), formatted.size()),
            "[2023-11-14T22:13:20.123Z] [warning] node n1: unreachable\n");
}

// ConfigureLogging gives the default logger (the one spdlog::info writes to) that format.
TEST(LoggingTest, ConfigureLoggingFormatsTheDefaultLoggersLines) {
  SetTimeZoneAwayFromUtc();
  std::ostringstream out;
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("", std::make_shared<spdlog::sinks::ostream_sink_st>(out)));
  ConfigureLogging();
  spdlog::info("llmctld: stopping (signal {})", 15);
  EXPECT_TRUE(std::regex_match(
      out.str(),
      std::regex(
          R"(\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\] \[info\] llmctld: stopping \(signal 15\)\n)")))
      << out.str();
}

// LogLinePrefix, which begins each of llm-agent's lines, reads as a line from LogLineFormatter
// does: the time in UTC with its Z whatever TZ says, then the level.
TEST(LoggingTest, LogLinePrefixIsALinesBeginningInUtcWithAZ) {
  SetTimeZoneAwayFromUtc();
  const std::string prefix = LogLinePrefix(LogLevel::kInfo);
  EXPECT_TRUE(std::regex_match(
      prefix, std::regex(R"(\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\] \[info\] )")))
      << prefix;
}

// Each level is named as spdlog names it in llmctld's lines (ALinePrintsItsTimeInUtcWithAZ's
// "[warning]"), so that one grep for "[error]" or "[warning]" finds both daemons' failures.
TEST(LoggingTest, LogLinePrefixNamesItsLevelAsLlmctldsLinesDo) {
  const std::pair<LogLevel, std::string> levels[] = {
      {LogLevel::kInfo, "info"}, {LogLevel::kWarning, "warning"}, {LogLevel::kError, "error"}};
  for (const auto& [level, name] : levels) {
    const std::string prefix = LogLinePrefix(level);
    EXPECT_TRUE(std::regex_match(
        prefix, std::regex(R"(\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\] \[)" + name + R"(\] )")))
        << prefix;
  }
}

}  // namespace
}  // namespace llmctl
