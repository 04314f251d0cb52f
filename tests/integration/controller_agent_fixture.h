// The fixture of the controller-with-real-agents tests (controller_agent_test.cc,
// multinode_test.cc): the controller in this process with its dispatcher's rounds run by hand on a
// manual clock, real llm-agent processes over mutual TLS on unix sockets, a real SQLite file, and
// a shell script standing in for llm-train (a test may point trainer_ at the real one before it
// adds agents).
#ifndef LLMCTL_TESTS_INTEGRATION_CONTROLLER_AGENT_FIXTURE_H_
#define LLMCTL_TESTS_INTEGRATION_CONTROLLER_AGENT_FIXTURE_H_

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "agent/stop_runs_test_support.h"
#include "common/child_process.h"
#include "common/files.h"
#include "common/unique_fd.h"
#include "controller/daemon.h"
#include "tests/support/shell_command.h"

extern char** environ;

namespace llmctl::controller::testing_support {

namespace fs = std::filesystem;
using llmctl::testing::BuildDir;
using std::chrono::milliseconds;
using std::chrono::seconds;

// Every run writes a start and two steps; seed 0 then finishes ok, 300 first waits for a file
// named `go` in its run directory, 109 kills itself with SIGKILL (as a user's kill -9 or the
// kernel's OOM killer does).
// Launched as ranks (--nproc N, a ddp trial), every line goes to each of its ranks' event files:
// global ranks node_rank x N .. + N - 1 (--nnodes, --node-rank: one node of a multi-node trial),
// rank 0's being --events' and rank g's events.rank<g>.jsonl, and the ranks file records a fake
// rendezvous port as llm-train's launcher does. Seed 110 makes node rank 1 run out of memory (its
// first rank's result says so, the ranks file names it, exit 3) while every other node's ranks
// wait to be stopped, as real ranks would wait in a collective. Seed 120 writes, before its ok
// result, four lines that break the event-line rule (a number for a type, an array, bad UTF-8, a
// line of 1,100,000 bytes). Its arguments go to argv.txt in the run directory.
constexpr char kFakeTrainer[] = R"sh(#!/bin/sh
config="$2"
events="$4"
seed=$(sed -n 's/^seed: *//p' "$config")
nproc=1; nnodes=1; node_rank=0; ranks_file=; prev=
for arg in "$@"; do
  case "$prev" in
    --nproc) nproc=$arg ;;
    --nnodes) nnodes=$arg ;;
    --node-rank) node_rank=$arg ;;
    --ranks-file) ranks_file=$arg ;;
  esac
  prev=$arg
done
[ -n "$events" ] && printf '%s\n' "$*" > "$(dirname "$events")/argv.txt"
first=$((node_rank * nproc))
world=$((nnodes * nproc))
[ -n "$ranks_file" ] && printf '{"world_size":%d,"master_port":29400,"pids":[%d],"nnodes":%d,"node_rank":%d,"nproc_per_node":%d}\n' \
  $world $$ $nnodes $node_rank $nproc > "$ranks_file"
rank_file() {
  if [ "$1" -eq 0 ]; then echo "$events"; else echo "${events%events.jsonl}events.rank$1.jsonl"; fi
}
emit() {
  r=$first
  while [ $r -lt $((first + nproc)) ]; do
    printf '%s\n' "$1" >> "$(rank_file $r)"
    r=$((r + 1))
  done
  return 0
}
emit '{"type":"start","total_steps":4}'
emit '{"type":"step","step":0,"loss":2.0}'
emit '{"type":"step","step":1,"loss":1.5}'
if [ "$seed" -eq 300 ]; then
  while [ ! -e go ]; do sleep 0.02; done
  emit '{"type":"step","step":2,"loss":1.25}'
fi
if [ "$seed" -eq 120 ]; then
  printf '%s\n' '{"type":1,"x":"result"}' '[1,2]' >> "$events"
  printf 'not json \377\n' >> "$events"
  head -c 1100000 /dev/zero | tr '\0' a >> "$events" && echo >> "$events"
fi
if [ "$seed" -eq 109 ]; then kill -9 $$; fi
if [ "$seed" -eq 110 ]; then
  if [ "$node_rank" -eq 1 ]; then
    printf '%s\n' '{"type":"result","outcome":"oom","error":"device_memory budget exceeded"}' >> "$(rank_file $first)"
    printf '{"world_size":%d,"master_port":29400,"pids":[%d],"first_failure":{"rank":%d,"exit_code":3}}\n' \
      $world $$ $first > "$ranks_file"
    exit 3
  fi
  while true; do sleep 0.02; done
fi
emit '{"type":"result","outcome":"ok","error":"","final_loss":1.0}'
exit 0
)sh";

inline void WriteFile(const fs::path& path, const std::string& text, fs::perms perms) {
  std::ofstream(path) << text;
  fs::permissions(path, perms);
}

inline std::string Experiment(const std::vector<std::pair<std::string, int>>& trials) {
  std::string yaml =
      "name: integration\nmodel: llmctl-demo\ntokenizer: tok.json\n"
      "data: {path: data/train.jsonl, max_seq_length: 64}\n"
      "train: {micro_batch_size: 2, max_steps: 2}\ntrials:\n";
  for (const auto& [name, seed] : trials) {
    // A trial named ddp-*: strategy ddp over 2 ranks; mn-*: over 2 nodes of 1 rank each.
    const std::string ranks =
        name.starts_with("ddp-")  ? ", strategy: ddp, devices: 2, train.global_batch_size: 4"
        : name.starts_with("mn-") ? ", strategy: ddp, nodes: 2, train.global_batch_size: 4"
                                  : "";
    yaml += "  - name: " + name + "\n    set: {seed: " + std::to_string(seed) + ranks + "}\n";
  }
  return yaml;
}

class ControllerAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Short: unix socket paths live under it (at most 107 characters).
    std::string pattern = (fs::temp_directory_path() / "llmctl_ca_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    agent_binary_ = (BuildDir() / "agent/llm-agent").string();
    ASSERT_TRUE(fs::exists(agent_binary_)) << agent_binary_ << " is built with this test";
    trainer_ = (dir_ / "fake-llm-train").string();
    WriteFile(trainer_, kFakeTrainer, fs::perms::owner_all);

    StartController();
  }

  // The controller in this process on the test's data directory: at SetUp, and again after a test
  // has dropped it (a restarted controller, with everything its store had committed).
  void StartController() {
    ControllerConfig config;
    config.data_dir = (dir_ / "controller").string();
    config.listen = "unix:" + (dir_ / "controller.sock").string();
    config.requeue_after = seconds(600);
    config.health_interval = seconds(5);
    config.agent_call_deadline = seconds(30);
    auto daemon = Daemon::Start(config, clock_, {.run_dispatcher = false});
    ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
    daemon_ = std::move(*daemon);
    controller_ = v1::Controller::NewStub(
        grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    daemon_.reset();
    for (auto& [node, pid] : agents_) Kill(node);
    StopRuns();
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // Stops the runs the agents left (agent/stop_runs_test_support.h): their workers outlive the
  // killed agents by design.
  void StopRuns() {
    std::error_code error;
    for (const fs::directory_entry& node : fs::directory_iterator(dir_, error)) {
      if (node.path().filename().string().ends_with("-data")) {
        agent::test_support::StopRuns(node.path());
      }
    }
  }

  // Registers the node with the controller and starts its llm-agent with the credentials;
  // `measure_rates`: the agent measures its node's rates (llm-train --probe), as outside tests.
  void AddAgent(const std::string& node, bool measure_rates = false) {
    grpc::ClientContext context;
    v1::RegisterNodeRequest request;
    request.set_name(node);
    request.set_address("unix:" + (dir_ / (node + ".sock")).string());
    v1::NodeCredentials credentials;
    ASSERT_TRUE(controller_->RegisterNode(&context, request, &credentials).ok());
    const fs::path etc = dir_ / (node + "-etc");
    fs::create_directories(etc);
    WriteFile(etc / "ca.pem", credentials.ca_certificate_pem(),
              fs::perms::owner_read | fs::perms::owner_write);
    WriteFile(etc / "agent.pem", credentials.certificate_pem(),
              fs::perms::owner_read | fs::perms::owner_write);
    WriteFile(etc / "agent.key", credentials.private_key_pem(),
              fs::perms::owner_read | fs::perms::owner_write);
    WriteFile(etc / "agent.token", credentials.token(),
              fs::perms::owner_read | fs::perms::owner_write);
    StartAgent(node, measure_rates);
  }

  void StartAgent(const std::string& node, bool measure_rates = false) {
    const fs::path etc = dir_ / (node + "-etc");
    const std::string socket = (dir_ / (node + ".sock")).string();
    fs::remove(socket);
    std::vector<std::string> args = {agent_binary_,
                                     "--listen",
                                     "unix:" + socket,
                                     "--data-dir",
                                     (dir_ / (node + "-data")).string(),
                                     "--node",
                                     node,
                                     "--ca",
                                     (etc / "ca.pem").string(),
                                     "--cert",
                                     (etc / "agent.pem").string(),
                                     "--key",
                                     (etc / "agent.key").string(),
                                     "--token-file",
                                     (etc / "agent.token").string(),
                                     "--llm-train",
                                     trainer_};
    // This process's environment with LLMCTL_RATE_PROBE=off, as ctest's has it, also when the test
    // binary runs on its own: these tests are about dispatch, and an agent measuring its node's
    // rates refuses trials meanwhile (about 12 s, longer on a busy machine, whose probe measures
    // again), which outlasted RoundsUntil's bound.
    std::vector<std::string> environment;
    if (!measure_rates) environment.emplace_back("LLMCTL_RATE_PROBE=off");
    for (char** variable = environ; *variable != nullptr; ++variable) {
      if (!std::string_view(*variable).starts_with("LLMCTL_RATE_PROBE=")) {
        environment.emplace_back(*variable);
      }
    }
    const pid_t pid =
        StartLogged(std::move(args), dir_ / (node + "-agent.log"), std::move(environment));
    ASSERT_GE(pid, 0);
    agents_[node] = pid;
    for (int i = 0; i < 1000 && !fs::exists(socket); ++i)
      std::this_thread::sleep_for(milliseconds(10));
    ASSERT_TRUE(fs::exists(socket)) << "llm-agent did not start; see " << node << "-agent.log";
  }

  // Starts the program argv[0] with `argv` through StartChild, as the product starts its children
  // (killed when this test's thread ends), its standard error appended to `log`, in `envp` (this
  // process's environment without it); -1 when it cannot be started. One that cannot be executed
  // exits 127, why in `log`.
  static pid_t StartLogged(std::vector<std::string> argv, const fs::path& log,
                           std::optional<std::vector<std::string>> envp = std::nullopt) {
    const UniqueFd err(open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    if (!err.valid()) return -1;
    ChildSpec spec;
    spec.program = argv[0];
    spec.argv = std::move(argv);
    spec.envp = std::move(envp);
    spec.stderr_fd = err.get();
    spec.exec_failure = ExecFailureReport::kStderrAndExitCode;
    spec.exec_failure_message = spec.program + ": ";
    const StatusOr<pid_t> pid = StartChild(spec);
    return pid.ok() ? *pid : -1;
  }

  void Kill(const std::string& node) {
    const pid_t pid = agents_.at(node);
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    agents_[node] = 0;
  }

  int64_t Submit(const std::string& yaml) {
    v1::SubmitRequest request;
    request.set_filename("integration.yaml");
    request.set_yaml_text(yaml);
    v1::SubmitResponse response;
    grpc::ClientContext context;
    grpc::Status status = controller_->Submit(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.experiment_id();
  }

  std::vector<store::TrialRecord> Trials(int64_t experiment) {
    auto trials = daemon_->store().ListTrials(experiment);
    EXPECT_TRUE(trials.ok());
    return trials.ok() ? *trials : std::vector<store::TrialRecord>{};
  }

  // Dispatcher rounds, each a health interval later, until `done`; bounded so that a bug fails the
  // test instead of hanging it. Nothing here measures time.
  template <typename Predicate>
  bool RoundsUntil(Predicate done) {
    return RoundsUntil(done, [] { return 0; });
  }

  // RoundsUntil for a run of the real llm-train, whose steps take real time, which a busy machine
  // stretches while a round stays about 25 ms: the bound counts the rounds since the experiment
  // last stored a step, so a run that goes on training is waited for however slowly it does, and
  // one that hangs still fails the test. (At a load of 8.5 on 2 cores a step took 1.6 to 3 s and
  // a 24-step run 50 s, where 1500 rounds in all lasted about 35 s.)
  template <typename Predicate>
  bool RoundsWhileItTrainsUntil(int64_t experiment, Predicate done) {
    return RoundsUntil(done, [&] { return Losses(experiment).size(); });
  }

  // Rounds until `done`, giving up after 1500 rounds in a row in which `progress` kept its value.
  template <typename Predicate, typename Progress>
  bool RoundsUntil(Predicate done, Progress progress) {
    auto seen = progress();
    int still = 0;
    while (!done()) {
      if (still++ == 1500) return false;
      clock_.Advance(seconds(5));
      daemon_->dispatcher().Tick();
      std::this_thread::sleep_for(milliseconds(20));
      if (auto now = progress(); now != seen) {
        seen = now;
        still = 0;
      }
    }
    return true;
  }

  // The experiment's report as llmctl report reads it.
  v1::ReportResponse Report(int64_t experiment) {
    grpc::ClientContext context;
    v1::GetExperimentRequest which;
    which.set_experiment_id(experiment);
    v1::ReportResponse report;
    const grpc::Status got = controller_->Report(&context, which, &report);
    EXPECT_TRUE(got.ok()) << got.error_message();
    return report;
  }

  // Whether the store holds attempt 1 of the trial up to line `seq` of rank 0's and rank 1's event
  // files (a 2-rank trial, on one node or two).
  bool BothRanksStoredUpTo(int64_t trial_id, int64_t seq) {
    auto ranks = daemon_->store().LastRankSeqs(trial_id, 1);
    return *daemon_->store().LastSeq(trial_id, 1) == seq && ranks.ok() && ranks->contains(1) &&
           ranks->at(1) == seq;
  }

  bool AllEnded(int64_t experiment) {
    for (const store::TrialRecord& trial : Trials(experiment)) {
      if (!store::IsOutcome(trial.state)) return false;
    }
    return true;
  }

  // (attempt, loss) of rank 0's steps, in order.
  std::vector<std::pair<int64_t, double>> Losses(int64_t experiment) {
    std::vector<std::pair<int64_t, double>> by_step;
    auto steps = daemon_->store().RunSteps(experiment);
    EXPECT_TRUE(steps.ok());
    if (steps.ok()) {
      for (const store::TrialStep& step : *steps) {
        by_step.emplace_back(step.attempt, step.loss.value_or(-1));
      }
    }
    return by_step;
  }

  // The trial of `resumed`, stopped with a checkpoint in attempt 1 and resumed as attempt 2, took
  // exactly the losses of `reference`, the same trial run uninterrupted for its `steps` steps.
  void ExpectResumedLossesAreTheReferences(int64_t resumed, int64_t reference, int64_t steps) {
    const auto expected = Losses(reference);
    const auto got = Losses(resumed);
    ASSERT_EQ(expected.size(), static_cast<size_t>(steps));
    ASSERT_EQ(got.size(), expected.size());
    EXPECT_EQ(got.front().first, 1);
    EXPECT_EQ(got.back().first, 2);
    for (size_t step = 0; step < got.size(); ++step) {
      EXPECT_EQ(got[step].second, expected[step].second) << "step " << step;
    }
  }

  fs::path RunDir(const std::string& node, int64_t experiment, const std::string& trial,
                  int attempt) {
    return dir_ / (node + "-data") / "runs" / std::to_string(experiment) / trial /
           std::to_string(attempt);
  }

  int64_t FileLines(const fs::path& path) {
    auto text = ReadFileToString(path.string());
    return text.ok() ? std::count(text->begin(), text->end(), '\n') : -1;
  }

  // From the real time: the agents date their device samples by it, and the controller refuses
  // one dated past its own clock (event_streams.h kMaxSampleClockLead). Rounds only move it on.
  ManualClock clock_{std::chrono::time_point_cast<seconds>(std::chrono::system_clock::now())};
  fs::path dir_;
  std::string agent_binary_;
  std::string trainer_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<v1::Controller::Stub> controller_;
  std::map<std::string, pid_t> agents_;
};

}  // namespace llmctl::controller::testing_support

#endif  // LLMCTL_TESTS_INTEGRATION_CONTROLLER_AGENT_FIXTURE_H_
