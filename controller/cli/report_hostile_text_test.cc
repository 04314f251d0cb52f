// A report is the controller's answer, and its renderers print it to the user's terminal or into
// files others open: no control character, bidirectional control, Markdown or HTML syntax, formula
// or endless field of the controller's gets through as itself, in any format.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/printf.h"
#include "controller/cli/report.h"
#include "controller/cli/report_format.h"
#include "controller/cli/report_rows.h"
#include "controller/cli/report_test_support.h"

namespace llmctl::cli {
namespace {

using report_test_support::FixedReport;

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

// A report of one ended trial, "forged", whose step lines (each of attempt 1) carry these seconds
// and `tokens` tokens each.
v1::ReportResponse ForgedSteps(const std::vector<double>& seconds, int64_t tokens) {
  v1::ReportResponse report;
  v1::TrialReport* trial = report.add_trials();
  trial->set_name("forged");
  trial->set_outcome("ok");
  trial->set_attempt(1);
  trial->set_train_seconds(2);
  for (size_t step = 0; step < seconds.size(); ++step) {
    v1::TrialStep* row = trial->add_steps();
    row->set_attempt(1);
    row->set_step(static_cast<int32_t>(step));
    row->set_tokens(tokens);
    row->set_seconds(seconds[step]);
  }
  return report;
}

// A step's seconds are the trainer's event line's, another process's bytes: a step of 1e-310 s
// makes an infinite tokens/s, one of 1e308 s a rate whose error overflows a double, and one of
// 1e307 s an error (2.4e307) whose percentage does. None is a figure to print: "–" in the table;
// null in the JSON for the first two, the error itself for the third.
TEST(ReportTest, StepTimesNoMachineRunsAtPrintNoInfiniteFigure) {
  for (const double seconds : {1e-310, 1e308, 1e307}) {
    const bool error_is_finite = seconds == 1e307;
    v1::ReportResponse report = ForgedSteps({1.0, seconds}, 200);
    v1::TrialReport* trial = report.mutable_trials(0);
    trial->mutable_prediction()->set_step_seconds(0.4);
    trial->mutable_prediction()->set_tokens_per_second(480);
    EXPECT_EQ(TimePredictionError(*trial).has_value(), error_is_finite) << seconds;
    const std::string table = RenderReport(report, ReportFormat::kTable);
    const size_t row = table.find("\nforged ");
    ASSERT_NE(row, std::string::npos) << table;
    std::istringstream cells(table.substr(row + 1, table.find('\n', row + 1) - row - 1));
    const std::vector<std::string> words{std::istream_iterator<std::string>(cells),
                                         std::istream_iterator<std::string>()};
    ASSERT_GE(words.size(), 4u) << table;
    // tokens/s, steps ± (one steady step: none), predicted tokens/s, error: the rate infinite, or
    // so small it prints as 0.
    EXPECT_EQ(words[words.size() - 4], seconds < 1 ? "–" : "0") << table;
    EXPECT_EQ(words[words.size() - 3], "–") << table;
    EXPECT_EQ(words[words.size() - 2], "480") << table;
    EXPECT_EQ(words.back(), "–") << table;
    const nlohmann::json json = nlohmann::json::parse(RenderReport(report, ReportFormat::kJson));
    const nlohmann::json& error = json["trials"][0]["tokens_per_second_prediction_error"];
    if (error_is_finite) {
      EXPECT_NEAR(error.get<double>(), 2.4e307, 1e300) << json.dump();
    } else {
      EXPECT_TRUE(error.is_null()) << json.dump();
    }
  }
}

// How much the steps moved is taken over the same hostile step lines: steady steps of 1 s and
// 1e308 s a token make a variance past every double, so no figure ("–", null); whatever is
// printed is finite, never "inf%" or "nan%".
TEST(ReportTest, StepTimesNoMachineRunsAtMakeNoStepVariation) {
  for (const double seconds : {1e-310, 1e308, 1e307}) {
    const v1::ReportResponse report = ForgedSteps({1.0, 1.0, seconds}, 1);
    const std::optional<double> variation = StepVariation(report.trials(0));
    if (seconds > 1) {
      EXPECT_FALSE(variation.has_value()) << seconds;
    }
    if (variation) {
      EXPECT_TRUE(std::isfinite(*variation)) << seconds;
    }
    const std::string table = RenderReport(report, ReportFormat::kTable);
    EXPECT_EQ(table.find("inf%"), std::string::npos) << table;
    EXPECT_EQ(table.find("nan%"), std::string::npos) << table;
    const nlohmann::json json = nlohmann::json::parse(RenderReport(report, ReportFormat::kJson));
    const nlohmann::json& figure = json["trials"][0]["steady_step_variation"];
    EXPECT_TRUE(figure.is_null() || std::isfinite(figure.get<double>())) << json.dump();
  }
}

// A figure too long for a fixed buffer is printed whole, not cut to a smaller number.
TEST(ReportTest, AHugeFigureIsPrintedWhole) {
  EXPECT_EQ(Grouped(1e20, 0), "100,000,000,000,000,000,000");
  const std::string huge = Grouped(1e70, 1);
  EXPECT_EQ(huge.size(), 71u + 23u + 2u) << huge;  // 71 digits, 23 commas, ".0"
  EXPECT_EQ(huge.substr(0, 6), "10,000") << huge;
  EXPECT_EQ(Printf("%+.1f%%", 1e70).size(), 1u + 71u + 2u + 1u);
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

}  // namespace
}  // namespace llmctl::cli
