#include "agent/event_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/files.h"

namespace llmctl::agent {

void LineSplitter::Feed(std::string_view data, std::vector<EventLine>& lines) {
  while (!data.empty()) {
    const size_t newline = data.find('\n');
    const std::string_view piece = data.substr(0, newline);
    partial_bytes_ += static_cast<int64_t>(piece.size());
    if (partial_bytes_ <= max_line_bytes_) {
      partial_.append(piece);
    } else {
      partial_.clear();  // overlong: its bytes are dropped until its '\n'
      partial_.shrink_to_fit();
    }
    if (newline == std::string_view::npos) return;
    lines.push_back(EventLine{std::move(partial_), partial_bytes_});
    partial_.clear();
    partial_bytes_ = 0;
    data.remove_prefix(newline + 1);
  }
}

StatusOr<std::vector<EventLine>> EventReader::ReadNewLines() {
  std::vector<EventLine> lines;
  if (!fd_.valid()) {
    // The trainer's own regular file: a FIFO, a device or a link put in its place is refused, not
    // waited on or read for ever.
    struct stat info;
    StatusOr<UniqueFd> opened = OpenRegularFile(path_, info, /*follow_links=*/false);
    if (!opened.ok()) {
      if (opened.status().code() == StatusCode::kNotFound) {
        at_end_ = true;
        return lines;
      }
      return opened.status();
    }
    fd_ = std::move(*opened);
  }
  char buffer[1 << 16];
  int64_t budget = kReadBudgetBytes;
  at_end_ = false;
  while (budget > 0) {
    const ssize_t n = ::pread(fd_.get(), buffer, sizeof(buffer), offset_);
    if (n < 0) {
      if (errno == EINTR) continue;
      return UnavailableError("cannot read " + path_ + ": " + std::strerror(errno));
    }
    if (n == 0) {
      at_end_ = true;
      break;
    }
    offset_ += n;
    budget -= n;
    splitter_.Feed(std::string_view(buffer, static_cast<size_t>(n)), lines);
  }
  lines_read_ += static_cast<int64_t>(lines.size());
  return lines;
}

}  // namespace llmctl::agent
