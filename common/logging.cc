#include "common/logging.h"

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

}  // namespace llmctl
