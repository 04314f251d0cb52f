#include "trainer/train/events.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/atomic_file.h"
#include "common/foreign_json.h"

namespace llmctl::trainer {

StatusOr<std::unique_ptr<EventLog>> EventLog::Open(const std::string& path) {
  if (path.empty()) return std::unique_ptr<EventLog>(new EventLog(path, UniqueFd()));
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666));
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
  const off_t end = ::lseek(fd_.get(), 0, SEEK_END);
  const Status written = WriteAll(fd_.get(), line.data(), line.size());
  if (written.ok()) return;
  // The part of the line that was written goes again, so that a reader (the agent following the
  // file) never takes it for a line, nor a later line joined to it; nothing more is written.
  const bool cut = end >= 0 && ::ftruncate(fd_.get(), end) == 0;
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
