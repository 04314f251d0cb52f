// The report views (schema.cc) that users query with sqlite3, against the figures the report
// shows, and the docs' SQL examples run against a database the store wrote.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/snapshot_event.h"
#include "controller/store/store.h"
#include "controller/store/store_test_support.h"
#include "tests/support/shell_command.h"

namespace llmctl::store {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using namespace test_support;  // NOLINT(build/namespaces): the tests' shared vocabulary

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
  const std::filesystem::path source = llmctl::testing::SourceDir();
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

// The trial_memory_timeline view: each attempt's snapshots in order beside its start's wall clock
// and device limit; an attempt without snapshots is listed all the same.
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
}  // namespace
}  // namespace llmctl::store
