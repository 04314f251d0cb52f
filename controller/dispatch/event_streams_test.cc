// Following running attempts: dropped streams reopened from the last stored seq (after a backoff on
// the monotonic clock), device samples, idempotent storage, a restarted controller resuming where
// the store ends; only the store's fence settling a stream, the agent's refusals read again, and
// an attempt whose agent does not know the run or keeps refusing it lost; OutcomeState.
#include "controller/dispatch/event_streams.h"

#include <gtest/gtest.h>

#include "controller/blob_store.h"
#include "controller/change_notifier.h"
#include "controller/dispatch/agent_links.h"
#include "controller/dispatch/artifacts.h"
#include "controller/dispatch/checkpoint_copy.h"
#include "controller/dispatch/dispatch_test_support.h"
#include "controller/store/refusing_vfs.h"

namespace llmctl::controller::dispatch_test {
namespace {

using EventStreamsTest = DispatcherTest;

// The controller's database file stops taking writes when a test says so (RefusingVfs).
class EventStreamsStorageTest : public DispatcherTest {
 protected:
  // Once a write was refused and the stream stopped, the database takes writes again.
  void AcceptOnceTheStreamStopped() {
    ASSERT_TRUE(Eventually(
        [&] { return vfs_.RefusedWrites() > 0 && daemon_->dispatcher().ActiveStreams() == 0; }));
    vfs_.Accept();
  }

  // Registered before SetUp opens the store, so the store writes through it.
  store::test_support::RefusingVfs vfs_;
};

// Device sample `seq` of a GPU, a second apart.
v1::DeviceSample GpuSample(int64_t seq, const std::string& device = "cuda:0") {
  v1::DeviceSample sample;
  sample.set_seq(seq);
  sample.set_unix_ms(1'700'000'000'000 + 1000 * seq);
  sample.set_device(device);
  sample.set_utilization_percent(40 + seq);
  sample.set_memory_used_bytes(seq << 30);
  sample.set_memory_total_bytes(int64_t{80} << 30);
  sample.set_temperature_celsius(60);
  return sample;
}

TEST_F(EventStreamsTest, ADroppedStreamResumesFromTheLastStoredSeqAfterTheBackoff) {
  agent_state_.script = {StepLine(0), StepLine(1), StepLine(2), StepLine(3), kResultLine};
  agent_state_.drop_after = 2;
  const int64_t experiment = SubmitOne();
  Tick();
  const store::TrialRecord trial = OnlyTrial(experiment);
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));
  EXPECT_EQ(StoredEvents(trial.id, 1), 2);

  Tick();  // within the backoff: no new stream
  EXPECT_EQ(agent_state_.stream_from_seqs, std::vector<int64_t>{1});
  clock_.Advance(seconds(1));
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(agent_state_.stream_from_seqs, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(StoredEvents(trial.id, 1), 5);
  EXPECT_EQ(*daemon_->store().LastSeq(trial.id, 1), 5);
}

// The backoff runs on the monotonic clock: the wall clock stepped an hour back does not hold the
// reopening up for the hour.
TEST_F(EventStreamsTest, ADroppedStreamIsReopenedAfterTheBackoffThoughTheWallClockSteppedBack) {
  agent_state_.script = {StepLine(0), StepLine(1), kResultLine};
  agent_state_.drop_after = 2;
  const int64_t experiment = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));

  clock_.StepWallClock(-std::chrono::hours(1));
  clock_.Advance(seconds(1));
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(agent_state_.stream_from_seqs, (std::vector<int64_t>{1, 3}));
}

TEST_F(EventStreamsTest, EveryRanksEventsAreStoredOnceAndEachRankResumesAfterItsLastStored) {
  // A 2-rank run: the stream drops after 3 events (rank 0's 1 and 2, rank 1's 1).
  agent_state_.script = {StepLine(0), StepLine(1), StepLine(2), kResultLine};
  agent_state_.rank1_script = {StepLine(0), StepLine(1), StepLine(2), kResultLine};
  agent_state_.drop_after = 3;
  const int64_t experiment = SubmitOne("llmctl-demo",
                                       "trials:\n  - {name: ddp, set: {devices: 2, strategy: ddp, "
                                       "train: {global_batch_size: 4}}}\n");
  Tick();
  const store::TrialRecord trial = OnlyTrial(experiment);
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));
  EXPECT_EQ(*daemon_->store().LastSeq(trial.id, 1), 2);
  EXPECT_EQ(daemon_->store().LastRankSeqs(trial.id, 1)->at(1), 1);
  clock_.Advance(seconds(1));
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  // The second stream asks each rank for what the store lacks of it.
  EXPECT_EQ(agent_state_.stream_from_seqs, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(agent_state_.stream_from_rank1_seqs, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(*daemon_->store().LastSeq(trial.id, 1), 4);
  EXPECT_EQ(daemon_->store().LastRankSeqs(trial.id, 1)->at(1), 4);
  EXPECT_EQ(StoredEvents(trial.id, 1), 4);  // rank 0's, as before
}

TEST_F(EventStreamsTest, LinesOfRanksTheNodeDoesNotRunAreDropped) {
  // A one-rank trial whose agent also sends lines as rank 1: stored, they would hold the places
  // (rank 1, seq 1..) that the real rank 1 of a node that runs it fills.
  agent_state_.script = {StepLine(0), StepLine(1), kResultLine};
  agent_state_.rank1_script = {StepLine(0), kResultLine};
  const int64_t experiment = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  const store::TrialRecord trial = OnlyTrial(experiment);
  EXPECT_EQ(StoredEvents(trial.id, 1), 3);
  EXPECT_TRUE(daemon_->store().LastRankSeqs(trial.id, 1)->empty());
}

TEST_F(EventStreamsTest, AMessageOfMoreLinesThanAnAgentSendsIsRefusedWhole) {
  // 513 lines in one message: each would cost the store a row (a refused_line's where the agent
  // sent 2 bytes), so the message is refused and nothing of it stored.
  agent_state_.one_batch = true;
  agent_state_.script.assign(513, StepLine(0));
  const int64_t experiment = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));
  EXPECT_EQ(StoredEvents(OnlyTrial(experiment).id, 1), 0);
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kRunning);
}

// A stream whose messages keep being refused (a full disk's store, or an agent's oversized
// message) stores nothing each time it is read: its backoff doubles (1 s, 2 s, ...) instead of
// starting over at 1 s because a message came, which reopened it and warned every second.
TEST_F(EventStreamsTest, AStreamWhoseMessagesKeepBeingRefusedBacksOffLongerEachTime) {
  agent_state_.one_batch = true;
  agent_state_.script.assign(513, StepLine(0));
  const auto streams_opened = [&] {
    std::lock_guard lock(agent_state_.mutex);
    return agent_state_.stream_from_seqs.size();
  };
  SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));
  clock_.Advance(seconds(1));
  Tick();
  ASSERT_TRUE(Eventually([&] { return streams_opened() == 2; }));
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));

  clock_.Advance(seconds(1));  // within the second backoff, of 2 s
  Tick();
  EXPECT_EQ(daemon_->dispatcher().ActiveStreams(), 0);
  EXPECT_EQ(streams_opened(), 2u);
  clock_.Advance(seconds(1));
  Tick();
  ASSERT_TRUE(Eventually([&] { return streams_opened() == 3; }));
}

// A database file that cannot be written for a while (made read-only, removed, on a filesystem
// remounted read-only) is no fence: the stream is read again after its backoff and stores what
// was refused once the file takes writes again. SQLite's READONLY was FailedPrecondition, taken
// for a fenced-off attempt, and the trial's events were no longer recorded until a restart.
TEST_F(EventStreamsStorageTest, EventsAStoreCouldNotWriteAreStoredWhenTheStreamIsReadAgain) {
  const int64_t experiment = SubmitOneThatKeepsRunning();
  const int64_t trial = OnlyTrial(experiment).id;
  vfs_.Refuse(SQLITE_READONLY);
  agent_state_.AddLinesAndEnd(std::to_string(experiment) + "/one#1", {StepLine(1), kResultLine},
                              "ok");
  AcceptOnceTheStreamStopped();
  EXPECT_EQ(StoredEvents(trial, 1), 1);

  clock_.Advance(seconds(1));
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(StoredEvents(trial, 1), 3);
  EXPECT_EQ(agent_state_.stream_from_seqs, (std::vector<int64_t>{1, 2}));
}

// A batch of device samples the store cannot write (an I/O error) is read again with the stream,
// as on a full disk, where it was dropped: only a batch refused for a bad reading is.
TEST_F(EventStreamsStorageTest, DeviceSamplesAStoreCouldNotWriteAreStoredWhenTheStreamIsReadAgain) {
  agent_state_.drop_after = 1;  // the first stream breaks after its first line
  const int64_t experiment = SubmitOneThatKeepsRunning();
  const int64_t trial = OnlyTrial(experiment).id;
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));
  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.samples = {GpuSample(1), GpuSample(2), GpuSample(3)};
  }
  vfs_.Refuse(SQLITE_IOERR_WRITE);
  clock_.Advance(seconds(1));
  Tick();  // the second stream sends the samples first
  AcceptOnceTheStreamStopped();
  EXPECT_EQ(*daemon_->store().LastDeviceSampleSeq(trial, 1), 0);

  clock_.Advance(seconds(2));  // that read stored nothing: its backoff doubled
  Tick();
  ASSERT_TRUE(Eventually([&] { return *daemon_->store().LastDeviceSampleSeq(trial, 1) == 3; }));
  EXPECT_EQ(agent_state_.stream_from_sample_seqs, (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(daemon_->store().DeviceSamples(experiment, "one")->size(), 3u);
  agent_state_.AddLinesAndEnd(std::to_string(experiment) + "/one#1", {kResultLine}, "ok");
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
}

// A fenced-off attempt (declared lost while its stream still read) stores nothing more: its
// stream stops at the first refusal.
TEST_F(EventStreamsTest, AFencedOffAttemptsStreamStops) {
  const int64_t experiment = SubmitOneThatKeepsRunning();
  const int64_t trial = OnlyTrial(experiment).id;
  ASSERT_TRUE(daemon_->store().MarkAttemptLost(trial, 1, clock_.Now()).ok());
  agent_state_.AddLinesAndEnd(std::to_string(experiment) + "/one#1", {StepLine(1), kResultLine},
                              "ok");
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));
  EXPECT_EQ(StoredEvents(trial, 1), 1);
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
}

// The agent's FAILED_PRECONDITION is its own state, not the store's fence: it was taken for one
// (store::IsFence of whatever the stream ended with), the stream was never read again, and the
// run's events and end never reached the store, the trial left running for good.
TEST_F(EventStreamsTest, AStreamTheAgentRefusedWithFailedPreconditionIsReadAgainToTheRunsEnd) {
  agent_state_.stream_results = {
      grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "the agent is not ready")};
  const int64_t experiment = SubmitOne();
  Tick();
  const store::TrialRecord trial = OnlyTrial(experiment);
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));
  EXPECT_EQ(StoredEvents(trial.id, 1), 0);

  clock_.Advance(seconds(1));
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(agent_state_.stream_from_seqs, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(StoredEvents(trial.id, 1), 3);
  EXPECT_EQ(OnlyTrial(experiment).current_attempt, 1);
}

// An agent that answers its health checks but turns the stream away every time (one of another
// llmctl version, say) cannot be followed: after requeue_after (60 s here) of nothing but refusals
// the attempt is lost, as if its agent were silent, and the trial runs again as attempt 2.
TEST_F(EventStreamsTest, AnAttemptWhoseAgentKeepsRefusingItsStreamIsLostAfterRequeueAfter) {
  agent_state_.stream_results.assign(
      100, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this agent is llmctl 0.3.9"));
  const int64_t experiment = SubmitOne();
  Tick();  // the first refusal
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));
  for (int refused_for = 4; refused_for < 60; refused_for += 4) {
    clock_.Advance(seconds(4));
    Tick();
    ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));
    ASSERT_EQ(OnlyTrial(experiment).state, store::TrialState::kRunning) << refused_for << " s";
  }
  {
    std::lock_guard lock(agent_state_.mutex);
    EXPECT_EQ(agent_state_.stream_from_seqs.size(), 15u) << "read again at each round";
    agent_state_.stream_results.clear();  // attempt 2's stream is taken
  }
  clock_.Advance(seconds(4));  // refused for 60 s
  Tick();                      // attempt 1 lost; its CancelRun is made off the round thread
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().LostRunCancelsInFlight() == 0; }));
  Tick();  // its run has ended: attempt 2 takes its device
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(OnlyTrial(experiment).current_attempt, 2);
  EXPECT_EQ(
      daemon_->store()
          .FinishAttempt(OnlyTrial(experiment).id, 1, store::TrialState::kOk, 0, "", clock_.Now())
          .code(),
      StatusCode::kFailedPrecondition)
      << "attempt 1 is fenced off";
}

// An attempt lost because its agent, which still answers, kept refusing its stream may still run
// there: it is asked to stop (CancelRun), and the next attempt does not take its devices (the
// node's one) until the agent confirms the run ended. Before, only a multi-node attempt's runs
// were stopped, and attempt 2 started beside the still running attempt 1 at once.
TEST_F(EventStreamsTest, AnAttemptLostThroughARefusedStreamIsStoppedBeforeItsDevicesTakeTheNext) {
  agent_state_.stream_results.assign(
      100, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this agent is llmctl 0.3.9"));
  agent_state_.script_ends = false;     // attempt 1's worker goes on
  agent_state_.cancels_before_end = 1;  // and is still stopping when the first CancelRun answers
  const int64_t experiment = SubmitOne();
  const std::string attempt1 = std::to_string(experiment) + "/one#1";
  const std::string attempt2 = std::to_string(experiment) + "/one#2";
  Tick();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));
  ASSERT_NO_FATAL_FAILURE(TickWhileTheStreamIsRefusedForRequeueAfter());
  // Lost after requeue_after (60 s), and queued again: attempt 1's run still holds the node's
  // device.
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().LostRunCancelsInFlight() == 0; }));
  {
    std::lock_guard lock(agent_state_.mutex);
    EXPECT_EQ(agent_state_.cancelled, std::vector<std::string>{attempt1});
    EXPECT_FALSE(agent_state_.runs.at(attempt1).ended);
    EXPECT_FALSE(agent_state_.runs.contains(attempt2));
    agent_state_.stream_results.clear();  // attempt 2's stream is taken
    agent_state_.script_ends = true;
  }

  clock_.Advance(seconds(1));
  Tick();  // asked again: it has ended
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().LostRunCancelsInFlight() == 0; }));
  Tick();  // attempt 2 takes the device
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(OnlyTrial(experiment).current_attempt, 2);
  std::lock_guard lock(agent_state_.mutex);
  EXPECT_EQ(agent_state_.cancelled, (std::vector<std::string>{attempt1, attempt1}));
  EXPECT_TRUE(agent_state_.runs.at(attempt1).ended);
}

// An agent that no longer knows a run while its link stayed up (its state lost between two health
// checks, so no reconnect lists its runs) answers the stream NOT_FOUND: its runs are listed at the
// next round, and the attempt is lost and runs again, as for an agent back without the run. The
// stream was read again every backoff, for good.
TEST_F(EventStreamsTest, AnAgentThatNoLongerKnowsTheRunHasItRequeuedAtTheNextRound) {
  agent_state_.drop_after = 1;  // the first stream breaks after its line
  const int64_t experiment = SubmitOneThatKeepsRunning();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));
  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.runs.clear();
    agent_state_.script = {StepLine(0), kResultLine};
    agent_state_.script_ends = true;
  }
  clock_.Advance(seconds(1));
  Tick();  // read again: NOT_FOUND
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));
  EXPECT_EQ(OnlyTrial(experiment).current_attempt, 1);

  clock_.Advance(seconds(1));  // before the next health check
  Tick();  // attempt 1 lost; its CancelRun (NOT_FOUND) is made off the round thread
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().LostRunCancelsInFlight() == 0; }));
  Tick();  // attempt 1 holds no device: attempt 2 takes it
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(OnlyTrial(experiment).current_attempt, 2);
}

// The store's fence still settles a stream for good. Rounds that still list its attempt as running
// (it was declared lost after they listed it) do not read it again: EventStreams is driven here
// directly with that listing, against an agent of its own.
TEST_F(EventStreamsTest, TheStoresFenceSettlesAStreamForGood) {
  const int64_t experiment = SubmitOne();
  const store::TrialRecord trial = OnlyTrial(experiment);
  ASSERT_TRUE(daemon_->store().StartAttempt(trial.id, "n1", clock_.Now(), {0}).ok());
  const StatusOr<std::vector<store::RunningAttempt>> running =
      daemon_->store().ListRunningAttempts();
  ASSERT_TRUE(running.ok() && running->size() == 1);
  ASSERT_TRUE(daemon_->store().MarkAttemptLost(trial.id, 1, clock_.Now()).ok());

  FakeAgentState state;
  {
    FakeAgentState::Run& run = state.runs[std::to_string(experiment) + "/one#1"];
    run.request.mutable_key()->set_experiment_id(experiment);
    run.request.mutable_key()->set_trial(trial.name);
    run.request.mutable_key()->set_attempt(1);
    run.lines = {StepLine(0)};
  }
  FakeAgent service(state);
  const std::string address = "unix:" + root_ + "/direct-agent.sock";
  const std::unique_ptr<grpc::Server> agent = ServeAgentInsecurely(service, address);
  ASSERT_NE(agent, nullptr);
  auto blobs = BlobStore::Open(root_ + "/direct");
  ASSERT_TRUE(blobs.ok()) << blobs.status().ToString();
  ChangeNotifier changes;
  DispatcherOptions options;
  options.backoff_initial = seconds(1);
  options.backoff_max = seconds(4);
  dispatch::DispatcherCore core(daemon_->store(), **blobs, clock_, changes, options);
  dispatch::AgentLinks links(core, [&](const store::NodeRecord&) -> StatusOr<AgentChannel> {
    return AgentChannel{grpc::CreateChannel(address, grpc::InsecureChannelCredentials()), ""};
  });
  dispatch::ArtifactFetcher artifacts(core, links);
  dispatch::CheckpointCopies checkpoints(core, artifacts);
  dispatch::EventStreams streams(core, links, checkpoints);
  struct StopAtEnd {  // joins the readers and checks however the test ends
    dispatch::EventStreams& streams;
    dispatch::AgentLinks& links;
    ~StopAtEnd() {
      streams.StopAll();
      links.Stop();
    }
  } stop_at_end{streams, links};
  store::NodeRecord node;
  node.name = "n1";
  node.address = address;
  links.CheckNodes({node}, clock_.Now(), clock_.Monotonic());
  const auto streams_opened = [&] {
    std::lock_guard lock(state.mutex);
    return state.stream_from_seqs.size();
  };

  streams.Follow(*running, clock_.Monotonic());
  ASSERT_TRUE(Eventually([&] { return streams_opened() == 1 && streams.Active() == 0; }));
  EXPECT_EQ(StoredEvents(trial.id, 1), 0) << "its line was refused";
  for (int round = 0; round < 3; ++round) {
    clock_.Advance(seconds(5));
    streams.Follow(*running, clock_.Monotonic());
    EXPECT_EQ(streams.Active(), 0);
  }
  EXPECT_EQ(streams_opened(), 1u) << "never read again";
  EXPECT_TRUE(streams.RefusedRuns(*running, clock_.Monotonic()).empty());
}

TEST_F(EventStreamsTest, DeviceSamplesAreStoredOnceAndAStreamResumesAfterTheLastStored) {
  agent_state_.samples = {GpuSample(1), GpuSample(2), GpuSample(3)};
  agent_state_.script = {StepLine(0), StepLine(1), StepLine(2), kResultLine};
  agent_state_.drop_after = 2;
  const int64_t experiment = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));
  EXPECT_EQ(agent_state_.stream_from_sample_seqs, std::vector<int64_t>{1});
  EXPECT_EQ(*daemon_->store().LastDeviceSampleSeq(OnlyTrial(experiment).id, 1), 3);
  clock_.Advance(seconds(1));
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  // The second stream asks for what the store lacks: nothing is stored twice.
  EXPECT_EQ(agent_state_.stream_from_sample_seqs, (std::vector<int64_t>{1, 4}));
  StatusOr<std::vector<store::DeviceSample>> stored =
      daemon_->store().DeviceSamples(experiment, "one");
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  ASSERT_EQ(stored->size(), 3u);
  for (int64_t seq = 1; seq <= 3; ++seq) {
    const store::DeviceSample& sample = (*stored)[seq - 1];
    EXPECT_EQ(sample.attempt, 1);
    EXPECT_EQ(sample.device, "cuda:0");
    EXPECT_EQ(sample.time, store::Time(milliseconds(1'700'000'000'000 + 1000 * seq)));
    EXPECT_EQ(sample.utilization_percent, 40.0 + seq);
    EXPECT_EQ(sample.memory_used_bytes, seq << 30);
    EXPECT_EQ(sample.memory_total_bytes, int64_t{80} << 30);
    EXPECT_FALSE(sample.power_watts.has_value());
    EXPECT_EQ(sample.temperature_celsius, 60.0);
  }
}

TEST_F(EventStreamsTest, ASampleDatedFarPastTheControllersClockIsDropped) {
  // The controller's clock reads 1,700,000,000 s; the second reading claims a day later.
  v1::DeviceSample tomorrow = GpuSample(2);
  tomorrow.set_unix_ms(1'700'086'400'000);
  agent_state_.samples = {GpuSample(1), tomorrow, GpuSample(3)};
  const int64_t experiment = SubmitOneThatKeepsRunning();
  const int64_t trial = OnlyTrial(experiment).id;
  ASSERT_TRUE(Eventually([&] { return *daemon_->store().LastDeviceSampleSeq(trial, 1) == 3; }));
  StatusOr<std::vector<store::DeviceSample>> stored =
      daemon_->store().DeviceSamples(experiment, "one");
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->size(), 2u);
  EXPECT_EQ((*stored)[0].time, store::Time(milliseconds(1'700'000'001'000)));
  EXPECT_EQ((*stored)[1].time, store::Time(milliseconds(1'700'000'003'000)));
  // The newest reading a watcher sees is the true one.
  const std::vector<store::DeviceSample> latest = *daemon_->store().LatestDeviceSamples(trial, 1);
  ASSERT_EQ(latest.size(), 1u);
  EXPECT_EQ(latest[0].time, store::Time(milliseconds(1'700'000'003'000)));
  agent_state_.AddLinesAndEnd(std::to_string(experiment) + "/one#1", {kResultLine}, "ok");
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
}

// The trial holds device 0 of its node (a CPU trial: its host, "cpu", and index 0): samples of
// those two names are its, and a made-up name ("cuda:7", which it does not hold, or "disk") is
// dropped, so that no agent can grow its rows and every status without bound.
TEST_F(EventStreamsTest, ARunningTrialsStatusCarriesEachDevicesLatestSample) {
  agent_state_.samples = {GpuSample(1, "cpu"),    GpuSample(2, "cuda:0"), GpuSample(3, "cpu"),
                          GpuSample(4, "cuda:0"), GpuSample(5, "cuda:7"), GpuSample(6, "disk"),
                          GpuSample(7, "cuda:00")};
  const int64_t experiment = SubmitOneThatKeepsRunning();
  ASSERT_TRUE(Eventually([&] {
    return *daemon_->store().LastDeviceSampleSeq(OnlyTrial(experiment).id, 1) == 4 &&
           StatusOf(experiment).trials(0).devices_size() == 2;
  }));
  const v1::TrialStatus trial = StatusOf(experiment).trials(0);
  EXPECT_EQ(trial.devices(0).device(), "cpu");
  EXPECT_EQ(trial.devices(0).utilization_percent(), 43);
  EXPECT_EQ(trial.devices(0).memory_used_bytes(), int64_t{3} << 30);
  EXPECT_EQ(trial.devices(1).device(), "cuda:0");
  EXPECT_EQ(trial.devices(1).memory_used_bytes(), int64_t{4} << 30);
  EXPECT_FALSE(trial.devices(1).has_power_watts());
  EXPECT_EQ(trial.devices(1).temperature_celsius(), 60);
  // Once it has ended, no bars: the samples stay in the store for the report.
  agent_state_.AddLinesAndEnd(std::to_string(experiment) + "/one#1", {kResultLine}, "ok");
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(StatusOf(experiment).trials(0).devices_size(), 0);
  EXPECT_EQ(daemon_->store().DeviceSamples(experiment, "one")->size(), 4u);
}

TEST_F(EventStreamsTest, EventsSentTwiceAreStoredOnce) {
  agent_state_.script = {StepLine(0), StepLine(1)};
  agent_state_.script_ends = false;
  const int64_t experiment = SubmitOne();
  Tick();
  const store::TrialRecord trial = OnlyTrial(experiment);
  ASSERT_TRUE(Eventually([&] { return StoredEvents(trial.id, 1) == 2; }));
  // A second delivery of the same lines (as after a reconnect that overlaps) changes nothing.
  const std::vector<store::Event> again = {{1, "step", StepLine(0)}, {2, "step", StepLine(1)}};
  EXPECT_EQ(*daemon_->store().AppendEvents(trial.id, 1, again), 0);
  agent_state_.AddLinesAndEnd(std::to_string(experiment) + "/one#1", {kResultLine}, "ok");
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(StoredEvents(trial.id, 1), 3);
}

TEST_F(EventStreamsTest, ARestartedControllerResumesStreamingWhereTheStoreEnds) {
  agent_state_.script = {StepLine(0), StepLine(1), StepLine(2)};
  agent_state_.script_ends = false;
  const int64_t experiment = SubmitOne();
  Tick();
  const store::TrialRecord trial = OnlyTrial(experiment);
  ASSERT_TRUE(Eventually([&] { return StoredEvents(trial.id, 1) == 3; }));

  daemon_.reset();
  StartController();
  agent_state_.AddLinesAndEnd(std::to_string(experiment) + "/one#1", {StepLine(3), kResultLine},
                              "ok");
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(agent_state_.stream_from_seqs.back(), 4);
  EXPECT_EQ(StoredEvents(trial.id, 1), 5);
  std::lock_guard lock(agent_state_.mutex);
  EXPECT_EQ(agent_state_.runs.size(), 1u) << "the finished work is not run again";
}

// Issue 37: the store refused such lines, the stream failed and was reopened at the same line every
// backoff, and the trial stayed running with its node held. A line over gRPC's default 4 MiB never
// even arrived. Now each is stored as a refused_line under its own seq and the trial ends.
TEST_F(EventStreamsTest, BadLinesAreStoredAsRefusedLinesAndTheTrialEnds) {
  const std::string huge = R"({"type":"log","message":")" + std::string(5 << 20, 'a') + "\"}";
  agent_state_.script = {StepLine(0),      "[1,2]", "not json",  R"({"type":1,"x":"result"})",
                         R"({"type":""})", huge,    StepLine(1), kResultLine};
  const int64_t experiment = SubmitOne();
  Tick();
  const store::TrialRecord trial = OnlyTrial(experiment);
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(StoredEvents(trial.id, 1), 8);
  EXPECT_EQ(*daemon_->store().LastSeq(trial.id, 1), 8);
  EXPECT_EQ(agent_state_.stream_from_seqs, std::vector<int64_t>{1}) << "one stream, never reopened";
  auto report = daemon_->store().Report(experiment);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->trials.at(0).refused_event_lines, 5);
}

// Issue 37: a faulty agent that does not replace a line of bad UTF-8 itself. While TrialEvent.json
// was a proto3 string, protobuf refused to parse the message, the stream failed, and the
// controller reopened it at that line every backoff with the trial left running. As bytes, the
// line arrives and the controller's own check (common/event_line.h) refuses it.
TEST_F(EventStreamsTest, BadUtf8FromAFaultyAgentIsStoredAsARefusedLineAndTheTrialEnds) {
  const std::string truncated_e_acute = "\xC3";
  agent_state_.script = {StepLine(0), R"({"type":"log","message":"caf)" + truncated_e_acute + "\"}",
                         StepLine(1), kResultLine};
  const int64_t experiment = SubmitOne();
  Tick();
  const store::TrialRecord trial = OnlyTrial(experiment);
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(StoredEvents(trial.id, 1), 4);
  EXPECT_EQ(agent_state_.stream_from_seqs, std::vector<int64_t>{1}) << "one stream, never reopened";
  auto report = daemon_->store().Report(experiment);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->trials.at(0).refused_event_lines, 1);
}

TEST(StoredEventTest, ARefusedLineIsReplacedUnderItsSeqAndRankAndAGoodOneKeepsItsOwnType) {
  v1::TrialEvent sent;
  sent.set_seq(7);
  sent.set_rank(1);
  sent.set_type("step");  // the agent's word is not taken: the line's own type is
  sent.set_json(R"({"type":"log","message":"hi"})");
  std::string refusal;
  const store::Event good = dispatch::StoredEvent(sent, refusal);
  EXPECT_EQ(refusal, "");
  EXPECT_EQ(good.type, "log");
  EXPECT_EQ(good.json, sent.json());
  sent.set_json("[1]");
  const store::Event bad = dispatch::StoredEvent(sent, refusal);
  EXPECT_EQ(refusal, "not a JSON object");
  EXPECT_EQ(bad.seq, 7);
  EXPECT_EQ(bad.rank, 1);
  EXPECT_EQ(bad.type, "refused_line");
  EXPECT_EQ(bad.json, R"({"type":"refused_line","bytes":3,"error":"not a JSON object"})");
}

TEST(OutcomeStateTest, OutcomesMapToTheirStateAndAnythingElseFails) {
  EXPECT_EQ(dispatch::OutcomeState("ok"), store::TrialState::kOk);
  EXPECT_EQ(dispatch::OutcomeState("cancelled"), store::TrialState::kCancelled);
  EXPECT_EQ(dispatch::OutcomeState("failed"), store::TrialState::kFailed);
  EXPECT_EQ(dispatch::OutcomeState("oom"), store::TrialState::kOom);
  EXPECT_EQ(dispatch::OutcomeState("invalid"), store::TrialState::kFailed);
  EXPECT_EQ(dispatch::OutcomeState("running"), store::TrialState::kFailed);  // no outcome
  EXPECT_EQ(dispatch::OutcomeState("what"), store::TrialState::kFailed);
}

}  // namespace
}  // namespace llmctl::controller::dispatch_test
