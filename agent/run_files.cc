#include "agent/run_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <limits>

#include "common/atomic_file.h"
#include "common/files.h"
#include "common/foreign_json.h"

namespace llmctl::agent {

Status WriteJsonFile(const std::string& path, const nlohmann::json& json) {
  // Lossy: a run's files hold other processes' text (a trainer's last stderr line, cut anywhere),
  // and a dump() that threw on it would leave the run without its ended.json for ever.
  const std::string text = DumpLossy(json) + "\n";
  return WriteFileAtomically(path, [&](int fd) { return WriteAll(fd, text.data(), text.size()); });
}

std::optional<nlohmann::json> ReadJsonObject(const std::string& path) {
  auto text = ReadFileToString(path, 1 << 20);
  if (!text.ok()) return std::nullopt;
  nlohmann::json json = ParseForeignJson(*text);
  if (json.is_discarded() || !json.is_object()) return std::nullopt;
  return json;
}

bool FileExists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

void CountNewLines(const std::string& path, int64_t& offset, int64_t& lines) {
  // The trainer's own regular file: a FIFO or a link to /dev/zero put in its place would hold the
  // agent's run lock for ever.
  struct stat info;
  const StatusOr<UniqueFd> fd = OpenRegularFile(path, info, /*follow_links=*/false);
  if (!fd.ok()) return;
  char buffer[1 << 16];
  ssize_t n;
  while ((n = ::pread(fd->get(), buffer, sizeof(buffer), offset)) > 0) {
    lines += std::count(buffer, buffer + n, '\n');
    offset += n;
  }
}

std::string ReadTail(const std::string& path, size_t bytes) {
  struct stat info;
  const StatusOr<UniqueFd> fd = OpenRegularFile(path, info, /*follow_links=*/false);
  if (!fd.ok()) return "";
  std::string text;
  const off_t start = info.st_size > static_cast<off_t>(bytes) ? info.st_size - bytes : 0;
  text.resize(static_cast<size_t>(info.st_size - start));
  const ssize_t n = ::pread(fd->get(), text.data(), text.size(), start);
  text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return text;
}

nlohmann::json RunEndToJson(const RunEnd& end) {
  return {{"outcome", end.outcome}, {"exit_code", end.exit_code}, {"error", end.error}};
}

std::optional<RunEnd> RunEndFromJson(const nlohmann::json& json) {
  if (!json.contains("outcome") || !json["outcome"].is_string()) return std::nullopt;
  RunEnd end;
  end.outcome = json["outcome"].get<std::string>();
  end.exit_code = JsonFieldOr(json, "exit_code", 0);
  end.error = JsonFieldOr(json, "error", std::string());
  return end;
}

std::optional<RankExit> ReadFirstFailedRank(const std::string& path) {
  auto json = ReadJsonObject(path);
  if (!json) return std::nullopt;
  const nlohmann::json failure = json->value("first_failure", nlohmann::json());
  if (!failure.is_object() || !failure.value("rank", nlohmann::json()).is_number_integer()) {
    return std::nullopt;
  }
  RankExit exit;
  // A rank past int's range would wrap onto a real one.
  const int64_t rank = failure["rank"].get<int64_t>();
  if (rank < 0 || rank > std::numeric_limits<int>::max()) return std::nullopt;
  exit.rank = static_cast<int>(rank);
  exit.exit.signal = JsonFieldOr(failure, "signal", 0);
  exit.exit.exit_code = JsonFieldOr(failure, "exit_code", 0);
  return exit;
}

int ReadMasterPort(const std::string& path) {
  auto json = ReadJsonObject(path);
  if (!json) return 0;
  const nlohmann::json port = json->value("master_port", nlohmann::json());
  if (!port.is_number_integer() || port.get<int64_t>() < 1 || port.get<int64_t>() > 65535) return 0;
  return port.get<int>();
}

}  // namespace llmctl::agent
