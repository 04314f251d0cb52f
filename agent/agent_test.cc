// llm-agent end to end: real gRPC over mutual TLS on a unix socket, the real supervisor (the built
// llm-agent binary), a shell script standing in for llm-train, and the real llm-train when it has
// been built.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "agent/agent_test_support.h"
#include "agent/fake_device_sampler.h"
#include "agent/input_cache.h"
#include "agent/process.h"
#include "agent/server.h"
#include "common/digest/digest.h"
#include "common/experiment.h"
#include "common/files.h"
#include "common/nvml/gpu_probe.h"
#include "common/version.h"
#include "llmctl/v1/agent.grpc.pb.h"
#include "rpc/tls.h"

extern char** environ;

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;
namespace pb = llmctl::v1;
using namespace test_support;  // NOLINT(build/namespaces): the tests' shared vocabulary

// Stands in for llm-train; the trial's seed says what it does. Every run writes three events;
// seed 0 finishes ok, 1..99 exit with that code, 100+N kill themselves with signal N, 200 ignores
// SIGTERM with a child in its process group until it is killed, 300 waits for a file named `go`
// in the run directory before its last events, 400 writes `ready` and waits for SIGTERM or SIGUSR1,
// writes the signal's name to `got-signal`, takes a second (a checkpoint being written) and exits
// cancelled. Its arguments go to `argv` in the run directory, one a line. `--version --json`
// (the agent's probe) answers a CUDA 13.2 LibTorch. With `--nproc 2` (a 2-rank ddp trial) it plays
// llm-train's launcher and both ranks: every event also goes to rank 1's events.rank1.jsonl (with
// "rank":1), and seeds 500+C end with rank 1 failing first with exit code C, 600+N with rank 1
// killed by signal N, as the launcher records them in --ranks-file (the job then exits C, or 1).
constexpr char kFakeTrainer[] = R"sh(#!/bin/sh
if [ "$1" = --version ]; then  # the agent's node probe: llm-train --version --json
  echo '{"llmctl": "0", "libtorch": "2.15.0", "libtorch_cuda": "13.2", "cuda_devices": 0}'; exit 0
fi
config="$2"
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
esac
if [ "$seed" -ge 100 ] && [ "$seed" -lt 200 ]; then kill -$((seed - 100)) $$; fi
mkdir -p "$out/adapter"
head -c 2500000 /dev/urandom > "$out/adapter/weights.bin"
echo "stderr line for seed $seed" >&2
if [ "$seed" -eq 0 ] || [ "$seed" -eq 300 ]; then
  emit '{"type":"result","outcome":"ok","error":""}'
  exit 0
fi
exit "$seed"
)sh";

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("llmctl_agent_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
            std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    auto ca = rpc::CertificateAuthority::LoadOrCreate((dir_ / "ca").string());
    ASSERT_TRUE(ca.ok()) << ca.status().ToString();
    auto agent = (*ca)->Issue(rpc::AgentCertificateName("node1"), 1);
    auto controller = (*ca)->Issue(rpc::kControllerCertificateName, 1);
    ASSERT_TRUE(agent.ok() && controller.ok());
    agent_identity_ = {(*ca)->ca_certificate_pem(), agent->certificate_pem, agent->private_key_pem};
    controller_identity_ = {(*ca)->ca_certificate_pem(), controller->certificate_pem,
                            controller->private_key_pem};
    fake_trainer_ = (dir_ / "fake-llm-train").string();
    WriteFile(fake_trainer_, kFakeTrainer, fs::perms::owner_all);
    supervisor_ = BuildDir() + "/agent/llm-agent";
    ASSERT_TRUE(fs::exists(supervisor_)) << supervisor_ << " is built with agent_test";
    address_ = "unix:" + (dir_ / "agent.sock").string();
  }

  void TearDown() override {
    server_.reset();
    if (agent_pid_ > 0) KillAgentProcess();
    fs::remove_all(dir_);
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
    std::vector<std::string> args = {supervisor_,
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
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    ASSERT_EQ(::posix_spawn(&agent_pid_, argv[0], nullptr, nullptr, argv.data(), environ), 0);
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

  // Runs the fake trainer's seed 400 and waits until it listens for its stop signal.
  void StartSignalRecorder(const pb::RunKey& key) {
    RunTrial(key, 400);
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

TEST_F(AgentTest, AResumedRunGetsItsCheckpointOnlyWhileThisNodeHasIt) {
  StartAgent();
  const pb::RunKey first = Key(9, "long", 1);
  RunTrial(first, 0);
  ASSERT_TRUE(Stream(first, 0).ended.has_value());
  const fs::path checkpoint = RunDir(first) / "output" / "checkpoints" / "step-2";
  const auto resume = [&](const pb::RunKey& key, const pb::RunKey& from, const fs::path& path) {
    pb::RunTrialRequest request;
    *request.mutable_key() = key;
    request.set_config_json(
        nlohmann::json{{"seed", 0}, {"data", {{"path", "unused.jsonl"}}}}.dump());
    *request.mutable_resume_from()->mutable_run() = from;
    request.mutable_resume_from()->set_checkpoint(path.string());
    grpc::ClientContext context;
    Deadline(&context);
    pb::RunState state;
    return Stub()->RunTrial(&context, request, &state);
  };

  grpc::Status status = resume(Key(9, "long", 2), first, checkpoint);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("its checkpoint " + checkpoint.string() +
                                        " is gone from this node"),
            std::string::npos)
      << status.error_message();
  status = resume(Key(9, "long", 2), Key(9, "other", 1), checkpoint);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("this node has no such run"), std::string::npos)
      << status.error_message();
  EXPECT_FALSE(fs::exists(RunDir(Key(9, "long", 2)))) << "nothing started";

  fs::create_directories(checkpoint);
  WriteFile(checkpoint / "trainer_state.json", "{}",
            fs::perms::owner_read | fs::perms::owner_write);
  status = resume(Key(9, "long", 2), first, checkpoint);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_TRUE(Stream(Key(9, "long", 2), 0).ended.has_value());
  const std::vector<std::string> argv = Lines(ReadAll(RunDir(Key(9, "long", 2)) / "argv"));
  const auto flag = std::find(argv.begin(), argv.end(), "--resume");
  ASSERT_NE(flag, argv.end()) << ReadAll(RunDir(Key(9, "long", 2)) / "argv");
  ASSERT_NE(flag + 1, argv.end());
  EXPECT_EQ(*(flag + 1), checkpoint.string());
  // A run from step 0 gets no --resume.
  const std::vector<std::string> first_argv = Lines(ReadAll(RunDir(first) / "argv"));
  EXPECT_EQ(std::find(first_argv.begin(), first_argv.end(), "--resume"), first_argv.end());
}

TEST_F(AgentTest, ACheckpointIsFetchedByItsPathAndAnotherNodeResumesFromItAsATree) {
  StartAgent();
  const pb::RunKey first = Key(9, "moved", 1);
  RunTrial(first, 0);
  ASSERT_TRUE(Stream(first, 0).ended.has_value());
  const fs::path checkpoint = RunDir(first) / "output" / "checkpoints" / "step-2";
  fs::create_directories(checkpoint / "sub");
  const std::map<std::string, std::string> written = {
      {"model.safetensors", std::string(1500000, 'm')},
      {"sub/rng.safetensors", ""},
      {"trainer_state.json", R"({"next_step": 2})"}};
  for (const auto& [path, content] : written) {
    WriteFile(checkpoint / path, content, fs::perms::owner_read | fs::perms::owner_write);
  }
  // The checkpoint's directory alone, as the controller copies it: paths relative to it.
  const auto fetch = [&](const std::string& path, std::map<std::string, std::string>* files) {
    pb::FetchArtifactsRequest request;
    *request.mutable_key() = first;
    request.set_path(path);
    grpc::ClientContext context;
    Deadline(&context);
    auto stub = Stub();
    auto reader = stub->FetchArtifacts(&context, request);
    std::string current;
    pb::ArtifactChunk chunk;
    while (reader->Read(&chunk)) {
      if (!chunk.path().empty()) current = chunk.path();
      (*files)[current] += chunk.data();
      if (chunk.last()) {
        EXPECT_EQ(chunk.sha256(), digest::Sha256Hex((*files)[current]));
      }
    }
    return reader->Finish();
  };
  for (const std::string& path : {checkpoint.string(), std::string("output/checkpoints/step-2")}) {
    std::map<std::string, std::string> files;
    const grpc::Status fetched = fetch(path, &files);
    ASSERT_TRUE(fetched.ok()) << path << ": " << fetched.error_message();
    EXPECT_EQ(files, written) << path;
  }
  std::map<std::string, std::string> ignored;
  EXPECT_EQ(fetch(RunDir(first).string(), &ignored).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(fetch("output/../../../../..", &ignored).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(fetch("output/checkpoints/step-9", &ignored).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(ignored.empty());

  // Sent to a node as a tree (here the same agent, under another trial with no run of its own).
  std::vector<digest::TreeFile> files;
  pb::InputTree tree;
  for (const auto& [path, content] : written) {
    files.push_back({path, digest::Sha256Hex(content), static_cast<int64_t>(content.size())});
    pb::TreeFile* file = tree.add_files();
    file->set_path(path);
    file->set_sha256(digest::Sha256Hex(content));
    file->set_size(static_cast<int64_t>(content.size()));
  }
  tree.set_digest(digest::TreeDigest(files));
  const auto resume = [&](const pb::RunKey& key) {
    pb::RunTrialRequest request;
    *request.mutable_key() = key;
    request.set_config_json(
        nlohmann::json{{"seed", 0}, {"data", {{"path", "unused.jsonl"}}}}.dump());
    *request.mutable_resume_from()->mutable_run() = Key(9, "elsewhere", 1);
    request.mutable_resume_from()->set_checkpoint("/on/another/node");
    *request.mutable_resume_from()->mutable_tree() = tree;
    grpc::ClientContext context;
    Deadline(&context);
    pb::RunState state;
    return Stub()->RunTrial(&context, request, &state);
  };
  const pb::RunKey moved = Key(9, "elsewhere", 2);
  grpc::Status status = resume(moved);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << "its blobs are missing";
  EXPECT_FALSE(fs::exists(RunDir(moved)));
  for (const auto& [path, content] : written) {
    grpc::ClientContext context;
    Deadline(&context);
    pb::UploadBlobResponse response;
    auto stub = Stub();
    auto writer = stub->UploadBlob(&context, &response);
    pb::BlobChunk chunk;
    chunk.set_sha256(digest::Sha256Hex(content));
    chunk.set_size(static_cast<int64_t>(content.size()));
    chunk.set_data(content);
    writer->Write(chunk);
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok()) << path;
  }
  status = resume(moved);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_TRUE(Stream(moved, 0).ended.has_value());
  const std::vector<std::string> argv = Lines(ReadAll(RunDir(moved) / "argv"));
  const auto flag = std::find(argv.begin(), argv.end(), "--resume");
  ASSERT_NE(flag, argv.end());
  ASSERT_NE(flag + 1, argv.end());
  EXPECT_EQ(*(flag + 1), (dir_ / "data/cache/trees" / tree.digest()).string());
  EXPECT_EQ(ReadAll(fs::path(*(flag + 1)) / "trainer_state.json"),
            written.at("trainer_state.json"));
}

TEST_F(AgentTest, RunsToOkStreamingEveryEventOnceAndIsIdempotent) {
  StartAgent();
  const pb::RunKey key = Key(7, "base/precision=bf16-true", 1);
  const pb::RunState started = RunTrial(key, 0);
  EXPECT_EQ(started.key().trial(), key.trial());

  const Streamed streamed = Stream(key, 0);
  ASSERT_TRUE(streamed.status.ok()) << streamed.status.error_message();
  ASSERT_TRUE(streamed.ended.has_value());
  EXPECT_EQ(streamed.ended->outcome(), "ok");
  EXPECT_EQ(streamed.ended->exit_code(), 0);
  ASSERT_EQ(streamed.events.size(), 4u);
  EXPECT_EQ(streamed.events.front().type(), "start");
  EXPECT_EQ(streamed.events.back().type(), "result");
  const fs::path dir = dir_ / "data/runs/7/base%2Fprecision%3Dbf16-true/1";
  ExpectSameAsFile(streamed.events, dir / "events.jsonl");
  EXPECT_TRUE(fs::exists(dir / "ended.json"));
  EXPECT_TRUE(fs::exists(dir / "exit.json"));
  EXPECT_NE(ReadAll(dir / "stderr.log").find("stderr line for seed 0"), std::string::npos);

  // The same key again: the existing run's state, nothing started twice.
  const pb::RunState again = RunTrial(key, 0);
  EXPECT_EQ(again.status(), pb::RUN_STATUS_ENDED);
  EXPECT_EQ(again.last_seq(), 4);
  EXPECT_EQ(again.ended().outcome(), "ok");
  EXPECT_EQ(Lines(ReadAll(dir / "events.jsonl")).size(), 4u);
  // Another attempt is another run.
  RunTrial(Key(7, key.trial(), 2), 0);
  grpc::ClientContext context;
  Deadline(&context);
  pb::ListRunsResponse runs;
  ASSERT_TRUE(Stub()->ListRuns(&context, {}, &runs).ok());
  EXPECT_EQ(runs.runs_size(), 2);
}

TEST_F(AgentTest, DeviceSamplesOfARunningTrialAreStreamedFromAnySequenceNumber) {
  const DeviceReading gpu0{.device = "cuda:0",
                           .utilization_percent = 45,
                           .memory_used_bytes = int64_t{49} << 30,
                           .memory_total_bytes = int64_t{80} << 30,
                           .power_watts = 312.5,
                           .temperature_celsius = 64};
  DeviceReading gpu1 = gpu0;
  gpu1.device = "cuda:1";
  gpu1.power_watts.reset();
  sampler_ = std::make_unique<FakeDeviceSampler>(std::vector<DeviceReading>{gpu0, gpu1});
  sample_interval_ = std::chrono::milliseconds(20);
  StartAgent();
  const pb::RunKey key = Key(3, "sampled", 1);
  RunTrial(key, 300);  // holds until `go`
  const fs::path samples_file = RunDir(key) / "samples.jsonl";
  // Until the sampler has seen the worker's process group and written a few readings.
  const auto worker_seen = [&] {
    const std::vector<SampleTarget> targets = sampler_->targets();
    return std::any_of(targets.begin(), targets.end(),
                       [](const SampleTarget& t) { return t.process_group > 0; });
  };
  while (Lines(ReadAll(samples_file)).size() < 6 || !worker_seen()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::ofstream(RunDir(key) / "go").close();

  pb::StreamEventsRequest request;
  *request.mutable_key() = key;
  request.set_from_sample_seq(3);
  grpc::ClientContext context;
  Deadline(&context);
  auto stub = Stub();
  auto reader = stub->StreamEvents(&context, request);
  std::vector<pb::DeviceSample> samples;
  bool ended = false;
  for (pb::StreamEventsResponse item; reader->Read(&item);) {
    for (const pb::DeviceSample& sample : item.samples().samples()) samples.push_back(sample);
    ended = ended || item.has_ended();
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_TRUE(ended);

  // Every line from the third on, once, in order, as the sampler read it.
  const std::vector<std::string> lines = Lines(ReadAll(samples_file));
  ASSERT_GE(samples.size(), 4u);
  ASSERT_LE(samples.size(), lines.size() - 2);  // the recorder may add lines after the end
  for (size_t i = 0; i < samples.size(); ++i) {
    const pb::DeviceSample& sample = samples[i];
    SCOPED_TRACE("sample " + std::to_string(sample.seq()));
    EXPECT_EQ(sample.seq(), static_cast<int64_t>(i) + 3);
    const DeviceReading& expected = i % 2 == 0 ? gpu0 : gpu1;
    EXPECT_EQ(sample.device(), expected.device);
    EXPECT_EQ(sample.utilization_percent(), 45);
    EXPECT_EQ(sample.memory_used_bytes(), expected.memory_used_bytes);
    EXPECT_EQ(sample.memory_total_bytes(), expected.memory_total_bytes);
    EXPECT_EQ(sample.has_power_watts(), expected.power_watts.has_value());
    EXPECT_EQ(sample.temperature_celsius(), 64);
    EXPECT_GT(sample.unix_ms(), 0);
    const auto line = ParseSampleLine(lines[sample.seq() - 1]);
    ASSERT_TRUE(line.ok());
    EXPECT_EQ(line->unix_ms, sample.unix_ms());
  }
  // The sampler saw the run as it is (a CPU trial) and forgot it once it ended.
  const std::vector<SampleTarget> targets = sampler_->targets();
  EXPECT_EQ(targets.front().run_dir, RunDir(key).string());
  EXPECT_EQ(targets.front().device_type, "cpu");
  while (!sampler_->forgotten().contains(RunDir(key).string())) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

TEST_F(AgentTest, StreamingResumesFromASequenceNumber) {
  StartAgent();
  const pb::RunKey key = Key(1, "t", 1);
  RunTrial(key, 0);
  const Streamed all = Stream(key, 1);
  ASSERT_TRUE(all.ended.has_value());
  const Streamed rest = Stream(key, 3);
  ASSERT_EQ(rest.events.size(), 2u);
  ExpectSameAsFile(rest.events, RunDir(key) / "events.jsonl", 3);
  EXPECT_TRUE(rest.ended.has_value());
  const Streamed none = Stream(key, 10);
  EXPECT_TRUE(none.events.empty());
  EXPECT_TRUE(none.ended.has_value());
  EXPECT_EQ(Stream(Key(1, "unknown", 1), 0).status.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(AgentTest, ExitCodesAndSignalsBecomeOutcomes) {
  StartAgent();
  const struct {
    int seed;
    const char* outcome;
    int exit_code;
    const char* error_part;
  } table[] = {
      {1, "failed", 1, "stderr line for seed 1"},
      {2, "invalid", 2, "stderr line for seed 2"},
      {3, "oom", 3, ""},
      {4, "diverged", 4, ""},
      {5, "cancelled", 5, ""},
      {7, "failed", 7, "llm-train exited with code 7: stderr line for seed 7"},
      {100 + SIGKILL, "oom", -SIGKILL, "killed by the kernel (host memory)"},
      {100 + SIGSEGV, "failed", -SIGSEGV, "SIGSEGV"},
  };
  for (const auto& row : table) {
    const pb::RunKey key = Key(2, "seed-" + std::to_string(row.seed), 1);
    RunTrial(key, row.seed);
    const Streamed streamed = Stream(key, 0);
    ASSERT_TRUE(streamed.ended.has_value()) << row.seed;
    EXPECT_EQ(streamed.ended->outcome(), row.outcome) << row.seed;
    EXPECT_EQ(streamed.ended->exit_code(), row.exit_code) << row.seed;
    EXPECT_NE(streamed.ended->error().find(row.error_part), std::string::npos)
        << row.seed << ": " << streamed.ended->error();
    EXPECT_EQ(streamed.events.size(), 3u) << row.seed;
  }
}

TEST_F(AgentTest, CancelKillsTheWholeProcessGroup) {
  StartAgent();
  const pb::RunKey key = Key(3, "stubborn", 1);
  RunTrial(key, 200);
  const fs::path child_file = RunDir(key) / "child.pid";
  // The fake writes child.pid once its child runs; the wait is for the file, not for a time.
  while (!fs::exists(child_file)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const pid_t child = std::stoi(ReadAll(child_file));
  const nlohmann::json worker = nlohmann::json::parse(ReadAll(RunDir(key) / "worker.json"));
  ASSERT_TRUE(ProcessStartTime(child).has_value());

  pb::CancelRunRequest request;
  *request.mutable_key() = key;
  pb::RunState state;
  ASSERT_TRUE(Cancel(request, &state).ok());
  EXPECT_EQ(state.status(), pb::RUN_STATUS_ENDED);
  EXPECT_EQ(state.ended().outcome(), "cancelled");
  EXPECT_NE(state.ended().error().find("SIGKILL"), std::string::npos) << state.ended().error();
  // It ignored SIGTERM, so both it and its child went with SIGKILL to the group.
  EXPECT_FALSE(ProcessStartTime(worker["pid"].get<pid_t>()).has_value());
  EXPECT_FALSE(ProcessStartTime(child).has_value());
  const Streamed streamed = Stream(key, 0);
  ASSERT_TRUE(streamed.ended.has_value());
  EXPECT_EQ(streamed.ended->outcome(), "cancelled");
}

TEST_F(AgentTest, CheckpointingCancelSendsSigusr1AndWaitsItsLongerGrace) {
  StartAgent();  // cancel grace 300 ms: shorter than the worker's second of "checkpointing"
  const pb::RunKey key = Key(3, "checkpointing", 1);
  StartSignalRecorder(key);

  pb::CancelRunRequest request;
  *request.mutable_key() = key;
  request.set_checkpoint_grace_ms(60'000);
  pb::RunState state;
  EXPECT_EQ(Cancel(request, &state).error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << "a grace without checkpoint";
  request.set_checkpoint(true);
  ASSERT_TRUE(Cancel(request, &state).ok());

  const Streamed streamed = Stream(key, 0);
  ASSERT_TRUE(streamed.ended.has_value());
  EXPECT_EQ(streamed.ended->outcome(), "cancelled");
  // It exited by itself after its second: the 60 s grace applied, not the 300 ms one.
  EXPECT_EQ(streamed.ended->exit_code(), 5) << streamed.ended->error();
  EXPECT_EQ(ReadAll(RunDir(key) / "got-signal"), "USR1\n");
  EXPECT_EQ(streamed.events.back().type(), "result");
}

TEST_F(AgentTest, PlainCancelSendsSigtermAndKillsAfterTheCancelGrace) {
  StartAgent();
  const pb::RunKey key = Key(3, "plain", 1);
  StartSignalRecorder(key);
  pb::CancelRunRequest request;
  *request.mutable_key() = key;
  pb::RunState state;
  ASSERT_TRUE(Cancel(request, &state).ok());
  ASSERT_EQ(state.status(), pb::RUN_STATUS_ENDED);
  EXPECT_EQ(state.ended().outcome(), "cancelled");
  EXPECT_EQ(state.ended().exit_code(), -SIGKILL) << state.ended().error();
  EXPECT_EQ(ReadAll(RunDir(key) / "got-signal"), "TERM\n");
}

// With a poll interval far past the call deadline, only the wake-ups can end these in time: a
// supervisor's exit wakes the run watcher, and a run's end wakes the stream following it and the
// cancel waiting for it.
TEST_F(AgentTest, RunsEndWhenTheirSupervisorExitsNotAtThePollInterval) {
  StartAgent("", std::chrono::hours(1));
  const pb::RunKey key = Key(5, "followed", 1);
  RunTrial(key, 300);
  // Events are followed at the poll interval: the stream starts once the worker has written the
  // three it writes before waiting for `go`, so that its first read gets them all.
  while (Lines(ReadAll(RunDir(key) / "events.jsonl")).size() < 3) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  pb::StreamEventsRequest request;
  *request.mutable_key() = key;
  grpc::ClientContext context;
  Deadline(&context);
  auto stub = Stub();
  auto reader = stub->StreamEvents(&context, request);
  pb::StreamEventsResponse item;
  // The worker waits for `go` after these three: the stream is waiting on a live run.
  for (int64_t seq = 1; seq <= 3; ++seq) {
    ASSERT_TRUE(reader->Read(&item));
    EXPECT_EQ(item.event().seq(), seq);
  }
  WriteFile(RunDir(key) / "go", "", fs::perms::owner_read | fs::perms::owner_write);
  std::vector<pb::TrialEvent> rest;
  std::optional<pb::RunEnded> ended;
  while (reader->Read(&item)) {
    if (item.has_event()) rest.push_back(item.event());
    if (item.has_ended()) ended = item.ended();
  }
  const grpc::Status finished = reader->Finish();
  ASSERT_TRUE(finished.ok()) << finished.error_message();
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->outcome(), "ok");
  EXPECT_EQ(rest.size(), 3u);

  const pb::RunKey stubborn = Key(5, "stubborn", 1);
  RunTrial(stubborn, 200);
  const fs::path child_file = RunDir(stubborn) / "child.pid";
  while (!fs::exists(child_file)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  pb::CancelRunRequest cancel;
  *cancel.mutable_key() = stubborn;
  pb::RunState state;
  ASSERT_TRUE(Cancel(cancel, &state).ok());
  EXPECT_EQ(state.status(), pb::RUN_STATUS_ENDED);
  EXPECT_EQ(state.ended().outcome(), "cancelled");
}

TEST_F(AgentTest, KilledAgentReadoptsTheRunningWorkerAfterRestart) {
  StartAgentProcess();
  const pb::RunKey key = Key(4, "survivor", 1);
  RunTrial(key, 300);
  const Streamed before = Stream(key, 0, 3);
  ASSERT_EQ(before.events.size(), 3u);

  KillAgentProcess();
  StartAgentProcess();
  WriteFile(RunDir(key) / "go", "", fs::perms::owner_read | fs::perms::owner_write);
  const Streamed after = Stream(key, before.events.back().seq() + 1);
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  ASSERT_TRUE(after.ended.has_value());
  EXPECT_EQ(after.ended->outcome(), "ok");
  std::vector<pb::TrialEvent> all = before.events;
  all.insert(all.end(), after.events.begin(), after.events.end());
  ExpectSameAsFile(all, RunDir(key) / "events.jsonl");
  EXPECT_EQ(all.size(), 6u);
}

TEST_F(AgentTest, ATwoRankTrialRunsThroughTheLauncherAndStreamsEveryRank) {
  StartAgent();
  const pb::RunKey key = Key(5, "ddp", 1);
  RunTrial(key, 0, nullptr, /*ddp_devices=*/2);
  const Streamed streamed = Stream(key, 0);
  ASSERT_TRUE(streamed.status.ok()) << streamed.status.error_message();
  ASSERT_TRUE(streamed.ended.has_value());
  EXPECT_EQ(streamed.ended->outcome(), "ok");
  const std::vector<std::string> argv = Lines(ReadAll(RunDir(key) / "argv"));
  const std::string joined = [&] {
    std::string all;
    for (const std::string& arg : argv) all += arg + " ";
    return all;
  }();
  EXPECT_NE(joined.find("--nproc 2 --master-port 0 --ranks-file " +
                        (RunDir(key) / "ranks.json").string()),
            std::string::npos)
      << joined;
  ASSERT_EQ(streamed.events.size(), 8u);
  ExpectSameAsFile(OfRank(streamed.events, 0), RunDir(key) / "events.jsonl");
  ExpectSameAsFile(OfRank(streamed.events, 1), RunDir(key) / "events.rank1.jsonl");
  EXPECT_EQ(OfRank(streamed.events, 1).back().type(), "result");

  // Each rank resumes from its own seq.
  const Streamed rest = Stream(key, 3, SIZE_MAX, {{1, 4}});
  ASSERT_TRUE(rest.ended.has_value());
  ExpectSameAsFile(OfRank(rest.events, 0), RunDir(key) / "events.jsonl", 3);
  ExpectSameAsFile(OfRank(rest.events, 1), RunDir(key) / "events.rank1.jsonl", 4);
  EXPECT_EQ(rest.events.size(), 3u);
  EXPECT_EQ(Stream(key, 0, SIZE_MAX, {{0, 1}}).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(AgentTest, TheFirstFailedRankDecidesTheOutcomeAndIsNamed) {
  StartAgent();
  const pb::RunKey oom = Key(5, "oom", 1);
  RunTrial(oom, 503, nullptr, /*ddp_devices=*/2);
  const Streamed oom_streamed = Stream(oom, 0);
  ASSERT_TRUE(oom_streamed.ended.has_value());
  EXPECT_EQ(oom_streamed.ended->outcome(), "oom");
  EXPECT_EQ(oom_streamed.ended->exit_code(), 3);
  EXPECT_EQ(oom_streamed.ended->error(), "rank 1 of 2: out of memory at step 1");

  const pb::RunKey killed = Key(5, "killed", 1);
  RunTrial(killed, 600 + SIGSEGV, nullptr, /*ddp_devices=*/2);
  const Streamed killed_streamed = Stream(killed, 0);
  ASSERT_TRUE(killed_streamed.ended.has_value());
  EXPECT_EQ(killed_streamed.ended->outcome(), "failed");
  EXPECT_EQ(killed_streamed.ended->exit_code(), -SIGSEGV);
  EXPECT_THAT(killed_streamed.ended->error(),
              ::testing::StartsWith("rank 1 of 2: killed by SIGSEGV"));

  // After a restart the outcome is decided again from the same files, with the same result.
  server_.reset();
  fs::remove(RunDir(oom) / "ended.json");
  StartAgent();
  const Streamed again = Stream(oom, 0);
  ASSERT_TRUE(again.ended.has_value());
  EXPECT_EQ(again.ended->outcome(), "oom");
  EXPECT_EQ(again.ended->error(), "rank 1 of 2: out of memory at step 1");
}

TEST_F(AgentTest, KilledAgentReadoptsATwoRankRunAndLosesOrRepeatsNoEvent) {
  StartAgentProcess();
  const pb::RunKey key = Key(4, "ddp-survivor", 1);
  RunTrial(key, 300, nullptr, /*ddp_devices=*/2);
  // Some of the 6 events written before `go`, of either rank.
  const Streamed before = Stream(key, 0, 4);
  ASSERT_EQ(before.events.size(), 4u);

  KillAgentProcess();
  StartAgentProcess();
  WriteFile(RunDir(key) / "go", "", fs::perms::owner_read | fs::perms::owner_write);
  // Each rank from the line after the last one received, as the controller resumes.
  std::map<int, int64_t> next = {{0, 1}, {1, 1}};
  for (const pb::TrialEvent& event : before.events) next[event.rank()] = event.seq() + 1;
  const Streamed after = Stream(key, next[0], SIZE_MAX, {{1, next[1]}});
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  ASSERT_TRUE(after.ended.has_value());
  EXPECT_EQ(after.ended->outcome(), "ok");
  std::vector<pb::TrialEvent> all = before.events;
  all.insert(all.end(), after.events.begin(), after.events.end());
  ExpectSameAsFile(OfRank(all, 0), RunDir(key) / "events.jsonl");
  ExpectSameAsFile(OfRank(all, 1), RunDir(key) / "events.rank1.jsonl");
  EXPECT_EQ(all.size(), 12u);
}

TEST_F(AgentTest, RunWhoseSupervisorVanishedIsFailedAfterRestart) {
  StartAgentProcess();
  const pb::RunKey key = Key(4, "orphan", 1);
  RunTrial(key, 300);
  ASSERT_EQ(Stream(key, 0, 3).events.size(), 3u);
  KillAgentProcess();
  const nlohmann::json supervisor = nlohmann::json::parse(ReadAll(RunDir(key) / "supervisor.json"));
  const nlohmann::json worker = nlohmann::json::parse(ReadAll(RunDir(key) / "worker.json"));
  ::kill(supervisor["pid"].get<pid_t>(), SIGKILL);
  while (ProcessStartTime(supervisor["pid"].get<pid_t>()).has_value()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  StartAgentProcess();
  const Streamed streamed = Stream(key, 0);
  ASSERT_TRUE(streamed.ended.has_value());
  EXPECT_EQ(streamed.ended->outcome(), "failed");
  EXPECT_NE(streamed.ended->error().find("worker vanished"), std::string::npos);
  // Nobody would collect the orphaned worker's result: it was stopped.
  EXPECT_FALSE(ProcessStartTime(worker["pid"].get<pid_t>()).has_value());
}

TEST_F(AgentTest, UploadsAreCheckedAndABadOneLeavesNothing) {
  StartAgent();
  const std::string data(3 << 20, 'x');
  const std::string sha = digest::Sha256Hex(data);
  auto upload = [&](const std::string& announced_sha, const std::string& bytes,
                    pb::UploadBlobResponse* response) {
    grpc::ClientContext context;
    Deadline(&context);
    auto stub = Stub();
    auto writer = stub->UploadBlob(&context, response);
    for (size_t offset = 0; offset < bytes.size() || offset == 0; offset += 1 << 20) {
      pb::BlobChunk chunk;
      if (offset == 0) {
        chunk.set_sha256(announced_sha);
        chunk.set_size(static_cast<int64_t>(bytes.size()));
      }
      chunk.set_data(bytes.substr(offset, 1 << 20));
      if (!writer->Write(chunk)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  };
  pb::UploadBlobResponse response;
  std::string corrupted = data;
  corrupted[12345] = 'y';
  EXPECT_EQ(upload(sha, corrupted, &response).error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_TRUE(fs::is_empty(dir_ / "data/cache/blobs"));
  EXPECT_TRUE(fs::is_empty(dir_ / "data/cache/tmp"));
  EXPECT_EQ(upload("not-a-sha", data, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  ASSERT_TRUE(upload(sha, data, &response).ok());
  EXPECT_FALSE(response.already_present());
  EXPECT_EQ(ReadAll(dir_ / "data/cache/blobs" / sha), data);
  ASSERT_TRUE(upload(sha, data, &response).ok());
  EXPECT_TRUE(response.already_present());

  pb::MissingBlobsRequest request;
  request.add_sha256(sha);
  request.add_sha256(digest::Sha256Hex("absent"));
  grpc::ClientContext context;
  Deadline(&context);
  pb::MissingBlobsResponse missing;
  ASSERT_TRUE(Stub()->MissingBlobs(&context, request, &missing).ok());
  ASSERT_EQ(missing.sha256_size(), 1);
  EXPECT_EQ(missing.sha256(0), digest::Sha256Hex("absent"));
}

TEST_F(AgentTest, UnsafeOrIncompleteInputTreesAreRefused) {
  StartAgent();
  auto run_with = [&](const std::string& path, grpc::Status* status) {
    pb::RunTrialRequest request;
    *request.mutable_key() = Key(5, "inputs", 1);
    request.set_config_json("{}");
    pb::InputTree& tree = (*request.mutable_inputs())["data.path"];
    tree.set_is_file(true);
    pb::TreeFile* file = tree.add_files();
    file->set_path(path);
    file->set_sha256(digest::Sha256Hex("data"));
    file->set_size(4);
    tree.set_digest(
        digest::TreeDigest(std::vector<digest::TreeFile>{{path, digest::Sha256Hex("data"), 4}}));
    grpc::ClientContext context;
    Deadline(&context);
    pb::RunState state;
    *status = Stub()->RunTrial(&context, request, &state);
  };
  grpc::Status status;
  run_with("../../etc/passwd", &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find(".."), std::string::npos) << status.error_message();
  run_with("data.jsonl", &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find(digest::Sha256Hex("data")), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ / "data/runs/5")) << "a refused run leaves no directory";
}

TEST_F(AgentTest, ArtifactsComeInChunksWithTheirSha256) {
  StartAgent();
  const pb::RunKey key = Key(6, "art", 1);
  RunTrial(key, 0);
  ASSERT_TRUE(Stream(key, 0).ended.has_value());
  pb::FetchArtifactsRequest request;
  *request.mutable_key() = key;
  grpc::ClientContext context;
  Deadline(&context);
  auto stub = Stub();
  auto reader = stub->FetchArtifacts(&context, request);
  std::map<std::string, std::string> files;
  std::map<std::string, std::string> sha256s;
  std::string current;
  int weight_chunks = 0;
  pb::ArtifactChunk chunk;
  while (reader->Read(&chunk)) {
    EXPECT_LE(chunk.data().size(), size_t{1} << 20);
    if (!chunk.path().empty()) current = chunk.path();
    if (current == "output/adapter/weights.bin") ++weight_chunks;
    files[current] += chunk.data();
    if (chunk.last()) sha256s[current] = chunk.sha256();
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_TRUE(files.count("output/adapter/weights.bin"));
  EXPECT_EQ(files["output/adapter/weights.bin"],
            ReadAll(RunDir(key) / "output/adapter/weights.bin"));
  EXPECT_EQ(files["output/adapter/weights.bin"].size(), 2500000u);
  EXPECT_EQ(weight_chunks, 3);
  for (const char* log : {"events.jsonl", "stderr.log", "stdout.log", "trial.yaml"}) {
    EXPECT_TRUE(files.count(log)) << log;
  }
  for (const auto& [path, bytes] : files)
    EXPECT_EQ(sha256s[path], digest::Sha256Hex(bytes)) << path;
}

TEST_F(AgentTest, NodeInfoAndAuthentication) {
  StartAgent();
  grpc::ClientContext context;
  Deadline(&context);
  pb::NodeInfo info;
  ASSERT_TRUE(Stub()->GetNodeInfo(&context, {}, &info).ok());
  EXPECT_EQ(info.node(), "agent-node1.llmctl");
  ASSERT_GT(info.devices_size(), 0);
  EXPECT_GT(info.host_memory_bytes(), 0);
  EXPECT_GT(info.cpu_count(), 0);
  EXPECT_EQ(info.llmctl_version(), kVersion);
  EXPECT_EQ(info.trainer_version(), "llm-train 0 (LibTorch 2.15.0, no CUDA device)");
  EXPECT_EQ(info.libtorch_version(), "2.15.0");
  EXPECT_EQ(info.libtorch_cuda_version(), "13.2");
  // The driver's versions come from NVML: this machine's, if it has one.
  EXPECT_EQ(info.nvidia_driver_version().empty(), !nvml::OpenNvml().ok());

  auto wrong =
      pb::Agent::NewStub(rpc::Dial(address_, rpc::AgentCertificateName("node1"),
                                   rpc::ChannelCredentials(controller_identity_, "guess")));
  grpc::ClientContext refused;
  Deadline(&refused);
  EXPECT_EQ(wrong->GetNodeInfo(&refused, {}, &info).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  grpc::ClientContext hub;
  Deadline(&hub);
  pb::PrepareHubModelResponse hub_response;
  // An authenticated call reaches the handler, which checks the request (agent_hub_test covers
  // the downloads).
  EXPECT_EQ(Stub()->PrepareHubModel(&hub, {}, &hub_response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// A run of the demo experiment's trial (`config`) by the real trainer, with the data and
// tokenizer uploaded as input trees.
class RealTrainerTest : public AgentTest {
 protected:
  void SetUp() override {
    AgentTest::SetUp();
    llm_train_ = BuildDir() + "/trainer/llm-train";
    if (!fs::exists(llm_train_)) GTEST_SKIP() << llm_train_ << " is not built";
    auto experiment = LoadExperimentFile("experiments/demo.yaml");
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

  // Sets `strategy` over 2 ranks, global batch 8, and `max_steps`.
  void TwoRanks(const std::string& strategy, int64_t max_steps) {
    for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{
             {"strategy", strategy},
             {"devices", "2"},
             {"train.global_batch_size", "8"},
             {"train.max_steps", std::to_string(max_steps)}}) {
      ASSERT_TRUE(config_.SetFromText(name, value).ok()) << name;
    }
  }

  // Streams `key`'s events until every one of `ranks` has taken `steps` steps (the job is under
  // way); the run must not have ended by then.
  Streamed StreamUntilSteps(const pb::RunKey& key, int64_t steps, int ranks = 2) {
    Streamed streamed;
    pb::StreamEventsRequest request;
    *request.mutable_key() = key;
    grpc::ClientContext context;
    Deadline(&context);
    auto stub = Stub();
    auto reader = stub->StreamEvents(&context, request);
    std::map<int, int64_t> taken;
    pb::StreamEventsResponse item;
    while (reader->Read(&item)) {
      if (item.has_ended()) streamed.ended = item.ended();
      if (!item.has_event()) continue;
      streamed.events.push_back(item.event());
      if (item.event().type() == "step") ++taken[item.event().rank()];
      bool all = true;
      for (int rank = 0; rank < ranks; ++rank) all = all && taken[rank] >= steps;
      if (all) break;
    }
    context.TryCancel();
    reader->Finish();
    return streamed;
  }

  std::vector<pid_t> JobPids(const pb::RunKey& key) { return test_support::JobPids(RunDir(key)); }

  // Cancels `key` (plainly) and returns all its events once it ended.
  Streamed CancelAndStream(const pb::RunKey& key) {
    pb::CancelRunRequest request;
    *request.mutable_key() = key;
    pb::RunState state;
    EXPECT_TRUE(Cancel(request, &state).ok());
    return Stream(key, 0);
  }

  // A 2-rank `strategy` trial stopped with `cancel --checkpoint` mid-run ends cancelled with a
  // complete checkpoint of its last complete step; the agent's resume from it continues with the
  // losses of an uninterrupted run.
  void ExpectCheckpointStopResumesExactly(const std::string& strategy);

  std::string llm_train_;
  TrialConfig config_;
};

void RealTrainerTest::ExpectCheckpointStopResumesExactly(const std::string& strategy) {
  StartAgent(llm_train_);
  // The schedule decays to max_steps, so every run here has the same one; none gets that far.
  TwoRanks(strategy, 100000);
  const pb::RunKey key = Key(9, strategy + "-stopped", 1);
  Start(key, 2);
  ASSERT_FALSE(StreamUntilSteps(key, 2).ended.has_value());
  const std::vector<pid_t> pids = JobPids(key);
  pb::CancelRunRequest cancel;
  *cancel.mutable_key() = key;
  cancel.set_checkpoint(true);
  cancel.set_checkpoint_grace_ms(60'000);
  pb::RunState state;
  ASSERT_TRUE(Cancel(cancel, &state).ok());

  const Streamed stopped = Stream(key, 0);
  ASSERT_TRUE(stopped.ended.has_value());
  const std::string stderr_log = ReadAll(RunDir(key) / "stderr.log");
  EXPECT_EQ(stopped.ended->outcome(), "cancelled") << stopped.ended->error() << "\n" << stderr_log;
  EXPECT_EQ(stopped.ended->exit_code(), 5) << stopped.ended->error() << "\n" << stderr_log;
  ExpectGone(pids);
  // Rank 0's result names the checkpoint of the steps it completed.
  const std::vector<pb::TrialEvent> rank0 = OfRank(stopped.events, 0);
  ASSERT_FALSE(rank0.empty());
  ASSERT_EQ(rank0.back().type(), "result") << stderr_log;
  const nlohmann::json result = nlohmann::json::parse(rank0.back().json());
  ASSERT_TRUE(result.contains("checkpoint")) << result.dump() << "\n" << stderr_log;
  const int64_t completed = result["checkpoint"].at("step").get<int64_t>() + 1;
  const fs::path checkpoint = result["checkpoint"].at("path").get<std::string>();
  EXPECT_EQ(checkpoint,
            RunDir(key) / "output" / "checkpoints" / ("step-" + std::to_string(completed)));
  EXPECT_GE(completed, 2);
  EXPECT_EQ(Losses(stopped.events, 0).size(), static_cast<size_t>(completed));
  for (int rank : {0, 1}) {
    ExpectSameAsFile(OfRank(stopped.events, rank), RunDir(key) / RankEventsFile(rank));
  }
  // Complete: the renamed directory (no staging one left) with the state, the model and every
  // optimizer shard.
  for (const char* file : {"trainer_state.json", "model.safetensors", "optimizer.safetensors"}) {
    EXPECT_TRUE(fs::exists(checkpoint / file)) << file;
  }
  EXPECT_EQ(fs::exists(checkpoint / "optimizer.rank1.safetensors"), strategy == "fsdp");
  for (const auto& entry : fs::directory_iterator(checkpoint.parent_path())) {
    EXPECT_EQ(entry.path(), checkpoint) << "only the one checkpoint";
  }

  // Resumed through the agent: two more steps each rank, then a plain cancel.
  const pb::RunKey resumed_key = Key(9, strategy + "-stopped", 2);
  Start(resumed_key, 2, &key, checkpoint.string());
  ASSERT_FALSE(StreamUntilSteps(resumed_key, 2).ended.has_value());
  const Streamed resumed = CancelAndStream(resumed_key);
  ASSERT_TRUE(resumed.ended.has_value());
  EXPECT_EQ(resumed.ended->outcome(), "cancelled") << resumed.ended->error();

  // The uninterrupted run, to past the resumed steps.
  const pb::RunKey whole_key = Key(9, strategy + "-whole", 1);
  Start(whole_key, 2);
  ASSERT_FALSE(StreamUntilSteps(whole_key, completed + 2).ended.has_value());
  const Streamed whole = CancelAndStream(whole_key);
  for (int rank : {0, 1}) {
    const std::map<int64_t, double> all = Losses(whole.events, rank);
    const std::map<int64_t, double> before = Losses(stopped.events, rank);
    const std::map<int64_t, double> after = Losses(resumed.events, rank);
    ASSERT_GE(after.size(), 2u) << "rank " << rank;
    EXPECT_EQ(after.begin()->first, completed) << "rank " << rank;
    for (const auto* part : {&before, &after}) {
      for (const auto& [step, loss] : *part) {
        if (!all.count(step)) continue;  // past the uninterrupted run's cancel
        EXPECT_EQ(loss, all.at(step)) << "rank " << rank << " step " << step;
      }
    }
    for (int64_t step = completed; step < completed + 2; ++step) {
      EXPECT_TRUE(all.count(step) && after.count(step)) << "rank " << rank << " step " << step;
    }
  }
}

// The real trainer on the demo experiment, two steps.
TEST_F(RealTrainerTest, RealLlmTrainRunsTheDemoFromUploadedInputs) {
  StartAgent(llm_train_);
  ASSERT_TRUE(config_.Set("train.max_steps", int64_t{2}).ok());
  const pb::RunKey key = Key(9, "demo", 1);
  Start(key);
  const Streamed streamed = Stream(key, 0);
  ASSERT_TRUE(streamed.ended.has_value());
  EXPECT_EQ(streamed.ended->outcome(), "ok") << streamed.ended->error() << "\n"
                                             << ReadAll(RunDir(key) / "stderr.log");
  ASSERT_FALSE(streamed.events.empty());
  EXPECT_EQ(streamed.events.front().type(), "start");
  EXPECT_EQ(streamed.events.back().type(), "result");
  int steps = 0;
  for (const auto& event : streamed.events) steps += event.type() == "step";
  EXPECT_EQ(steps, 2);
  ExpectSameAsFile(streamed.events, RunDir(key) / "events.jsonl");
  // The token cache went to the agent's cache, not the user's home.
  EXPECT_TRUE(fs::exists(dir_ / "data/cache/tokens"));
}

// strategy: ddp over 2 ranks on the CPU (Gloo), through the agent: both ranks' events arrive, each
// rank's in its file's order, and the run is ok.
TEST_F(RealTrainerTest, ATwoRankDdpTrialEndsOkWithEveryRanksEvents) {
  StartAgent(llm_train_);
  TwoRanks("ddp", /*max_steps=*/2);
  ASSERT_TRUE(config_.SetFromText("snapshot_every", "1").ok());
  const pb::RunKey key = Key(9, "ddp", 1);
  Start(key, 2);
  const Streamed streamed = Stream(key, 0);
  ASSERT_TRUE(streamed.ended.has_value());
  EXPECT_EQ(streamed.ended->outcome(), "ok") << streamed.ended->error() << "\n"
                                             << ReadAll(RunDir(key) / "stderr.log");
  for (int rank : {0, 1}) {
    const std::vector<pb::TrialEvent> events = OfRank(streamed.events, rank);
    ASSERT_FALSE(events.empty()) << "rank " << rank;
    EXPECT_EQ(events.front().type(), "start") << "rank " << rank;
    EXPECT_EQ(nlohmann::json::parse(events.front().json()).value("rank", -1), rank);
    EXPECT_EQ(events.back().type(), "result") << "rank " << rank;
    int steps = 0;
    int snapshots = 0;
    for (const auto& event : events) {
      steps += event.type() == "step";
      snapshots += event.type() == "snapshot";
    }
    EXPECT_EQ(steps, 2) << "rank " << rank;
    EXPECT_GT(snapshots, 0) << "rank " << rank;
    ExpectSameAsFile(events, RunDir(key) / RankEventsFile(rank));
  }
  EXPECT_EQ(OfRank(streamed.events, 2).size(), 0u);
}

// kill -9 of rank 1 mid-run: the launcher stops rank 0, nothing of the job is left, and the
// attempt's outcome names rank 1 (SIGKILL without a result reads as the kernel's OOM killer).
TEST_F(RealTrainerTest, KillingOneRankEndsTheAttemptNamingItWithNoProcessLeft) {
  StartAgent(llm_train_);
  TwoRanks("ddp", /*max_steps=*/100000);
  const pb::RunKey key = Key(9, "ddp-killed", 1);
  Start(key, 2);
  const Streamed first = StreamUntilSteps(key, 1);
  ASSERT_FALSE(first.ended.has_value()) << first.ended->error();
  const std::vector<pid_t> pids = JobPids(key);  // rank 0, rank 1, the launcher
  ASSERT_EQ(pids.size(), 3u);
  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);

  const Streamed streamed = Stream(key, 0);
  ASSERT_TRUE(streamed.ended.has_value());
  EXPECT_EQ(streamed.ended->outcome(), "oom");
  EXPECT_EQ(streamed.ended->exit_code(), -SIGKILL);
  EXPECT_EQ(streamed.ended->error(), "rank 1 of 2: killed by the kernel (host memory)");
  const nlohmann::json after = nlohmann::json::parse(ReadAll(RunDir(key) / "ranks.json"));
  EXPECT_EQ(after.at("first_failure"), (nlohmann::json{{"rank", 1}, {"signal", SIGKILL}}));
  ExpectGone(pids);
}

// A plain cancel of a running 2-rank ddp trial: SIGTERM to the worker's group reaches the launcher
// and both ranks; the attempt ends cancelled, every event either rank wrote is streamed, and
// neither rank nor the launcher is left.
TEST_F(RealTrainerTest, CancellingATwoRankTrialEndsItCancelledWithNoProcessLeft) {
  StartAgent(llm_train_);
  TwoRanks("ddp", 100000);
  const pb::RunKey key = Key(9, "ddp-cancelled", 1);
  Start(key, 2);
  ASSERT_FALSE(StreamUntilSteps(key, 1).ended.has_value());
  const std::vector<pid_t> pids = JobPids(key);
  ASSERT_EQ(pids.size(), 3u);

  pb::CancelRunRequest request;
  *request.mutable_key() = key;
  pb::RunState state;
  ASSERT_TRUE(Cancel(request, &state).ok());
  ASSERT_EQ(state.status(), pb::RUN_STATUS_ENDED);
  EXPECT_EQ(state.ended().outcome(), "cancelled") << state.ended().error();
  const Streamed streamed = Stream(key, 0);
  ASSERT_TRUE(streamed.ended.has_value());
  EXPECT_EQ(streamed.ended->outcome(), "cancelled") << streamed.ended->error();
  ExpectGone(pids);
  for (int rank : {0, 1}) {
    const std::vector<pb::TrialEvent> events = OfRank(streamed.events, rank);
    ASSERT_FALSE(events.empty()) << "rank " << rank;
    EXPECT_EQ(events.front().type(), "start") << "rank " << rank;
    EXPECT_GE(Losses(streamed.events, rank).size(), 1u) << "rank " << rank;
    ExpectSameAsFile(events, RunDir(key) / RankEventsFile(rank));
  }
}

// The ranks stop at one step, whichever of them the signal reached: SIGUSR1 to rank 1 alone (not
// the group) stops both ranks of an fsdp trial, whose checkpoint every rank writes its shard of,
// and the job ends cancelled with that checkpoint.
TEST_F(RealTrainerTest, ACheckpointSignalToOneRankStopsEveryRankAtTheSameStep) {
  StartAgent(llm_train_);
  TwoRanks("fsdp", 100000);
  const pb::RunKey key = Key(9, "fsdp-one-rank", 1);
  Start(key, 2);
  ASSERT_FALSE(StreamUntilSteps(key, 1).ended.has_value());
  const std::vector<pid_t> pids = JobPids(key);
  ASSERT_EQ(::kill(pids[1], SIGUSR1), 0);

  const Streamed streamed = Stream(key, 0);
  ASSERT_TRUE(streamed.ended.has_value());
  const std::string stderr_log = ReadAll(RunDir(key) / "stderr.log");
  EXPECT_EQ(streamed.ended->outcome(), "cancelled") << streamed.ended->error() << "\n"
                                                    << stderr_log;
  EXPECT_EQ(streamed.ended->exit_code(), 5) << stderr_log;
  ExpectGone(pids);
  int64_t stopped_at = -1;
  for (int rank : {0, 1}) {
    const std::vector<pb::TrialEvent> events = OfRank(streamed.events, rank);
    ASSERT_FALSE(events.empty()) << "rank " << rank;
    ASSERT_EQ(events.back().type(), "result") << "rank " << rank << "\n" << stderr_log;
    const nlohmann::json result = nlohmann::json::parse(events.back().json());
    EXPECT_EQ(result.value("outcome", ""), "cancelled") << "rank " << rank << ": " << result.dump();
    // Both ranks completed the same steps.
    const int64_t steps = static_cast<int64_t>(Losses(streamed.events, rank).size());
    if (rank == 0) stopped_at = steps;
    EXPECT_EQ(steps, stopped_at) << "rank " << rank;
    EXPECT_EQ(result.value("error", ""), "cancelled at step " + std::to_string(stopped_at))
        << "rank " << rank;
  }
  const fs::path checkpoint =
      RunDir(key) / "output" / "checkpoints" / ("step-" + std::to_string(stopped_at));
  for (const char* file : {"trainer_state.json", "model.safetensors", "optimizer.safetensors",
                           "optimizer.rank1.safetensors"}) {
    EXPECT_TRUE(fs::exists(checkpoint / file)) << checkpoint / file;
  }
}

TEST_F(RealTrainerTest, ACheckpointStopOfATwoRankDdpTrialResumesExactly) {
  ExpectCheckpointStopResumesExactly("ddp");
}

TEST_F(RealTrainerTest, ACheckpointStopOfATwoRankFsdpTrialResumesExactly) {
  ExpectCheckpointStopResumesExactly("fsdp");
}

}  // namespace
}  // namespace llmctl::agent
