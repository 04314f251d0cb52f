// StartChild against real programs: sh for argv, the environment and descriptors, grep of
// /proc/self/status for signals, and child_process_report (beside this test) for the parent-death
// signal, which /proc does not show.
#include "common/child_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "common/unique_fd.h"

namespace llmctl {
namespace {

namespace fs = std::filesystem;

struct TestPipe {
  UniqueFd read;
  UniqueFd write;
};

TestPipe MakePipe() {
  int fds[2];
  EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0) << std::strerror(errno);
  return TestPipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

// Everything `fd` gives until its end.
std::string ReadAll(const UniqueFd& fd) {
  std::string text;
  char buffer[4096];
  ssize_t got = 0;
  while ((got = ::read(fd.get(), buffer, sizeof(buffer))) != 0) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) break;
    text.append(buffer, static_cast<size_t>(got));
  }
  return text;
}

// `pid`'s wait status once it has ended.
int Reap(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

// Runs sh -c `script` with standard output on a pipe (and `spec`'s other settings), and returns
// what it printed; the child reaped, its exit status in `status`.
std::string RunShell(ChildSpec spec, const std::string& script, int* status = nullptr) {
  TestPipe out = MakePipe();
  spec.program = "/bin/sh";
  spec.argv = {"sh", "-c", script};
  spec.stdout_fd = out.write.get();
  const StatusOr<pid_t> pid = StartChild(spec);
  EXPECT_TRUE(pid.ok()) << pid.status().ToString();
  if (!pid.ok()) return "";
  out.write.reset();
  std::string text = ReadAll(out.read);
  const int ended = Reap(*pid);
  if (status != nullptr) *status = ended;
  return text;
}

// True once `pid` has ended: no such process, or a zombie.
bool ProcessEnded(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  const size_t name_end = text.rfind(')');
  return name_end == std::string::npos || text.substr(name_end + 2, 1) == "Z";
}

// Waits up to 10 s for `pid` to end; kills it (SIGKILL) when it has not, so that no test leaves it
// running. Whether it ended by itself.
bool AwaitEnd(pid_t pid) {
  for (int tries = 0; tries < 1000; ++tries) {
    if (ProcessEnded(pid)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  return false;
}

TEST(ChildProcessTest, AProgramThatCannotBeExecutedReturnsExecsErrno) {
  ChildSpec spec;
  spec.argv = {"/no/such/program"};
  const StatusOr<pid_t> missing = StartChild(spec);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), std::strerror(ENOENT));

  const fs::path not_executable = fs::temp_directory_path() / "not-executable";
  std::ofstream(not_executable) << "#!/bin/sh\n";
  fs::permissions(not_executable, fs::perms::owner_read | fs::perms::owner_write);
  spec.argv = {not_executable.string()};
  EXPECT_EQ(StartChild(spec).status().message(), std::strerror(EACCES));
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1) << "a child was left unreaped";
  EXPECT_EQ(errno, ECHILD);
}

// kStderrAndExitCode: the pid comes back, and the reason is the child's standard error and exit
// code.
TEST(ChildProcessTest, AnExecFailureCanBeTheChildsStderrAndExitCode) {
  TestPipe err = MakePipe();
  ChildSpec spec;
  spec.argv = {"/no/such/program"};
  spec.stderr_fd = err.write.get();
  spec.exec_failure = ExecFailureReport::kStderrAndExitCode;
  spec.exec_failure_message = "cannot execute: ";
  const StatusOr<pid_t> pid = StartChild(spec);
  ASSERT_TRUE(pid.ok()) << pid.status().ToString();
  err.write.reset();
  EXPECT_EQ(ReadAll(err.read),
            std::string("cannot execute: ").append(std::strerror(ENOENT)) + "\n");
  const int status = Reap(*pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 127);
}

TEST(ChildProcessTest, ArgvEnvironmentAndStandardDescriptorsReachTheProgram) {
  TestPipe in = MakePipe();
  TestPipe err = MakePipe();
  ASSERT_EQ(::write(in.write.get(), "from stdin\n", 11), 11);
  in.write.reset();
  ASSERT_EQ(::setenv("CHILD_PROCESS_TEST_PARENTS", "parent's", 1), 0);
  ChildSpec spec;
  spec.envp = std::vector<std::string>{"GREETING=hello"};
  spec.stdin_fd = in.read.get();
  spec.stderr_fd = err.write.get();
  const std::string said =
      RunShell(spec,
               "printf '%s|%s|%s\\n' \"$0\" \"$GREETING\" \"$CHILD_PROCESS_TEST_PARENTS\"; "
               "read line; echo \"$line\"; echo to stderr >&2");
  err.write.reset();
  EXPECT_EQ(said, "sh|hello|\nfrom stdin\n");
  EXPECT_EQ(ReadAll(err.read), "to stderr\n");

  // Without envp, this process's environment.
  EXPECT_EQ(RunShell(ChildSpec(), "echo \"$CHILD_PROCESS_TEST_PARENTS\""), "parent's\n");
  ::unsetenv("CHILD_PROCESS_TEST_PARENTS");
}

// A parent whose standard input was closed gets a pipe there: the program's standard output on
// descriptor 0 reaches it though its standard input is placed on 0 as well. Run in a forked
// process, whose descriptor 0 the test may take.
TEST(ChildProcessTest, AStandardDescriptorsSourceBelow3IsNotOverwritten) {
  const pid_t parent = ::fork();
  ASSERT_GE(parent, 0);
  if (parent == 0) {
    TestPipe out = MakePipe();
    UniqueFd null_device(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (::dup3(out.write.get(), 0, O_CLOEXEC) != 0 || !null_device.valid()) ::_exit(2);
    out.write.reset();
    ChildSpec spec;
    spec.argv = {"/bin/echo", "reached"};
    spec.stdin_fd = null_device.get();
    spec.stdout_fd = 0;
    const StatusOr<pid_t> pid = StartChild(spec);
    if (!pid.ok()) ::_exit(3);
    ::close(0);
    const std::string said = ReadAll(out.read);
    Reap(*pid);
    ::_exit(said == "reached\n" ? 0 : 1);
  }
  const int status = Reap(parent);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the output did not come through its pipe";
}

// A descriptor named in inherited_fds stays open across exec; another close-on-exec one closes.
TEST(ChildProcessTest, OnlyTheInheritedCloseOnExecDescriptorsStayOpen) {
  TestPipe kept = MakePipe();
  TestPipe closed = MakePipe();
  ChildSpec spec;
  spec.inherited_fds = {kept.write.get()};
  const std::string script = "for fd in " + std::to_string(kept.write.get()) + " " +
                             std::to_string(closed.write.get()) +
                             "; do if [ -e /proc/self/fd/$fd ]; then echo open; else echo closed; "
                             "fi; done";
  EXPECT_EQ(RunShell(spec, script), "open\nclosed\n");
  int flags = ::fcntl(kept.write.get(), F_GETFD);
  EXPECT_TRUE(flags & FD_CLOEXEC) << "the parent's descriptor changed";
}

TEST(ChildProcessTest, AProcessGroupOfItsOwnWhenAsked) {
  for (const bool own : {false, true}) {
    TestPipe in = MakePipe();
    ChildSpec spec;
    spec.argv = {"/bin/cat"};
    spec.stdin_fd = in.read.get();
    spec.own_process_group = own;
    const StatusOr<pid_t> pid = StartChild(spec);
    ASSERT_TRUE(pid.ok()) << pid.status().ToString();
    // After exec (StartChild returned): the group is the one the program runs in.
    EXPECT_EQ(::getpgid(*pid), own ? *pid : ::getpgrp()) << "own " << own;
    in.write.reset();  // cat ends
    Reap(*pid);
  }
}

// A session of its own: the program leads it and its group, and what it starts stays in it.
TEST(ChildProcessTest, ASessionOfItsOwnWhenAsked) {
  TestPipe in = MakePipe();
  ChildSpec spec;
  spec.argv = {"/bin/cat"};
  spec.stdin_fd = in.read.get();
  spec.own_session = true;
  const StatusOr<pid_t> pid = StartChild(spec);
  ASSERT_TRUE(pid.ok()) << pid.status().ToString();
  EXPECT_EQ(::getsid(*pid), *pid);
  EXPECT_EQ(::getpgid(*pid), *pid);
  in.write.reset();  // cat ends
  Reap(*pid);
  // What it starts stays in its session: sh's pid, then the session of the cut it runs.
  ChildSpec shell;
  shell.own_session = true;
  const std::string ids = RunShell(shell, "echo $$; cut -d' ' -f6 /proc/self/stat");
  const size_t newline = ids.find('\n');
  ASSERT_NE(newline, std::string::npos) << ids;
  EXPECT_EQ(ids.substr(newline + 1), ids.substr(0, newline + 1));
}

// Bits `signal` - 1 of a /proc/<pid>/status mask line ("SigBlk:\t0000000000004000").
uint64_t MaskLine(const std::string& status, const std::string& label) {
  const size_t at = status.find(label);
  if (at == std::string::npos) return ~uint64_t{0};
  return std::stoull(status.substr(at + label.size()), nullptr, 16);
}

uint64_t Bit(int signal) { return uint64_t{1} << (signal - 1); }

// The calling thread blocks SIGTERM and the process ignores SIGHUP and SIGINT: asked for, the
// program starts with none blocked and SIGHUP at its default; otherwise with both as they were.
TEST(ChildProcessTest, SignalsStartAtTheirDefaultAndUnblockedWhenAsked) {
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  sigset_t mask_before;
  ASSERT_EQ(::pthread_sigmask(SIG_BLOCK, &term, &mask_before), 0);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  struct sigaction hup_before {
  }, int_before{};
  ASSERT_EQ(::sigaction(SIGHUP, &ignore, &hup_before), 0);
  ASSERT_EQ(::sigaction(SIGINT, &ignore, &int_before), 0);
  const std::string script = "exec grep -E '^Sig(Blk|Ign):' /proc/self/status";
  const std::string kept = RunShell(ChildSpec(), script);
  ChildSpec reset;
  reset.default_signals = {SIGHUP};
  reset.clear_signal_mask = true;
  const std::string cleared = RunShell(reset, script);
  ::sigaction(SIGINT, &int_before, nullptr);
  ::sigaction(SIGHUP, &hup_before, nullptr);
  ::pthread_sigmask(SIG_SETMASK, &mask_before, nullptr);

  EXPECT_TRUE(MaskLine(kept, "SigBlk:") & Bit(SIGTERM)) << kept;
  EXPECT_TRUE(MaskLine(kept, "SigIgn:") & Bit(SIGHUP)) << kept;
  EXPECT_EQ(MaskLine(cleared, "SigBlk:"), 0u) << cleared;
  EXPECT_FALSE(MaskLine(cleared, "SigIgn:") & Bit(SIGHUP)) << cleared;
  EXPECT_TRUE(MaskLine(cleared, "SigIgn:") & Bit(SIGINT)) << "not asked for: " << cleared;
}

TEST(ChildProcessTest, TheProgramGetsSigkillWhenItsParentDies) {
  const fs::path report = fs::read_symlink("/proc/self/exe").parent_path() / "child_process_report";
  TestPipe out = MakePipe();
  ChildSpec spec;
  spec.argv = {report.string()};
  spec.stdout_fd = out.write.get();
  const StatusOr<pid_t> pid = StartChild(spec);
  ASSERT_TRUE(pid.ok()) << report << ": " << pid.status().ToString();
  out.write.reset();
  EXPECT_EQ(ReadAll(out.read), std::to_string(SIGKILL) + "\n");
  Reap(*pid);
}

TEST(ChildProcessTest, TheTieSendsTheSignalAskedFor) {
  const fs::path report = fs::read_symlink("/proc/self/exe").parent_path() / "child_process_report";
  TestPipe out = MakePipe();
  ChildSpec spec;
  spec.argv = {report.string()};
  spec.stdout_fd = out.write.get();
  spec.parent_death_signal = SIGTERM;
  const StatusOr<pid_t> pid = StartChild(spec);
  ASSERT_TRUE(pid.ok()) << report << ": " << pid.status().ToString();
  out.write.reset();
  EXPECT_EQ(ReadAll(out.read), std::to_string(SIGTERM) + "\n");
  Reap(*pid);
}

// A parent killed with SIGKILL takes its child along.
TEST(ChildProcessTest, TheChildEndsWithItsKilledParent) {
  TestPipe told = MakePipe();
  const pid_t parent = ::fork();
  ASSERT_GE(parent, 0);
  if (parent == 0) {
    ChildSpec spec;
    spec.argv = {"/bin/sleep", "600"};
    const StatusOr<pid_t> child = StartChild(spec);
    const pid_t pid = child.ok() ? *child : -1;
    (void)!::write(told.write.get(), &pid, sizeof(pid));
    ::pause();  // until killed
    ::_exit(0);
  }
  told.write.reset();
  pid_t child = -1;
  ASSERT_EQ(::read(told.read.get(), &child, sizeof(child)), static_cast<ssize_t>(sizeof(child)));
  ::kill(parent, SIGKILL);
  Reap(parent);
  ASSERT_GT(child, 0) << "the parent could not start its child";
  EXPECT_TRUE(AwaitEnd(child)) << "the child (pid " << child << ") outlived its parent";
}

// Untied, the child lives on: cat, started by a parent since SIGKILLed and reaped, still echoes
// what it reads. Once the parent is reaped a tie's SIGKILL has been sent (the kernel signals the
// children before the parent becomes a zombie), and it would end cat before it wrote a byte.
TEST(ChildProcessTest, AnUntiedChildOutlivesItsKilledParent) {
  TestPipe in = MakePipe();
  TestPipe out = MakePipe();
  TestPipe told = MakePipe();
  const pid_t parent = ::fork();
  ASSERT_GE(parent, 0);
  if (parent == 0) {
    ChildSpec spec;
    spec.argv = {"/bin/cat"};
    spec.stdin_fd = in.read.get();
    spec.stdout_fd = out.write.get();
    spec.tie_to_parent = false;
    const char started = StartChild(spec).ok() ? 1 : 0;
    (void)!::write(told.write.get(), &started, 1);
    ::pause();  // until killed
    ::_exit(0);
  }
  out.write.reset();
  told.write.reset();
  char started = 0;
  ASSERT_EQ(::read(told.read.get(), &started, 1), 1);
  ::kill(parent, SIGKILL);
  Reap(parent);
  ASSERT_EQ(started, 1) << "the parent could not start its child";
  ASSERT_EQ(::write(in.write.get(), "alive\n", 6), 6);  // its read end held here: no SIGPIPE
  in.read.reset();
  in.write.reset();  // cat ends
  EXPECT_EQ(ReadAll(out.read), "alive\n") << "the child ended with its parent";
}

// The program runs in working_dir; one it cannot enter fails as exec would.
TEST(ChildProcessTest, TheProgramStartsInItsWorkingDirectory) {
  const fs::path dir =
      fs::temp_directory_path() / ("child-process-cwd-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  ChildSpec spec;
  spec.working_dir = dir.string();
  EXPECT_EQ(RunShell(spec, "pwd -P"), fs::canonical(dir).string() + "\n");
  fs::remove(dir);

  spec.argv = {"/bin/true"};
  const StatusOr<pid_t> refused = StartChild(spec);
  EXPECT_EQ(refused.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(refused.status().message(), std::strerror(ENOENT));
}

// The signal comes when the thread that started the child ends, though the process lives on:
// callers keep that thread until the child has been reaped.
TEST(ChildProcessTest, TheChildEndsWithTheThreadThatStartedIt) {
  StatusOr<pid_t> started = InternalError("not started");
  std::thread([&started] {
    ChildSpec spec;
    spec.argv = {"/bin/sleep", "600"};
    started = StartChild(spec);
  }).join();
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  EXPECT_TRUE(AwaitEnd(*started)) << "the child outlived the thread that started it";
  const int status = Reap(*started);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
}

}  // namespace
}  // namespace llmctl
