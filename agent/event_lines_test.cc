// Event lines as the agent reads them: complete lines only, memory bounded whatever the file holds
// (a line over the cap comes out with its size only, a call reads at most its budget), and no line
// of any shape crashes the outcome decision, at a run's end or in startup recovery.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/agent_test_support.h"
#include "agent/event_reader.h"
#include "agent/input_cache.h"
#include "agent/outcome.h"
#include "agent/run_files.h"
#include "agent/runs.h"
#include "agent/supervisor.h"
#include "common/event_line.h"
#include "common/rank_files.h"
#include "common/text.h"

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;
namespace pb = llmctl::v1;
using test_support::AgentTest;
using test_support::Key;

fs::path FreshDir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("llmctl_event_lines_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::vector<std::string> Texts(const std::vector<EventLine>& lines) {
  std::vector<std::string> texts;
  for (const EventLine& line : lines) texts.push_back(line.text);
  return texts;
}

// Run 3/base/1's state as a RunManager opened on `data` finds it, the run having written `events`
// and the supervisor `exit_json` before the agent went down; the manager is closed again.
StatusOr<RunState> RecoverRun(const fs::path& data, const std::string& events,
                              const std::string& exit_json) {
  const fs::path run = data / "runs" / "3" / "base" / "1";
  fs::create_directories(run);
  std::ofstream(run / kEventsFile) << events;
  std::ofstream(run / kExitFile) << exit_json;
  ASSIGN_OR_RETURN(std::unique_ptr<InputCache> cache, InputCache::Open((data / "cache").string()));
  RunManagerOptions options;
  options.data_dir = data.string();
  options.llm_train = "/bin/false";
  options.supervisor_program = "/bin/false";
  ASSIGN_OR_RETURN(std::unique_ptr<RunManager> runs, RunManager::Open(options, cache.get()));
  return runs->Get(RunKey{3, "base", 1});
}

TEST(EventReaderTest, OnlyCompleteLinesInOrder) {
  const fs::path dir = FreshDir("complete");
  const std::string path = (dir / "events.jsonl").string();
  EventReader reader(path);
  EXPECT_TRUE(reader.ReadNewLines()->empty()) << "no file yet";
  EXPECT_TRUE(reader.at_end());
  std::ofstream out(path);
  out << "{\"type\":\"start\"}\n{\"type\":\"st" << std::flush;
  EXPECT_EQ(Texts(*reader.ReadNewLines()), std::vector<std::string>{"{\"type\":\"start\"}"});
  out << "ep\"}\n" << std::flush;
  auto lines = reader.ReadNewLines();
  ASSERT_EQ(lines->size(), 1u);
  EXPECT_EQ(event_line::Accept(lines->front().text).type, "step");
  EXPECT_EQ(lines->front().bytes, 15);
  EXPECT_EQ(reader.lines_read(), 2);
  fs::remove_all(dir);
}

// The trainer's files are regular files it made: a FIFO (which would hold an open for ever) or a
// link to /dev/zero (which a read to the end never finishes) in their place is refused at once, by
// the event reader, the result's reader and the run's line count and stderr tail alike.
TEST(EventReaderTest, AFifoOrALinkInTheEventFilesPlaceIsRefusedNotWaitedOn) {
  const fs::path dir = FreshDir("fifo");
  const std::string fifo = (dir / "events.jsonl").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EventReader reader(fifo);
  const auto refused = reader.ReadNewLines();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("not a regular file"), std::string::npos)
      << refused.status().message();
  EXPECT_FALSE(ReadResultEvent(fifo).present);

  const std::string link = (dir / "events.rank1.jsonl").string();
  fs::create_symlink("/dev/zero", link);
  EXPECT_EQ(EventReader(link).ReadNewLines().status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(ReadResultEvent(link).present);
  int64_t offset = 0, lines = 0;
  CountNewLines(link, offset, lines);
  EXPECT_EQ(offset, 0);
  EXPECT_EQ(ReadTail(fifo, 100), "");
  EXPECT_EQ(ReadTail(link, 100), "");
  fs::remove_all(dir);
}

TEST(LineSplitterTest, HoldsAtMostTheCapOfAnUnfinishedLineAndDropsTheRest) {
  LineSplitter splitter(/*max_line_bytes=*/8);
  std::vector<EventLine> lines;
  splitter.Feed("12345678", lines);
  EXPECT_EQ(splitter.held_bytes(), 8u);
  splitter.Feed("9abc", lines);  // over the cap: what was held goes, nothing more is kept
  EXPECT_EQ(splitter.held_bytes(), 0u);
  splitter.Feed(std::string(1000, 'x'), lines);
  EXPECT_EQ(splitter.held_bytes(), 0u);
  EXPECT_TRUE(lines.empty());
  splitter.Feed("yz\nshort\n1234", lines);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].text, "");
  EXPECT_EQ(lines[0].bytes, 8 + 4 + 1000 + 2);
  EXPECT_TRUE(lines[0].overlong());
  EXPECT_EQ(lines[1].text, "short");
  EXPECT_FALSE(lines[1].overlong());
  EXPECT_EQ(splitter.held_bytes(), 4u);
}

TEST(EventReaderTest, ALineOverTheCapComesOutWithItsSizeAndACallReadsAtMostItsBudget) {
  const fs::path dir = FreshDir("overlong");
  const std::string path = (dir / "events.jsonl").string();
  const int64_t long_bytes = event_line::kMaxBytes + kReadBudgetBytes;  // two calls' worth
  {
    std::ofstream out(path);
    out << "{\"type\":\"start\"}\n" << std::string(long_bytes, 'a') << "\n{\"type\":\"step\"}\n";
  }
  EventReader reader(path);
  std::vector<EventLine> lines;
  int calls = 0;
  do {
    auto read = reader.ReadNewLines();
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    for (EventLine& line : *read) lines.push_back(std::move(line));
    ++calls;
  } while (!reader.at_end());
  EXPECT_GE(calls, 3) << "the file is more than twice the budget";
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].text, "{\"type\":\"start\"}");
  EXPECT_EQ(lines[1].text, "");
  EXPECT_EQ(lines[1].bytes, long_bytes);
  EXPECT_EQ(lines[2].text, "{\"type\":\"step\"}");
  EXPECT_EQ(reader.lines_read(), 3);
  const event_line::Accepted refused = event_line::Accept(lines[1].text, lines[1].bytes);
  EXPECT_EQ(refused.type, event_line::kRefusedType);
  EXPECT_EQ(nlohmann::json::parse(refused.json).at("bytes"), long_bytes);
  fs::remove_all(dir);
}

// Issue 37: nlohmann's value("type", "") threw on a number, on the watcher thread, and the agent
// died at the run's end and again on every start.
TEST(OutcomeTest, ALineWhoseTypeIsNotAStringIsNoResult) {
  EXPECT_FALSE(FindResultEvent("{\"type\":1,\"x\":\"result\"}\n").present);
  EXPECT_FALSE(FindResultEvent("[\"result\"]\n\"result\"\n{\"type\":[\"result\"]}\n").present);
  const ResultEvent found =
      FindResultEvent("{\"type\":1,\"x\":\"result\"}\n{\"type\":\"result\",\"error\":2}\n");
  EXPECT_TRUE(found.present);
  EXPECT_EQ(found.error, "");
}

// A result event's error is the trainer's text, as its stderr is: it is quoted on one line and cut
// to kQuotedLineBytes where the agent reads it, as the last stderr line is. It was stored whole: a
// result line with 100 KB of error, escape sequences and newlines made the run's error, in its
// ended.json, the gRPC answer, the controller's store and every report.
TEST(RunManagerRecoveryTest, AResultEventsErrorIsQuotedOnOneLineOfAtMostTheQuotedBytes) {
  // JSON's escapes: ESC, a newline, CR, C1's CSI and a right-to-left override.
  const std::string error = R"(CUDA error: \u001b[31mbad\u001b[0m\nsee\r\nabove\u009b2J\u202e )" +
                            std::string(100'000, 'x') + R"(\nand a line after)";
  const std::string result_line = "{\"type\":\"result\",\"error\":\"" + error + "\"}\n";
  const auto on_one_line = [](const std::string& text) {
    EXPECT_LE(text.size(), kQuotedLineBytes);
    EXPECT_TRUE(text.starts_with("CUDA error:  [31mbad [0m see  above 2J  xxx")) << text;
    EXPECT_EQ(text.find_first_of(std::string("\n\r\x1b\x7f", 4)), std::string::npos) << text;
  };
  on_one_line(FindResultEvent(result_line).error);

  const fs::path data = FreshDir("result-error");
  auto state = RecoverRun(data, "{\"type\":\"start\"}\n" + result_line, "{\"exit_code\":1}\n");
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  ASSERT_TRUE(state->ended);
  EXPECT_EQ(state->end.outcome, "failed");
  on_one_line(state->end.error);
  fs::remove_all(data);
}

TEST(RunManagerRecoveryTest, ARunThatEndedWithBadEventLinesIsFinishedOnStart) {
  const fs::path data = FreshDir("recovery");
  auto state = RecoverRun(data,
                          "{\"type\":\"start\"}\n"
                          "{\"type\":1,\"x\":\"result\"}\n"
                          "not json \xff\n"
                          "{\"type\":\"result\",\"error\":\"\"}\n",
                          "{\"exit_code\":0}\n");
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  EXPECT_TRUE(state->ended);
  EXPECT_EQ(state->end.outcome, "ok");
  EXPECT_EQ(state->last_seq, 4);
  fs::remove_all(data);
}

// The stand-in trainer's seed 700 writes a start, two steps, four lines that break the rule and
// its result: every line goes out under its own seq, the bad ones as refused_line events, and the
// run still ends ok.
TEST_F(AgentTest, BadEventLinesGoOutAsRefusedLinesUnderTheirSeqAndTheRunStillEnds) {
  StartAgent();
  const pb::RunKey key = Key(9, "bad-lines", 1);
  RunTrial(key, 700);
  const test_support::Streamed streamed = Stream(key, 0);
  ASSERT_TRUE(streamed.status.ok()) << streamed.status.error_message();
  ASSERT_TRUE(streamed.ended.has_value());
  EXPECT_EQ(streamed.ended->outcome(), "ok");
  ASSERT_EQ(streamed.events.size(), 8u);
  const std::vector<std::pair<std::string, int64_t>> refused = {
      {"its \"type\" is not a string", 23},
      {"not a JSON object", 5},
      {"not valid UTF-8", 10},
      {"1100000 bytes, more than the 1048576-byte cap", 1100000}};
  for (int i = 0; i < 8; ++i) {
    const pb::TrialEvent& event = streamed.events[i];
    EXPECT_EQ(event.seq(), i + 1);
    if (i < 3 || i == 7) {
      EXPECT_EQ(event.type(), i == 0 ? "start" : i == 7 ? "result" : "step");
      continue;
    }
    EXPECT_EQ(event.type(), event_line::kRefusedType) << event.json();
    const nlohmann::json json = nlohmann::json::parse(event.json());
    EXPECT_NE(json.at("error").get<std::string>().find(refused[i - 3].first), std::string::npos)
        << event.json();
    EXPECT_EQ(json.at("bytes"), refused[i - 3].second);
  }
  // Resumed in the middle, from the line after the long one.
  const test_support::Streamed resumed = Stream(key, 8);
  ASSERT_EQ(resumed.events.size(), 1u);
  EXPECT_EQ(resumed.events[0].type(), "result");
}

}  // namespace
}  // namespace llmctl::agent
