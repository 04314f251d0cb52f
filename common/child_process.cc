#include "common/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/unique_fd.h"

extern char** environ;

namespace llmctl {
namespace {

// Pointers to `strings`' characters, then the nullptr exec ends the array at. Built before fork,
// where the child may not allocate.
std::vector<char*> ExecArray(const std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (const std::string& s : strings) pointers.push_back(const_cast<char*>(s.c_str()));
  pointers.push_back(nullptr);
  return pointers;
}

// What the child needs, all of it ready before fork.
struct ChildPlan {
  const ChildSpec& spec;
  const char* program;
  char* const* argv;
  char* const* envp;  // nullptr: environ
  pid_t parent;
  const sigset_t& parent_mask;  // the forking thread's, from before every signal was blocked
  int exec_error_fd;            // kReturned: where exec's errno goes; -1 otherwise
};

// exec's reason in words; strerrordesc_np rather than strerror, which may take a locale lock that
// another thread of the parent held at fork. The same words as strerror's in the C locale.
const char* ExecErrorText(int error) {
  const char* text = ::strerrordesc_np(error);
  return text != nullptr ? text : "unknown error";
}

// In the child: reports `error` as spec.exec_failure says and exits. Async-signal-safe.
[[noreturn]] void FailInChild(const ChildPlan& plan, int error) {
  if (plan.exec_error_fd >= 0) {
    (void)!::write(plan.exec_error_fd, &error, sizeof(error));
  } else {
    const std::string& message = plan.spec.exec_failure_message;
    (void)!::write(2, message.data(), message.size());
    const char* reason = ExecErrorText(error);
    (void)!::write(2, reason, std::strlen(reason));
    (void)!::write(2, "\n", 1);
  }
  ::_exit(kCannotExecuteExitCode);
}

// In the child: makes `source` descriptor `target` (open across exec); -1 leaves `target` as it
// is. False, errno set, when it cannot.
bool PlaceDescriptor(int source, int target) {
  if (source < 0) return true;
  if (source == target) return ::fcntl(target, F_SETFD, 0) == 0;  // dup2 would keep close-on-exec
  return ::dup2(source, target) >= 0;
}

// In the forked child: only async-signal-safe calls until execve.
[[noreturn]] void RunInChild(const ChildPlan& plan) {
  const ChildSpec& spec = plan.spec;
  if (spec.tie_to_parent) {
    ::prctl(PR_SET_PDEATHSIG, spec.parent_death_signal);
    if (::getppid() != plan.parent) ::_exit(kCannotExecuteExitCode);  // it died before prctl
  }
  if (spec.own_session) {
    ::setsid();
  } else if (spec.own_process_group) {
    ::setpgid(0, 0);
  }
  // A source below 3 is moved above 2 first, so that placing one never overwrites another's source
  // (a parent whose standard descriptors were closed gets its pipes there).
  int sources[3] = {spec.stdin_fd, spec.stdout_fd, spec.stderr_fd};
  for (int target = 0; target < 3; ++target) {
    if (sources[target] >= 0 && sources[target] < 3 && sources[target] != target) {
      sources[target] = ::fcntl(sources[target], F_DUPFD_CLOEXEC, 3);
      if (sources[target] < 0) FailInChild(plan, errno);
    }
  }
  for (int target = 0; target < 3; ++target) {
    if (!PlaceDescriptor(sources[target], target)) FailInChild(plan, errno);
  }
  if (!spec.working_dir.empty() && ::chdir(spec.working_dir.c_str()) != 0) {
    FailInChild(plan, errno);
  }
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  for (int signal : spec.default_signals) ::sigaction(signal, &default_action, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, spec.clear_signal_mask ? &none : &plan.parent_mask, nullptr);
  for (int fd : spec.inherited_fds) ::fcntl(fd, F_SETFD, 0);
  ::execve(plan.program, plan.argv, plan.envp != nullptr ? plan.envp : environ);
  FailInChild(plan, errno);
}

// The errno a child wrote to `exec_error` when its exec failed; 0 once exec has closed the pipe
// (close-on-exec) without a word.
int ReadExecErrno(const UniqueFd& exec_error) {
  int error = 0;
  ssize_t got = 0;
  do {
    got = ::read(exec_error.get(), &error, sizeof(error));
  } while (got < 0 && errno == EINTR);
  return got == static_cast<ssize_t>(sizeof(error)) ? error : 0;
}

void ReapChild(pid_t pid) {
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace

StatusOr<pid_t> StartChild(const ChildSpec& spec) {
  const std::string& program = spec.program.empty() ? spec.argv.at(0) : spec.program;
  const std::vector<char*> argv = ExecArray(spec.argv);
  std::vector<char*> envp;
  if (spec.envp.has_value()) envp = ExecArray(*spec.envp);
  // The child writes exec's errno here when exec fails; exec closes it (close-on-exec) otherwise.
  UniqueFd exec_error_read;
  UniqueFd exec_error_write;
  if (spec.exec_failure == ExecFailureReport::kReturned) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      return UnavailableError(std::string("pipe: ").append(std::strerror(errno)));
    }
    exec_error_read = UniqueFd(fds[0]);
    exec_error_write = UniqueFd(fds[1]);
  }
  sigset_t all, mask_before;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &mask_before);
  const ChildPlan plan{spec,
                       program.c_str(),
                       argv.data(),
                       spec.envp.has_value() ? envp.data() : nullptr,
                       ::getpid(),
                       mask_before,
                       exec_error_write.get()};
  const pid_t pid = ::fork();
  if (pid == 0) RunInChild(plan);
  const int fork_error = errno;
  ::pthread_sigmask(SIG_SETMASK, &mask_before, nullptr);
  if (pid < 0) return UnavailableError(std::string("fork: ").append(std::strerror(fork_error)));
  if (!exec_error_read.valid()) return pid;
  exec_error_write.reset();
  if (const int exec_errno = ReadExecErrno(exec_error_read); exec_errno != 0) {
    ReapChild(pid);
    return NotFoundError(std::strerror(exec_errno));
  }
  return pid;
}

}  // namespace llmctl
