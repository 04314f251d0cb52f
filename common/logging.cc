#include "common/logging.h"

#include <spdlog/details/log_msg.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>

namespace llmctl {

std::unique_ptr<spdlog::formatter> LogLineFormatter() {
  // The level and message as spdlog's default pattern has them (the level coloured on a terminal);
  // the logger's name, empty for the default logger, is left out as the default pattern does.
  return std::make_unique<spdlog::pattern_formatter>("[%Y-%m-%dT%H:%M:%S.%eZ] [%^%l%$] %v",
                                                     spdlog::pattern_time_type::utc);
}

void ConfigureLogging() { spdlog::set_formatter(LogLineFormatter()); }

namespace {

spdlog::level::level_enum SpdlogLevel(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarning:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
  }
  return spdlog::level::info;  // not reached: the switch names every level
}

}  // namespace

std::string LogLinePrefix(LogLevel level) {
  // An empty message formatted as a line, less its end of line: the prefix, by the one pattern.
  spdlog::memory_buf_t formatted;
  LogLineFormatter()->format(spdlog::details::log_msg("", SpdlogLevel(level), ""), formatted);
  std::string prefix(formatted.data(), formatted.size());
  while (!prefix.empty() && (prefix.back() == '\n' || prefix.back() == '\r')) prefix.pop_back();
  return prefix;
}

}  // namespace llmctl
