// Store's reports: Store::Report and Store::RunSteps, and the report views (schema.cc) that users
// query with sqlite3, against the figures the report shows.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/kernel_fallback_event.h"
#include "common/snapshot_event.h"
#include "controller/store/store.h"
#include "controller/store/store_test_support.h"

namespace llmctl::store {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;

using namespace test_support;  // NOLINT(build/namespaces): the tests' shared vocabulary

json Snapshot(int64_t step, const std::string& phase, int64_t allocated) {
  return {{"type", "snapshot"},
          {"step", step},
          {"micro_batch", 0},
          {"phase", phase},
          {"params_bytes", 10},
          {"grads_bytes", 20},
          {"allocated_bytes", allocated}};
}

// The trainer's spelling of every phase and byte field (common/snapshot_event.h) is what the
// report's views select: a snapshot of each phase, each field a distinct number, comes back whole.
TEST_F(StoreTest, PhasePeaksSelectEveryPhaseAndByteFieldTheTrainerWrites) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const int64_t experiment = *store->CreateExperiment(MakeExperiment("fields", {"t"}), kNow);
  const int64_t trial = store->ListTrials(experiment)->at(0).id;
  ASSERT_EQ(*store->StartAttempt(trial, "n", kNow), 1);
  std::vector<Event> events;
  for (size_t p = 0; p < snapshot_event::kPhases.size(); ++p) {
    json snapshot = {{"type", snapshot_event::kType},
                     {snapshot_event::kStep, 0},
                     {snapshot_event::kMicroBatch, 0},
                     {snapshot_event::kPhase, snapshot_event::kPhases[p]}};
    for (size_t f = 0; f < snapshot_event::kByteFields.size(); ++f) {
      snapshot[std::string(snapshot_event::kByteFields[f])] = 1000 * (p + 1) + f;
    }
    events.push_back(MakeEvent(static_cast<int64_t>(p + 1), snapshot));
  }
  ASSERT_EQ(*store->AppendEvents(trial, 1, events), static_cast<int64_t>(events.size()));
  const std::vector<json> rows =
      QueryRows(path_, "SELECT * FROM trial_phase_peaks WHERE trial_id = " + std::to_string(trial) +
                           " ORDER BY phase_order");
  ASSERT_EQ(rows.size(), snapshot_event::kPhases.size());
  for (size_t p = 0; p < rows.size(); ++p) {
    EXPECT_EQ(rows[p]["phase"], std::string(snapshot_event::kPhases[p]));
    for (size_t f = 0; f < snapshot_event::kByteFields.size(); ++f) {
      EXPECT_EQ(rows[p][std::string(snapshot_event::kByteFields[f])], 1000 * (p + 1) + f)
          << snapshot_event::kPhases[p] << " " << snapshot_event::kByteFields[f];
    }
  }
}

TEST_F(StoreTest, ReportHasEveryRanksMemoryForAMultiRankTrial) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const int64_t experiment = *store->CreateExperiment(MakeExperiment("x", {"ddp", "one"}), kNow);
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

// Issue 38: each rank's kernel_fallback events of the current attempt are the report's, rank by
// rank; an earlier attempt's are not, and a field of the wrong type reads as empty, not an error.
TEST_F(StoreTest, ReportNamesTheCurrentAttemptsKernelFallbacks) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const int64_t experiment = *store->CreateExperiment(MakeExperiment("fallbacks", {"t"}), kNow);
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

// A snapshot event with every memory category, as llm-train writes it.
json FullSnapshot(int64_t step, int64_t micro_batch, const std::string& phase, int64_t allocated,
                  int64_t peak) {
  return {{"type", "snapshot"},
          {"step", step},
          {"micro_batch", micro_batch},
          {"phase", phase},
          {"params_bytes", 4000},
          {"grads_bytes", step == 0 && phase == "phase0_before_fwd" ? 0 : 4000},
          {"optim_device_bytes", 8004},
          {"optim_host_bytes", 0},
          {"other_bytes", allocated - 16004},
          {"allocated_bytes", allocated},
          {"peak_bytes", peak},
          {"reserved_bytes", allocated}};
}

// An experiment with one trial of each kind the report tells apart: ok after a lost attempt, out
// of memory, failed without a result, and never started. Returns its id.
int64_t StoreLabExperiment(Store& store) {
  NewExperiment input = MakeExperiment("lab", {"ok-run", "oom-run", "failed-run", "never-ran"});
  input.trials[0].expect = "ok";
  input.trials[1].expect = "oom";
  const int64_t experiment = *store.CreateExperiment(input, kNow);
  const std::vector<TrialRecord> trials = *store.ListTrials(experiment);

  const int64_t ok = trials[0].id;
  EXPECT_EQ(*store.StartAttempt(ok, "lost-node", kNow), 1);
  EXPECT_TRUE(store
                  .AppendEvents(ok, 1,
                                std::vector<Event>{MakeEvent(
                                    1, FullSnapshot(0, 0, "phase1_after_fwd", 99'999, 99'999))})
                  .ok());
  EXPECT_TRUE(store.MarkAttemptLost(ok, 1, kNow).ok());
  EXPECT_EQ(*store.StartAttempt(ok, "cpu-1", kNow), 2);
  EXPECT_TRUE(
      store
          .AppendEvents(
              ok, 2,
              std::vector<Event>{
                  MakeEvent(1, {{"type", "start"}, {"total_steps", 2}, {"load_peak_bytes", 5000}}),
                  MakeEvent(2, FullSnapshot(0, 0, "phase0_before_fwd", 20'000, 21'000)),
                  MakeEvent(3, FullSnapshot(0, 0, "phase1_after_fwd", 30'000, 31'000)),
                  MakeEvent(4, FullSnapshot(0, 0, "phase2_after_bwd", 25'000, 33'000)),
                  MakeEvent(5, FullSnapshot(0, 0, "phase3_after_opt_step", 24'000, 34'000)),
                  MakeEvent(6, {{"type", "step"},
                                {"step", 0},
                                {"loss", 10.5},
                                {"lr", 0.001},
                                {"tokens", 128},
                                {"seconds", 0.25},
                                {"allocated_bytes", 24'000},
                                {"peak_bytes", 34'000}}),
                  MakeEvent(7, FullSnapshot(1, 0, "phase1_after_fwd", 30'000, 34'000)),
                  MakeEvent(8, {{"type", "step"},
                                {"step", 1},
                                {"loss", 9.75},
                                {"lr", 0.0005},
                                {"tokens", 120},
                                {"seconds", 0.5},
                                {"allocated_bytes", 24'000},
                                {"peak_bytes", 34'000}}),
                  MakeEvent(9, {{"type", "result"},
                                {"outcome", "ok"},
                                {"train_seconds", 0.75},
                                {"tokens_per_second", 330.0},
                                {"peak_bytes", 34'500},
                                {"final_loss", 9.75},
                                {"error", ""}}),
              })
          .ok());
  EXPECT_TRUE(store.FinishAttempt(ok, 2, TrialState::kOk, 0, "", kNow).ok());

  const int64_t oom = trials[1].id;
  EXPECT_EQ(*store.StartAttempt(oom, "cpu-1", kNow), 1);
  EXPECT_TRUE(
      store
          .AppendEvents(oom, 1,
                        std::vector<Event>{
                            MakeEvent(1, {{"type", "start"}, {"load_peak_bytes", 6000}}),
                            MakeEvent(2, FullSnapshot(0, 0, "phase0_before_fwd", 40'000, 40'000)),
                            MakeEvent(3, FullSnapshot(0, -1, "oom", 60'000, 61'000)),
                            MakeEvent(4, {{"type", "result"},
                                          {"outcome", "oom"},
                                          {"train_seconds", 0.0},
                                          {"tokens_per_second", 0.0},
                                          {"peak_bytes", 61'000},
                                          {"final_loss", nullptr},
                                          {"error", "out of memory: 2 MiB more"}}),
                        })
          .ok());
  EXPECT_TRUE(store.FinishAttempt(oom, 1, TrialState::kOom, 3, "", kNow).ok());

  const int64_t failed = trials[2].id;
  EXPECT_EQ(*store.StartAttempt(failed, "cpu-1", kNow), 1);
  EXPECT_TRUE(store.AppendEvents(failed, 1, std::vector<Event>{StepEvent(1, 0, 3.5)}).ok());
  EXPECT_TRUE(store
                  .FinishAttempt(failed, 1, TrialState::kFailed, -9,
                                 "killed by the kernel (host memory)", kNow)
                  .ok());
  return experiment;
}

// What a view's column should hold for a figure the report has or lacks.
template <typename T>
json Cell(const std::optional<T>& value) {
  return value.has_value() ? json(*value) : json(nullptr);
}

json SnapshotCell(const json& snapshot, const char* key) {
  return snapshot.is_object() ? snapshot.at(key) : json(nullptr);
}

TEST_F(StoreTest, TrialResultsViewHoldsTheReportsFigures) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const int64_t experiment = StoreLabExperiment(*store);
  StatusOr<ExperimentReport> report = store->Report(experiment);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const std::vector<json> rows = QueryRows(
      path_, "SELECT * FROM trial_results WHERE experiment_id = " + std::to_string(experiment));
  ASSERT_EQ(rows.size(), report->trials.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const json& row = rows[i];
    const TrialReport& trial = report->trials[i];
    SCOPED_TRACE(trial.name);
    EXPECT_EQ(row["experiment"], "lab");
    EXPECT_EQ(row["trial"], trial.name);
    EXPECT_EQ(row["ordinal"], static_cast<int64_t>(i));
    EXPECT_EQ(row["attempt"], trial.attempt == 0 ? json(nullptr) : json(trial.attempt));
    EXPECT_EQ(row["node"], trial.node.empty() ? json(nullptr) : json(trial.node));
    EXPECT_EQ(row["outcome"], TrialStateName(trial.state));
    EXPECT_EQ(row["expected"], Cell(trial.expect));
    EXPECT_EQ(row["exit_code"], Cell(trial.exit_code));
    EXPECT_EQ(row["error"], trial.error.empty() ? json(nullptr) : json(trial.error));
    EXPECT_EQ(row["peak_bytes"], Cell(trial.peak_bytes));
    EXPECT_EQ(row["load_peak_bytes"], Cell(trial.load_peak_bytes));
    EXPECT_EQ(row["tokens_per_second"], Cell(trial.tokens_per_second));
    EXPECT_EQ(row["train_seconds"], Cell(trial.train_seconds));
    EXPECT_EQ(row["final_loss"], Cell(trial.final_loss));
    EXPECT_EQ(row["at_peak_step"], SnapshotCell(trial.peak_snapshot, "step"));
    EXPECT_EQ(row["at_peak_phase"], SnapshotCell(trial.peak_snapshot, "phase"));
    for (const char* category :
         {"params_bytes", "grads_bytes", "optim_device_bytes", "optim_host_bytes", "other_bytes",
          "allocated_bytes", "reserved_bytes"}) {
      EXPECT_EQ(row[category], SnapshotCell(trial.peak_snapshot, category)) << category;
    }
  }
  // The figures themselves, so that the view and the report cannot be wrong together.
  EXPECT_EQ(rows[0]["attempt"], 2);  // the lost attempt's larger snapshot does not count
  EXPECT_EQ(rows[0]["run_attempts"], "2");
  EXPECT_EQ(rows[0]["node"], "cpu-1");
  EXPECT_EQ(rows[0]["peak_bytes"], 34'500);
  EXPECT_EQ(rows[0]["tokens_per_second"], 330.0);
  EXPECT_EQ(rows[0]["final_loss"], 9.75);
  EXPECT_EQ(rows[0]["at_peak_step"], 0);  // step 1's snapshot only ties it
  EXPECT_EQ(rows[0]["at_peak_phase"], "phase1_after_fwd");
  EXPECT_EQ(rows[0]["other_bytes"], 30'000 - 16'004);
  EXPECT_EQ(rows[1]["outcome"], "oom");
  EXPECT_EQ(rows[1]["at_peak_phase"], "oom");
  EXPECT_EQ(rows[1]["error"], "out of memory: 2 MiB more");
  EXPECT_EQ(rows[1]["final_loss"], nullptr);
  EXPECT_EQ(rows[2]["error"], "killed by the kernel (host memory)");
  EXPECT_EQ(rows[2]["peak_bytes"], nullptr);
  EXPECT_EQ(rows[3]["outcome"], "queued");
  EXPECT_EQ(rows[3]["attempt"], nullptr);

  // Per phase: the report's per-phase rows, in the step anatomy's order.
  const std::vector<json> phases =
      QueryRows(path_,
                "SELECT trial, phase, step, allocated_bytes FROM trial_phase_peaks WHERE "
                "experiment_id = " +
                    std::to_string(experiment));
  std::vector<json> expected;
  for (const TrialReport& trial : report->trials) {
    for (const auto& [phase, snapshot] : trial.phase_peaks) {
      expected.push_back({{"trial", trial.name},
                          {"phase", phase},
                          {"step", snapshot.at("step")},
                          {"allocated_bytes", snapshot.at("allocated_bytes")}});
    }
  }
  EXPECT_EQ(phases, expected);
  ASSERT_EQ(phases.size(), 6u);
  EXPECT_EQ(phases[1]["phase"], "phase1_after_fwd");
  EXPECT_EQ(phases[1]["step"], 0);
  EXPECT_EQ(phases[5]["phase"], "oom");

  // Steps: the final attempts' step events.
  const std::vector<json> steps =
      QueryRows(path_,
                "SELECT trial, attempt, step, loss, tokens, seconds FROM trial_steps WHERE "
                "experiment_id = " +
                    std::to_string(experiment));
  EXPECT_EQ(steps, (std::vector<json>{
                       {{"trial", "ok-run"},
                        {"attempt", 2},
                        {"step", 0},
                        {"loss", 10.5},
                        {"tokens", 128},
                        {"seconds", 0.25}},
                       {{"trial", "ok-run"},
                        {"attempt", 2},
                        {"step", 1},
                        {"loss", 9.75},
                        {"tokens", 120},
                        {"seconds", 0.5}},
                       {{"trial", "failed-run"},
                        {"attempt", 1},
                        {"step", 0},
                        {"loss", 3.5},
                        {"tokens", nullptr},
                        {"seconds", nullptr}},
                   }));
}

// The README's "The results in SQL" shows `sqlite3 PATH 'QUERY'` lines (wherever the docs keep
// it: README.md or docs/*.md): each query runs against a database the store wrote, and the path is
// the embedded controller's.
TEST_F(StoreTest, TheDocsSqlExamplesRun) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  StoreLabExperiment(*store);
  const char* source_dir = std::getenv("LLMCTL_SOURCE_DIR");
  const std::filesystem::path source = source_dir != nullptr ? source_dir : ".";
  ASSERT_TRUE(std::filesystem::exists(source / "README.md")) << "README.md not found";
  std::vector<std::filesystem::path> docs = {source / "README.md"};
  for (const auto& entry : std::filesystem::directory_iterator(source / "docs")) {
    if (entry.path().extension() == ".md") docs.push_back(entry.path());
  }
  int examples = 0;
  for (const std::filesystem::path& doc : docs) {
    std::ifstream in(doc);
    std::string line;
    while (std::getline(in, line)) {
      if (!line.starts_with("sqlite3 ")) continue;
      SCOPED_TRACE(doc.string() + ": " + line);
      ++examples;
      EXPECT_NE(line.find(" ~/.local/share/llmctl/llmctl.db "), std::string::npos)
          << "not the embedded controller's database";
      const size_t open = line.find_first_of("'\"");
      ASSERT_NE(open, std::string::npos);
      const size_t close = line.rfind(line[open]);
      ASSERT_GT(close, open);
      const std::string sql = line.substr(open + 1, close - open - 1);
      EXPECT_FALSE(QueryRows(path_, sql).empty()) << sql;
    }
  }
  EXPECT_GE(examples, 2);
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
    first.push_back(MakeEvent(4 + step, {{"type", "step"},
                                         {"step", step},
                                         {"loss", 6.0 - step},
                                         {"tokens", 100},
                                         {"seconds", 1.0}}));
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
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM trial_steps"), 6);
  EXPECT_EQ(QueryInt("SELECT train_seconds * 10 FROM trial_results"), 45);

  EXPECT_THAT(store->ResumeTrial(trial).status().message(),
              HasSubstr("'long' ended ok: there is nothing left to run"));
  EXPECT_EQ(store->RunSteps(987654).status().code(), StatusCode::kNotFound);
}

// The trial_memory_timeline view: each attempt's snapshots in order beside its start's wall clock
// and device limit; an attempt without snapshots is listed all the same.
// A resumed trial's time and rate are sums and products of its runs' figures, which are the
// trainer's: past a double's range SQLite makes inf of them, which the report leaves out.
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

TEST_F(StoreTest, MemoryTimelineHoldsEachAttemptsSnapshotsAndItsStart) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const std::vector<int64_t> trials =
      CreateTrials(*store, "timeline", {"fits", "load-oom", "queued"});
  ASSERT_EQ(trials.size(), 3u);
  ASSERT_EQ(*store->StartAttempt(trials[0], "n1", kNow), 1);
  json early = FullSnapshot(0, 0, "phase0_before_fwd", 20'000, 20'000);
  early["elapsed_ms"] = 812.125;
  json late = FullSnapshot(0, 0, "phase1_after_fwd", 30'000, 30'000);
  late["elapsed_ms"] = 1'020.5;
  json oom = FullSnapshot(0, -1, "oom", 40'000, 40'000);
  oom["elapsed_ms"] = 1'100;
  ASSERT_TRUE(
      store
          ->AppendEvents(
              trials[0], 1,
              std::vector<Event>{
                  MakeEvent(1, {{"type", "start"},
                                {"started_unix_ms", 1'700'000'000'123},
                                {"device_limit_bytes", 226'492'416}}),
                  MakeEvent(2, early), StepEvent(3, 0), MakeEvent(4, late), MakeEvent(5, oom),
                  MakeEvent(6, {{"type", "result"}, {"outcome", "oom"}, {"elapsed_ms", 1'234.5}})})
          .ok());
  ASSERT_EQ(*store->StartAttempt(trials[1], "n1", kNow), 1);  // no start event, no snapshot

  StatusOr<ExperimentReport> report = store->Report(store->ListExperiments()->back().id);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const std::vector<AttemptMemory>& fits = report->trials[0].memory_timeline;
  ASSERT_EQ(fits.size(), 1u);
  EXPECT_EQ(fits[0].attempt, 1);
  EXPECT_EQ(fits[0].started_unix_ms, 1'700'000'000'123);
  EXPECT_EQ(fits[0].device_limit_bytes, 226'492'416);
  EXPECT_THAT(fits[0].snapshots, ElementsAre(early, late, oom));
  EXPECT_EQ(fits[0].ended_elapsed_ms, 1'234.5);
  const std::vector<AttemptMemory>& load_oom = report->trials[1].memory_timeline;
  ASSERT_EQ(load_oom.size(), 1u);
  EXPECT_EQ(load_oom[0].started_unix_ms, std::nullopt);
  EXPECT_EQ(load_oom[0].device_limit_bytes, std::nullopt);
  EXPECT_TRUE(load_oom[0].snapshots.empty());
  EXPECT_EQ(load_oom[0].ended_elapsed_ms, std::nullopt);
  EXPECT_TRUE(report->trials[2].memory_timeline.empty()) << "never started";
  // What sqlite3 users read: the times and bytes as columns.
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM trial_memory_timeline WHERE trial = 'fits'"), 3);
  EXPECT_EQ(QueryInt("SELECT SUM(elapsed_ms * 1000) FROM trial_memory_timeline"), 2'932'625);
  EXPECT_EQ(QueryInt("SELECT allocated_bytes FROM trial_memory_timeline WHERE phase = 'oom'"),
            40'000);
}

// Data parallelism's memory: DDP's gradient buckets and the ranks' sum slots (comm_bytes), FSDP's
// gathered full parameters (gathered_bytes), next to the other categories; NULL, as any category
// is, in a snapshot from before the trainer measured them.
TEST_F(StoreTest, TheViewsHaveTheDataParallelCategories) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const std::vector<int64_t> trials = CreateTrials(*store, "dist", {"ddp", "fsdp", "older"});
  ASSERT_EQ(trials.size(), 3u);
  json ddp = FullSnapshot(0, 0, "phase2_after_bwd", 30'000, 30'000);
  ddp["comm_bytes"] = 4'000;
  ddp["gathered_bytes"] = 0;
  ddp["other_bytes"] = 30'000 - 16'004 - 4'000;
  json fsdp = FullSnapshot(0, 0, "phase1_after_fwd", 25'000, 25'000);
  fsdp["comm_bytes"] = 1'500;
  fsdp["gathered_bytes"] = 8'000;
  fsdp["other_bytes"] = 25'000 - 16'004 - 9'500;
  const json older = FullSnapshot(0, 0, "phase1_after_fwd", 20'000, 20'000);
  for (const auto& [trial, snapshot] :
       {std::pair{trials[0], ddp}, std::pair{trials[1], fsdp}, std::pair{trials[2], older}}) {
    ASSERT_EQ(*store->StartAttempt(trial, "n1", kNow), 1);
    ASSERT_TRUE(store->AppendEvents(trial, 1, std::vector<Event>{MakeEvent(1, snapshot)}).ok());
  }

  const std::vector<json> expected = {
      {{"trial", "ddp"}, {"comm_bytes", 4'000}, {"gathered_bytes", 0}, {"other_bytes", 9'996}},
      {{"trial", "fsdp"}, {"comm_bytes", 1'500}, {"gathered_bytes", 8'000}, {"other_bytes", -504}},
      {{"trial", "older"},
       {"comm_bytes", nullptr},
       {"gathered_bytes", nullptr},
       {"other_bytes", 3'996}}};
  EXPECT_EQ(QueryRows(path_,
                      "SELECT trial, comm_bytes, gathered_bytes, other_bytes "
                      "FROM trial_results ORDER BY ordinal"),
            expected);
  EXPECT_EQ(QueryRows(path_,
                      "SELECT trial, comm_bytes, gathered_bytes, other_bytes "
                      "FROM trial_phase_peaks ORDER BY trial_id, phase_order"),
            expected);
  // Placed with the other byte categories, before other_bytes.
  for (const char* view : {"trial_results", "trial_phase_peaks"}) {
    const std::vector<json> columns =
        QueryRows(path_, std::string("SELECT group_concat(name, ',') AS names FROM "
                                     "pragma_table_info('") +
                             view + "')");
    ASSERT_EQ(columns.size(), 1u);
    EXPECT_THAT(columns[0]["names"].get<std::string>(),
                HasSubstr("optim_host_bytes,comm_bytes,gathered_bytes,other_bytes,"))
        << view;
  }
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

}  // namespace
}  // namespace llmctl::store
