#include "trainer/train/events.h"

#include <cerrno>
#include <cstring>

#include "common/foreign_json.h"

namespace llmctl::trainer {

StatusOr<std::unique_ptr<EventLog>> EventLog::Open(const std::string& path) {
  if (path.empty()) return std::unique_ptr<EventLog>(new EventLog(nullptr));
  std::FILE* file = std::fopen(path.c_str(), "a");
  if (file == nullptr) {
    return UnavailableError("cannot open events file " + path + ": " + std::strerror(errno));
  }
  return std::unique_ptr<EventLog>(new EventLog(file));
}

EventLog::~EventLog() {
  if (file_ != nullptr) std::fclose(file_);
}

void EventLog::Emit(const nlohmann::json& event) {
  ++lines_written_;
  if (file_ == nullptr) return;
  // One write per line: a reader never sees half a line followed by another writer's bytes.
  const std::string line = DumpLossy(event) + "\n";
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

}  // namespace llmctl::trainer
