#include "agent/event_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

namespace llmctl::agent {

EventReader::~EventReader() {
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<std::vector<std::string>> EventReader::ReadNewLines() {
  std::vector<std::string> lines;
  if (fd_ < 0) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      if (errno == ENOENT) return lines;
      return UnavailableError("cannot open " + path_ + ": " + std::strerror(errno));
    }
  }
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::pread(fd_, buffer, sizeof(buffer), offset_);
    if (n < 0) {
      if (errno == EINTR) continue;
      return UnavailableError("cannot read " + path_ + ": " + std::strerror(errno));
    }
    if (n == 0) break;
    offset_ += n;
    partial_.append(buffer, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t newline; (newline = partial_.find('\n', start)) != std::string::npos;
         start = newline + 1) {
      lines.push_back(partial_.substr(start, newline - start));
    }
    partial_.erase(0, start);
  }
  lines_read_ += static_cast<int64_t>(lines.size());
  return lines;
}

std::string EventType(const std::string& line) {
  const nlohmann::json event = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!event.is_object()) return "";
  const auto type = event.find("type");
  return (type != event.end() && type->is_string()) ? type->get<std::string>() : "";
}

}  // namespace llmctl::agent
