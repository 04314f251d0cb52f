// Starting a program in a child process, tied to this one unless asked otherwise: the child gets
// SIGKILL (or the signal asked for) when the thread that started it ends (PR_SET_PDEATHSIG), and
// never runs its program when this process died before the tie was made. fork and exec rather
// than posix_spawn, which cannot set a parent-death signal: a rate probe or a rank that outlived a
// killed agent, llmctl or launcher would go on measuring or training beside the next one.
#ifndef LLMCTL_COMMON_CHILD_PROCESS_H_
#define LLMCTL_COMMON_CHILD_PROCESS_H_

#include <signal.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace llmctl {

// The exit code of a child whose program could not be executed (as a shell's).
inline constexpr int kCannotExecuteExitCode = 127;

// How a child tells that its program could not be executed.
enum class ExecFailureReport {
  // StartChild reaps the child and returns NotFound with exec's strerror as the message.
  kReturned,
  // The child writes "<exec_failure_message><strerror>\n" to its standard error and exits
  // kCannotExecuteExitCode; StartChild returns its pid. For a caller that learns how each of its
  // children ended in one place, when it reaps them.
  kStderrAndExitCode,
};

// What differs between the children this project starts.
struct ChildSpec {
  // The path exec runs; empty: argv[0]. No PATH lookup: a caller finds the program before, where it
  // may still allocate.
  std::string program;
  std::vector<std::string> argv;
  // Its whole environment, "NAME=value" each; nullopt: this process's.
  std::optional<std::vector<std::string>> envp;
  // What become its standard input, output and error; -1 leaves it this process's.
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  // Close-on-exec descriptors the program keeps open at their numbers (a listening socket handed
  // to a rank); every other close-on-exec descriptor closes at exec.
  std::vector<int> inherited_fds;
  // A process group of its own (its pid): killing the group ends what the program started too,
  // and a terminal's Ctrl-C reaches this process, which decides, not the child.
  bool own_process_group = false;
  // A session of its own (setsid: its pid is the session's id and its group's), which every
  // process the program starts stays in, whatever groups they make: a test's local service, whose
  // processes are all found by session and checked gone once it stops. own_process_group is then
  // implied.
  bool own_session = false;
  // Signals the program starts at their default action: an ignored signal stays ignored across
  // exec.
  std::vector<int> default_signals;
  // Whether the program starts with no signal blocked, rather than with the mask of the thread
  // that calls StartChild (a mask survives exec).
  bool clear_signal_mask = false;
  // Whether the child gets SIGKILL when the calling thread ends, and never runs its program when
  // this process died before that tie was made. False for a child that may outlive this process:
  // the supervisor's worker, which the agent stops itself when its supervisor is gone.
  bool tie_to_parent = true;
  // The signal the tie sends: SIGKILL, or SIGTERM for a program that stops what it started on its
  // way out (a test's service script, whose service would otherwise outlive the test).
  int parent_death_signal = SIGKILL;
  // The directory the program starts in; empty: this process's. A relative `program` is found from
  // it (exec comes after), and one the child cannot enter fails as exec would, with chdir's errno.
  std::string working_dir;
  ExecFailureReport exec_failure = ExecFailureReport::kReturned;
  // kStderrAndExitCode's message before exec's reason.
  std::string exec_failure_message;
};

// Forks a child that runs `spec`'s program, and returns its pid once the child has executed it
// (kReturned) or has been forked (kStderrAndExitCode). A tied child is SIGKILLed when the calling
// thread ends, not the process: a caller keeps that thread until the child has been reaped. No
// handler of this process runs in the child: every signal is blocked from before fork until the
// child has set its signals. NotFound, exec's strerror as the message, when the program cannot be
// executed (kReturned only; the child reaped); Unavailable naming the call when there is no pipe or
// fork.
StatusOr<pid_t> StartChild(const ChildSpec& spec);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_CHILD_PROCESS_H_
