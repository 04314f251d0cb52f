#include "controller/cli/report.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>
#include <vector>

#include "controller/cli/report_format.h"
#include "controller/cli/report_rows.h"
#include "controller/cli/report_test_support.h"
#include "tests/support/shell_command.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

using report_test_support::FixedReport;
using report_test_support::kMiB;

fs::path TestdataDir() { return llmctl::testing::SourceDir() / "controller" / "cli" / "testdata"; }

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
                     "1:phase0_before_fwd=41943040|phase1_after_fwd=73400320,,,,"),
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
  EXPECT_NE(markdown.find("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"),
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

// The Markdown rows are the terminal table's, cell for cell.
TEST(ReportTest, MarkdownRowsReadLikeTheLabTable) {
  const std::string markdown = RenderReport(FixedReport(), ReportFormat::kMarkdown);
  EXPECT_NE(markdown.find("| trial | expected | outcome | Params MiB | Grads MiB | Optim MiB "
                          "(device + host) | Acts MiB | peak MiB | train s | tokens/s | steps ± |\n"
                          "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"),
            std::string::npos);
  EXPECT_NE(markdown.find("| reduced-batch | ok | ok | 4,196.0 | 4,196.0 | 8,392.0 | 9,000.0 | "
                          "31,139.0 | 137.0 | 12,506 | – |"),
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
  // An OOM trial measured no rate: null, not 0.0.
  const nlohmann::json& oom = json["trials"][1];
  EXPECT_EQ(oom["outcome"], "oom");
  EXPECT_TRUE(oom["tokens_per_second"].is_null()) << oom["tokens_per_second"];
  EXPECT_TRUE(oom["steady_tokens_per_second"].is_null()) << oom["steady_tokens_per_second"];
  EXPECT_EQ(ok["tokens_per_second"], 12506.13);
  const nlohmann::json& running = json["trials"][3];
  EXPECT_TRUE(running["tokens_per_second"].is_null());
  EXPECT_TRUE(running["train_seconds"].is_null()) << running["train_seconds"];
  EXPECT_EQ(ok["train_seconds"], 137.04);
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
  EXPECT_NE(csv.find(",predicted_peak_bytes,predicted_verdict,prediction_error,"),
            std::string::npos);
  EXPECT_NE(csv.find(",29096949760,fits,-0.10"), std::string::npos) << csv;
  const std::string html = RenderReport(report, ReportFormat::kHtml);
  EXPECT_NE(html.find("<th>predicted MiB</th><th>error</th>"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"n\">-10.9%</td>"), std::string::npos);

  // A peak within the caching allocator's slack of a GPU's limit is said so beside the figure.
  predicted->set_verdict("tight");
  EXPECT_NE(RenderReport(report, ReportFormat::kTable).find("27,749.0 (tight)  -10.9%"),
            std::string::npos)
      << RenderReport(report, ReportFormat::kTable);
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
  EXPECT_NEAR(TimePredictionError(*trial).value(), 0.2, 1e-12);
  const std::string table = RenderReport(report, ReportFormat::kTable);
  // Steps 1, 2 and 4 took 0.5 s each for their 200 tokens: steps ± 0%.
  EXPECT_DOUBLE_EQ(StepVariation(*trial).value(), 0.0);
  EXPECT_NE(table.find("  400       0%                 480  +20.0%"), std::string::npos) << table;
  EXPECT_NE(table.find("tokens/s: the run's steps after each attempt's first"), std::string::npos)
      << table;
  const nlohmann::json json = nlohmann::json::parse(RenderReport(report, ReportFormat::kJson));
  EXPECT_EQ(json["trials"][0]["tokens_per_second"], 250.0);
  EXPECT_EQ(json["trials"][0]["steady_tokens_per_second"], 400.0);
  EXPECT_NEAR(json["trials"][0]["tokens_per_second_prediction_error"].get<double>(), 0.2, 1e-12);
  // The CSV has the table's figure and its prediction too, where it had only the whole run's.
  const std::string csv = RenderReport(report, ReportFormat::kCsv);
  EXPECT_NE(csv.find(",steady_tokens_per_second,predicted_tokens_per_second,"
                     "tokens_per_second_prediction_error,others_cpu_share,steady_step_variation,"
                     "machine_pace,tokens_per_second_prediction_error_at_pace\n"),
            std::string::npos)
      << csv;
  EXPECT_NE(csv.find(",400.0,480.0,0."), std::string::npos) << csv;
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
  // figure; a step of negative or infinite seconds weighs nothing, as in the busy share (an
  // infinite one made the figure 0 tokens/s, which the report showed as no measurement); and
  // steps whose seconds sum past every double, or no step with a time, give the whole run's.
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
  const double max_tokens = static_cast<double>(std::numeric_limits<int64_t>::max());
  hostile.mutable_steps(1)->set_seconds(-1.0);
  hostile.mutable_steps(2)->set_seconds(0.5);
  EXPECT_DOUBLE_EQ(SteadyTokensPerSecond(hostile), max_tokens / 0.5);
  hostile.mutable_steps(1)->set_seconds(std::numeric_limits<double>::infinity());
  EXPECT_DOUBLE_EQ(SteadyTokensPerSecond(hostile), max_tokens / 0.5);
  hostile.mutable_steps(1)->set_seconds(1e308);
  hostile.mutable_steps(2)->set_seconds(1e308);
  EXPECT_DOUBLE_EQ(SteadyTokensPerSecond(hostile), 250.0);
  hostile.mutable_steps(1)->set_seconds(0.0);
  hostile.mutable_steps(2)->set_seconds(-0.5);
  EXPECT_DOUBLE_EQ(SteadyTokensPerSecond(hostile), 250.0);
}

// steps ± is how much the steady steps' time a token moved around its mean: each attempt's first
// step and a step without tokens left out, as from the tokens/s; none with fewer than two steps
// or while the trial runs.
TEST(ReportTest, StepsPlusMinusIsTheSteadyStepsVariationOfTheirTimeAToken) {
  v1::ReportResponse report;
  report.set_experiment_id(5);
  report.set_name("uneven");
  v1::TrialReport* trial = report.add_trials();
  trial->set_name("uneven");
  trial->set_outcome("ok");
  trial->set_attempt(2);
  trial->set_train_seconds(12.0);
  trial->set_tokens_per_second(100);
  for (const auto& [attempt, step, tokens, seconds] :
       std::vector<std::tuple<int, int, int, double>>{{1, 0, 100, 10.0},
                                                      {1, 1, 100, 0.2},
                                                      {1, 2, 0, 0.1},
                                                      {2, 3, 300, 9.0},
                                                      {2, 4, 200, 0.3},
                                                      {2, 5, 200, 0.5}}) {
    v1::TrialStep* row = trial->add_steps();
    row->set_attempt(attempt);
    row->set_step(step);
    row->set_tokens(tokens);
    row->set_seconds(seconds);
  }
  // 2.0, 1.5 and 2.5 ms a token: a standard deviation of 0.5 ms over a mean of 2.0.
  EXPECT_NEAR(StepVariation(*trial).value(), 0.25, 1e-12);
  const std::string table = RenderReport(report, ReportFormat::kTable);
  EXPECT_NE(table.find("  steps \u00b1\n"), std::string::npos) << table;
  EXPECT_NE(table.find("  25%\n"), std::string::npos) << table;
  EXPECT_NE(table.find("steps \u00b1: how much the time a token"), std::string::npos) << table;
  const nlohmann::json json = nlohmann::json::parse(RenderReport(report, ReportFormat::kJson));
  EXPECT_NEAR(json["trials"][0]["steady_step_variation"].get<double>(), 0.25, 1e-12);
  EXPECT_NE(RenderReport(report, ReportFormat::kCsv).find(",0.25,,\n"), std::string::npos);
  EXPECT_NE(RenderReport(report, ReportFormat::kHtml).find("<th>steps \u00b1</th>"),
            std::string::npos);

  v1::TrialReport running = *trial;
  running.set_outcome("running");
  EXPECT_FALSE(StepVariation(running).has_value());
  v1::TrialReport one_steady_step = *trial;
  one_steady_step.mutable_steps()->DeleteSubrange(4, 2);
  EXPECT_FALSE(StepVariation(one_steady_step).has_value());
}

// What others took of the machine's CPU is weighed over the steps the tokens/s is taken over, and
// a trial measured while they took 10% or more is named under the table, in the HTML, the JSON
// and the CSV; a share the trainer did not write, or one outside [0, 1], is not one.
TEST(ReportTest, ATrialMeasuredOnABusyMachineIsNamedWithTheShareOthersTook) {
  v1::ReportResponse report;
  report.set_experiment_id(4);
  report.set_name("busy");
  for (const auto& [name, shares] : std::vector<std::pair<std::string, std::vector<double>>>{
           {"quiet", {0.9, 0.02, 0.04}}, {"busy", {0.0, 0.5, 0.2}}, {"unmeasured", {}}}) {
    v1::TrialReport* trial = report.add_trials();
    trial->set_name(name);
    trial->set_outcome("ok");
    trial->set_attempt(1);
    trial->set_train_seconds(2.0);
    trial->set_tokens_per_second(300);
    for (int step = 0; step < 3; ++step) {
      v1::TrialStep* row = trial->add_steps();
      row->set_attempt(1);
      row->set_step(step);
      row->set_tokens(200);
      row->set_seconds(step == 2 ? 1.5 : 0.5);
      if (!shares.empty()) row->set_others_cpu_share(shares[static_cast<size_t>(step)]);
    }
  }
  // The first step is left out, as from the tokens/s: (0.5 x 0.5 + 0.2 x 1.5) / 2 s.
  EXPECT_DOUBLE_EQ(OthersCpuShare(report.trials(1)).value(), 0.275);
  EXPECT_DOUBLE_EQ(OthersCpuShare(report.trials(0)).value(), (0.02 * 0.5 + 0.04 * 1.5) / 2);
  EXPECT_FALSE(OthersCpuShare(report.trials(2)).has_value());
  const std::string line = BusyMachineLine(report);
  EXPECT_NE(line.find("busy machine: "), std::string::npos) << line;
  EXPECT_NE(line.find(": busy 28%; "), std::string::npos) << line;
  EXPECT_EQ(line.find("quiet"), std::string::npos) << line;
  EXPECT_NE(RenderReport(report, ReportFormat::kTable).find(line + "\n"), std::string::npos);
  EXPECT_NE(RenderReport(report, ReportFormat::kHtml).find("busy machine: "), std::string::npos);
  const nlohmann::json json = nlohmann::json::parse(RenderReport(report, ReportFormat::kJson));
  EXPECT_DOUBLE_EQ(json["trials"][1]["others_cpu_share"].get<double>(), 0.275);
  EXPECT_TRUE(json["trials"][2]["others_cpu_share"].is_null());
  EXPECT_DOUBLE_EQ(json["trials"][1]["steps"][1]["others_cpu_share"].get<double>(), 0.5);
  EXPECT_TRUE(json["trials"][2]["steps"][1]["others_cpu_share"].is_null());
  // others_cpu_share, then steady_step_variation: 0.5 and 1.5 s a step, 0.71 of their mean apart.
  EXPECT_NE(RenderReport(report, ReportFormat::kCsv).find(",0.275,0.7"), std::string::npos);

  // A trial still running has no steady tokens/s yet, and so no share beside it.
  v1::TrialReport running = report.trials(1);
  running.set_outcome("running");
  EXPECT_FALSE(OthersCpuShare(running).has_value());

  // A step whose seconds a hostile line made negative or infinite weighs nothing.
  v1::TrialReport hostile = report.trials(1);
  hostile.mutable_steps(2)->set_seconds(-1.0);
  EXPECT_DOUBLE_EQ(OthersCpuShare(hostile).value(), 0.5);
  hostile.mutable_steps(2)->set_seconds(std::numeric_limits<double>::infinity());
  EXPECT_DOUBLE_EQ(OthersCpuShare(hostile).value(), 0.5);

  // No trial at 10% or more: no line.
  report.mutable_trials(1)->mutable_steps(1)->set_others_cpu_share(0.05);
  report.mutable_trials(1)->mutable_steps(2)->set_others_cpu_share(0.05);
  EXPECT_EQ(BusyMachineLine(report), "");
  EXPECT_EQ(RenderReport(report, ReportFormat::kTable).find("busy machine"), std::string::npos);
}

// The machine's pace is the probe's canary seconds over the median of the steady steps' (the
// first step left out, as from the tokens/s), and the error at it the predicted tokens/s times
// the pace against the measured; a step's seconds that are no canary's, a trial without the
// probe's pace and one that did not end ok have none, and without any the table has no columns.
TEST(ReportTest, ThePaceSetsTheStepsCanaryAgainstTheProbesAndTakesItOutOfTheError) {
  v1::ReportResponse report;
  report.set_experiment_id(5);
  report.set_name("paced");
  for (const auto& [name, probe_pace] :
       std::vector<std::pair<std::string, double>>{{"slow", 0.0011}, {"unprobed", 0}}) {
    v1::TrialReport* trial = report.add_trials();
    trial->set_name(name);
    trial->set_outcome("ok");
    trial->set_attempt(1);
    trial->set_train_seconds(2.0);
    trial->set_tokens_per_second(400);
    trial->mutable_prediction()->set_step_seconds(0.5);
    trial->mutable_prediction()->set_tokens_per_second(500);
    trial->mutable_prediction()->set_pace_seconds(probe_pace);
    // 400 tokens/s over the steady steps; their canary 0.0010, 0.0012, 0.0014 s: median 0.0012.
    const double paces[] = {0.0005, 0.0014, 0.0010, 0.0012};
    for (int step = 0; step < 4; ++step) {
      v1::TrialStep* row = trial->add_steps();
      row->set_attempt(1);
      row->set_step(step);
      row->set_tokens(200);
      row->set_seconds(0.5);
      row->set_pace_seconds(paces[step]);
    }
  }
  const v1::TrialReport& slow = report.trials(0);
  EXPECT_DOUBLE_EQ(MachinePace(slow).value(), 0.0011 / 0.0012);
  EXPECT_DOUBLE_EQ(TimePredictionErrorAtPace(slow).value(), (500 * (0.0011 / 0.0012) - 400) / 400);
  EXPECT_FALSE(MachinePace(report.trials(1)).has_value());
  EXPECT_FALSE(TimePredictionErrorAtPace(report.trials(1)).has_value());

  const std::string table = RenderReport(report, ReportFormat::kTable);
  EXPECT_NE(table.find("pace  error at pace"), std::string::npos) << table;
  EXPECT_NE(table.find("+25.0%  0.92         +14.6%\n"), std::string::npos) << table;
  EXPECT_NE(table.find(std::string(kPaceNote)), std::string::npos) << table;
  const nlohmann::json json = nlohmann::json::parse(RenderReport(report, ReportFormat::kJson));
  EXPECT_DOUBLE_EQ(json["trials"][0]["machine_pace"].get<double>(), 0.0011 / 0.0012);
  EXPECT_DOUBLE_EQ(json["trials"][0]["tokens_per_second_prediction_error_at_pace"].get<double>(),
                   (500 * (0.0011 / 0.0012) - 400) / 400);
  EXPECT_DOUBLE_EQ(json["trials"][0]["prediction"]["pace_seconds"].get<double>(), 0.0011);
  EXPECT_DOUBLE_EQ(json["trials"][0]["steps"][1]["pace_seconds"].get<double>(), 0.0014);
  EXPECT_TRUE(json["trials"][1]["machine_pace"].is_null());
  EXPECT_TRUE(json["trials"][1]["prediction"]["pace_seconds"].is_null());
  EXPECT_NE(RenderReport(report, ReportFormat::kCsv).find(",0.916666"), std::string::npos);

  // A step's figure outside a canary's seconds (another process's line) is left out; with none
  // left there is no pace.
  v1::TrialReport hostile = slow;
  hostile.mutable_steps(1)->set_pace_seconds(-1);
  hostile.mutable_steps(2)->set_pace_seconds(1e300);
  EXPECT_DOUBLE_EQ(MachinePace(hostile).value(), 0.0011 / 0.0012);
  hostile.mutable_steps(3)->set_pace_seconds(0);
  EXPECT_FALSE(MachinePace(hostile).has_value());
  // Nor for a trial that did not end ok: its tokens/s is no prediction's measure.
  v1::TrialReport failed = slow;
  failed.set_outcome("failed");
  EXPECT_FALSE(MachinePace(failed).has_value());

  report.mutable_trials(0)->mutable_prediction()->set_pace_seconds(0);
  EXPECT_EQ(RenderReport(report, ReportFormat::kTable).find("error at pace"), std::string::npos);
}

// A tokens/s is a measurement only once the trial has ended and measured a step: a running
// trial's steps so far and an ended trial's 0 are none, alike in every format.
TEST(ReportTest, EveryFormatLeavesOutTheSameUnmeasuredTokensPerSecond) {
  v1::ReportResponse report;
  report.set_name("rates");
  auto add = [&report](const std::string& name, const std::string& outcome, double whole_run) {
    v1::TrialReport* trial = report.add_trials();
    trial->set_name(name);
    trial->set_outcome(outcome);
    trial->set_tokens_per_second(whole_run);
    return trial;
  };
  // Steps 1 and 2: 400 tokens over 1 s, the whole run's 250.
  for (v1::TrialReport* trial : {add("ran", "ok", 250), add("runs", "running", 250)}) {
    for (const auto& [step, seconds] :
         std::vector<std::pair<int, double>>{{0, 0.6}, {1, 0.5}, {2, 0.5}}) {
      v1::TrialStep* row = trial->add_steps();
      row->set_attempt(1);
      row->set_step(step);
      row->set_tokens(200);
      row->set_seconds(seconds);
    }
  }
  add("oom-at-once", "oom", 0);

  EXPECT_EQ(MeasuredRate(report.trials(0), 400), 400.0);
  EXPECT_EQ(MeasuredRate(report.trials(1), 400), std::nullopt);
  EXPECT_EQ(MeasuredRate(report.trials(2), 0), std::nullopt);

  const LabLayout layout = LabLayoutOf(report);
  const std::vector<std::string> columns = LabColumns(layout);
  const size_t tokens_column =
      std::find(columns.begin(), columns.end(), "tokens/s") - columns.begin();
  ASSERT_LT(tokens_column, columns.size());
  EXPECT_EQ(MakeLabRow(report.trials(0), layout).cells[tokens_column], "400");
  EXPECT_EQ(MakeLabRow(report.trials(1), layout).cells[tokens_column], std::string(kNone));
  EXPECT_EQ(MakeLabRow(report.trials(2), layout).cells[tokens_column], std::string(kNone));

  const nlohmann::json json = nlohmann::json::parse(RenderReport(report, ReportFormat::kJson));
  EXPECT_EQ(json["trials"][0]["tokens_per_second"], 250.0);
  EXPECT_EQ(json["trials"][0]["steady_tokens_per_second"], 400.0);
  for (int i : {1, 2}) {
    EXPECT_TRUE(json["trials"][i]["tokens_per_second"].is_null()) << json["trials"][i];
    EXPECT_TRUE(json["trials"][i]["steady_tokens_per_second"].is_null()) << json["trials"][i];
  }

  std::istringstream csv(RenderReport(report, ReportFormat::kCsv));
  std::vector<std::vector<std::string>> rows;
  for (std::string line; std::getline(csv, line);) {
    std::vector<std::string>& fields = rows.emplace_back();
    std::istringstream cells(line);
    for (std::string field; std::getline(cells, field, ',');) fields.push_back(field);
    if (line.ends_with(',')) fields.emplace_back();
  }
  ASSERT_EQ(rows.size(), 4u);
  const auto index = [&rows](const std::string& name) {
    return std::find(rows[0].begin(), rows[0].end(), name) - rows[0].begin();
  };
  for (const char* name : {"tokens_per_second", "steady_tokens_per_second"}) {
    ASSERT_LT(index(name), std::ssize(rows[0])) << name;
    EXPECT_NE(rows[1][index(name)], "") << name;
    EXPECT_EQ(rows[2][index(name)], "") << name;
    EXPECT_EQ(rows[3][index(name)], "") << name;
  }

  // The HTML page's tokens/s chart: one bar with its figure, the running trial's none.
  const std::string html = RenderReport(report, ReportFormat::kHtml);
  EXPECT_NE(html.find(">400</text>"), std::string::npos) << html;
  EXPECT_EQ(html.find(">400</text>"), html.rfind(">400</text>")) << html;
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

// A trial without `expect:` that failed is marked as unexpected without naming an expectation the
// file never stated: "cancelled (expected )" read as if one had been.
TEST(ReportTest, AnUnexpectedOutcomeWithoutExpectNamesNoExpectation) {
  v1::ReportResponse report = FixedReport();
  report.mutable_trials(3)->clear_expected();
  report.mutable_trials(3)->set_outcome("cancelled");
  for (const ReportFormat format :
       {ReportFormat::kTable, ReportFormat::kMarkdown, ReportFormat::kHtml}) {
    const std::string rendered = RenderReport(report, format);
    EXPECT_EQ(rendered.find("(expected )"), std::string::npos) << rendered;
    EXPECT_NE(rendered.find("(expected ok)"), std::string::npos) << rendered;  // cpu-offload's
  }
  EXPECT_NE(RenderReport(report, ReportFormat::kMarkdown).find("**cancelled** |"),
            std::string::npos);
}

// The table says why each trial that ended other than expected did, on a line of its own under the
// count; a trial that ended as expected (an expected oom) is not repeated there.
TEST(ReportTest, TheTableSaysWhyEachUnexpectedTrialEndedAsItDid) {
  v1::ReportResponse report = FixedReport();
  report.mutable_trials(3)->clear_expected();
  report.mutable_trials(3)->set_outcome("failed");
  report.mutable_trials(3)->set_error("llm-train exited with code 1: data.path: \x1b[2Jgone");
  const std::string table = RenderReport(report, ReportFormat::kTable);
  const std::string name = report.trials(3).name();
  EXPECT_NE(table.find("2 trials ended other than the experiment file expects.\n" + name +
                       ": failed: llm-train exited with code 1: data.path:  [2Jgone\n"),
            std::string::npos)
      << table;
  for (const v1::TrialReport& trial : report.trials()) {
    if (trial.outcome() == trial.expected() && !trial.error().empty()) {
      EXPECT_EQ(table.find(trial.name() + ": " + trial.outcome() + ": "), std::string::npos)
          << table;
    }
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
  EXPECT_EQ(json["trials"][0]["steps"][3], nlohmann::json({{"attempt", 3},
                                                           {"step", 3},
                                                           {"loss", 7.0},
                                                           {"tokens", 0},
                                                           {"seconds", 0.0},
                                                           {"others_cpu_share", nullptr},
                                                           {"pace_seconds", nullptr}}));
  // A run of one attempt says nothing more.
  EXPECT_EQ(RenderReport(FixedReport(), ReportFormat::kTable).find("resumed;"), std::string::npos);
}

// Issue 37: event lines stored as refused_line events are counted, under the table and in the JSON.
TEST(ReportTest, RefusedEventLinesAreCountedUnderTheTableAndInTheJson) {
  v1::ReportResponse report = FixedReport();
  report.mutable_trials(0)->set_refused_event_lines(3);
  const std::string table = RenderReport(report, ReportFormat::kTable);
  EXPECT_NE(table.find("\n" + report.trials(0).name() + ": 3 event lines refused ("),
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
