// llm-agent end to end, a run's life: started, streamed (events and device samples), ended with
// its outcome, cancelled, and kept or failed across the agent's restart; and the node's info and
// authentication. Real gRPC over mutual TLS on a unix socket, the real supervisor (the built
// llm-agent binary), a shell script standing in for llm-train, and the real llm-train when it has
// been built. What goes into and out of a run is agent_files_test.cc's; the 2-rank trials are
// agent_ranks_test.cc's.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/agent_test_support.h"
#include "agent/process.h"
#include "agent/sample_line.h"
#include "common/estimate/rate_probe.h"
#include "common/nvml/gpu_probe.h"
#include "common/version.h"
#include "llmctl/v1/agent.grpc.pb.h"
#include "rpc/tls.h"

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;
namespace pb = llmctl::v1;
using namespace test_support;  // NOLINT(build/namespaces): the tests' shared vocabulary

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

// A supervisor writes exit.json and then exits, so its run can end while it still lives: the agent
// that started it reaps it all the same (11-30: a demo's agent kept one zombie supervisor). A 1 ms
// poll interval checks the runs often enough to find exit.json before its supervisor exits.
// The controller's MeasureRates over the agent's API (`llmctl nodes --measure NODE`): the node
// measures again and its next health check reports the new rates, the old ones meanwhile; an
// agent that measures nothing says why.
TEST_F(AgentTest, MeasureRatesMeasuresTheNodeAgainAndItsHealthCheckReportsTheNewRates) {
  const auto measure_rates = [&](pb::MeasureRatesResponse* response) {
    grpc::ClientContext context;
    Deadline(&context);
    return Stub()->MeasureRates(&context, {}, response);
  };
  const auto node_info = [&] {
    grpc::ClientContext context;
    Deadline(&context);
    pb::NodeInfo info;
    EXPECT_TRUE(Stub()->GetNodeInfo(&context, {}, &info).ok());
    return info;
  };
  StartAgent();
  pb::MeasureRatesResponse response;
  grpc::Status status = measure_rates(&response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message(), "this agent measures no rates (LLMCTL_RATE_PROBE=off)");
  server_.reset();

  // A stand-in llm-train whose --probe prints the probe in `probe_file`.
  estimate::RateProbe probe;
  probe.measured_at = "2026-11-29T01:00:00Z";
  probe.device = "cpu";
  probe.device_name = "Test CPU";
  probe.threads = 2;
  probe.matmul = {{"fp32", 512, 5e10}};
  probe.memory_bytes_per_s = 1e10;
  const fs::path probe_file = dir_ / "probe-output.json";
  WriteFile(probe_file, probe.ToJson().dump(), fs::perms::owner_read | fs::perms::owner_write);
  const std::string trainer = (dir_ / "probing-llm-train").string();
  const std::string fake = FakeTrainer();
  WriteFile(trainer,
            "#!/bin/sh\nif [ \"$1\" = --probe ]; then cat '" + probe_file.string() +
                "'; exit 0; fi\n" + fake.substr(fake.find('\n') + 1),
            fs::perms::owner_all);
  AgentOptions options = Options(trainer, std::chrono::milliseconds(20));
  options.measure_rates = true;
  auto server = AgentServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  server_ = std::move(*server);
  // Whether the health check comes to report settled rates of `memory` (within 20 s): no probe
  // underway, and no note.
  const auto reported_memory = [&](double memory) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
      const pb::NodeInfo info = node_info();
      if (!info.rate_probe_underway() && !info.rate_probe_json().empty() &&
          info.rate_probe_pending().empty()) {
        const StatusOr<estimate::RateProbe> reported =
            estimate::RateProbe::FromJson(nlohmann::json::parse(info.rate_probe_json()));
        if (reported.ok() && reported->memory_bytes_per_s == memory) return true;
      }
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
  ASSERT_TRUE(reported_memory(1e10));

  probe.memory_bytes_per_s = 2e10;
  WriteFile(probe_file, probe.ToJson().dump(), fs::perms::owner_read | fs::perms::owner_write);
  status = measure_rates(&response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.pending(), "measuring");
  // Underway from the answer on, and the first report that is not has the new rates: the
  // controller's `--wait` stops on it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  pb::NodeInfo info = node_info();
  while (info.rate_probe_underway() && std::chrono::steady_clock::now() < deadline) {
    EXPECT_TRUE(info.rate_probe_pending() == "measuring" ||
                info.rate_probe_pending().starts_with("waiting"))
        << info.rate_probe_pending();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    info = node_info();
  }
  EXPECT_FALSE(info.rate_probe_underway());
  EXPECT_EQ(info.rate_probe_pending(), "");
  const StatusOr<estimate::RateProbe> measured =
      estimate::RateProbe::FromJson(nlohmann::json::parse(info.rate_probe_json()));
  ASSERT_TRUE(measured.ok()) << measured.status().ToString();
  EXPECT_EQ(measured->memory_bytes_per_s, 2e10);
}

TEST_F(AgentTest, EveryEndedRunsSupervisorIsReaped) {
  StartAgent("", std::chrono::milliseconds(1));
  std::vector<pb::RunKey> keys;
  for (int i = 0; i < 6; ++i) {
    keys.push_back(Key(8, "reaped-" + std::to_string(i), 1));
    RunTrial(keys.back(), 0);
  }
  for (const pb::RunKey& key : keys) {
    const Streamed streamed = Stream(key, 0);
    ASSERT_TRUE(streamed.ended.has_value()) << key.trial();
    EXPECT_EQ(streamed.ended->outcome(), "ok");
    const nlohmann::json supervisor =
        nlohmann::json::parse(ReadAll(RunDir(key) / "supervisor.json"));
    const pid_t pid = supervisor["pid"].get<pid_t>();
    // A zombie keeps its /proc entry: gone means reaped. The wait is for the reaping, bounded.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (ProcessStartTime(pid).has_value() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_FALSE(ProcessStartTime(pid).has_value()) << key.trial() << ": supervisor " << pid;
  }
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
      // The host's OOM kill count does not rise for the worker's own SIGKILL.
      {100 + SIGKILL, "failed", -SIGKILL, "killed by SIGKILL, not by the kernel's out-of-memory"},
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
  const fs::path worker_file = RunDir(key) / "worker.json";
  // The fake writes child.pid once its child runs, and the supervisor worker.json (atomically)
  // once the worker started, in either order; the wait is for the files, not for a time.
  while (!fs::exists(child_file) || !fs::exists(worker_file)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const pid_t child = std::stoi(ReadAll(child_file));
  const nlohmann::json worker = nlohmann::json::parse(ReadAll(worker_file));
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

// A worker stuck writing its checkpoint keeps the node's devices until the checkpoint's grace
// ends, unless a plain cancel comes: then it goes within the plain cancel's grace.
TEST_F(AgentTest, APlainCancelEndsARunStuckInACheckpointingCancel) {
  StartAgent();  // cancel grace 300 ms
  const pb::RunKey key = Key(3, "stuck", 1);
  StartSignalRecorder(key, 410);
  pb::CancelRunRequest checkpointing;
  *checkpointing.mutable_key() = key;
  checkpointing.set_checkpoint(true);
  checkpointing.set_checkpoint_grace_ms(600'000);
  pb::RunState state;
  ASSERT_TRUE(Cancel(checkpointing, &state).ok());
  while (ReadAll(RunDir(key) / "got-signal") != "USR1\n") {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  pb::CancelRunRequest plain;
  *plain.mutable_key() = key;
  ASSERT_TRUE(Cancel(plain, &state).ok());
  ASSERT_EQ(state.status(), pb::RUN_STATUS_ENDED);
  EXPECT_EQ(state.ended().outcome(), "cancelled");
  EXPECT_EQ(state.ended().exit_code(), -SIGKILL) << state.ended().error();
  EXPECT_EQ(ReadAll(RunDir(key) / "got-signal"), "USR1\nTERM\n");
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

// A caller that asks for batch_events gets the lines read at once as one item, from its from_seq
// on, and never a single `event`; the run's end still comes last.
TEST_F(AgentTest, BatchedEventsComeAsTheLinesReadAtOnce) {
  StartAgent("", std::chrono::hours(1));
  const pb::RunKey key = Key(6, "batched", 1);
  RunTrial(key, 300);
  while (Lines(ReadAll(RunDir(key) / "events.jsonl")).size() < 3) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  pb::StreamEventsRequest request;
  *request.mutable_key() = key;
  request.set_from_seq(2);
  request.set_batch_events(true);
  grpc::ClientContext context;
  Deadline(&context);
  auto stub = Stub();
  auto reader = stub->StreamEvents(&context, request);
  pb::StreamEventsResponse item;
  // The three lines the worker wrote before waiting for `go`, read at once, from line 2.
  ASSERT_TRUE(reader->Read(&item));
  ASSERT_TRUE(item.has_events());
  ASSERT_EQ(item.events().events_size(), 2);
  EXPECT_EQ(item.events().events(0).seq(), 2);
  EXPECT_EQ(item.events().events(1).seq(), 3);
  WriteFile(RunDir(key) / "go", "", fs::perms::owner_read | fs::perms::owner_write);
  std::vector<int64_t> seqs;
  bool ended = false;
  while (reader->Read(&item)) {
    EXPECT_FALSE(item.has_event());
    EXPECT_FALSE(ended) << "nothing after the end";
    for (const pb::TrialEvent& event : item.events().events()) seqs.push_back(event.seq());
    ended = ended || item.has_ended();
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_TRUE(ended);
  EXPECT_EQ(seqs, (std::vector<int64_t>{4, 5, 6}));
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

// What the agent makes is its user's alone whatever the umask: under umask 000 its socket was
// 0777 (any local user could call it; only the token stood between them and RunTrial) and its data,
// runs and run directories 0777 (any user could plant or change a run's files). The socket is 0700,
// bound under umask 077 (rpc::BuildAndStartServer): connecting takes its write permission, the
// owner's alone.
TEST_F(AgentTest, ItsSocketAndDirectoriesAreItsUsersAloneUnderAnOpenUmask) {
  const mode_t umask = ::umask(0);
  StartAgent();
  const pb::RunKey key = Key(9, "open-umask", 1);
  RunTrial(key, 0);
  ::umask(umask);
  const auto mode = [](const fs::path& path) {
    struct stat info {};
    EXPECT_EQ(::lstat(path.c_str(), &info), 0) << path;
    return info.st_mode & 07777;
  };
  EXPECT_EQ(mode(dir_ / "agent.sock"), 0700u);
  for (const fs::path& dir :
       {dir_ / "data", dir_ / "data/runs", dir_ / "data/runs/9", dir_ / "data/runs/9/open-umask",
        dir_ / "data/runs/9/open-umask/1", dir_ / "data/runs/9/open-umask/1/output"}) {
    EXPECT_EQ(mode(dir), 0700u) << dir;
  }
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
  EXPECT_EQ(
      info.trainer_version(),
      std::string("llm-train ").append(kVersion).append(" (LibTorch 2.15.0, no CUDA device)"));
  EXPECT_EQ(info.unusable(), "");
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

// An llm-train of another llmctl release (a node bundle shipped without its own, or one of the two
// rebuilt) reads a trial's settings by that release's rules: the node info says the node takes no
// trial, and RunTrial refuses, naming both versions and the fix.
TEST_F(AgentTest, AnLlmTrainOfAnotherVersionTakesNoTrial) {
  const std::string other = (dir_ / "other-llm-train").string();
  WriteFile(other, FakeTrainer("0.3.9"), fs::perms::owner_all);
  StartAgent(other);
  const std::string version(kVersion);
  const std::string reason = "its llm-train (" + other + ") is llmctl 0.3.9, its agent llmctl " +
                             version +
                             "; they must be the same version, so no trial runs there: install "
                             "llmctl " +
                             version +
                             "'s llm-train there and restart the agent (the embedded one: llmctl "
                             "daemon stop)";
  grpc::ClientContext context;
  Deadline(&context);
  pb::NodeInfo info;
  ASSERT_TRUE(Stub()->GetNodeInfo(&context, {}, &info).ok());
  EXPECT_EQ(info.unusable(), reason);

  grpc::Status refused;
  RunTrial(Key(1, "t", 1), 0, &refused);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(refused.error_message(), "RunTrial: " + reason);
  grpc::ClientContext list;
  Deadline(&list);
  pb::ListRunsResponse runs;
  ASSERT_TRUE(Stub()->ListRuns(&list, {}, &runs).ok());
  EXPECT_EQ(runs.runs_size(), 0);
}

// The real trainer's one-process runs; agent_ranks_test.cc has its 2-rank ones.
using RealTrainerTest = RealTrainerFixture;

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

}  // namespace
}  // namespace llmctl::agent
