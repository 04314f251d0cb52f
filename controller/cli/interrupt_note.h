// What `llmctl submit --wait` and `resume --wait` say when Ctrl-C stops them following.
#ifndef LLMCTL_CONTROLLER_CLI_INTERRUPT_NOTE_H_
#define LLMCTL_CONTROLLER_CLI_INTERRUPT_NOTE_H_

#include <signal.h>

#include <string_view>

namespace llmctl::cli {

// While it lives, SIGINT (Ctrl-C) writes `note` (at most 1023 bytes kept) to stderr and exits 130,
// the status a shell reads for a process ended by SIGINT: the default action ended the process
// silently, leaving the user to guess whether the experiment ended with it. One at a time; the
// destructor restores the action it replaced.
class InterruptNote {
 public:
  explicit InterruptNote(std::string_view note);
  ~InterruptNote();
  InterruptNote(const InterruptNote&) = delete;
  InterruptNote& operator=(const InterruptNote&) = delete;

 private:
  struct sigaction previous_ {};
};

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_INTERRUPT_NOTE_H_
