// Store's reports: Store::Report and Store::RunSteps (the final attempt, every rank's memory, the
// kernel fallbacks, a status's lighter read, resumed runs), and the runs a time calibration reads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/kernel_fallback_event.h"
#include "controller/store/store.h"
#include "controller/store/store_test_support.h"

namespace llmctl::store {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;

using namespace test_support;  // NOLINT(build/namespaces): the tests' shared vocabulary

TEST_F(StoreTest, ReportHasEveryRanksMemoryForAMultiRankTrial) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  NewExperiment file = MakeExperiment("x", {"ddp", "one"});
  file.trials[0].config_json = DataParallelConfig(2);
  const int64_t experiment = *store->CreateExperiment(file, kNow);
  const int64_t ddp = store->ListTrials(experiment)->at(0).id;
  const int64_t one = store->ListTrials(experiment)->at(1).id;
  ASSERT_EQ(*store->StartAttempt(ddp, "n", kNow, {0, 1}), 1);
  auto ranked = [](Event event, int32_t rank) {
    event.rank = rank;
    return event;
  };
  ASSERT_EQ(
      *store->AppendEvents(
          ddp, 1,
          std::vector<Event>{
              MakeEvent(1, Snapshot(0, "phase1_after_fwd", 300)),
              MakeEvent(2, Snapshot(0, "phase2_after_bwd", 250)),
              MakeEvent(3, Snapshot(1, "phase1_after_fwd", 310)),
              ranked(MakeEvent(1, Snapshot(0, "phase1_after_fwd", 400)), 1),
              ranked(MakeEvent(2, Snapshot(0, "phase2_after_bwd", 200)), 1),
              MakeEvent(4, {{"type", "result"}, {"outcome", "ok"}, {"peak_bytes", 330}}),
              ranked(MakeEvent(3, {{"type", "result"}, {"outcome", "ok"}, {"peak_bytes", 420}}), 1),
          }),
      7);
  ASSERT_TRUE(store->FinishAttempt(ddp, 1, TrialState::kOk, 0, "", kNow).ok());
  ASSERT_EQ(*store->StartAttempt(one, "n", kNow, {0}), 1);
  ASSERT_EQ(*store->AppendEvents(
                one, 1, std::vector<Event>{MakeEvent(1, Snapshot(0, "phase1_after_fwd", 5))}),
            1);

  StatusOr<ExperimentReport> report = store->Report(experiment);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const TrialReport& row = report->trials[0];
  ASSERT_EQ(row.ranks.size(), 2u);
  EXPECT_EQ(row.ranks[0].rank, 0);
  EXPECT_EQ(row.ranks[0].peak_bytes, 330);
  EXPECT_EQ(row.ranks[0].allocated_bytes, 310);
  EXPECT_THAT(row.ranks[0].phase_allocated,
              ElementsAre(Pair("phase1_after_fwd", 310), Pair("phase2_after_bwd", 250)));
  EXPECT_EQ(row.ranks[1].rank, 1);
  EXPECT_EQ(row.ranks[1].peak_bytes, 420);
  EXPECT_EQ(row.ranks[1].allocated_bytes, 400);
  EXPECT_THAT(row.ranks[1].phase_allocated,
              ElementsAre(Pair("phase1_after_fwd", 400), Pair("phase2_after_bwd", 200)));
  // The trial-level figures stay rank 0's.
  EXPECT_EQ(row.peak_snapshot.at("allocated_bytes"), 310);
  // A one-process trial lists no ranks.
  EXPECT_THAT(report->trials[1].ranks, IsEmpty());
}

// A multi-node attempt's node rank 1 dates its device samples by its own clock, and its trainer
// starts later than rank 0's: node rank 1 is launched once node rank 0's launcher has written its
// port, and rank 0 waits for it where the ranks meet. The report carries, for node rank 1, the
// moment rank 0's trainer started read on node rank 1's clock, through that meeting, the one moment
// both clocks read: node rank 1's first rank's (rank 2 of 2 nodes of 2 ranks) start and meeting
// less rank 0's wait for it. Node rank 2, whose start event does not say when it met the others,
// has none.
TEST_F(StoreTest, ReportPlacesEachOtherNodeAgainstRankZerosStartOnItsOwnClock) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  NewExperiment file = MakeExperiment("x", {"three-nodes"});
  file.trials[0].config_json = DataParallelConfig(2, 3);
  const int64_t experiment = *store->CreateExperiment(file, kNow);
  const int64_t trial = store->ListTrials(experiment)->at(0).id;
  ASSERT_EQ(*store->StartMultiNodeAttempt(
                trial,
                {{.node_rank = 0, .node = "n1", .device_indices = {0, 1}, .ended = false},
                 {.node_rank = 1, .node = "n2", .device_indices = {0, 1}, .ended = false},
                 {.node_rank = 2, .node = "n3", .device_indices = {0, 1}, .ended = false}},
                kNow),
            1);
  constexpr int64_t kNodeZeroStart = 1'700'000'000'000;
  constexpr int64_t kClockAhead = 30'000;  // node rank 1's clock against node rank 0's
  constexpr int64_t kLaunchedLater = 4'000;
  constexpr double kNodeOneWait = 500.25;  // from its start until the ranks met
  constexpr double kRankZeroWait = kLaunchedLater + kNodeOneWait;
  const auto start = [](int32_t rank, int64_t started_unix_ms, std::optional<double> met_ms) {
    json line = {
        {"type", "start"}, {"rank", rank}, {"world_size", 6}, {"started_unix_ms", started_unix_ms}};
    if (met_ms) line["ranks_met_elapsed_ms"] = *met_ms;
    Event event = MakeEvent(1, line);
    event.rank = rank;
    return event;
  };
  const int64_t node_one_start = kNodeZeroStart + kClockAhead + kLaunchedLater;
  ASSERT_EQ(*store->AppendEvents(trial, 1,
                                 std::vector<Event>{
                                     start(0, kNodeZeroStart, kRankZeroWait),
                                     start(1, kNodeZeroStart + 5, kRankZeroWait - 5),
                                     start(2, node_one_start, kNodeOneWait),
                                     start(3, node_one_start + 7, kNodeOneWait - 7),
                                     start(4, kNodeZeroStart + 6'000, std::nullopt),
                                     start(5, kNodeZeroStart + 6'000, std::nullopt),
                                 }),
            6);

  StatusOr<ExperimentReport> report = store->Report(experiment);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->trials[0].memory_timeline.size(), 1u);
  const AttemptMemory& attempt = report->trials[0].memory_timeline[0];
  EXPECT_EQ(attempt.started_unix_ms, kNodeZeroStart);
  EXPECT_THAT(attempt.node_started_unix_ms, ElementsAre(Pair(1, kNodeZeroStart + kClockAhead)));
}

// An attempt stored before start events said when the ranks met (no ranks_met_elapsed_ms, in
// rank 0's or any other's): no node gets a zero, not a wrong one (node rank 1's own start, 4 s
// after rank 0's, would draw its line 4 s early), and each node's device samples are still the
// report's, for the chart to list what it cannot place.
TEST_F(StoreTest, AnOldMultiNodeAttemptGivesNoOtherNodeAZeroButKeepsItsSamples) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const int64_t experiment = *store->CreateExperiment(MakeExperiment("x", {"two-nodes"}), kNow);
  const int64_t trial = store->ListTrials(experiment)->at(0).id;
  ASSERT_EQ(*store->StartMultiNodeAttempt(
                trial,
                {{.node_rank = 0, .node = "n1", .device_indices = {0}, .ended = false},
                 {.node_rank = 1, .node = "n2", .device_indices = {0}, .ended = false}},
                kNow),
            1);
  constexpr int64_t kNodeZeroStart = 1'700'000'000'000;
  const auto start = [](int32_t rank, int64_t started_unix_ms) {
    Event event = MakeEvent(1, {{"type", "start"},
                                {"rank", rank},
                                {"world_size", 2},
                                {"started_unix_ms", started_unix_ms}});
    event.rank = rank;
    return event;
  };
  ASSERT_EQ(
      *store->AppendEvents(
          trial, 1, std::vector<Event>{start(0, kNodeZeroStart), start(1, kNodeZeroStart + 4'000)}),
      2);
  const auto reading = [](int64_t seq, int64_t unix_ms, int64_t used_bytes) {
    NewDeviceSample reading{.seq = seq, .sample = {}};
    reading.sample.device = "cuda:0";
    reading.sample.time = Time(std::chrono::milliseconds(unix_ms));
    reading.sample.memory_used_bytes = used_bytes;
    reading.sample.memory_total_bytes = int64_t{80} << 30;
    return reading;
  };

  const std::vector<NewDeviceSample> node_zero = {reading(1, kNodeZeroStart + 1'000, 10 << 20)};
  const std::vector<NewDeviceSample> node_one = {reading(1, kNodeZeroStart + 5'000, 11 << 20),
                                                 reading(2, kNodeZeroStart + 6'000, 12 << 20)};
  ASSERT_EQ(*store->AppendDeviceSamples(trial, 1, node_zero, 0), 1);
  ASSERT_EQ(*store->AppendDeviceSamples(trial, 1, node_one, 1), 2);

  StatusOr<ExperimentReport> report = store->Report(experiment);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->trials[0].memory_timeline.size(), 1u);
  const AttemptMemory& attempt = report->trials[0].memory_timeline[0];
  EXPECT_EQ(attempt.started_unix_ms, kNodeZeroStart);
  EXPECT_THAT(attempt.node_started_unix_ms, IsEmpty());
  StatusOr<std::vector<DeviceSample>> samples = store->DeviceSamples(experiment, "two-nodes");
  ASSERT_TRUE(samples.ok()) << samples.status().ToString();
  ASSERT_EQ(samples->size(), 3u);
  EXPECT_EQ(samples->at(1).node_rank, 1);
  EXPECT_EQ(samples->at(2).memory_used_bytes, 12 << 20);
}

// Issue 38: each rank's kernel_fallback events of the current attempt are the report's, rank by
// rank; an earlier attempt's are not, and a field of the wrong type reads as empty, not an error.
TEST_F(StoreTest, ReportNamesTheCurrentAttemptsKernelFallbacks) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  NewExperiment file = MakeExperiment("fallbacks", {"t"});
  file.trials[0].config_json = DataParallelConfig(2);
  const int64_t experiment = *store->CreateExperiment(file, kNow);
  const int64_t trial = store->ListTrials(experiment)->at(0).id;
  const json earlier = {{"type", kernel_fallback_event::kType}, {"op", "rope"}, {"step", 0}};
  ASSERT_EQ(*store->StartAttempt(trial, "n", kNow, {0, 1}), 1);
  ASSERT_EQ(*store->AppendEvents(trial, 1, std::vector<Event>{MakeEvent(1, earlier)}), 1);
  ASSERT_TRUE(store->MarkAttemptLost(trial, 1, kNow).ok());
  ASSERT_EQ(*store->StartAttempt(trial, "n", kNow, {0, 1}), 2);
  Event on_rank_one = MakeEvent(1, {{"type", kernel_fallback_event::kType},
                                    {kernel_fallback_event::kOp, "cross_entropy"},
                                    {kernel_fallback_event::kReason, "logits not contiguous"},
                                    {kernel_fallback_event::kStep, 3}});
  on_rank_one.rank = 1;
  ASSERT_EQ(*store->AppendEvents(
                trial, 2,
                std::vector<Event>{MakeEvent(1, {{"type", kernel_fallback_event::kType},
                                                 {kernel_fallback_event::kOp, "rms_norm"},
                                                 {kernel_fallback_event::kReason, 7},
                                                 {kernel_fallback_event::kStep, "two"}}),
                                   on_rank_one}),
            2);

  StatusOr<ExperimentReport> report = store->Report(experiment);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const std::vector<KernelFallback>& fallbacks = report->trials[0].kernel_fallbacks;
  ASSERT_EQ(fallbacks.size(), 2u);
  EXPECT_EQ(fallbacks[0].op, "rms_norm");
  EXPECT_EQ(fallbacks[0].reason, "");
  EXPECT_EQ(fallbacks[0].step, 0);
  EXPECT_EQ(fallbacks[0].rank, 0);
  EXPECT_EQ(fallbacks[1].op, "cross_entropy");
  EXPECT_EQ(fallbacks[1].reason, "logits not contiguous");
  EXPECT_EQ(fallbacks[1].step, 3);
  EXPECT_EQ(fallbacks[1].rank, 1);

  // A trainer's lines are untrusted: the same op again on a rank is left out (its first is
  // named), a long reason is cut at 512 bytes (in the middle of a 2-byte character here, which
  // the cut replaces), and no more than 256 fallbacks are read however many lines there are.
  std::vector<Event> more;
  std::string reason(511, 'r');
  for (int i = 0; i < 200; ++i) reason += "\u00e9";
  more.push_back(MakeEvent(2, {{"type", kernel_fallback_event::kType},
                               {kernel_fallback_event::kOp, "rms_norm"},
                               {kernel_fallback_event::kReason, "again"}}));
  for (int i = 0; i < 400; ++i) {
    more.push_back(MakeEvent(3 + i, {{"type", kernel_fallback_event::kType},
                                     {kernel_fallback_event::kOp, "op" + std::to_string(i)},
                                     {kernel_fallback_event::kReason, reason}}));
  }
  ASSERT_EQ(*store->AppendEvents(trial, 2, more), 401);
  report = store->Report(experiment);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const std::vector<KernelFallback>& capped = report->trials[0].kernel_fallbacks;
  ASSERT_EQ(capped.size(), 256u);
  EXPECT_EQ(capped[0].op, "rms_norm");
  EXPECT_EQ(capped[0].reason, "");  // its first line's, not "again"
  EXPECT_EQ(capped[1].op, "op0");
  EXPECT_EQ(capped[1].reason, std::string(511, 'r') + "\ufffd");
  EXPECT_EQ(capped[255].op, "op254");
}

// A watcher's status reads what its lines show and leaves out what reads back every snapshot of
// the run: the same trial figures as the full report's, without its phases, timeline, refused
// lines and fallbacks.
TEST_F(StoreTest, AStatusReportIsTheFullOneWithoutItsSnapshotDetail) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const int64_t experiment = *store->CreateExperiment(MakeExperiment("status", {"t"}), kNow);
  const int64_t trial = store->ListTrials(experiment)->at(0).id;
  ASSERT_EQ(*store->StartAttempt(trial, "n", kNow), 1);
  const std::vector<Event> events = {
      MakeEvent(1, {{"type", "start"}, {"total_steps", 2}, {"started_unix_ms", 1}}),
      MakeEvent(2, {{"type", "snapshot"},
                    {"step", 0},
                    {"micro_batch", 0},
                    {"phase", "phase1_after_fwd"},
                    {"allocated_bytes", 300},
                    {"peak_bytes", 400},
                    {"elapsed_ms", 5.0}}),
      MakeEvent(3, {{"type", kernel_fallback_event::kType},
                    {kernel_fallback_event::kOp, "rope"},
                    {kernel_fallback_event::kStep, 0}}),
      MakeEvent(4,
                {{"type", "step"}, {"step", 0}, {"loss", 2.5}, {"tokens", 10}, {"seconds", 1.0}})};
  ASSERT_EQ(*store->AppendEvents(trial, 1, events), 4);

  StatusOr<ExperimentReport> full = store->Report(experiment);
  StatusOr<ExperimentReport> status = store->Report(experiment, ReportDetail::kStatus);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  const TrialReport& f = full->trials.at(0);
  const TrialReport& s = status->trials.at(0);
  ASSERT_FALSE(f.phase_peaks.empty());
  ASSERT_FALSE(f.memory_timeline.empty());
  ASSERT_EQ(f.kernel_fallbacks.size(), 1u);
  EXPECT_TRUE(s.phase_peaks.empty());
  EXPECT_TRUE(s.memory_timeline.empty());
  EXPECT_TRUE(s.kernel_fallbacks.empty());
  EXPECT_EQ(s.state, f.state);
  EXPECT_EQ(s.attempt, f.attempt);
  EXPECT_EQ(s.node, f.node);
  EXPECT_EQ(s.start, f.start);
  EXPECT_EQ(s.last_step, f.last_step);
  EXPECT_EQ(s.peak_snapshot, f.peak_snapshot);
  EXPECT_EQ(s.peak_bytes, f.peak_bytes);
  EXPECT_EQ(s.error, f.error);
  EXPECT_EQ(s.last_step["loss"], 2.5);
}

TEST_F(StoreTest, ReportReadsTheFinalAttemptOnly) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  NewExperiment input = MakeExperiment("report", {"requeued", "never-ran"});
  input.trials[0].expect = "ok";
  const int64_t experiment = *store->CreateExperiment(input, kNow);
  const int64_t trial = store->ListTrials(experiment)->at(0).id;

  // Attempt 1 saw a huge snapshot before its node was lost; the report must not show it.
  ASSERT_EQ(*store->StartAttempt(trial, "lost-node", kNow), 1);
  ASSERT_EQ(*store->AppendEvents(trial, 1,
                                 std::vector<Event>{
                                     MakeEvent(1, {{"type", "start"}, {"total_steps", 99}}),
                                     MakeEvent(2, Snapshot(0, "phase1_after_fwd", 1'000'000)),
                                 }),
            2);
  ASSERT_TRUE(store->MarkAttemptLost(trial, 1, kNow).ok());

  ASSERT_EQ(*store->StartAttempt(trial, "good-node", kNow), 2);
  const std::vector<Event> events = {
      MakeEvent(1, {{"type", "start"}, {"total_steps", 2}, {"parameters_total", 1234}}),
      MakeEvent(2, Snapshot(0, "phase0_before_fwd", 100)),
      MakeEvent(3, Snapshot(0, "phase1_after_fwd", 300)),
      MakeEvent(4, Snapshot(0, "phase2_after_bwd", 250)),
      MakeEvent(5, Snapshot(0, "phase3_after_opt_step", 200)),
      StepEvent(6, 0, 2.5),
      MakeEvent(7, Snapshot(1, "phase0_before_fwd", 150)),
      MakeEvent(8, Snapshot(1, "phase1_after_fwd", 300)),  // ties step 0's: the earlier wins
      MakeEvent(9, Snapshot(1, "phase2_after_bwd", 260)),
      StepEvent(10, 1, 2.25),
      MakeEvent(11, {{"type", "log"}, {"level", "info"}, {"message", "hi"}}),
      MakeEvent(12, {{"type", "result"},
                     {"outcome", "ok"},
                     {"train_seconds", 1.5},
                     {"tokens_per_second", 1000.0},
                     {"peak_bytes", 320},
                     {"final_loss", 2.25},
                     {"error", ""}}),
  };
  ASSERT_EQ(*store->AppendEvents(trial, 2, events), 12);
  ASSERT_TRUE(store->FinishAttempt(trial, 2, TrialState::kOk, 0, "", kNow).ok());

  StatusOr<ExperimentReport> report = store->Report(experiment);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->experiment.name, "report");
  ASSERT_EQ(report->trials.size(), 2u);

  const TrialReport& row = report->trials[0];
  EXPECT_EQ(row.name, "requeued");
  EXPECT_EQ(row.expect, "ok");
  EXPECT_EQ(row.state, TrialState::kOk);
  EXPECT_EQ(row.attempt, 2);
  EXPECT_EQ(row.node, "good-node");
  EXPECT_EQ(row.exit_code, 0);
  EXPECT_EQ(row.start.at("total_steps"), 2);
  EXPECT_EQ(row.tokens_per_second, 1000.0);
  EXPECT_EQ(row.train_seconds, 1.5);
  EXPECT_EQ(row.final_loss, 2.25);
  EXPECT_EQ(row.peak_bytes, 320);  // the result's: the snapshots name no peak
  EXPECT_EQ(row.last_step.at("step"), 1);
  EXPECT_EQ(row.last_step.at("loss"), 2.25);
  EXPECT_EQ(row.peak_snapshot.at("allocated_bytes"), 300);
  EXPECT_EQ(row.peak_snapshot.at("step"), 0);
  EXPECT_EQ(row.peak_snapshot.at("phase"), "phase1_after_fwd");
  EXPECT_EQ(row.peak_snapshot.at("params_bytes"), 10);

  std::vector<std::string> phases;
  for (const auto& [phase, snapshot] : row.phase_peaks) {
    phases.push_back(phase + ":" + std::to_string(snapshot.at("allocated_bytes").get<int64_t>()) +
                     "@" + std::to_string(snapshot.at("step").get<int64_t>()));
  }
  EXPECT_THAT(phases, ElementsAre("phase0_before_fwd:150@1", "phase1_after_fwd:300@0",
                                  "phase2_after_bwd:260@1", "phase3_after_opt_step:200@0"));

  const TrialReport& idle = report->trials[1];
  EXPECT_EQ(idle.name, "never-ran");
  EXPECT_EQ(idle.state, TrialState::kQueued);
  EXPECT_EQ(idle.attempt, 0);
  EXPECT_FALSE(idle.tokens_per_second.has_value());
  EXPECT_FALSE(idle.peak_bytes.has_value());
  EXPECT_TRUE(idle.peak_snapshot.is_null());
  EXPECT_TRUE(idle.phase_peaks.empty());

  EXPECT_EQ(store->Report(987654).status().code(), StatusCode::kNotFound);
}

TEST_F(StoreTest, AResumedTrialRunsFromItsCheckpointAndItsRunJoinsTheAttempts) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  NewExperiment input = MakeExperiment("resume", {"long"});
  input.trials[0].expect = "ok";
  const int64_t experiment = *store->CreateExperiment(input, kNow);
  const int64_t trial = store->ListTrials(experiment)->at(0).id;
  const std::string checkpoint = "/agent/runs/1/long/1/output/checkpoints/step-3";
  const json checkpoint_event = {{"step", 2}, {"path", checkpoint}};

  ASSERT_EQ(*store->StartAttempt(trial, "n1", kNow), 1);
  EXPECT_THAT(store->ResumeTrial(trial).status().message(),
              HasSubstr("'long' is running; only a trial that has ended can be resumed"));
  // Stopped after 4 steps with a checkpoint of 3 (an older one: writing the stop's failed), so step
  // 3 (from 0) is run again by the continuation.
  std::vector<Event> first = {
      MakeEvent(1, {{"type", "start"}, {"total_steps", 6}, {"load_peak_bytes", 90}}),
      MakeEvent(2, FullSnapshot(0, 0, "phase1_after_fwd", 30'000, 30'000)),
      MakeEvent(3, FullSnapshot(0, 0, "phase3_after_opt_step", 24'000, 31'000)),
  };
  for (int step = 0; step < 4; ++step) {
    json line = {
        {"type", "step"}, {"step", step}, {"loss", 6.0 - step}, {"tokens", 100}, {"seconds", 1.0}};
    // What others took of the machine's CPU, on the steps that measured it.
    if (step % 2 == 1) line["others_cpu_share"] = 0.125 * step;
    first.push_back(MakeEvent(4 + step, line));
  }
  first.push_back(
      MakeEvent(8, ResultEvent("cancelled", 3.0, 100.0, 35'000, 3.0, checkpoint_event)));
  ASSERT_TRUE(store->AppendEvents(trial, 1, first).ok());
  ASSERT_TRUE(store->CancelTrial(trial).ok());  // a cancel request, as `cancel --checkpoint` makes
  ASSERT_TRUE(store->FinishAttempt(trial, 1, TrialState::kCancelled, 5, "", kNow).ok());
  ASSERT_EQ(store->GetExperiment(experiment)->state, ExperimentState::kDone);

  StatusOr<TrialResume> resume = store->ResumeTrial(trial);
  ASSERT_TRUE(resume.ok()) << resume.status().ToString();
  const TrialResume expected{
      .attempt = 1, .node = "n1", .checkpoint = checkpoint, .step = 3, .tree = ""};
  EXPECT_EQ(*resume, expected);
  StatusOr<TrialRecord> record = store->GetTrial(trial);
  EXPECT_EQ(record->state, TrialState::kQueued);
  EXPECT_FALSE(record->cancel_requested);
  EXPECT_EQ(record->resume, expected);
  EXPECT_EQ(store->GetExperiment(experiment)->state, ExperimentState::kActive);

  // The continuation is lost (its cancel request was cleared: it is queued again, not cancelled),
  // and the next one starts from the same checkpoint.
  ASSERT_EQ(*store->StartAttempt(trial, "n1", kNow), 2);
  ASSERT_TRUE(store->AppendEvents(trial, 2, std::vector<Event>{StepEvent(1, 3, 99.0)}).ok());
  ASSERT_TRUE(store->MarkAttemptLost(trial, 2, kNow).ok());
  EXPECT_EQ(store->GetTrial(trial)->state, TrialState::kQueued);
  ASSERT_EQ(*store->StartAttempt(trial, "n1", kNow), 3);
  EXPECT_EQ(
      QueryInt("SELECT SUM(first_step) FROM attempts WHERE trial_id = " + std::to_string(trial)),
      6);  // 0 + 3 + 3
  std::vector<Event> third = {
      MakeEvent(1, {{"type", "start"}, {"total_steps", 6}, {"load_peak_bytes", 80}}),
      MakeEvent(2, FullSnapshot(4, 0, "phase1_after_fwd", 30'000, 30'000)),  // ties attempt 1's
      MakeEvent(3, FullSnapshot(4, 0, "phase3_after_opt_step", 26'000, 30'000)),
  };
  for (int step = 3; step < 6; ++step) {
    third.push_back(MakeEvent(1 + static_cast<int64_t>(third.size()), {{"type", "step"},
                                                                       {"step", step},
                                                                       {"loss", 6.0 - step},
                                                                       {"tokens", 100},
                                                                       {"seconds", 0.5}}));
  }
  third.push_back(MakeEvent(1 + static_cast<int64_t>(third.size()),
                            ResultEvent("ok", 1.5, 200.0, 32'000, 1.0, checkpoint_event)));
  ASSERT_TRUE(store->AppendEvents(trial, 3, third).ok());
  ASSERT_TRUE(store->FinishAttempt(trial, 3, TrialState::kOk, 0, "", kNow).ok());

  StatusOr<ExperimentReport> report = store->Report(experiment);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const TrialReport& row = report->trials[0];
  EXPECT_EQ(row.state, TrialState::kOk);
  EXPECT_EQ(row.attempt, 3);
  EXPECT_THAT(row.run_attempts, ElementsAre(1, 3));
  EXPECT_EQ(row.train_seconds, 4.5);
  EXPECT_DOUBLE_EQ(*row.tokens_per_second, (300.0 + 300.0) / 4.5);
  EXPECT_EQ(row.peak_bytes, 35'000);  // attempt 1's result
  EXPECT_EQ(row.final_loss, 1.0);
  EXPECT_EQ(row.load_peak_bytes, 80);  // the final attempt's start
  EXPECT_EQ(row.error, "");
  EXPECT_EQ(row.start.at("load_peak_bytes"), 80);
  EXPECT_EQ(row.peak_snapshot.at("step"), 0) << "a tie goes to the earlier attempt";
  std::vector<std::string> phases;
  for (const auto& [phase, snapshot] : row.phase_peaks) {
    phases.push_back(phase + "@" + std::to_string(snapshot.at("step").get<int64_t>()));
  }
  EXPECT_THAT(phases, ElementsAre("phase1_after_fwd@0", "phase3_after_opt_step@4"));
  // Memory over time: the run's attempts, each with every snapshot it took (the lost one none).
  ASSERT_EQ(row.memory_timeline.size(), 2u);
  EXPECT_EQ(row.memory_timeline[0].attempt, 1);
  EXPECT_THAT(row.memory_timeline[0].snapshots,
              ElementsAre(json::parse(first[1].json), json::parse(first[2].json)));
  EXPECT_EQ(row.memory_timeline[1].attempt, 3);
  EXPECT_THAT(row.memory_timeline[1].snapshots,
              ElementsAre(json::parse(third[1].json), json::parse(third[2].json)));
  EXPECT_EQ(row.memory_timeline[1].started_unix_ms, std::nullopt) << "a start without the field";

  StatusOr<std::vector<TrialStep>> steps = store->RunSteps(experiment);
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  std::vector<std::string> run;
  for (const TrialStep& step : *steps) {
    run.push_back(std::to_string(step.attempt) + ":" + std::to_string(step.step) + "=" +
                  std::to_string(static_cast<int>(step.loss.value_or(-1))));
  }
  // Attempt 1 up to its checkpoint (its step 3 was run again), the lost attempt 2 not at all.
  EXPECT_THAT(run, ElementsAre("1:0=6", "1:1=5", "1:2=4", "3:3=3", "3:4=2", "3:5=1"));
  EXPECT_EQ((*steps)[0].others_cpu_share, std::nullopt);
  EXPECT_EQ((*steps)[1].others_cpu_share, 0.125);
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM trial_steps"), 6);
  EXPECT_EQ(QueryInt("SELECT train_seconds * 10 FROM trial_results"), 45);

  EXPECT_THAT(store->ResumeTrial(trial).status().message(),
              HasSubstr("'long' ended ok: there is nothing left to run"));
  EXPECT_EQ(store->RunSteps(987654).status().code(), StatusCode::kNotFound);
}

// A resumed trial's time and rate are sums and products of its runs' figures, which are the
// trainer's: past a double's range SQLite makes inf of them, which the report leaves out.
// An attempt's error is an agent's words, and without them (a trial that runs, or ended ok) the
// report takes its result event's error, the trainer's: either may be any length and hold escape
// sequences and newlines, from a hostile or older agent or trainer. The store keeps the one, and a
// report and a resume's refusal carry either, on one line of at most kMaxErrorBytes; they kept and
// carried them whole.
TEST_F(StoreTest, AnAttemptsErrorIsKeptAndReportedOnOneLineOfAtMostTheBound) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const std::vector<int64_t> trials =
      CreateTrials(*store, "long", {"ended", "running", "resumed", "nodes"});
  const std::string hostile = "llm-train: \x1b[31mred\x1b[0m\nline two\r\n" +
                              std::string(100'000, 'x') +
                              "\n\xc2\x9b"
                              "2J";
  const auto on_one_line = [](const std::string& text) {
    EXPECT_LE(text.size(), kMaxErrorBytes);
    EXPECT_EQ(text.find_first_of(std::string("\n\r\x1b", 3)), std::string::npos) << text;
  };
  ASSERT_EQ(*store->StartAttempt(trials[0], "n", kNow), 1);
  ASSERT_TRUE(store->FinishAttempt(trials[0], 1, TrialState::kFailed, 1, hostile, kNow).ok());
  // The agent sends the same end again when its stream is reopened.
  EXPECT_TRUE(store->FinishAttempt(trials[0], 1, TrialState::kFailed, 1, hostile, kNow).ok());

  json result = ResultEvent("failed", 1.0, 1.0, 1, 1.0);
  result["error"] = hostile;
  ASSERT_EQ(*store->StartAttempt(trials[1], "n", kNow), 1);
  ASSERT_EQ(*store->AppendEvents(trials[1], 1, std::vector<Event>{MakeEvent(1, result)}), 1);
  ASSERT_EQ(*store->StartAttempt(trials[2], "n", kNow), 1);
  ASSERT_EQ(*store->AppendEvents(trials[2], 1, std::vector<Event>{MakeEvent(1, result)}), 1);
  ASSERT_TRUE(store->FinishAttempt(trials[2], 1, TrialState::kFailed, 1, "", kNow).ok());

  // A multi-node attempt keeps each node's error and names the node in the attempt's.
  ASSERT_EQ(*store->StartMultiNodeAttempt(
                trials[3],
                {{.node_rank = 0, .node = "n1", .device_indices = {0}, .ended = false},
                 {.node_rank = 1, .node = "n2", .device_indices = {0}, .ended = false}},
                kNow),
            1);
  ASSERT_TRUE(
      store->FinishAttemptNode(trials[3], 1, 1, TrialState::kFailed, 1, hostile, kNow).ok());
  EXPECT_TRUE(
      store->FinishAttemptNode(trials[3], 1, 1, TrialState::kFailed, 1, hostile, kNow).ok());
  ASSERT_TRUE(store->FinishAttemptNode(trials[3], 1, 0, TrialState::kOk, 0, "", kNow).ok());
  for (const json& row :
       QueryRows(path_,
                 "SELECT COALESCE(error, '') AS error FROM attempt_nodes UNION ALL "
                 "SELECT COALESCE(error, '') FROM attempts")) {
    on_one_line(row.at("error").get<std::string>());
  }

  const StatusOr<ExperimentReport> report = store->Report(*store->LatestExperimentId());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->trials.size(), 4u);
  EXPECT_TRUE(report->trials[0].error.starts_with("llm-train:  [31mred [0m line two  xxx"))
      << report->trials[0].error;
  EXPECT_TRUE(report->trials[3].error.starts_with("node n2 (node rank 1 of 2): llm-train:  [31m"))
      << report->trials[3].error;
  for (const TrialReport& trial : report->trials) on_one_line(trial.error);
  const Status refused = store->ResumeTrial(trials[2]).status();
  EXPECT_THAT(refused.message(), HasSubstr("without a checkpoint (llm-train:  [31mred"));
  on_one_line(refused.message());
}

TEST_F(StoreTest, ARunsFiguresPastADoublesRangeReportAsNone) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const int64_t experiment = *store->CreateExperiment(MakeExperiment("huge", {"t"}), kNow);
  const int64_t trial = store->ListTrials(experiment)->at(0).id;
  const json checkpoint = {{"step", 0}, {"path", "/agent/runs/1/t/1/output/checkpoints/step-1"}};
  ASSERT_EQ(*store->StartAttempt(trial, "n1", kNow), 1);
  ASSERT_TRUE(
      store
          ->AppendEvents(trial, 1,
                         std::vector<Event>{MakeEvent(
                             1, ResultEvent("cancelled", 1e308, 1e308, 1, 1.0, checkpoint))})
          .ok());
  ASSERT_TRUE(store->FinishAttempt(trial, 1, TrialState::kCancelled, 5, "", kNow).ok());
  ASSERT_TRUE(store->ResumeTrial(trial).ok());
  ASSERT_EQ(*store->StartAttempt(trial, "n1", kNow), 2);
  ASSERT_TRUE(
      store
          ->AppendEvents(trial, 2,
                         std::vector<Event>{MakeEvent(1, ResultEvent("ok", 1e308, 1e308, 1, 1.0))})
          .ok());
  ASSERT_TRUE(store->FinishAttempt(trial, 2, TrialState::kOk, 0, "", kNow).ok());
  StatusOr<ExperimentReport> report = store->Report(experiment);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_THAT(report->trials[0].run_attempts, ElementsAre(1, 2));
  EXPECT_EQ(report->trials[0].train_seconds, std::nullopt);
  EXPECT_EQ(report->trials[0].tokens_per_second, std::nullopt);
}

// Integer figures near INT64_MAX, as a hostile event line may write them, overflowed SQLite's
// integer SUM over a resumed run's attempts, which failed the report of the whole experiment: the
// sums are of REALs, the overflowing one reported as a finite figure, and the other trial too.
TEST_F(StoreTest, AResumedRunsIntegerFiguresNearInt64MaxDoNotFailTheReport) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const int64_t experiment = *store->CreateExperiment(MakeExperiment("huge", {"t", "other"}), kNow);
  const int64_t trial = store->ListTrials(experiment)->at(0).id;
  const int64_t other = store->ListTrials(experiment)->at(1).id;
  const json checkpoint = {{"step", 0}, {"path", "/agent/runs/1/t/1/output/checkpoints/step-1"}};
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  json first = ResultEvent("cancelled", 0, 0, 1, 1.0, checkpoint);
  first["train_seconds"] = kHuge;
  first["tokens_per_second"] = kHuge;
  json second = ResultEvent("ok", 0, 0, 1, 1.0);
  second["train_seconds"] = kHuge;
  second["tokens_per_second"] = 2;
  ASSERT_EQ(*store->StartAttempt(trial, "n1", kNow), 1);
  ASSERT_TRUE(store->AppendEvents(trial, 1, std::vector<Event>{MakeEvent(1, first)}).ok());
  ASSERT_TRUE(store->FinishAttempt(trial, 1, TrialState::kCancelled, 5, "", kNow).ok());
  ASSERT_TRUE(store->ResumeTrial(trial).ok());
  ASSERT_EQ(*store->StartAttempt(trial, "n1", kNow), 2);
  ASSERT_TRUE(store->AppendEvents(trial, 2, std::vector<Event>{MakeEvent(1, second)}).ok());
  ASSERT_TRUE(store->FinishAttempt(trial, 2, TrialState::kOk, 0, "", kNow).ok());
  ASSERT_EQ(*store->StartAttempt(other, "n1", kNow), 1);
  ASSERT_TRUE(
      store
          ->AppendEvents(other, 1,
                         std::vector<Event>{MakeEvent(1, ResultEvent("ok", 2.0, 50.0, 1, 1.0))})
          .ok());
  ASSERT_TRUE(store->FinishAttempt(other, 1, TrialState::kOk, 0, "", kNow).ok());

  StatusOr<ExperimentReport> report = store->Report(experiment);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_DOUBLE_EQ(*report->trials[0].train_seconds, 2.0 * static_cast<double>(kHuge));
  EXPECT_DOUBLE_EQ(*report->trials[0].tokens_per_second, (static_cast<double>(kHuge) + 2.0) / 2.0);
  EXPECT_EQ(report->trials[1].train_seconds, 2.0);
  EXPECT_EQ(report->trials[1].tokens_per_second, 50.0);
}

// The runs a time calibration rests on: trials that ended ok with a prediction and timed steps;
// the store read as `llmctl estimate` reads it, without writing.
TEST_F(StoreTest, TimedRunsAreTheOkTrialsStepsWithAPrediction) {
  {
    std::unique_ptr<Store> store = OpenStore();
    ASSERT_NE(store, nullptr);
    NewExperiment experiment = MakeExperiment("timed", {"measured", "unpredicted", "failed"});
    experiment.trials[0].prediction_json = R"({"peak_bytes":1,"time_device":"cpu"})";
    experiment.trials[2].prediction_json = R"({"peak_bytes":1,"time_device":"cpu"})";
    const int64_t id = *store->CreateExperiment(experiment, kNow);
    const std::vector<TrialRecord> trials = *store->ListTrials(id);
    const TrialState ends[] = {TrialState::kOk, TrialState::kOk, TrialState::kFailed};
    for (size_t i = 0; i < trials.size(); ++i) {
      ASSERT_EQ(*store->StartAttempt(trials[i].id, "n", kNow), 1);
      std::vector<Event> events;
      // 1, 2, 50 and 3 s: the third step slowed by something else on the machine.
      const double seconds[] = {1, 2, 50, 3};
      for (int64_t step = 0; step < 4; ++step) {
        events.push_back(MakeEvent(
            step + 1,
            {{"type", "step"}, {"step", step}, {"tokens", 100}, {"seconds", seconds[step]}}));
      }
      ASSERT_EQ(*store->AppendEvents(trials[i].id, 1, events), 4);
      ASSERT_TRUE(store->FinishAttempt(trials[i].id, 1, ends[i], 0, "", kNow).ok());
    }
  }
  StatusOr<std::unique_ptr<Store>> reader = Store::OpenReadOnly(path_);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  StatusOr<std::vector<TimedRun>> runs = (*reader)->TimedRuns();
  ASSERT_TRUE(runs.ok()) << runs.status().ToString();
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_EQ((*runs)[0].prediction_json, R"({"peak_bytes":1,"time_device":"cpu"})");
  // Steps 1 to 3 (step 0 left out): 2, 50 and 3 s for 100 tokens each, the median 3.
  EXPECT_DOUBLE_EQ((*runs)[0].seconds_per_token, 0.03);
  EXPECT_EQ((*runs)[0].steps, 3);

  EXPECT_EQ(Store::OpenReadOnly((dir_ / "none.db").string()).status().code(),
            StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "none.db"));
}

// A step during which other processes took a tenth or more of the trainer's CPUs calibrates
// nothing: its time is the load's. A run all of whose steps were so is no run; a share the
// trainer did not write (before 12-03, several ranks) leaves the step in.
TEST_F(StoreTest, TimedRunsLeaveOutTheStepsOthersSharedTheCpusWith) {
  {
    std::unique_ptr<Store> store = OpenStore();
    ASSERT_NE(store, nullptr);
    NewExperiment experiment = MakeExperiment("shared", {"partly", "wholly"});
    for (NewTrial& trial : experiment.trials) {
      trial.prediction_json = R"({"peak_bytes":1,"time_device":"cpu"})";
    }
    const int64_t id = *store->CreateExperiment(experiment, kNow);
    const std::vector<TrialRecord> trials = *store->ListTrials(id);
    // Steps 1-4 of each: 1, 2, 9 and 8 s for 100 tokens; "partly" shared steps 3 and 4 (0.10 and
    // 0.5 of the CPUs), "wholly" every step (0.3).
    const std::vector<std::vector<std::optional<double>>> shares = {
        {std::nullopt, 0.02, std::nullopt, 0.10, 0.5}, {0.3, 0.3, 0.3, 0.3, 0.3}};
    const double seconds[] = {1, 1, 2, 9, 8};
    for (size_t i = 0; i < trials.size(); ++i) {
      ASSERT_EQ(*store->StartAttempt(trials[i].id, "n", kNow), 1);
      std::vector<Event> events;
      for (int64_t step = 0; step < 5; ++step) {
        json line = {{"type", "step"}, {"step", step}, {"tokens", 100}, {"seconds", seconds[step]}};
        if (const std::optional<double> share = shares[i][static_cast<size_t>(step)]) {
          line["others_cpu_share"] = *share;
        }
        events.push_back(MakeEvent(step + 1, line));
      }
      ASSERT_EQ(*store->AppendEvents(trials[i].id, 1, events), 5);
      ASSERT_TRUE(store->FinishAttempt(trials[i].id, 1, TrialState::kOk, 0, "", kNow).ok());
    }
  }
  StatusOr<std::unique_ptr<Store>> reader = Store::OpenReadOnly(path_);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  StatusOr<std::vector<TimedRun>> runs = (*reader)->TimedRuns();
  ASSERT_TRUE(runs.ok()) << runs.status().ToString();
  ASSERT_EQ(runs->size(), 1u);
  // Steps 1 and 2 (1 and 2 s): the upper middle of two, 2 s for 100 tokens.
  EXPECT_EQ((*runs)[0].steps, 2);
  EXPECT_DOUBLE_EQ((*runs)[0].seconds_per_token, 0.02);
}

// A run's pace is the median of its timed steps' pace canary seconds, those that are a finite
// positive number (the trainer's word; the reader checks the range); a run whose steps wrote none
// has 0.
TEST_F(StoreTest, TimedRunsCarryTheMedianOfTheirStepsPace) {
  {
    std::unique_ptr<Store> store = OpenStore();
    ASSERT_NE(store, nullptr);
    NewExperiment experiment = MakeExperiment("paced", {"paced", "unpaced"});
    for (NewTrial& trial : experiment.trials) {
      trial.prediction_json = R"({"peak_bytes":1,"time_device":"cpu"})";
    }
    const int64_t id = *store->CreateExperiment(experiment, kNow);
    const std::vector<TrialRecord> trials = *store->ListTrials(id);
    // Step 0 is left out with its time; then 1.2, -1 (no pace), 1.0, "x" and 1.1 ms.
    const std::vector<json> paces = {0.0009, 0.0012, -1, 0.0010, "x", 0.0011};
    for (size_t i = 0; i < trials.size(); ++i) {
      ASSERT_EQ(*store->StartAttempt(trials[i].id, "n", kNow), 1);
      std::vector<Event> events;
      for (int64_t step = 0; step < 6; ++step) {
        json line = {{"type", "step"}, {"step", step}, {"tokens", 100}, {"seconds", 1}};
        if (i == 0) line["pace_seconds"] = paces[static_cast<size_t>(step)];
        events.push_back(MakeEvent(step + 1, line));
      }
      ASSERT_EQ(*store->AppendEvents(trials[i].id, 1, events), 6);
      ASSERT_TRUE(store->FinishAttempt(trials[i].id, 1, TrialState::kOk, 0, "", kNow).ok());
    }
  }
  StatusOr<std::unique_ptr<Store>> reader = Store::OpenReadOnly(path_);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  StatusOr<std::vector<TimedRun>> runs = (*reader)->TimedRuns();
  ASSERT_TRUE(runs.ok()) << runs.status().ToString();
  ASSERT_EQ(runs->size(), 2u);
  EXPECT_DOUBLE_EQ((*runs)[0].pace_seconds, 0.0011);
  EXPECT_EQ((*runs)[0].steps, 5);
  EXPECT_EQ((*runs)[1].pace_seconds, 0);
}

// However many runs the store holds, TimedRuns reads the newest kMaxTimedRuns: the answer the
// controller sends stays bounded.
TEST_F(StoreTest, TimedRunsReadsTheNewestRunsOnly) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const size_t count = kMaxTimedRuns + 3;
  std::vector<std::string> names;
  for (size_t i = 0; i < count; ++i) {
    char name[32];  // not "t" + std::to_string(i), which trips GCC 12's -Wrestrict
    std::snprintf(name, sizeof name, "t%zu", i);
    names.emplace_back(name);
  }
  NewExperiment experiment = MakeExperiment("many", names);
  for (size_t i = 0; i < count; ++i) {
    experiment.trials[i].prediction_json = json{{"n", i}}.dump();
  }
  const int64_t id = *store->CreateExperiment(experiment, kNow);
  const std::vector<TrialRecord> trials = *store->ListTrials(id);
  for (const TrialRecord& trial : trials) {
    ASSERT_EQ(*store->StartAttempt(trial.id, "n", kNow), 1);
    std::vector<Event> events;
    for (int64_t step = 0; step < 2; ++step) {
      events.push_back(MakeEvent(
          step + 1, {{"type", "step"}, {"step", step}, {"tokens", 100}, {"seconds", 1.0}}));
    }
    ASSERT_EQ(*store->AppendEvents(trial.id, 1, events), 2);
    ASSERT_TRUE(store->FinishAttempt(trial.id, 1, TrialState::kOk, 0, "", kNow).ok());
  }
  StatusOr<std::vector<TimedRun>> runs = store->TimedRuns();
  ASSERT_TRUE(runs.ok()) << runs.status().ToString();
  ASSERT_EQ(runs->size(), kMaxTimedRuns);
  EXPECT_EQ(runs->front().prediction_json, (json{{"n", 3}}.dump()));
  EXPECT_EQ(runs->back().prediction_json, (json{{"n", count - 1}}.dump()));
}
}  // namespace
}  // namespace llmctl::store
