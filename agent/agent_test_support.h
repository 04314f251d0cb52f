// What the agent's end-to-end tests (agent_runs_test.cc, agent_files_test.cc, agent_ranks_test.cc,
// event_lines_test.cc, multinode_test.cc) share: files, run keys, event streams and the real
// trainer's inputs and processes; and AgentTest, the fixture of those with one agent and a
// stand-in for llm-train. The tests of the agent's parts (trial_file_test.cc, input_cache_test.cc,
// process_test.cc, node_info_test.cc, supervisor_test.cc, agent_start_test.cc) take their
// directories from FreshTestDir.
#ifndef LLMCTL_AGENT_AGENT_TEST_SUPPORT_H_
#define LLMCTL_AGENT_AGENT_TEST_SUPPORT_H_

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "agent/fake_device_sampler.h"
#include "agent/server.h"
#include "agent/stop_runs_test_support.h"
#include "common/child_process.h"
#include "common/digest/digest.h"
#include "common/experiment.h"
#include "common/files.h"
#include "common/trial_config.h"
#include "common/version.h"
#include "llmctl/v1/agent.grpc.pb.h"
#include "rpc/tls.h"
#include "tests/support/shell_command.h"

namespace llmctl::agent::test_support {

namespace fs = std::filesystem;
namespace pb = llmctl::v1;

inline constexpr char kToken[] = "node1-token-0123456789";
inline constexpr auto kCallTimeout = std::chrono::seconds(120);

// The build tree, absolute (tests/support/shell_command.h): the supervisor starts llm-train, the
// run's worker, in the run's directory, where a relative path finds nothing.
inline std::string BuildDir() { return llmctl::testing::BuildDir().string(); }

inline std::string ReadAll(const fs::path& path) {
  auto text = ReadFileToString(path.string());
  return text.ok() ? *text : "";
}

inline std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

inline void WriteFile(const fs::path& path, const std::string& text, fs::perms perms) {
  std::ofstream(path) << text;
  fs::permissions(path, perms);
}

// An empty directory of this test's own under the process's temporary one (tests/support/
// gtest_main.cc gives each test process its own): PREFIX_XXXXXX. Short, not named after the test:
// the agent's unix socket lies in it, and its path must fit sun_path's 108 bytes.
inline fs::path FreshTestDir(const std::string& prefix) {
  std::string pattern = (fs::temp_directory_path() / (prefix + "_XXXXXX")).string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    ADD_FAILURE() << "cannot make a directory " << pattern << ": " << std::strerror(errno);
  }
  return pattern;
}

inline pb::RunKey Key(int64_t experiment, const std::string& trial, int attempt) {
  pb::RunKey key;
  key.set_experiment_id(experiment);
  key.set_trial(trial);
  key.set_attempt(attempt);
  return key;
}

inline void Deadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() + kCallTimeout);
}

struct Streamed {
  std::vector<pb::TrialEvent> events;
  std::optional<pb::RunEnded> ended;
  grpc::Status status;
};

// Streams `key`'s events from `from_seq` (rank 0's; other ranks' from `from_rank_seq`); stops after
// `max_events` events when given, else at the end.
inline Streamed StreamRun(pb::Agent::Stub& stub, const pb::RunKey& key, int64_t from_seq,
                          size_t max_events = SIZE_MAX,
                          const std::map<int, int64_t>& from_rank_seq = {}) {
  pb::StreamEventsRequest request;
  *request.mutable_key() = key;
  request.set_from_seq(from_seq);
  for (const auto& [rank, seq] : from_rank_seq) (*request.mutable_from_rank_seq())[rank] = seq;
  grpc::ClientContext context;
  Deadline(&context);
  auto reader = stub.StreamEvents(&context, request);
  Streamed streamed;
  pb::StreamEventsResponse item;
  while (streamed.events.size() < max_events && reader->Read(&item)) {
    if (item.has_event()) streamed.events.push_back(item.event());
    if (item.has_ended()) streamed.ended = item.ended();
  }
  if (streamed.events.size() >= max_events) context.TryCancel();
  streamed.status = reader->Finish();
  return streamed;
}

// The events of one rank, in the order they came.
inline std::vector<pb::TrialEvent> OfRank(const std::vector<pb::TrialEvent>& events, int rank) {
  std::vector<pb::TrialEvent> of_rank;
  for (const pb::TrialEvent& event : events) {
    if (event.rank() == rank) of_rank.push_back(event);
  }
  return of_rank;
}

inline void ExpectSameAsFile(const std::vector<pb::TrialEvent>& events, const fs::path& file,
                             int64_t first_seq = 1) {
  const std::vector<std::string> lines = Lines(ReadAll(file));
  ASSERT_EQ(static_cast<int64_t>(events.size()),
            static_cast<int64_t>(lines.size()) - first_seq + 1);
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].seq(), first_seq + static_cast<int64_t>(i));
    EXPECT_EQ(events[i].json(), lines[first_seq - 1 + i]);
  }
}

// Rank `rank`'s step losses, by step.
inline std::map<int64_t, double> Losses(const std::vector<pb::TrialEvent>& events, int rank) {
  std::map<int64_t, double> losses;
  for (const auto& event : OfRank(events, rank)) {
    if (event.type() != "step") continue;
    const nlohmann::json json = nlohmann::json::parse(event.json());
    losses[json.at("step").get<int64_t>()] = json.at("loss").get<double>();
  }
  return losses;
}

// Uploads the trial's data and tokenizer through `stub` and names them in `request` as input
// trees, as the controller does.
inline void UploadInputs(pb::Agent::Stub& stub, const TrialConfig& config,
                         pb::RunTrialRequest* request) {
  for (const std::string input : {"data.path", "tokenizer"}) {
    const std::string path = config.GetString(input);
    const std::string bytes = ReadAll(path);
    ASSERT_FALSE(bytes.empty()) << path;
    pb::UploadBlobResponse uploaded;
    grpc::ClientContext context;
    Deadline(&context);
    auto writer = stub.UploadBlob(&context, &uploaded);
    pb::BlobChunk chunk;
    chunk.set_sha256(digest::Sha256Hex(bytes));
    chunk.set_size(static_cast<int64_t>(bytes.size()));
    chunk.set_data(bytes);
    ASSERT_TRUE(writer->Write(chunk));
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok());
    const std::string name = fs::path(path).filename().string();
    pb::InputTree& tree = (*request->mutable_inputs())[input];
    tree.set_is_file(true);
    pb::TreeFile* file = tree.add_files();
    file->set_path(name);
    file->set_sha256(digest::Sha256Hex(bytes));
    file->set_size(static_cast<int64_t>(bytes.size()));
    tree.set_digest(digest::TreeDigest(std::vector<digest::TreeFile>{
        {name, digest::Sha256Hex(bytes), static_cast<int64_t>(bytes.size())}}));
  }
}

// The ranks' pids from a run's ranks.json and the launcher's (the worker's) from worker.json.
inline std::vector<pid_t> JobPids(const fs::path& run_dir) {
  const nlohmann::json ranks = nlohmann::json::parse(ReadAll(run_dir / "ranks.json"));
  std::vector<pid_t> pids = ranks.at("pids").get<std::vector<pid_t>>();
  const nlohmann::json worker = nlohmann::json::parse(ReadAll(run_dir / "worker.json"));
  pids.push_back(worker.at("pid").get<pid_t>());
  return pids;
}

// Every pid is gone, reaped: the launcher's children (the ranks) are reaped by the launcher or,
// once it is gone, by init, which may take a moment after the run's end; the wait is bounded by
// the call deadline, not a measured time.
inline void ExpectGone(const std::vector<pid_t>& pids) {
  const auto deadline = std::chrono::steady_clock::now() + kCallTimeout;
  for (const pid_t pid : pids) {
    while (::kill(pid, 0) == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(::kill(pid, 0), -1) << "pid " << pid << " is still there";
    EXPECT_EQ(errno, ESRCH);
  }
}

// The end-to-end tests' agent, in this test's process (StartAgent) or as its own
// (StartAgentProcess, to be killed), with the built llm-agent as its supervisor and FakeTrainer()
// as its llm-train.
class AgentTest : public ::testing::Test {
 protected:
  // Stands in for llm-train; the trial's seed says what it does. Every run writes three events;
  // seed 0 finishes ok, 1..99 exit with that code, 100+N kill themselves with signal N, 200 ignores
  // SIGTERM with a child in its process group until it is killed, 300 waits for a file named `go`
  // in the run directory before its last events, 400 writes `ready` and waits for SIGTERM or
  // SIGUSR1, writes the signal's name to `got-signal`, takes a second (a checkpoint being written)
  // and exits cancelled, 410 writes `ready` and then each such signal's name, never stopping (a
  // checkpoint that hangs). Its arguments go to `argv` in the run directory, one a line. `--version
  // --json` (the agent's probe) answers a CUDA 13.2 LibTorch of `version` (FakeTrainer). With
  // `--nproc 2` (a 2-rank ddp trial)
  // it plays llm-train's launcher and both ranks: every event also goes to rank 1's
  // events.rank1.jsonl (with "rank":1), and seeds 500+C end with rank 1 failing first with exit
  // code C, 600+N with rank 1 killed by signal N, as the launcher records them in --ranks-file (the
  // job then exits C, or 1). Seed 700 then writes lines that break the event-line rule (a number
  // for a type, an array, bad UTF-8, a line of 1,100,000 bytes) before its ok result.
  static std::string FakeTrainer(std::string_view version = kVersion) {
    return std::string(
               "#!/bin/sh\n"
               "if [ \"$1\" = --version ]; then  # the agent's node probe: llm-train --version "
               "--json\n"
               "  echo '{\"llmctl\": \"")
        .append(version)
        .append(
            "\", \"libtorch\": \"2.15.0\", \"libtorch_cuda\": \"13.2\", \"cuda_devices\": 0}'; "
            "exit 0\nfi\n")
        .append(kFakeTrainerRuns);
  }
  static constexpr char kFakeTrainerRuns[] = R"sh(config="$2"
events="$4"
seed=$(sed -n 's/^seed: *//p' "$config")
out=$(sed -n 's/^output_dir: *//p' "$config")
nproc=1; ranks_file=; prev=
for arg in "$@"; do
  case "$prev" in --nproc) nproc=$arg ;; --ranks-file) ranks_file=$arg ;; esac
  prev=$arg
done
emit() {
  printf '%s\n' "$1" >> "$events"
  if [ "$nproc" -gt 1 ]; then
    printf '%s\n' "$1" | sed 's/^{/{"rank":1,/' >> "${events%.jsonl}.rank1.jsonl"
  fi
}
if [ "$nproc" -gt 1 ] && [ "$seed" -ge 500 ] && [ "$seed" -lt 700 ]; then
  emit '{"type":"start","total_steps":4}'
  if [ "$seed" -lt 600 ]; then
    failure="\"exit_code\":$((seed - 500))"
    printf '%s\n' '{"type":"result","outcome":"oom","error":"out of memory at step 1"}' \
      >> "${events%.jsonl}.rank1.jsonl"
  else
    failure="\"signal\":$((seed - 600))"
  fi
  printf '{"world_size":2,"master_port":1,"pids":[1,2],"first_failure":{"rank":1,%s}}\n' \
    "$failure" > "$ranks_file"
  echo "llm-train: rank 1 of 2 failed; the other ranks were stopped" >&2
  [ "$seed" -lt 600 ] && exit $((seed - 500))
  exit 1
fi
printf '%s\n' "$@" > "${events%/*}/argv"  # the run directory: what the agent passed
emit '{"type":"start","total_steps":4}'
emit '{"type":"step","step":1}'
emit '{"type":"step","step":2}'
case "$seed" in
  200) trap '' TERM
       sleep 1000 &
       echo $! > child.pid.tmp && mv child.pid.tmp child.pid
       while :; do sleep 0.05; done ;;
  300) while [ ! -e go ]; do sleep 0.02; done
       emit '{"type":"step","step":3}'
       emit '{"type":"step","step":4}' ;;
  400) stop=0
       trap 'echo TERM > got-signal; stop=1' TERM
       trap 'echo USR1 > got-signal; stop=1' USR1
       : > ready.tmp && mv ready.tmp ready
       while [ "$stop" -eq 0 ]; do sleep 0.02; done
       sleep 1
       emit '{"type":"result","outcome":"cancelled","error":"cancelled at step 2"}'
       exit 5 ;;
  410) trap 'echo USR1 >> got-signal' USR1
       trap 'echo TERM >> got-signal' TERM
       : > ready.tmp && mv ready.tmp ready
       while :; do sleep 0.02; done ;;
esac
if [ "$seed" -eq 700 ]; then
  printf '%s\n' '{"type":1,"x":"result"}' '[1,2]' >> "$events"
  printf 'not json \377\n' >> "$events"
  head -c 1100000 /dev/zero | tr '\0' a >> "$events" && echo >> "$events"
fi
if [ "$seed" -ge 100 ] && [ "$seed" -lt 200 ]; then kill -$((seed - 100)) $$; fi
mkdir -p "$out/adapter"
head -c 2500000 /dev/urandom > "$out/adapter/weights.bin"
echo "stderr line for seed $seed" >&2
if [ "$seed" -eq 0 ] || [ "$seed" -eq 300 ] || [ "$seed" -eq 700 ]; then
  emit '{"type":"result","outcome":"ok","error":""}'
  exit 0
fi
exit "$seed"
)sh";

  void SetUp() override {
    dir_ = FreshTestDir("llmctl_agent");
    auto ca = rpc::CertificateAuthority::LoadOrCreate((dir_ / "ca").string());
    ASSERT_TRUE(ca.ok()) << ca.status().ToString();
    auto agent = (*ca)->Issue(rpc::AgentCertificateName("node1"), 1);
    auto controller = (*ca)->Issue(rpc::kControllerCertificateName, 1);
    ASSERT_TRUE(agent.ok() && controller.ok());
    agent_identity_ = {(*ca)->ca_certificate_pem(), agent->certificate_pem, agent->private_key_pem};
    controller_identity_ = {(*ca)->ca_certificate_pem(), controller->certificate_pem,
                            controller->private_key_pem};
    fake_trainer_ = (dir_ / "fake-llm-train").string();
    WriteFile(fake_trainer_, FakeTrainer(), fs::perms::owner_all);
    supervisor_ = BuildDir() + "/agent/llm-agent";
    ASSERT_TRUE(fs::exists(supervisor_)) << supervisor_ << " is built with the agent's tests";
    address_ = "unix:" + (dir_ / "agent.sock").string();
  }

  void TearDown() override {
    server_.reset();
    if (agent_pid_ > 0) KillAgentProcess();
    // Supervisors and workers outlive their agent by design: a test that failed midway left them
    // running after the test process had ended.
    StopRuns(dir_ / "data");
    // A supervisor StopRuns cannot name (one yet to write supervisor.json) may still be writing its
    // run's files (a worker.json.tmp renamed away mid-removal) and make remove_all fail: try again
    // until nothing moves under it.
    std::error_code error;
    for (int attempt = 0; attempt < 100; ++attempt) {
      fs::remove_all(dir_, error);
      if (!error) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  AgentOptions Options(const std::string& llm_train, std::chrono::milliseconds poll_interval) {
    AgentOptions options;
    options.listen = address_;
    options.data_dir = (dir_ / "data").string();
    options.node = "node1";
    options.identity = agent_identity_;
    options.token = kToken;
    options.llm_train = llm_train;
    options.supervisor_program = supervisor_;
    options.cancel_grace = std::chrono::milliseconds(300);
    options.poll_interval = poll_interval;
    options.sampler = sampler_.get();
    options.sample_interval = sample_interval_;
    return options;
  }

  void StartAgent(const std::string& llm_train = "",
                  std::chrono::milliseconds poll_interval = std::chrono::milliseconds(20)) {
    auto server =
        AgentServer::Start(Options(llm_train.empty() ? fake_trainer_ : llm_train, poll_interval));
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
  }

  // The agent as its own process, so that it can be killed with SIGKILL.
  void StartAgentProcess() {
    const fs::path files = dir_ / "agent-files";
    fs::create_directories(files);
    WriteFile(files / "ca.pem", agent_identity_.ca_pem,
              fs::perms::owner_read | fs::perms::owner_write);
    WriteFile(files / "cert.pem", agent_identity_.certificate_pem,
              fs::perms::owner_read | fs::perms::owner_write);
    WriteFile(files / "key.pem", agent_identity_.private_key_pem,
              fs::perms::owner_read | fs::perms::owner_write);
    WriteFile(files / "token", std::string(kToken) + "\n",
              fs::perms::owner_read | fs::perms::owner_write);
    ChildSpec spec;
    spec.argv = {supervisor_,
                 "--listen",
                 address_,
                 "--data-dir",
                 (dir_ / "data").string(),
                 "--node",
                 "node1",
                 "--ca",
                 (files / "ca.pem").string(),
                 "--cert",
                 (files / "cert.pem").string(),
                 "--key",
                 (files / "key.pem").string(),
                 "--token-file",
                 (files / "token").string(),
                 "--llm-train",
                 fake_trainer_,
                 "--cancel-grace-ms",
                 "300"};
    const StatusOr<pid_t> pid = StartChild(spec);
    ASSERT_TRUE(pid.ok()) << pid.status().ToString();
    agent_pid_ = *pid;
    // Ready once it answers.
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
    pb::NodeInfo info;
    const grpc::Status status = Stub()->GetNodeInfo(&context, {}, &info);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }

  void KillAgentProcess() {
    ::kill(agent_pid_, SIGKILL);
    int status = 0;
    ::waitpid(agent_pid_, &status, 0);
    agent_pid_ = 0;
  }

  std::unique_ptr<pb::Agent::Stub> Stub() {
    return pb::Agent::NewStub(rpc::Dial(address_, rpc::AgentCertificateName("node1"),
                                        rpc::ChannelCredentials(controller_identity_, kToken)));
  }

  grpc::Status Cancel(const pb::CancelRunRequest& request, pb::RunState* state) {
    grpc::ClientContext context;
    Deadline(&context);
    return Stub()->CancelRun(&context, request, state);
  }

  pb::RunState RunTrial(const pb::RunKey& key, int seed, grpc::Status* status_out = nullptr,
                        int ddp_devices = 0) {
    pb::RunTrialRequest request;
    *request.mutable_key() = key;
    nlohmann::json config{{"seed", seed}, {"data", {{"path", "unused.jsonl"}}}};
    if (ddp_devices > 0) {
      config["strategy"] = "ddp";
      config["devices"] = ddp_devices;
      for (int i = 0; i < ddp_devices; ++i) request.add_device_indices(i);
    }
    request.set_config_json(config.dump());
    grpc::ClientContext context;
    Deadline(&context);
    pb::RunState state;
    const grpc::Status status = Stub()->RunTrial(&context, request, &state);
    if (status_out != nullptr) {
      *status_out = status;
    } else {
      EXPECT_TRUE(status.ok()) << status.error_message();
    }
    return state;
  }

  // Streams from `from_seq` (rank 0's; other ranks' from `from_rank_seq`); stops after
  // `max_events` events when given, else at the end.
  Streamed Stream(const pb::RunKey& key, int64_t from_seq, size_t max_events = SIZE_MAX,
                  const std::map<int, int64_t>& from_rank_seq = {}) {
    return StreamRun(*Stub(), key, from_seq, max_events, from_rank_seq);
  }

  fs::path RunDir(const pb::RunKey& key) {
    return dir_ / "data" / "runs" / std::to_string(key.experiment_id()) / key.trial() /
           std::to_string(key.attempt());
  }

  // Runs the fake trainer's seed 400 (or `seed`) and waits until it listens for its stop signal.
  void StartSignalRecorder(const pb::RunKey& key, int seed = 400) {
    RunTrial(key, seed);
    while (!fs::exists(RunDir(key) / "ready")) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  fs::path dir_;
  rpc::TlsIdentity agent_identity_;
  rpc::TlsIdentity controller_identity_;
  std::string fake_trainer_;
  std::string supervisor_;
  std::string address_;
  // The agent's device sampler when set (it outlives the agent); else the node's own.
  std::unique_ptr<FakeDeviceSampler> sampler_;
  std::chrono::milliseconds sample_interval_{1000};
  std::unique_ptr<AgentServer> server_;
  pid_t agent_pid_ = 0;
};

// A run of the demo experiment's trial (`config`) by the real trainer, with the data and
// tokenizer uploaded as input trees; agent_ranks_test.cc adds what its 2-rank runs need.
class RealTrainerFixture : public AgentTest {
 protected:
  void SetUp() override {
    AgentTest::SetUp();
    llm_train_ = BuildDir() + "/trainer/llm-train";
    if (!fs::exists(llm_train_)) GTEST_SKIP() << llm_train_ << " is not built";
    auto experiment =
        LoadExperimentFile((llmctl::testing::SourceDir() / "experiments/demo.yaml").string());
    ASSERT_TRUE(experiment.ok()) << experiment.status().ToString();
    config_ = experiment->trials.front().config;
  }

  // Uploads the inputs and starts the run.
  void Start(const pb::RunKey& key, int devices = 1, const pb::RunKey* resume_run = nullptr,
             const std::string& resume_checkpoint = "") {
    pb::RunTrialRequest request;
    *request.mutable_key() = key;
    if (resume_run != nullptr) {
      *request.mutable_resume_from()->mutable_run() = *resume_run;
      request.mutable_resume_from()->set_checkpoint(resume_checkpoint);
    }
    request.set_config_json(config_.ToJson().dump());
    for (int i = 0; i < devices; ++i) request.add_device_indices(i);
    ASSERT_NO_FATAL_FAILURE(UploadInputs(*Stub(), config_, &request));
    grpc::ClientContext context;
    Deadline(&context);
    pb::RunState state;
    const grpc::Status started = Stub()->RunTrial(&context, request, &state);
    ASSERT_TRUE(started.ok()) << started.error_message();
  }

  std::string llm_train_;
  TrialConfig config_;
};

}  // namespace llmctl::agent::test_support

#endif  // LLMCTL_AGENT_AGENT_TEST_SUPPORT_H_
