#include "controller/cli/report.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <tuple>
#include <vector>

#include "controller/cli/report_charts.h"
#include "controller/cli/report_rows.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kMiB = 1 << 20;

v1::MemorySnapshot Snapshot(const std::string& phase, int64_t step, int64_t params, int64_t grads,
                            int64_t optim_device, int64_t optim_host, int64_t other) {
  v1::MemorySnapshot snap;
  snap.set_step(step);
  snap.set_phase(phase);
  snap.set_params_bytes(params);
  snap.set_grads_bytes(grads);
  snap.set_optim_device_bytes(optim_device);
  snap.set_optim_host_bytes(optim_host);
  snap.set_other_bytes(other);
  snap.set_allocated_bytes(params + grads + optim_device + other);
  snap.set_peak_bytes(snap.allocated_bytes() + 3 * kMiB);
  snap.set_reserved_bytes(snap.allocated_bytes() + 8 * kMiB);
  return snap;
}

// `attempt`'s memory over time: a snapshot at each (elapsed ms, phase, step, allocated bytes),
// reserved 8 MiB above, and device samples at (ms after the start, bytes in use).
v1::AttemptMemory* AddAttemptMemory(
    v1::TrialReport* trial, int32_t attempt, int64_t started_unix_ms, int64_t limit_bytes,
    const std::vector<std::tuple<double, std::string, int64_t, int64_t>>& snapshots,
    const std::vector<std::pair<int64_t, int64_t>>& samples) {
  v1::AttemptMemory* memory = trial->add_memory_timeline();
  memory->set_attempt(attempt);
  memory->set_started_unix_ms(started_unix_ms);
  memory->set_device_limit_bytes(limit_bytes);
  for (const auto& [elapsed_ms, phase, step, allocated] : snapshots) {
    v1::MemorySnapshot* snap = memory->add_snapshots();
    snap->set_elapsed_ms(elapsed_ms);
    snap->set_phase(phase);
    snap->set_step(step);
    snap->set_micro_batch(phase == "oom" ? -1 : 0);
    snap->set_allocated_bytes(allocated);
    snap->set_peak_bytes(allocated);
    snap->set_reserved_bytes(allocated + 8 * kMiB);
  }
  for (const auto& [after_ms, used] : samples) {
    v1::DeviceMemorySample* sample = memory->add_device_samples();
    sample->set_device("cuda:0");
    sample->set_unix_ms(started_unix_ms + after_ms);
    sample->set_memory_used_bytes(used);
    sample->set_memory_total_bytes(80 * 1024 * kMiB);
  }
  return memory;
}

// A fixed report covering every case a renderer meets: ok with the four phases, an expected
// out-of-memory, host-offloaded optimizer state, an outcome other than expected, a trial still
// running without snapshots, and text that needs escaping in HTML, CSV and Markdown.
v1::ReportResponse FixedReport() {
  v1::ReportResponse report;
  report.set_experiment_id(7);
  report.set_name("single-gpu-lab");

  v1::TrialReport* ok = report.add_trials();
  ok->set_name("reduced-batch");
  ok->set_description("lab #2: micro-batch 16 fits");
  ok->set_outcome("ok");
  ok->set_expected("ok");
  ok->set_attempt(1);
  ok->set_node("local");
  ok->set_train_seconds(137.04);
  ok->set_tokens_per_second(12506.13);
  ok->set_peak_bytes(30 * 1024 * kMiB + 419 * kMiB);
  ok->set_final_loss(1.2345);
  ok->set_load_peak_bytes(4400 * kMiB);
  ok->set_config_json(R"({"model":"tinyllama-1.1b","train":{"micro_batch_size":16}})");
  const int64_t params = 4196 * kMiB;
  ok->add_per_phase()->CopyFrom(
      Snapshot("phase0_before_fwd", 1, params, params, 2 * params, 0, 12 * kMiB));
  ok->add_per_phase()->CopyFrom(
      Snapshot("phase1_after_fwd", 1, params, params, 2 * params, 0, 9000 * kMiB));
  ok->add_per_phase()->CopyFrom(
      Snapshot("phase2_after_bwd", 1, params, params, 2 * params, 0, 900 * kMiB));
  ok->add_per_phase()->CopyFrom(
      Snapshot("phase3_after_opt_step", 0, params, params, 2 * params, 0, 40 * kMiB));
  ok->mutable_at_peak()->CopyFrom(ok->per_phase(1));
  constexpr int64_t kStart = 1'700'000'000'000;
  AddAttemptMemory(ok, 1, kStart, 80 * 1024 * kMiB,
                   {{410.5, "phase0_before_fwd", 0, 16 * 1024 * kMiB},
                    {980.25, "phase1_after_fwd", 0, 25 * 1024 * kMiB},
                    {1650, "phase2_after_bwd", 0, 17 * 1024 * kMiB},
                    {1800, "phase3_after_opt_step", 0, 16 * 1024 * kMiB},
                    {2100, "phase0_before_fwd", 1, 16 * 1024 * kMiB},
                    {2600, "phase1_after_fwd", 1, 29 * 1024 * kMiB}},
                   {{-500, 1024 * kMiB},
                    {0, 2 * 1024 * kMiB},
                    {1000, 26 * 1024 * kMiB},
                    {2000, 31 * 1024 * kMiB},
                    {3000, 31 * 1024 * kMiB}});

  v1::TrialReport* oom = report.add_trials();
  oom->set_name("baseline");
  oom->set_description("lab #1: 64/1 fp32 AdamW, \"OOM\", as expected");
  oom->set_outcome("oom");
  oom->set_expected("oom");
  oom->set_attempt(1);
  oom->set_node("local");
  oom->set_peak_bytes(93 * 1024 * kMiB);
  oom->set_error("CUDA out of memory. Tried to allocate 1.12 GiB");
  oom->add_per_phase()->CopyFrom(Snapshot("phase0_before_fwd", 0, params, 0, 0, 0, 20 * kMiB));
  oom->add_per_phase()->CopyFrom(Snapshot("oom", 0, params, 0, 0, 0, 90000 * kMiB));
  oom->mutable_at_peak()->CopyFrom(oom->per_phase(1));
  AddAttemptMemory(oom, 1, kStart, 93 * 1024 * kMiB,
                   {{300, "phase0_before_fwd", 0, 4216 * kMiB}, {950, "oom", 0, 92 * 1024 * kMiB}},
                   {});

  v1::TrialReport* offload = report.add_trials();
  offload->set_name("cpu-offload");
  offload->set_description("lab #12, max_steps 2");
  offload->set_outcome("oom");
  offload->set_expected("ok");
  offload->set_attempt(2);
  offload->set_node("gpu-1");
  offload->set_train_seconds(0.04);
  offload->set_peak_bytes(61 * kMiB);
  offload->add_per_phase()->CopyFrom(
      Snapshot("phase2_after_bwd", 0, 60 * kMiB, 0, 0, 480 * kMiB + kMiB / 10, kMiB));
  offload->mutable_at_peak()->CopyFrom(offload->per_phase(0));
  AddAttemptMemory(
      offload, 1, kStart, 0,
      {{20, "phase0_before_fwd", 0, 50 * kMiB}, {45, "phase2_after_bwd", 0, 61 * kMiB}}, {});
  offload->mutable_memory_timeline(0)->set_ended_elapsed_ms(60);  // stopped after its last snapshot
  AddAttemptMemory(
      offload, 2, kStart + 3'600'000, 0,
      {{15, "phase0_before_fwd", 1, 52 * kMiB}, {40, "phase2_after_bwd", 1, 61 * kMiB}}, {});

  v1::TrialReport* running = report.add_trials();
  running->set_name("<script>alert('x')</script>&co|pipe");
  running->set_description("runs, still");
  running->set_outcome("running");
  running->set_attempt(1);
  return report;
}

fs::path TestdataDir() {
  const char* source = std::getenv("LLMCTL_SOURCE_DIR");
  return fs::path(source != nullptr ? source : ".") / "controller" / "cli" / "testdata";
}

// Compares with testdata/<name>; LLMCTL_UPDATE_GOLDEN=1 rewrites the file instead (then review the
// diff).
void ExpectGolden(const std::string& name, const std::string& actual) {
  const fs::path path = TestdataDir() / name;
  if (std::getenv("LLMCTL_UPDATE_GOLDEN") != nullptr) {
    std::ofstream(path, std::ios::binary) << actual;
    return;
  }
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in) << "missing golden file " << path
                  << " (run with LLMCTL_UPDATE_GOLDEN=1 to create it)";
  std::stringstream expected;
  expected << in.rdbuf();
  EXPECT_EQ(actual, expected.str()) << "differs from " << path;
}

// A 2-rank ddp trial whose ranks peak at 69.6 and 73.9 MiB, phase 1 differing between them.
v1::ReportResponse TwoRankReport() {
  v1::ReportResponse report;
  report.set_experiment_id(3);
  report.set_name("ddp");
  v1::TrialReport* trial = report.add_trials();
  trial->set_name("ddp2");
  trial->set_outcome("ok");
  trial->set_attempt(1);
  trial->set_train_seconds(2.0);
  trial->set_tokens_per_second(5960);
  trial->set_peak_bytes(72980889);  // rank 0's
  const int64_t mib = 1 << 20;
  const std::vector<std::tuple<int, int64_t, int64_t>> ranks = {{0, 72980889, 66 * mib},
                                                                {1, 77489930, 70 * mib}};
  for (const auto& [number, peak, after_forward] : ranks) {
    v1::RankMemory* rank = trial->add_ranks();
    rank->set_rank(number);
    rank->set_peak_bytes(peak);
    rank->set_allocated_bytes(after_forward);
    v1::PhaseBytes* before = rank->add_per_phase();
    before->set_phase("phase0_before_fwd");
    before->set_allocated_bytes(40 * mib);
    v1::PhaseBytes* forward = rank->add_per_phase();
    forward->set_phase("phase1_after_fwd");
    forward->set_allocated_bytes(after_forward);
  }
  return report;
}

TEST(ReportRanksTest, TheTableShowsTheHighestRanksPeakAndEachPhasesRange) {
  const std::string table = RenderReport(TwoRankReport(), ReportFormat::kTable);
  EXPECT_NE(table.find("73.9 (max of 2 ranks)"), std::string::npos) << table;
  EXPECT_NE(table.find("ddp2: 2 ranks; peak MiB 69.6 (rank 0), 73.9 (rank 1); allocated MiB per "
                       "phase, min\u2013max over the ranks: phase0_before_fwd 40.0, "
                       "phase1_after_fwd 66.0\u201370.0; tokens/s is the whole job's\n"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("5,960"), std::string::npos) << table;  // the job's, as rank 0 reports it
}

TEST(ReportRanksTest, JsonCsvAndHtmlHaveEveryRank) {
  const nlohmann::json json =
      nlohmann::json::parse(RenderReport(TwoRankReport(), ReportFormat::kJson));
  const nlohmann::json& trial = json.at("trials").at(0);
  ASSERT_EQ(trial.at("ranks").size(), 2u);
  EXPECT_EQ(trial.at("ranks").at(1).at("rank"), 1);
  EXPECT_EQ(trial.at("ranks").at(1).at("peak_bytes"), 77489930);
  EXPECT_EQ(trial.at("ranks").at(1).at("per_phase").at(1),
            (nlohmann::json{{"phase", "phase1_after_fwd"}, {"allocated_bytes", 70 << 20}}));
  EXPECT_EQ(trial.at("max_rank_peak_bytes"), 77489930);
  EXPECT_EQ(trial.at("per_phase_over_ranks").at(1),
            (nlohmann::json{{"phase", "phase1_after_fwd"},
                            {"min_allocated_bytes", 66 << 20},
                            {"max_allocated_bytes", 70 << 20}}));

  const std::string csv = RenderReport(TwoRankReport(), ReportFormat::kCsv);
  EXPECT_NE(csv.find(",2,72980889;77489930,0:phase0_before_fwd=41943040|phase1_after_fwd=69206016;"
                     "1:phase0_before_fwd=41943040|phase1_after_fwd=73400320,,,\n"),
            std::string::npos)
      << csv;

  const std::string html = RenderReport(TwoRankReport(), ReportFormat::kHtml);
  EXPECT_NE(html.find("<h2>Memory per rank</h2>"), std::string::npos);
  EXPECT_NE(html.find("<h3>ddp2: 2 ranks</h3>"), std::string::npos);
  EXPECT_NE(html.find("<td>min&#8211;max</td><td class=\"n\">69.6\u201373.9</td>"),
            std::string::npos)
      << html;
  // A report without multi-rank trials has no such section.
  EXPECT_EQ(RenderReport(FixedReport(), ReportFormat::kHtml).find("Memory per rank"),
            std::string::npos);
}

// Data parallelism's buffers and FSDP's gathered parameters get their own column when a trial has
// them, so that the memory columns still add up to the allocated bytes; one-device reports keep
// the lab's columns.
TEST(ReportRanksTest, CommAndGatheredBytesHaveAColumnWhenATrialHasThem) {
  v1::ReportResponse report = FixedReport();
  v1::MemorySnapshot& ddp = *report.mutable_trials(0)->mutable_at_peak();
  ddp.set_comm_bytes(33 * kMiB);
  ddp.set_allocated_bytes(ddp.allocated_bytes() + ddp.comm_bytes());
  v1::MemorySnapshot& fsdp = *report.mutable_trials(1)->mutable_at_peak();
  fsdp.set_comm_bytes(7 * kMiB);
  fsdp.set_gathered_bytes(6 * kMiB);
  *report.mutable_trials(1)->add_per_phase() = fsdp;

  const std::string table = RenderReport(report, ReportFormat::kTable);
  EXPECT_NE(table.find("Optim MiB (device + host)  Comm MiB (+ gathered)  Acts MiB"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("  33.0  "), std::string::npos) << table;
  EXPECT_NE(table.find("  7.0 + 6.0  "), std::string::npos) << table;
  const std::string markdown = RenderReport(report, ReportFormat::kMarkdown);
  EXPECT_NE(markdown.find("| Comm MiB (+ gathered) | Acts MiB |"), std::string::npos) << markdown;
  EXPECT_NE(markdown.find("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"),
            std::string::npos)
      << markdown;
  const std::string html = RenderReport(report, ReportFormat::kHtml);
  EXPECT_NE(html.find("<th>Comm MiB (+ gathered)</th>"), std::string::npos);
  EXPECT_NE(html.find("gathered params</span>"), std::string::npos) << "the phase charts' legend";
  const nlohmann::json json = nlohmann::json::parse(RenderReport(report, ReportFormat::kJson));
  EXPECT_EQ(json.at("trials").at(1).at("at_peak").at("gathered_bytes"), 6 * kMiB);

  const std::string one_device = RenderReport(FixedReport(), ReportFormat::kTable);
  EXPECT_EQ(one_device.find("Comm MiB"), std::string::npos) << one_device;
  EXPECT_EQ(RenderReport(FixedReport(), ReportFormat::kHtml).find("gathered params"),
            std::string::npos);
}

TEST(ReportGoldenTest, Table) {
  ExpectGolden("report.txt", RenderReport(FixedReport(), ReportFormat::kTable));
}
TEST(ReportGoldenTest, Markdown) {
  ExpectGolden("report.md", RenderReport(FixedReport(), ReportFormat::kMarkdown));
}
TEST(ReportGoldenTest, Csv) {
  ExpectGolden("report.csv", RenderReport(FixedReport(), ReportFormat::kCsv));
}
TEST(ReportGoldenTest, Json) {
  ExpectGolden("report.json", RenderReport(FixedReport(), ReportFormat::kJson));
}
TEST(ReportGoldenTest, Html) {
  ExpectGolden("report.html", RenderReport(FixedReport(), ReportFormat::kHtml));
}

// The Markdown rows are scripts/lab_table.py's, cell for cell.
TEST(ReportTest, MarkdownRowsReadLikeTheLabTable) {
  const std::string markdown = RenderReport(FixedReport(), ReportFormat::kMarkdown);
  EXPECT_NE(markdown.find("| trial | expected | outcome | Params MiB | Grads MiB | Optim MiB "
                          "(device + host) | Acts MiB | peak MiB | train s | tokens/s |\n"
                          "|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n"),
            std::string::npos);
  EXPECT_NE(markdown.find("| reduced-batch | ok | ok | 4,196.0 | 4,196.0 | 8,392.0 | 9,000.0 | "
                          "31,139.0 | 137.0 | 12,506 |"),
            std::string::npos)
      << markdown;
  EXPECT_NE(markdown.find("| cpu-offload | ok | **oom** (expected ok) | 60.0 | 0.0 | 0.0 + 480.1 "
                          "| 1.0 | 61.0 | 0.0 | – |"),
            std::string::npos)
      << markdown;
  EXPECT_NE(markdown.find("| – | running | – | – | – | – | – | – | – |"), std::string::npos);
}

TEST(ReportTest, JsonHasTheFieldsScriptsReadAndAtPeakIsTheHighestSnapshot) {
  const nlohmann::json json =
      nlohmann::json::parse(RenderReport(FixedReport(), ReportFormat::kJson));
  ASSERT_EQ(json["trials"].size(), 4u);
  const nlohmann::json& ok = json["trials"][0];
  for (const char* key : {"name", "outcome", "expected", "train_seconds", "tokens_per_second",
                          "peak_bytes", "final_loss", "at_peak", "per_phase"}) {
    EXPECT_TRUE(ok.contains(key)) << key;
  }
  EXPECT_EQ(ok["at_peak"]["phase"], "phase1_after_fwd");
  EXPECT_EQ(ok["at_peak"]["other_bytes"], 9000 * kMiB);
  EXPECT_EQ(ok["per_phase"].size(), 4u);
  EXPECT_EQ(ok["config"]["train"]["micro_batch_size"], 16);
  const nlohmann::json& running = json["trials"][3];
  EXPECT_TRUE(running["expected"].is_null());
  EXPECT_TRUE(running["final_loss"].is_null());
  EXPECT_TRUE(running["at_peak"].is_null());
}

TEST(ReportTest, HtmlEscapesEveryStringAndLoadsNothing) {
  const std::string html = RenderReport(FixedReport(), ReportFormat::kHtml);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;co|pipe"),
            std::string::npos);
  EXPECT_EQ(html.find("http"), std::string::npos);  // no network, no external scripts or fonts
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(EscapeHtml(R"(<a href="x">'&'</a>)"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
}

TEST(ReportTest, PredictedPeakSitsBesideTheMeasuredOneWithItsError) {
  v1::ReportResponse report = FixedReport();
  // Submitted with the estimate's predictions: 27,749.0 MiB against 31,139.0 measured, and an
  // out-of-memory verdict; the third trial was not estimated.
  v1::TrialPrediction* predicted = report.mutable_trials(0)->mutable_prediction();
  predicted->set_peak_bytes(29096949760);
  predicted->set_activation_bytes(14847606784);
  predicted->set_model_state_bytes(17600774148);
  predicted->set_peak_phase("backward");
  predicted->set_device_memory_bytes(80 * 1024 * kMiB);
  predicted->set_verdict("fits");
  v1::TrialPrediction* oom = report.mutable_trials(1)->mutable_prediction();
  oom->set_peak_bytes(140371206144);
  oom->set_verdict("oom");
  oom->set_device_memory_bytes(80 * 1024 * kMiB);
  const std::string table = RenderReport(report, ReportFormat::kTable);
  EXPECT_NE(table.find("peak MiB    predicted MiB   error"), std::string::npos) << table;
  // (27,749.0 - 31,139.0) / 31,139.0 for the trial that ran; an out-of-memory trial's error is
  // not a peak's, so none; a trial submitted without a prediction shows none.
  EXPECT_NE(table.find("31,139.0         27,749.0  -10.9%"), std::string::npos) << table;
  EXPECT_NE(table.find("133,868.4 (OOM)       –"), std::string::npos) << table;
  EXPECT_NE(table.find("predicted MiB: the peak `llmctl estimate` predicted at submit"),
            std::string::npos)
      << table;
  const nlohmann::json json = nlohmann::json::parse(RenderReport(report, ReportFormat::kJson));
  EXPECT_EQ(json["trials"][0]["prediction"]["peak_bytes"], 29096949760);
  EXPECT_EQ(json["trials"][0]["prediction"]["verdict"], "fits");
  EXPECT_NEAR(json["trials"][0]["prediction_error"].get<double>(), -0.1089, 0.0005);
  EXPECT_TRUE(json["trials"][1]["prediction_error"].is_null());
  EXPECT_TRUE(json["trials"][2]["prediction"].is_null());
  const std::string csv = RenderReport(report, ReportFormat::kCsv);
  EXPECT_NE(csv.find(",predicted_peak_bytes,predicted_verdict,prediction_error\n"),
            std::string::npos);
  EXPECT_NE(csv.find(",29096949760,fits,-0.10"), std::string::npos) << csv;
  const std::string html = RenderReport(report, ReportFormat::kHtml);
  EXPECT_NE(html.find("<th>predicted MiB</th><th>error</th>"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"n\">-10.9%</td>"), std::string::npos);
}

// tokens/s, and the predicted tokens/s' error, leave out each attempt's first step (its one-time
// work): attempt 1 ran steps 0-2, attempt 3 resumed at step 3 and ran 3-4.
TEST(ReportTest, TokensPerSecondLeavesOutEachAttemptsFirstStep) {
  v1::ReportResponse report;
  report.set_experiment_id(3);
  report.set_name("timed");
  v1::TrialReport* trial = report.add_trials();
  trial->set_name("resumed");
  trial->set_outcome("ok");
  trial->set_attempt(3);
  trial->set_train_seconds(4.0);
  trial->set_tokens_per_second(250);  // the whole run's: 1,000 tokens over 4 s
  for (const auto& [attempt, step, seconds] : std::vector<std::tuple<int, int, double>>{
           {1, 0, 1.0}, {1, 1, 0.5}, {1, 2, 0.5}, {3, 3, 1.5}, {3, 4, 0.5}}) {
    v1::TrialStep* row = trial->add_steps();
    row->set_attempt(attempt);
    row->set_step(step);
    row->set_tokens(200);
    row->set_seconds(seconds);
  }
  trial->mutable_prediction()->set_step_seconds(0.4);
  trial->mutable_prediction()->set_tokens_per_second(480);
  // Steps 1, 2 and 4: 600 tokens over 1.5 s.
  EXPECT_DOUBLE_EQ(SteadyTokensPerSecond(*trial), 400.0);
  EXPECT_NEAR(*TimePredictionError(*trial), 0.2, 1e-12);
  const std::string table = RenderReport(report, ReportFormat::kTable);
  EXPECT_NE(table.find("  400                 480  +20.0%"), std::string::npos) << table;
  EXPECT_NE(table.find("tokens/s: the run's steps after each attempt's first"), std::string::npos)
      << table;
  const nlohmann::json json = nlohmann::json::parse(RenderReport(report, ReportFormat::kJson));
  EXPECT_EQ(json["trials"][0]["tokens_per_second"], 250.0);
  EXPECT_EQ(json["trials"][0]["steady_tokens_per_second"], 400.0);
  EXPECT_NEAR(json["trials"][0]["tokens_per_second_prediction_error"].get<double>(), 0.2, 1e-12);
  // The HTML page's tokens/s chart shows the table's figure, not the whole run's.
  const std::string html = RenderReport(report, ReportFormat::kHtml);
  EXPECT_NE(html.find(">400</text>"), std::string::npos) << html;
  EXPECT_EQ(html.find(">250</text>"), std::string::npos) << html;

  // A one-step run has no step after its first: the whole run's figure.
  v1::TrialReport one_step;
  one_step.set_tokens_per_second(250);
  v1::TrialStep* only = one_step.add_steps();
  only->set_attempt(1);
  only->set_tokens(200);
  only->set_seconds(0.8);
  EXPECT_DOUBLE_EQ(SteadyTokensPerSecond(one_step), 250.0);

  // Steps as a hostile event line can make them: tokens that overflow an int64 sum give a finite
  // figure, and steps whose seconds add up to nothing give the whole run's.
  v1::TrialReport hostile;
  hostile.set_tokens_per_second(250);
  for (int step = 0; step < 3; ++step) {
    v1::TrialStep* row = hostile.add_steps();
    row->set_attempt(1);
    row->set_step(step);
    row->set_tokens(std::numeric_limits<int64_t>::max());
    row->set_seconds(1.0);
  }
  EXPECT_DOUBLE_EQ(SteadyTokensPerSecond(hostile),
                   static_cast<double>(std::numeric_limits<int64_t>::max()));
  hostile.mutable_steps(1)->set_seconds(-1.0);
  hostile.mutable_steps(2)->set_seconds(0.5);
  EXPECT_DOUBLE_EQ(SteadyTokensPerSecond(hostile), 250.0);
}

// The report says what the predicted tokens/s were predicted at: the calibration and the rates
// stored with each prediction, once when the trials share them, by trial when they differ.
TEST(ReportTest, SaysWhereThePredictedTimeCameFrom) {
  const std::string probed =
      "built-in calibration; measured rates: this machine's probe (/h/probe.json): cpu AMD EPYC (2 "
      "threads, LibTorch 2.15.0), 2026-12-01T03:38:26Z, its speed moving 23% while measured";
  v1::ReportResponse report;
  report.set_name("timed");
  for (const char* name : {"a", "b", "untimed"}) {
    v1::TrialReport* trial = report.add_trials();
    trial->set_name(name);
    trial->set_outcome("ok");
    if (std::string(name) == "untimed") continue;
    trial->mutable_prediction()->set_step_seconds(0.5);
    trial->mutable_prediction()->set_tokens_per_second(100);
    trial->mutable_prediction()->set_calibration(probed);
  }
  EXPECT_EQ(TimeSourceLines(report), std::vector<std::string>{"predicted tokens/s at: " + probed});
  const std::string table = RenderReport(report, ReportFormat::kTable);
  EXPECT_NE(table.find("\npredicted tokens/s at: " + probed + "\n"), std::string::npos) << table;
  EXPECT_NE(table.find("its speed moving 23% while measured"), std::string::npos);
  const std::string html = RenderReport(report, ReportFormat::kHtml);
  EXPECT_NE(html.find("<p>predicted tokens/s at: built-in calibration; measured rates: this "
                      "machine&#39;s probe"),
            std::string::npos)
      << html;

  // Two sources: each line names its trials; a prediction stored without one says so.
  report.mutable_trials(1)->mutable_prediction()->set_calibration("");
  report.mutable_trials(2)->mutable_prediction()->set_step_seconds(0.5);
  report.mutable_trials(2)->mutable_prediction()->set_calibration(probed);
  EXPECT_EQ(TimeSourceLines(report),
            (std::vector<std::string>{"predicted tokens/s of a, untimed at: " + probed,
                                      "predicted tokens/s of b at: an unrecorded calibration"}));

  // No trial with a predicted time: no line.
  for (v1::TrialReport& trial : *report.mutable_trials()) trial.clear_prediction();
  EXPECT_TRUE(TimeSourceLines(report).empty());
}

// A report is the controller's answer: its words reach the terminal without their control
// characters, a Markdown row stays one row without raw HTML, a CSV cell is never a spreadsheet's
// formula, a config nested past any real one stays text (dumping it recursed per level and
// overflowed the stack), and only the step's phases make columns.
TEST(ReportTest, AHostileReportIsRenderedSafely) {
  v1::ReportResponse report = FixedReport();
  report.set_name("lab\x1b]0;owned\x07");
  report.mutable_trials(0)->set_name("a\x1b[2J\n| fake | row |<script>");
  report.mutable_trials(0)->set_outcome("ok\r\x1b[K");
  report.mutable_trials(0)->set_final_loss(-1.5);
  report.mutable_trials(1)->set_name("=HYPERLINK(\"http://x\")");
  report.mutable_trials(1)->set_config_json(std::string(100000, '[') + std::string(100000, ']'));
  const std::string table = RenderReport(report, ReportFormat::kTable);
  EXPECT_EQ(table.find_first_of("\x1b\x07\r"), std::string::npos) << table;
  EXPECT_NE(table.find("experiment 7: lab ]0;owned \n"), std::string::npos) << table;

  const std::string markdown = RenderReport(report, ReportFormat::kMarkdown);
  EXPECT_NE(markdown.find("| a \\[2J \\| fake \\| row \\|&lt;script> |"), std::string::npos)
      << markdown;
  EXPECT_EQ(markdown.find('\x1b'), std::string::npos);

  const std::string csv = RenderReport(report, ReportFormat::kCsv);
  EXPECT_NE(csv.find("\n\"'=HYPERLINK(\"\"http://x\"\")\","), std::string::npos) << csv;
  EXPECT_NE(csv.find(",-1.5,"), std::string::npos) << "a negative figure stays a number: " << csv;

  const nlohmann::json json = nlohmann::json::parse(RenderReport(report, ReportFormat::kJson));
  EXPECT_TRUE(json["trials"][1]["config"].is_string());

  v1::TrialReport* ranked = report.mutable_trials(0);
  for (int rank = 0; rank < 3; ++rank) {
    v1::RankMemory* memory = ranked->add_ranks();
    memory->set_rank(rank);
    v1::PhaseBytes* made_up = memory->add_per_phase();
    made_up->set_phase(std::array{"p0", "p1", "p2"}[static_cast<size_t>(rank)]);
    made_up->set_allocated_bytes(1);
    v1::PhaseBytes* known = memory->add_per_phase();
    known->set_phase("phase1_after_fwd");
    known->set_allocated_bytes((rank + 1) << 20);
  }
  const std::vector<PhaseRange> ranges = PhaseRanges(*ranked);
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0].phase, "phase1_after_fwd");
  EXPECT_EQ(ranges[0].min, 1 << 20);
  EXPECT_EQ(ranges[0].max, 3 << 20);
}

// `report --format csv` goes to the terminal too: the controller's words (a trial's name, its
// description, error, a rank's phase) reach it on one line each, without an escape, BEL or C1 CSI.
TEST(ReportTest, CsvCellsAreOneLineWithoutControlCharacters) {
  v1::ReportResponse report = FixedReport();
  report.mutable_trials(0)->set_error("w\x1b]0;HUBTITLE\x07\x1b[31mRED.bin has no size\r\nFORGED");
  report.mutable_trials(1)->set_description(
      "two\nlines \xc2\x9b"
      "2J");
  report.mutable_trials(2)->set_name("\tcell");
  v1::RankMemory* rank = report.mutable_trials(2)->add_ranks();
  rank->add_per_phase()->set_phase("p\x1b[2J");
  const std::string csv = RenderReport(report, ReportFormat::kCsv);
  EXPECT_EQ(csv.find_first_of("\x1b\x07\r\t"), std::string::npos) << csv;
  EXPECT_EQ(csv.find("\xc2\x9b"), std::string::npos) << csv;
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + report.trials_size()) << csv;
  EXPECT_NE(csv.find(",w ]0;HUBTITLE  [31mRED.bin has no size  FORGED,"), std::string::npos) << csv;
  EXPECT_NE(csv.find("\n cell,"), std::string::npos) << csv;
}

// `report --format json` goes to the terminal too: every character past ASCII is written as
// \uXXXX, so a C1 CSI (U+009B) or a right-to-left override (U+202E) in the controller's words is
// not one there; a JSON reader reads the same strings back.
TEST(ReportTest, JsonWritesNonAsciiAsEscapes) {
  v1::ReportResponse report = FixedReport();
  const std::string error =
      "died \xe2\x80\xae"
      "txt.exe \xc2\x9b"
      "2J \xe2\x80\x93 done";
  report.mutable_trials(0)->set_error(error);
  v1::KernelFallback* fallback = report.mutable_trials(0)->add_kernel_fallbacks();
  fallback->set_op("rms_norm");
  fallback->set_reason(
      "\xe2\x81\xa6"
      "odd");
  const std::string text = RenderReport(report, ReportFormat::kJson);
  EXPECT_TRUE(std::all_of(text.begin(), text.end(),
                          [](char c) { return static_cast<unsigned char>(c) < 0x80; }));
  EXPECT_NE(text.find(R"("error": "died \u202etxt.exe \u009b2J \u2013 done")"), std::string::npos)
      << text;
  EXPECT_NE(text.find(R"("reason": "\u2066odd")"), std::string::npos) << text;
  const nlohmann::json json = nlohmann::json::parse(text);
  EXPECT_EQ(json["trials"][0]["error"], error);
}

// `report --format html` without --output goes to the terminal: an escape sequence or C1 control
// in a trial's name (a chart's label, a <figcaption>), a phase (a <title>) or an error (a <p>) is
// a space there; HTML's own characters are still entities.
TEST(ReportTest, HtmlTextHoldsNoControlCharacters) {
  v1::ReportResponse report = FixedReport();
  report.mutable_trials(0)->set_name("a\x1b]0;T\x07<b>");
  report.mutable_trials(0)->set_error(
      "boom\r\n\xc2\x9b"
      "2J");
  report.mutable_trials(0)->mutable_at_peak()->set_phase("phase1\x1b[31m");
  const std::string html = RenderReport(report, ReportFormat::kHtml);
  EXPECT_EQ(html.find_first_of("\x1b\x07\r"), std::string::npos);
  EXPECT_EQ(html.find("\xc2\x9b"), std::string::npos);
  EXPECT_NE(html.find("<p><b>a ]0;T &lt;b&gt;</b>: boom   2J</p>"), std::string::npos) << html;
  EXPECT_EQ(EscapeHtml("line\none\t\x7f'&"), "line one  &#39;&amp;");
}

// A trial's name in a Markdown table is literal text: it cannot add an image, a link, emphasis or
// code, nor end its cell with `\|`.
TEST(ReportTest, MarkdownCellsAreLiteralText) {
  v1::ReportResponse report = FixedReport();
  report.mutable_trials(0)->set_name("evil/model=![a](http://evil.example/x.png)");
  report.mutable_trials(1)->set_name("[c](javascript:alert(1))");
  report.mutable_trials(2)->set_name("m\\|x *b* _i_ `c` ~s~ &lt;");
  const std::string markdown = RenderReport(report, ReportFormat::kMarkdown);
  EXPECT_NE(markdown.find("| evil/model=\\!\\[a\\]\\(http://evil.example/x.png\\) | ok |"),
            std::string::npos)
      << markdown;
  EXPECT_NE(markdown.find("| \\[c\\]\\(javascript:alert\\(1\\)\\) | oom |"), std::string::npos)
      << markdown;
  EXPECT_NE(markdown.find("| m\\\\\\|x \\*b\\* \\_i\\_ \\`c\\` \\~s\\~ \\&lt; | ok | **oom** "
                          "(expected ok) |"),
            std::string::npos)
      << markdown;
}

// The table's cells and the lines under it cut the controller's words (a trial's name at 200
// bytes, an outcome, a kernel fallback's reason at 300) and space out their bidi controls: one
// 5,000-byte name made every row that wide.
TEST(ReportTest, TheTableCutsLongWordsAndSpacesOutBidiControls) {
  v1::ReportResponse report = FixedReport();
  report.mutable_trials(0)->set_name(std::string(5000, 'n'));
  report.mutable_trials(1)->set_name(
      "evil\xe2\x80\xae"
      "gpj.exe");
  report.mutable_trials(2)->set_outcome(std::string(5000, 'o'));
  v1::KernelFallback* fallback = report.mutable_trials(1)->add_kernel_fallbacks();
  fallback->set_op("rms_norm");
  fallback->set_reason(std::string(60000, 'r'));
  for (ReportFormat format : {ReportFormat::kTable, ReportFormat::kMarkdown}) {
    const std::string text = RenderReport(report, format);
    EXPECT_EQ(text.find("\xe2\x80\xae"), std::string::npos) << text;
    EXPECT_NE(text.find("evil gpj.exe"), std::string::npos) << text;
    size_t start = 0;
    for (size_t end = text.find('\n'); end != std::string::npos;
         start = end + 1, end = text.find('\n', start)) {
      EXPECT_LT(end - start, 1000u) << text.substr(start, 200);
    }
  }
  const std::string table = RenderReport(report, ReportFormat::kTable);
  EXPECT_NE(table.find(std::string(100, 'r').append("\u2026)\n")), std::string::npos) << table;
}

TEST(ReportTest, CountsOutcomesOtherThanExpected) {
  v1::ReportResponse report = FixedReport();
  EXPECT_EQ(CountUnexpectedOutcomes(report), 1);  // cpu-offload; the running one expects nothing
  report.mutable_trials(3)->set_expected("ok");
  EXPECT_EQ(CountUnexpectedOutcomes(report), 2);
  // Without `expect:`, ok and oom are measurements; failed, invalid (an input refused, nothing
  // ran), diverged and cancelled are not.
  report.mutable_trials(3)->clear_expected();
  const std::map<std::string, int> unexpected_without_expect = {
      {"ok", 0},       {"oom", 0},       {"failed", 1}, {"invalid", 1},
      {"diverged", 1}, {"cancelled", 1}, {"running", 0}};
  for (const auto& [outcome, extra] : unexpected_without_expect) {
    report.mutable_trials(3)->set_outcome(outcome);
    EXPECT_EQ(CountUnexpectedOutcomes(report), 1 + extra) << outcome;
  }
}

TEST(ReportTest, AResumedRunSaysWhichAttemptRanWhichSteps) {
  v1::ReportResponse report;
  report.set_experiment_id(3);
  report.set_name("resumed");
  v1::TrialReport* trial = report.add_trials();
  trial->set_name("long");
  trial->set_outcome("ok");
  trial->set_attempt(3);
  trial->add_run_attempts(1);
  trial->add_run_attempts(3);
  for (const auto& [attempt, step] :
       std::vector<std::pair<int, int>>{{1, 0}, {1, 1}, {1, 2}, {3, 3}, {3, 4}}) {
    v1::TrialStep* entry = trial->add_steps();
    entry->set_attempt(attempt);
    entry->set_step(step);
    entry->set_loss(10.0 - step);
  }
  const std::string table = RenderReport(report, ReportFormat::kTable);
  EXPECT_NE(table.find("\nlong: resumed; steps 1-3 in attempt 1, 4-5 in attempt 3\n"),
            std::string::npos)
      << table;
  const nlohmann::json json = nlohmann::json::parse(RenderReport(report, ReportFormat::kJson));
  EXPECT_EQ(json["trials"][0]["run_attempts"], nlohmann::json({1, 3}));
  ASSERT_EQ(json["trials"][0]["steps"].size(), 5u);
  EXPECT_EQ(json["trials"][0]["steps"][3],
            nlohmann::json(
                {{"attempt", 3}, {"step", 3}, {"loss", 7.0}, {"tokens", 0}, {"seconds", 0.0}}));
  // A run of one attempt says nothing more.
  EXPECT_EQ(RenderReport(FixedReport(), ReportFormat::kTable).find("resumed;"), std::string::npos);
}

// Issue 37: event lines stored as refused_line events are counted, under the table and in the JSON.
TEST(ReportTest, RefusedEventLinesAreCountedUnderTheTableAndInTheJson) {
  v1::ReportResponse report = FixedReport();
  report.mutable_trials(0)->set_refused_event_lines(3);
  const std::string table = RenderReport(report, ReportFormat::kTable);
  EXPECT_NE(table.find("\n" + report.trials(0).name() + ": 3 event line(s) refused ("),
            std::string::npos)
      << table;
  const nlohmann::json json = nlohmann::json::parse(RenderReport(report, ReportFormat::kJson));
  EXPECT_EQ(json["trials"][0]["refused_event_lines"], 3);
  EXPECT_EQ(json["trials"][1]["refused_event_lines"], 0);
  EXPECT_EQ(RenderReport(FixedReport(), ReportFormat::kTable).find("refused"), std::string::npos);
}

// Issue 38: a fused op that ran ATen's composition is named under the table and in the JSON, never
// silently.
TEST(ReportTest, KernelFallbacksAreNamedUnderTheTableAndInTheJson) {
  v1::ReportResponse report = FixedReport();
  v1::KernelFallback* fallback = report.mutable_trials(0)->add_kernel_fallbacks();
  fallback->set_op("rms_norm");
  fallback->set_reason("dtype Double (the fused kernels take float32, bfloat16 and float16)");
  fallback->set_step(2);
  const std::string table = RenderReport(report, ReportFormat::kTable);
  EXPECT_NE(table.find("\n" + report.trials(0).name() +
                       ": kernels: fused ran ATen's rms_norm instead of its kernel from step 2 "
                       "(dtype Double (the fused kernels take float32, bfloat16 and float16))\n"),
            std::string::npos)
      << table;
  const nlohmann::json json = nlohmann::json::parse(RenderReport(report, ReportFormat::kJson));
  ASSERT_EQ(json["trials"][0]["kernel_fallbacks"].size(), 1u);
  EXPECT_EQ(json["trials"][0]["kernel_fallbacks"][0]["op"], "rms_norm");
  EXPECT_EQ(json["trials"][0]["kernel_fallbacks"][0]["step"], 2);
  EXPECT_EQ(json["trials"][1]["kernel_fallbacks"], nlohmann::json::array());
  EXPECT_EQ(RenderReport(FixedReport(), ReportFormat::kTable).find("instead of its kernel"),
            std::string::npos);
  // The op and the reason are a trainer's words: their control characters never reach the
  // terminal.
  fallback->set_op("rms_norm\x1b[2J");
  fallback->set_reason("clear\x1b]0;owned\x07\nline");
  EXPECT_NE(
      RenderReport(report, ReportFormat::kTable)
          .find("ATen's rms_norm [2J instead of its kernel from step 2 (clear ]0;owned  line)"),
      std::string::npos);
}

// The attempts of a run follow each other on one axis, each from its trainer's start; device
// samples are placed by their wall clock against that start, those from before it left out.
TEST(MemoryTimelineTest, LaysOutAttemptsEndToEndAndSamplesByTheirClock) {
  const v1::ReportResponse report = FixedReport();
  const MemoryTimeline ok = LayOutMemoryTimeline(report.trials(0));
  ASSERT_EQ(ok.attempts.size(), 1u);
  EXPECT_EQ(ok.attempts[0].limit_bytes, 80 * 1024 * kMiB);
  ASSERT_EQ(ok.snapshots.size(), 6u);
  const v1::AttemptMemory& stored = report.trials(0).memory_timeline(0);
  for (size_t i = 0; i < ok.snapshots.size(); ++i) {
    const v1::MemorySnapshot& snap = stored.snapshots(static_cast<int>(i));
    EXPECT_DOUBLE_EQ(ok.snapshots[i].seconds, snap.elapsed_ms() / 1000);
    EXPECT_EQ(ok.snapshots[i].allocated_bytes, snap.allocated_bytes());
    EXPECT_EQ(ok.snapshots[i].reserved_bytes, snap.reserved_bytes());
    EXPECT_EQ(ok.snapshots[i].phase, snap.phase());
  }
  ASSERT_EQ(ok.device_used.at("cuda:0").size(), 4u);  // the one from before the start left out
  EXPECT_DOUBLE_EQ(ok.device_used.at("cuda:0")[1].seconds, 1.0);
  EXPECT_EQ(ok.device_used.at("cuda:0")[3].used_bytes, 31 * 1024 * kMiB);
  EXPECT_DOUBLE_EQ(ok.end_seconds, 3.0);  // the last sample outlasts the last snapshot
  EXPECT_EQ(ok.top_bytes, 80 * 1024 * kMiB);
  // A CPU node's samples (the trial's resident memory) are no device's memory.
  v1::TrialReport on_cpu = report.trials(0);
  for (v1::DeviceMemorySample& sample :
       *on_cpu.mutable_memory_timeline(0)->mutable_device_samples()) {
    sample.set_device("cpu");
  }
  EXPECT_TRUE(LayOutMemoryTimeline(on_cpu).device_used.empty());
  EXPECT_DOUBLE_EQ(LayOutMemoryTimeline(on_cpu).end_seconds, 2.6);

  // Resumed an hour later: the second attempt starts where the first one's trainer ended (after
  // its last snapshot), and ends at its own last snapshot, as it has no end.
  const MemoryTimeline resumed = LayOutMemoryTimeline(report.trials(2));
  ASSERT_EQ(resumed.attempts.size(), 2u);
  EXPECT_DOUBLE_EQ(resumed.attempts[0].end_seconds, 0.06);
  EXPECT_DOUBLE_EQ(resumed.attempts[1].start_seconds, 0.06);
  ASSERT_EQ(resumed.snapshots.size(), 4u);
  EXPECT_EQ(resumed.snapshots[2].attempt, 2);
  EXPECT_DOUBLE_EQ(resumed.snapshots[2].seconds, 0.06 + 0.015);
  EXPECT_DOUBLE_EQ(resumed.end_seconds, 0.1);
}

// One figure of the "Memory over time" section, by its trial's name.
std::string TimelineFigure(const std::string& html, const std::string& trial) {
  const size_t section = html.find("<h2>Memory over time</h2>");
  const size_t begin = html.find("<figcaption>" + trial + "</figcaption>", section);
  if (section == std::string::npos || begin == std::string::npos) return "";
  return html.substr(begin, html.find("</figure>", begin) - begin);
}

// The (x, y) pairs of every `<polyline class="CLASS" ... points="...">` in `svg`, one list each.
std::vector<std::vector<std::pair<double, double>>> Polylines(const std::string& svg,
                                                              const std::string& css_class) {
  std::vector<std::vector<std::pair<double, double>>> lines;
  const std::regex polyline("<polyline class=\"" + css_class + "\"[^>]* points=\"([^\"]*)\"");
  for (std::sregex_iterator it(svg.begin(), svg.end(), polyline), end; it != end; ++it) {
    std::vector<std::pair<double, double>>& line = lines.emplace_back();
    std::istringstream points((*it)[1].str());
    for (std::string pair; points >> pair;) {
      const size_t comma = pair.find(',');
      line.emplace_back(std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1)));
    }
  }
  return lines;
}

// The chart draws the snapshots themselves: one point per snapshot, x an affine function of its
// seconds and y of its bytes (to the SVG's 0.1 px), one line per attempt.
TEST(MemoryTimelineTest, ChartPointsAreTheSnapshots) {
  const v1::ReportResponse report = FixedReport();
  const std::string html = RenderReport(report, ReportFormat::kHtml);
  for (int t : {0, 1, 2}) {
    const v1::TrialReport& trial = report.trials(t);
    const std::string figure = TimelineFigure(html, trial.name());
    ASSERT_FALSE(figure.empty()) << trial.name();
    const auto lines = Polylines(figure, "allocated");
    ASSERT_EQ(static_cast<int>(lines.size()), trial.memory_timeline_size()) << trial.name();
    std::vector<std::pair<double, double>> points;      // drawn
    std::vector<std::pair<double, int64_t>> snapshots;  // stored: joined seconds, bytes
    double offset = 0;
    for (int a = 0; a < trial.memory_timeline_size(); ++a) {
      const v1::AttemptMemory& attempt = trial.memory_timeline(a);
      ASSERT_EQ(static_cast<int>(lines[a].size()), attempt.snapshots_size()) << trial.name();
      points.insert(points.end(), lines[a].begin(), lines[a].end());
      for (const v1::MemorySnapshot& snap : attempt.snapshots()) {
        snapshots.emplace_back(offset + snap.elapsed_ms() / 1000, snap.allocated_bytes());
      }
      offset +=
          std::max(attempt.ended_elapsed_ms(), attempt.snapshots().rbegin()->elapsed_ms()) / 1000;
    }
    // The scales from the first and the highest point, checked on every point.
    const size_t high = static_cast<size_t>(
        std::max_element(snapshots.begin(), snapshots.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; }) -
        snapshots.begin());
    const double x_per_second =
        (points[high].first - points[0].first) / (snapshots[high].first - snapshots[0].first);
    const double y_per_byte = (points[high].second - points[0].second) /
                              static_cast<double>(snapshots[high].second - snapshots[0].second);
    EXPECT_GT(x_per_second, 0);
    EXPECT_LT(y_per_byte, 0);  // up the page
    for (size_t i = 0; i < points.size(); ++i) {
      EXPECT_NEAR(points[i].first,
                  points[0].first + x_per_second * (snapshots[i].first - snapshots[0].first), 0.1)
          << trial.name() << " point " << i;
      EXPECT_NEAR(points[i].second,
                  points[0].second +
                      y_per_byte * static_cast<double>(snapshots[i].second - snapshots[0].second),
                  0.1)
          << trial.name() << " point " << i;
    }
  }
  const std::string ok = TimelineFigure(html, "reduced-batch");
  EXPECT_EQ(Polylines(ok, "device").at(0).size(), 4u);
  EXPECT_NE(ok.find("limit 80.00 GiB"), std::string::npos);
  EXPECT_NE(ok.find("<title>phase1_after_fwd, step 1, micro-batch 0, 2.600 s: allocated 29,696.0 "
                    "MiB, reserved 29,704.0 MiB</title>"),
            std::string::npos);
  const std::string oom = TimelineFigure(html, "baseline");
  EXPECT_NE(oom.find("class=\"oom\""), std::string::npos);
  EXPECT_NE(oom.find("out of memory"), std::string::npos);
  EXPECT_EQ(TimelineFigure(html, "reduced-batch").find("class=\"oom\""), std::string::npos);
  EXPECT_NE(TimelineFigure(html, "cpu-offload").find("attempt 2"), std::string::npos);

  // Attempts with one limit: a line over each, its label once.
  v1::ReportResponse same_limit = FixedReport();
  for (v1::AttemptMemory& attempt : *same_limit.mutable_trials(2)->mutable_memory_timeline()) {
    attempt.set_device_limit_bytes(100 * kMiB);
  }
  const std::string resumed =
      TimelineFigure(RenderReport(same_limit, ReportFormat::kHtml), "cpu-offload");
  size_t lines = 0;
  for (size_t at = resumed.find("class=\"limit\""); at != std::string::npos;
       at = resumed.find("class=\"limit\"", at + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 2u);
  EXPECT_EQ(resumed.find(">limit 100.00 MiB<"), resumed.rfind(">limit 100.00 MiB<"));
  EXPECT_NE(resumed.find(">limit 100.00 MiB<"), std::string::npos);
}

TEST(ReportTest, ParsesFormatNames) {
  EXPECT_EQ(*ParseReportFormat("md"), ReportFormat::kMarkdown);
  EXPECT_EQ(*ParseReportFormat("html"), ReportFormat::kHtml);
  Status bad = ParseReportFormat("pdf").status();
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(),
            "--format: unknown format 'pdf' (one of table, csv, json, markdown, html)");
}

}  // namespace
}  // namespace llmctl::cli
