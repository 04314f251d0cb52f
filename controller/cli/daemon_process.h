// Daemons detached from the process that starts them, and found again by their pid files: the
// mechanics under llmctl's embedded pair (daemons.h), which know nothing of llmctld or llm-agent.
//
// A daemon is detached by a double fork and setsid (it outlives the command and its terminal); the
// process between stays its parent while the starter waits for it, to pass on its wait status
// should it end first (StartedDaemon). A pid file is believed only while /proc/<pid>/exe is a
// program of the daemon's name, so a reused pid is not mistaken for a daemon.
#ifndef LLMCTL_CONTROLLER_CLI_DAEMON_PROCESS_H_
#define LLMCTL_CONTROLLER_CLI_DAEMON_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace llmctl::cli {

// How often a start looks at a daemon it waits for (and the process between at its daemon).
inline constexpr std::chrono::milliseconds kDaemonPollInterval{50};

// One detached process: a binary, its pid file and its log.
struct DaemonSpec {
  std::string name;               // for messages: "llmctld"
  std::filesystem::path binary;   // absolute
  std::vector<std::string> args;  // without argv[0]
  std::filesystem::path pid_file;
  std::filesystem::path log_file;  // stdout and stderr, appended
};

// A daemon StartDetached started, while this process may still learn how it ends. A detached
// daemon is not this process's child, so its exit code was lost, and llmctl could only say that
// it had died: its parent (the process between, the leader of its session) stays until Release,
// to reap the daemon should it end first and pass its wait status on. Released, that parent exits
// and the daemon is init's, as any detached daemon's; that parent exits too when this process ends
// (Ctrl-C, kill -9), so it never outlives the start it served.
class StartedDaemon {
 public:
  StartedDaemon(pid_t pid, pid_t watcher, UniqueFd watch, off_t log_start)
      : pid_(pid), watcher_(watcher), watch_(std::move(watch)), log_start_(log_start) {}
  StartedDaemon(StartedDaemon&&) noexcept = default;
  // Not assignable: the daemon it held would be let go without its parent being reaped.
  StartedDaemon& operator=(StartedDaemon&&) = delete;
  ~StartedDaemon() { Release(); }

  pid_t pid() const { return pid_; }
  // Where its log ended when it started: what it wrote since lies after.
  off_t log_start() const { return log_start_; }

  // Its wait status (waitpid's: an exit code or a signal) when it ended before Release, waiting up
  // to `wait` for it; nullopt while it runs, once released, or when its parent was killed.
  std::optional<int> WaitStatus(std::chrono::milliseconds wait);

  // Lets the daemon go (its parent exits, and is reaped here). Idempotent.
  void Release();

 private:
  pid_t pid_;
  pid_t watcher_;
  UniqueFd watch_;  // this end of a socket pair with its parent; none once released
  off_t log_start_;
};

// Starts `spec` detached from this process (its own session, stdin from /dev/null) and writes its
// pid file; the daemon's program runs only once that file is written, so a daemon never runs
// without it (this process ended first: Ctrl-C, kill -9). FailedPrecondition with the reason when
// the binary cannot be executed, or when the pid file cannot be written (a full disk). The daemon
// comes watched until released (StartedDaemon): a caller that does not wait for it to be ready
// lets the result go at once.
StatusOr<StartedDaemon> StartDetached(const DaemonSpec& spec);

// A daemon as its pid file names it: a live process that runs a program of `binary`'s file name
// (llmctld, llm-agent), wherever that lies. nullopt otherwise, and for a pid file that is not a
// regular file (a FIFO is not waited on) or holds more than a pid.
struct RunningDaemon {
  pid_t pid = 0;
  // The program it runs: `binary` itself (also when rebuilt since it started), or, with
  // another_binary, another llmctl's (one upgraded or moved while its daemons ran).
  std::filesystem::path runs;
  bool another_binary = false;
  bool replaced = false;  // `runs` was rebuilt or replaced since it started (/proc's " (deleted)")
};
std::optional<RunningDaemon> FindDaemon(const std::filesystem::path& pid_file,
                                        const std::filesystem::path& binary);

// The pid in `pid_file` when that process is alive and still runs `binary` itself (FindDaemon,
// not another_binary); nullopt otherwise.
std::optional<pid_t> RunningPid(const std::filesystem::path& pid_file,
                                const std::filesystem::path& binary);

// SIGTERM, then waits up to `grace` for the process to end (SIGKILL after that); its pid file is
// the caller's to remove. Returns true when it had to kill.
bool StopProcess(pid_t pid, std::chrono::milliseconds grace);

// The last `max_lines` lines of a log's last 64 KiB, of those from byte `from` on (what a daemon
// wrote since it started: StartedDaemon::log_start), for messages when a daemon dies at start; ""
// when the log is missing or not a regular file.
std::string LogTail(const std::filesystem::path& log_file, size_t max_lines, off_t from = 0);

// True while `pid` exists and is not a zombie waiting for its parent.
bool ProcessAlive(pid_t pid);

// Writes `text` to `path` whole (beside it, then renamed into place) with `mode`, and returns the
// file's error (common/files.h's), except that one of the kind "try again" is FailedPrecondition:
// a file's error is this machine's, never the controller's, whose Unavailable would have llmctl
// ask whether the controller is running.
Status WriteTextFile(const std::filesystem::path& path, const std::string& text, mode_t mode);

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_DAEMON_PROCESS_H_
