#include "controller/cli/report.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

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

TEST(ReportTest, CountsOutcomesOtherThanExpected) {
  v1::ReportResponse report = FixedReport();
  EXPECT_EQ(CountUnexpectedOutcomes(report), 1);  // cpu-offload; the running one expects nothing
  report.mutable_trials(3)->set_expected("ok");
  EXPECT_EQ(CountUnexpectedOutcomes(report), 2);
  // Without `expect:`, ok and oom are measurements; failed, diverged and cancelled are not.
  report.mutable_trials(3)->clear_expected();
  const std::map<std::string, int> unexpected_without_expect = {
      {"ok", 0}, {"oom", 0}, {"failed", 1}, {"diverged", 1}, {"cancelled", 1}, {"running", 0}};
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
