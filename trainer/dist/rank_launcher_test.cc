#include "trainer/dist/rank_launcher.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

namespace llmctl::dist {
namespace {

namespace fs = std::filesystem;

class LauncherTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("llmctl_launcher_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    // A test that failed half-way leaves no launcher behind (its ranks die with it).
    if (child_ > 0) {
      ::kill(child_, SIGKILL);
      WaitForChild();
    }
    fs::remove_all(dir_);
  }

  // `nproc` ranks that are /bin/sh running `script`; each first writes its pid to DIR/rankN.pid
  // (N its global rank).
  LaunchSpec Shell(const std::string& script, int nproc) const {
    LaunchSpec spec;
    spec.argv = {"/bin/sh", "-c", "echo $$ > " + dir_.string() + "/rank$RANK.pid; " + script};
    spec.nproc_per_node = nproc;
    spec.master_port = 29555;
    return spec;
  }

  // Shell code that waits until ranks first..first+count-1 have all written their pid files, so a
  // rank that then fails cannot get the others stopped before they have recorded who they are.
  std::string AwaitPids(int count, int first = 0) const {
    return "for r in $(seq " + std::to_string(first) + " " + std::to_string(first + count - 1) +
           "); do while [ ! -s " + dir_.string() + "/rank$r.pid ]; do sleep 0.01; done; done; ";
  }

  // Shell code that waits until DIR/`name` exists.
  std::string AwaitFile(const std::string& name) const {
    return "while [ ! -e " + (dir_ / name).string() + " ]; do sleep 0.01; done; ";
  }

  // Launch(spec) in a child process, as another host's launcher would run it; its exit code is 0
  // when the launch succeeded.
  pid_t LaunchInChild(const LaunchSpec& spec) {
    const pid_t pid = ::fork();
    if (pid == 0) ::_exit(Launch(spec).status.ok() ? 0 : 1);
    child_ = pid;
    return pid;
  }

  // The child's exit code, once it has ended; -1 when it did not exit.
  int WaitForChild() {
    int status = 0;
    const pid_t done = ::waitpid(child_, &status, 0);
    child_ = -1;
    return done > 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  pid_t PidOf(int rank) const {
    std::ifstream in(dir_ / ("rank" + std::to_string(rank) + ".pid"));
    pid_t pid = -1;
    in >> pid;
    return pid;
  }

  std::string Read(const std::string& name) const {
    std::ifstream in(dir_ / name);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  fs::path dir_;
  pid_t child_ = -1;
};

TEST_F(LauncherTest, EveryRankGetsTorchrunsVariables) {
  const Status launched = LaunchRanks(
      Shell("echo $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT > " +
                dir_.string() + "/env$RANK",
            3));
  ASSERT_TRUE(launched.ok()) << launched.ToString();
  EXPECT_EQ(Read("env0"), "0 0 3 3 127.0.0.1 29555\n");
  EXPECT_EQ(Read("env1"), "1 1 3 3 127.0.0.1 29555\n");
  EXPECT_EQ(Read("env2"), "2 2 3 3 127.0.0.1 29555\n");
}

// Without OMP_NUM_THREADS each rank gets a share of this process's CPUs (at least one), so N
// ranks do not start N times as many threads as there are CPUs; a value the user set is kept.
TEST_F(LauncherTest, RanksShareTheCpusUnlessOmpNumThreadsIsSet) {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(cpus), &cpus), 0);
  const int share = std::max(1, CPU_COUNT(&cpus) / 2);
  const char* saved = std::getenv("OMP_NUM_THREADS");
  const std::string restore = saved != nullptr ? saved : "";
  ::unsetenv("OMP_NUM_THREADS");
  Status launched =
      LaunchRanks(Shell("echo $OMP_NUM_THREADS > " + dir_.string() + "/threads$RANK", 2));
  ASSERT_TRUE(launched.ok()) << launched.ToString();
  EXPECT_EQ(Read("threads0"), std::to_string(share) + "\n");
  EXPECT_EQ(Read("threads1"), std::to_string(share) + "\n");

  ::setenv("OMP_NUM_THREADS", "5", 1);
  launched = LaunchRanks(Shell("echo $OMP_NUM_THREADS > " + dir_.string() + "/threads$RANK", 2));
  if (saved != nullptr) {
    ::setenv("OMP_NUM_THREADS", restore.c_str(), 1);
  } else {
    ::unsetenv("OMP_NUM_THREADS");
  }
  ASSERT_TRUE(launched.ok()) << launched.ToString();
  EXPECT_EQ(Read("threads0"), "5\n");
  EXPECT_EQ(Read("threads1"), "5\n");
}

TEST_F(LauncherTest, ARankThatExitsEarlyStopsTheOthersAndIsNamed) {
  // Rank 1 fails once all have started; ranks 0 and 2 would sleep for ten minutes (exec: the rank
  // is the sleep).
  const Status launched = LaunchRanks(
      Shell("if [ \"$RANK\" = 1 ]; then " + AwaitPids(3) + "exit 7; fi; exec sleep 600", 3));
  ASSERT_FALSE(launched.ok());
  EXPECT_EQ(launched.code(), StatusCode::kAborted);
  EXPECT_EQ(launched.message(), "rank 1 of 3 exited with code 7; the other ranks were stopped");
  // Every rank is gone and reaped: no process, not even a zombie, has its pid.
  for (int rank : {0, 1, 2}) {
    const pid_t pid = PidOf(rank);
    ASSERT_GT(pid, 0) << "rank " << rank;
    EXPECT_EQ(::kill(pid, 0), -1) << "rank " << rank << " (pid " << pid << ") is still there";
    EXPECT_EQ(errno, ESRCH);
  }
}

// The error carries the failed rank's reason, its last line on stderr that is not blank, on one
// line; everything each rank wrote still reaches the launcher's stderr.
TEST_F(LauncherTest, AFailedRanksLastErrorLineIsItsReason) {
  const std::string launcher_stderr = (dir_ / "launcher.stderr").string();
  const int saved_stderr = ::dup(2);
  ASSERT_GE(saved_stderr, 0);
  const int file = ::open(launcher_stderr.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(file, 0);
  ASSERT_EQ(::dup2(file, 2), 2);
  ::close(file);
  const Status launched = LaunchRanks(
      Shell("if [ \"$RANK\" = 1 ]; then " + AwaitFile("started0") +
                "echo 'step 3' >&2; printf 'llm-train: data.bin shrank\\033[2J while read\\n  \\n' "
                ">&2; exit 6; fi; echo 'rank 0 started' >&2; touch " +
                dir_.string() + "/started0; exec sleep 600",
            2));
  ::dup2(saved_stderr, 2);
  ::close(saved_stderr);
  ASSERT_FALSE(launched.ok());
  EXPECT_EQ(launched.message(),
            "rank 1 of 2 exited with code 6: llm-train: data.bin shrank [2J while read; the other "
            "ranks were stopped");
  const std::string passed_on = Read("launcher.stderr");
  EXPECT_NE(passed_on.find("rank 0 started\n"), std::string::npos) << passed_on;
  EXPECT_NE(passed_on.find("step 3\nllm-train: data.bin shrank\033[2J while read\n  \n"),
            std::string::npos)
      << passed_on;
}

// The launcher keeps the last 64 KiB of a rank's stderr and quotes 400 bytes of the last line in it
// that is not blank, as the agent does of a run's stderr: a line of 5,000 bytes is quoted from its
// start (as when the launcher kept each line's first 4,096 bytes); one of 100,000 from 64 KiB
// before its end, where the launcher quoted its start.
TEST_F(LauncherTest, ARanksReasonIsTheLastLineOfItsLast64KiBOfStderr) {
  const auto launch_with_stderr = [&](const std::string& script) {
    const int saved_stderr = ::dup(2);
    const int file =
        ::open((dir_ / "launcher.stderr").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ::dup2(file, 2);
    ::close(file);
    const Status launched = LaunchRanks(Shell(script + "; exit 6", 1));
    ::dup2(saved_stderr, 2);
    ::close(saved_stderr);
    return std::string(launched.message());
  };
  const std::string words = "rank 0 of 1 exited with code 6: ";
  const std::string stopped = "; the other ranks were stopped";
  EXPECT_EQ(launch_with_stderr("echo before >&2; printf 'llm-train: reason ' >&2; "
                               "head -c 5000 /dev/zero | tr '\\0' a >&2; echo >&2"),
            words + "llm-train: reason " + std::string(379, 'a') + "…" + stopped);
  EXPECT_EQ(launch_with_stderr("printf 'llm-train: reason ' >&2; "
                               "head -c 100000 /dev/zero | tr '\\0' a >&2; echo >&2"),
            words + std::string(397, 'a') + "…" + stopped);
}

// A launcher whose stderr nobody reads any more (`llm-train ... 2>&1 | head -1` once head has
// ended) loses what its ranks write there, not the run: passing their lines on raised SIGPIPE,
// which killed it and, with it, its ranks. The ranks still start with the launcher's SIGPIPE (here
// the default), not ignored, and the launcher has it back when Launch returns.
TEST_F(LauncherTest, AStderrNobodyReadsLosesTheRanksLinesNotTheRun) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ::close(pipe_fds[0]);
  const LaunchSpec spec = Shell("grep SigIgn /proc/$$/status > " + dir_.string() +
                                    "/sigign$RANK; echo \"rank $RANK's line\" >&2; touch " +
                                    dir_.string() + "/done$RANK",
                                2);
  child_ = ::fork();
  if (child_ == 0) {
    ::signal(SIGPIPE, SIG_DFL);
    if (::dup2(pipe_fds[1], 2) != 2) ::_exit(2);
    const bool launched = Launch(spec).status.ok();
    struct sigaction after {};
    ::sigaction(SIGPIPE, nullptr, &after);
    ::_exit(!launched ? 1 : after.sa_handler != SIG_DFL ? 3 : 0);
  }
  ::close(pipe_fds[1]);
  ASSERT_GT(child_, 0);
  // -1: killed (by SIGPIPE); 1: the launch failed; 3: SIGPIPE not restored.
  EXPECT_EQ(WaitForChild(), 0);
  for (const std::string rank : {"0", "1"}) {
    EXPECT_TRUE(fs::exists(dir_ / ("done" + rank))) << "rank " << rank;
    const std::string ignored = Read("sigign" + rank);
    ASSERT_TRUE(ignored.starts_with("SigIgn:")) << ignored;
    EXPECT_EQ((std::stoull(ignored.substr(7), nullptr, 16) >> (SIGPIPE - 1)) & 1, 0u)
        << "rank " << rank << " ignores SIGPIPE: " << ignored;
  }
}

TEST_F(LauncherTest, ARankKilledByASignalIsNamed) {
  const Status launched = LaunchRanks(
      Shell("if [ \"$RANK\" = 0 ]; then " + AwaitPids(2) + "kill -9 $$; fi; exec sleep 600", 2));
  ASSERT_FALSE(launched.ok());
  EXPECT_EQ(launched.message(),
            "rank 0 of 2 was killed by SIGKILL (Killed); the other ranks were stopped");
  ASSERT_GT(PidOf(1), 0);
  EXPECT_EQ(::kill(PidOf(1), 0), -1);
}

TEST_F(LauncherTest, ARankThatIgnoresSigtermIsKilled) {
  // Rank 0 ignores SIGTERM before rank 1 fails, so only the SIGKILL after stop_grace ends it.
  const std::string trapped = (dir_ / "trapped").string();
  LaunchSpec spec = Shell("if [ \"$RANK\" = 1 ]; then " + AwaitPids(2) + "while [ ! -e " + trapped +
                              " ]; do sleep 0.01; done; exit 3; fi; trap '' TERM; touch " +
                              trapped + "; while :; do :; done",
                          2);
  spec.stop_grace = std::chrono::milliseconds(200);
  const Status launched = LaunchRanks(spec);
  ASSERT_FALSE(launched.ok());
  EXPECT_EQ(launched.message(), "rank 1 of 2 exited with code 3; the other ranks were stopped");
  ASSERT_GT(PidOf(0), 0);
  EXPECT_EQ(::kill(PidOf(0), 0), -1);
}

TEST_F(LauncherTest, AProgramThatCannotRunIsNamed) {
  LaunchSpec spec;
  spec.argv = {(dir_ / "no-such-program").string()};
  spec.nproc_per_node = 2;
  const Status launched = LaunchRanks(spec);
  ASSERT_FALSE(launched.ok());
  EXPECT_NE(launched.message().find("could not execute its program (exit code 127): cannot "
                                    "execute the rank's program: "),
            std::string::npos)
      << launched.message();
}

TEST_F(LauncherTest, PortZeroHandsRankZeroAListeningSocketOnAFreePort) {
  LaunchSpec spec = Shell(
      "echo $MASTER_PORT \"${LLMCTL_MASTER_LISTEN_FD:-none}\" > " + dir_.string() + "/env$RANK", 2);
  spec.master_port = 0;
  spec.status_file = (dir_ / "ranks.json").string();
  const LaunchResult launched = Launch(spec);
  ASSERT_TRUE(launched.status.ok()) << launched.status.ToString();
  EXPECT_FALSE(launched.first_failure.has_value());
  std::istringstream rank0(Read("env0"));
  std::istringstream rank1(Read("env1"));
  int port0 = 0, port1 = 0;
  std::string fd0, fd1;
  rank0 >> port0 >> fd0;
  rank1 >> port1 >> fd1;
  EXPECT_GT(port0, 0);
  EXPECT_EQ(port0, port1);
  // Only rank 0 holds the socket; the others do not have the variable.
  EXPECT_NE(fd0, "none");
  EXPECT_EQ(fd1, "none");
  const std::string record = Read("ranks.json");
  EXPECT_NE(record.find("\"world_size\":2,\"master_port\":" + std::to_string(port0)),
            std::string::npos)
      << record;
  EXPECT_EQ(record.find("first_failure"), std::string::npos) << record;
}

TEST_F(LauncherTest, TheFirstFailureIsRecordedInTheStatusFile) {
  LaunchSpec spec =
      Shell("if [ \"$RANK\" = 1 ]; then " + AwaitPids(2) + "kill -9 $$; fi; exec sleep 600", 2);
  spec.status_file = (dir_ / "ranks.json").string();
  const LaunchResult launched = Launch(spec);
  ASSERT_FALSE(launched.status.ok());
  ASSERT_TRUE(launched.first_failure.has_value());
  EXPECT_EQ(launched.first_failure->rank, 1);
  EXPECT_EQ(launched.first_failure->signal, SIGKILL);
  const std::string record = Read("ranks.json");
  EXPECT_NE(
      record.find("\"pids\":[" + std::to_string(PidOf(0)) + "," + std::to_string(PidOf(1)) + "]"),
      std::string::npos)
      << record;
  EXPECT_NE(record.find("\"first_failure\":{\"rank\":1,\"signal\":9}"), std::string::npos)
      << record;
}

// Two launchers as the two nodes of a 2 x 2 job on loopback: node rank 0 picks the port and records
// it, node rank 1 is started with it, and every rank is told its global place. Node rank 0's ranks
// wait for node rank 1's, so the two nodes' ranks run at the same time, as a job's must.
TEST_F(LauncherTest, TwoNodesRunOneJobsRanks) {
  const std::string script =
      "echo $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR " +
      std::string("$MASTER_PORT \"${LLMCTL_MASTER_LISTEN_FD:-none}\" > ") + dir_.string() +
      "/env$RANK.tmp; mv " + dir_.string() + "/env$RANK.tmp " + dir_.string() + "/env$RANK; " +
      "if [ $RANK -lt 2 ]; then " + AwaitFile("env2") + AwaitFile("env3") + "fi";
  LaunchSpec node0 = Shell(script, 2);
  node0.nnodes = 2;
  node0.node_rank = 0;
  node0.master_port = 0;
  node0.status_file = (dir_ / "ranks0.json").string();
  LaunchInChild(node0);
  // The port, once node rank 0's launcher has recorded it (the file appears whole: atomically).
  int port = 0;
  while (port == 0) {
    if (::waitpid(child_, nullptr, WNOHANG) != 0) {
      child_ = -1;
      FAIL() << "node rank 0's launcher ended before it recorded the port";
    }
    const std::string text = Read("ranks0.json");
    if (!text.empty()) port = nlohmann::json::parse(text).at("master_port").get<int>();
    if (port == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  LaunchSpec node1 = Shell(script, 2);
  node1.nnodes = 2;
  node1.node_rank = 1;
  node1.master_port = static_cast<uint16_t>(port);
  node1.status_file = (dir_ / "ranks1.json").string();
  const LaunchResult launched = Launch(node1);
  ASSERT_TRUE(launched.status.ok()) << launched.status.ToString();
  ASSERT_EQ(WaitForChild(), 0);

  const std::string at = " 127.0.0.1 " + std::to_string(port) + " ";
  EXPECT_EQ(Read("env2"), "2 0 4 2" + at + "none\n");
  EXPECT_EQ(Read("env3"), "3 1 4 2" + at + "none\n");
  EXPECT_EQ(Read("env1"), "1 1 4 2" + at + "none\n");
  // Only global rank 0 holds the listening socket.
  const std::string env0 = Read("env0");
  EXPECT_TRUE(env0.starts_with("0 0 4 2" + at)) << env0;
  EXPECT_FALSE(env0.ends_with(" none\n")) << env0;
  for (int node : {0, 1}) {
    const nlohmann::json record =
        nlohmann::json::parse(Read("ranks" + std::to_string(node) + ".json"));
    EXPECT_EQ(record["world_size"], 4);
    EXPECT_EQ(record["master_port"], port);
    EXPECT_EQ(record["nnodes"], 2);
    EXPECT_EQ(record["node_rank"], node);
    EXPECT_EQ(record["nproc_per_node"], 2);
    EXPECT_EQ(record["pids"], nlohmann::json({PidOf(2 * node), PidOf(2 * node + 1)}));
    EXPECT_FALSE(record.contains("first_failure"));
  }
}

// The CPU share counts this host's ranks only: one rank per node gets all of this one's CPUs.
TEST_F(LauncherTest, TheCpuShareCountsThisNodesRanksOnly) {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(cpus), &cpus), 0);
  const char* saved = std::getenv("OMP_NUM_THREADS");
  const std::string restore = saved != nullptr ? saved : "";
  ::unsetenv("OMP_NUM_THREADS");
  LaunchSpec spec = Shell("echo $OMP_NUM_THREADS > " + dir_.string() + "/threads$RANK", 1);
  spec.nnodes = 2;
  spec.node_rank = 1;
  const Status launched = LaunchRanks(spec);
  if (saved != nullptr) ::setenv("OMP_NUM_THREADS", restore.c_str(), 1);
  ASSERT_TRUE(launched.ok()) << launched.ToString();
  EXPECT_EQ(Read("threads1"), std::to_string(CPU_COUNT(&cpus)) + "\n");
}

TEST_F(LauncherTest, ANodeAboveRankZeroNeedsThePort) {
  LaunchSpec spec = Shell("touch " + dir_.string() + "/ran", 1);
  spec.nnodes = 2;
  spec.node_rank = 1;
  spec.master_port = 0;
  const Status launched = LaunchRanks(spec);
  EXPECT_EQ(launched.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(launched.message().find("node rank 0 only"), std::string::npos) << launched.message();
  EXPECT_FALSE(fs::exists(dir_ / "ran"));

  spec.master_port = 29555;
  spec.node_rank = 2;
  EXPECT_EQ(LaunchRanks(spec).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(dir_ / "ran"));
}

// Node rank 1 of a 2 x 2 job holds ranks 2 and 3: its failed local rank 1 is rank 3 of 4, in the
// error and in the ranks file (the agent reports it as the job's).
TEST_F(LauncherTest, AFailureOnANodeNamesItsGlobalRank) {
  LaunchSpec spec = Shell(
      "if [ \"$LOCAL_RANK\" = 1 ]; then " + AwaitPids(2, 2) + "exit 7; fi; exec sleep 600", 2);
  spec.nnodes = 2;
  spec.node_rank = 1;
  spec.status_file = (dir_ / "ranks.json").string();
  const LaunchResult launched = Launch(spec);
  ASSERT_FALSE(launched.status.ok());
  EXPECT_EQ(launched.status.message(),
            "rank 3 of 4 exited with code 7; the other ranks were stopped");
  ASSERT_TRUE(launched.first_failure.has_value());
  EXPECT_EQ(launched.first_failure->rank, 3);
  const nlohmann::json record = nlohmann::json::parse(Read("ranks.json"));
  EXPECT_EQ(record["first_failure"], nlohmann::json({{"rank", 3}, {"exit_code", 7}}));
  EXPECT_EQ(record["pids"], nlohmann::json({PidOf(2), PidOf(3)}));
  EXPECT_EQ(::kill(PidOf(2), 0), -1);
}

TEST_F(LauncherTest, SigtermToTheLauncherReachesEveryRank) {
  // Each rank records SIGTERM and exits 5, as llm-train does when it is stopped; rank 0 sends
  // SIGTERM to the launcher alone once both have set their trap.
  const std::string script =
      "trap 'touch " + dir_.string() + "/term$RANK; exit 5' TERM; touch " + dir_.string() +
      "/trap$RANK; if [ \"$RANK\" = 0 ]; then while [ ! -e " + dir_.string() +
      "/trap1 ]; do sleep 0.01; done; kill -TERM $PPID; fi; while :; do sleep 0.05; done";
  LaunchSpec spec = Shell(script, 2);
  const LaunchResult launched = Launch(spec);
  ASSERT_FALSE(launched.status.ok());
  ASSERT_TRUE(launched.first_failure.has_value());
  EXPECT_EQ(launched.first_failure->exit_code, 5);
  EXPECT_TRUE(fs::exists(dir_ / "term0"));
  EXPECT_TRUE(fs::exists(dir_ / "term1"));
}

}  // namespace
}  // namespace llmctl::dist
