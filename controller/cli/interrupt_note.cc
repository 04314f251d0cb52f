#include "controller/cli/interrupt_note.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>

namespace llmctl::cli {
namespace {

// Filled before the handler is installed: the handler only reads it (async-signal-safe calls only).
std::array<char, 1024> note_text;
size_t note_size = 0;

extern "C" void WriteNoteAndExit(int signal) {
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, note_text.data(), note_size);
  ::_exit(128 + signal);
}

}  // namespace

InterruptNote::InterruptNote(std::string_view note) {
  note_size = std::min(note.size(), note_text.size() - 1);
  std::memcpy(note_text.data(), note.data(), note_size);
  struct sigaction action {};
  action.sa_handler = WriteNoteAndExit;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, &previous_);
}

InterruptNote::~InterruptNote() { ::sigaction(SIGINT, &previous_, nullptr); }

}  // namespace llmctl::cli
