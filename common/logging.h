// How llmctld's log lines look: "[2026-12-02T04:05:06.789Z] [info] message". spdlog's default
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

// The "[<UTC time>Z] [info] " that LogLineFormatter begins a line with, at this instant: for
// llm-agent, whose lines go straight to stderr rather than through spdlog, so that they read as
// llmctld's do.
std::string LogLinePrefix();

}  // namespace llmctl

#endif  // LLMCTL_COMMON_LOGGING_H_
