#include "trainer/train/events.h"

#include <fcntl.h>

#include <cerrno>
#include <cstring>

#include "common/files.h"
#include "common/foreign_json.h"

namespace llmctl::trainer {

StatusOr<std::unique_ptr<EventLog>> EventLog::Open(const std::string& path) {
  if (path.empty()) return std::unique_ptr<EventLog>(new EventLog(path, UniqueFd()));
  // 0600: the agent, the same user, reads it; under umask 000 0666 let any user write events.
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    return UnavailableError("cannot open events file " + path + ": " + std::strerror(errno));
  }
  return std::unique_ptr<EventLog>(new EventLog(path, std::move(fd)));
}

void EventLog::Emit(const nlohmann::json& event) {
  ++lines_written_;
  if (!fd_.valid() || !status_.ok()) return;
  // One write per line: a reader never sees half a line followed by another writer's bytes.
  const std::string line = DumpLossy(event) + "\n";
  bool cut = false;
  const Status written = AppendWholeLines(fd_.get(), line, cut);
  if (written.ok()) return;
  // Nothing more is written: the outcome says which line was the first lost.
  status_ = UnavailableError(std::string("cannot write events file ")
                                 .append(path_)
                                 .append(": ")
                                 .append(written.message())
                                 .append("; line ")
                                 .append(std::to_string(lines_written_))
                                 .append(cut ? " and those after it are lost"
                                             : " is incomplete and those after it are lost"));
}

}  // namespace llmctl::trainer
