// How the daemons' log lines look: "[2026-12-02T04:05:06.789Z] [info] message". spdlog's default
// pattern prints the local time without its zone, which cannot be set beside `llmctl report`'s
// times or another node's log (each machine in its own TZ, and an hour repeated at a DST change);
// UTC in ISO 8601 with its Z reads the same everywhere.
#ifndef LLMCTL_COMMON_LOGGING_H_
#define LLMCTL_COMMON_LOGGING_H_

#include <spdlog/formatter.h>

#include <memory>
#include <string>

namespace llmctl {

// Formats a line as "[<UTC time, ISO 8601, milliseconds>Z] [<level>] <message>", whatever TZ says.
std::unique_ptr<spdlog::formatter> LogLineFormatter();

// Gives every spdlog logger, the default one included, LogLineFormatter: first thing in a daemon's
// main, before any thread logs.
void ConfigureLogging();

// How much a line matters, named in it as spdlog names its levels ("info", "warning", "error"):
// kError for a refusal or failure that ends the process, kWarning for one it recovers from or skips
// past, kInfo for progress. A user looking for what went wrong greps for the first two.
enum class LogLevel { kInfo, kWarning, kError };

// The "[<UTC time>Z] [<level>] " that LogLineFormatter begins a line at `level` with, at this
// instant: for llm-agent, whose lines go straight to stderr rather than through spdlog, so that
// they read as llmctld's do.
std::string LogLinePrefix(LogLevel level);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_LOGGING_H_
