// The files of a run's directory (the layout runs.h shows) and how the agent writes and reads
// them back. Read back after a crash, or written by llm-train (ranks.json): a missing, damaged or
// oddly typed file reads as absent or as the fallback, never as an exception.
#ifndef LLMCTL_AGENT_RUN_FILES_H_
#define LLMCTL_AGENT_RUN_FILES_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "agent/outcome.h"
#include "common/status.h"

namespace llmctl::agent {

inline constexpr char kTrialFile[] = "trial.yaml";
inline constexpr char kDevicesFile[] = "devices.json";
inline constexpr char kRanksFile[] = "ranks.json";
inline constexpr char kSupervisorFile[] = "supervisor.json";
inline constexpr char kSupervisorLog[] = "supervisor.log";
inline constexpr char kCancelFile[] = "cancel_requested";
inline constexpr char kEndedFile[] = "ended.json";
inline constexpr char kOutputDir[] = "output";

// `json` as one line, written atomically.
Status WriteJsonFile(const std::string& path, const nlohmann::json& json);
// The file's JSON object; nullopt when it is missing, unreadable or not an object.
std::optional<nlohmann::json> ReadJsonObject(const std::string& path);

// `json[key]` when it is an integer (a string when `T` is one), else `fallback`: these files are
// read back after a crash, and ranks.json is llm-train's, so a field of the wrong type must not
// throw as nlohmann's value() does.
template <typename T>
T JsonFieldOr(const nlohmann::json& json, const char* key, T fallback) {
  const auto field = json.find(key);
  if (field == json.end()) return fallback;
  if constexpr (std::is_same_v<T, std::string>) {
    return field->is_string() ? field->get<std::string>() : fallback;
  } else {
    // Within T's range, else the fallback: another process's 2^32 must not read as 0.
    if (!field->is_number_integer()) return fallback;
    if (field->is_number_unsigned()) {
      const uint64_t value = field->get<uint64_t>();
      return std::in_range<T>(value) ? static_cast<T>(value) : fallback;
    }
    const int64_t value = field->get<int64_t>();
    return std::in_range<T>(value) ? static_cast<T>(value) : fallback;
  }
}

bool FileExists(const std::string& path);

// Adds the complete lines (ending in '\n') in the file after `offset` to `lines` and moves
// `offset` past the last byte read: called again, it reads only what was appended since.
void CountNewLines(const std::string& path, int64_t& offset, int64_t& lines);

// The file's last `bytes` bytes (all of it when shorter); "" when it cannot be read.
std::string ReadTail(const std::string& path, size_t bytes);

// ended.json's object.
nlohmann::json RunEndToJson(const RunEnd& end);
std::optional<RunEnd> RunEndFromJson(const nlohmann::json& json);

// The first failed rank as llm-train's launcher recorded it in ranks.json; nullopt when none did.
std::optional<RankExit> ReadFirstFailedRank(const std::string& path);

// The rendezvous port llm-train's launcher recorded in ranks.json; 0 when it has not yet.
int ReadMasterPort(const std::string& path);

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_RUN_FILES_H_
