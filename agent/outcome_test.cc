// A run's outcome: the trainer's exit code and signal, its result event or stderr, the first
// failed rank's error, the kernel's OOM kills.
#include "agent/outcome.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "agent/run_files.h"
#include "common/text.h"

namespace llmctl::agent {
namespace {

TEST(OutcomeTest, ExitCodesFollowTheTrainersTable) {
  const ResultEvent result{true, ""};
  const struct {
    int code;
    const char* outcome;
  } table[] = {{0, "ok"},       {1, "failed"},    {2, "invalid"}, {3, "oom"},
               {4, "diverged"}, {5, "cancelled"}, {7, "failed"}};
  for (const auto& row : table) {
    const RunEnd end = DecideOutcome(WorkerExit{row.code, 0}, result, false, std::nullopt, "");
    EXPECT_EQ(end.outcome, row.outcome) << "exit code " << row.code;
    EXPECT_EQ(end.exit_code, row.code);
  }
  EXPECT_EQ(DecideOutcome({7, 0}, {}, false, std::nullopt, "").error,
            "llm-train exited with code 7");
}

TEST(OutcomeTest, ErrorsComeFromTheResultEventElseStderr) {
  EXPECT_EQ(
      DecideOutcome({3, 0}, {true, "CUDA out of memory"}, false, std::nullopt, "noise\n").error,
      "CUDA out of memory");
  EXPECT_EQ(DecideOutcome({2, 0}, {}, false, std::nullopt,
                          "loading\nllm-train: x.yaml:3:1: unknown key\n\n")
                .error,
            "llm-train: x.yaml:3:1: unknown key");
  EXPECT_EQ(DecideOutcome({0, 0}, {true, ""}, false, std::nullopt, "warning\n").error, "");
}

// A multi-rank run's stderr is its launcher's, whose last line already names the failed rank and
// quotes that rank's own line (trainer/dist/rank_launcher.cc): the error names the rank once, where
// it read 'rank 1 of 2: llm-train: rank 1 of 2 exited with code 2: llm-train: ...'. An error from
// the rank's result event gets the rank's name.
TEST(OutcomeTest, AFailedRanksErrorNamesItsRankOnce) {
  const RunEnd end = DecideRankOutcome(
      {1, {2, 0}}, 2, {}, false, std::nullopt,
      "llm-train: rank 1 of 2 exited with code 2: llm-train: x.yaml:3:1: unknown key; the other "
      "ranks were stopped\n");
  EXPECT_EQ(end.outcome, "invalid");
  EXPECT_EQ(end.error,
            "rank 1 of 2 exited with code 2: llm-train: x.yaml:3:1: unknown key; the other ranks "
            "were stopped");
  EXPECT_EQ(
      DecideRankOutcome({1, {3, 0}}, 2, {true, "out of memory at step 1"}, false, std::nullopt,
                        "llm-train: rank 1 of 2 exited with code 3: oom; the other ranks "
                        "were stopped\n")
          .error,
      "rank 1 of 2: out of memory at step 1");
}

// llm-train's handler for a mapped input that shrank (common/files.h) exits 6 after one line naming
// the file; before, the run ended killed by SIGBUS and the user read only the signal's name.
TEST(OutcomeTest, AnInputThatShrankUnderItsMappingFailsTheRunWithTheLineNamingIt) {
  const RunEnd end = DecideOutcome(
      {6, 0}, {}, false, std::nullopt,
      "step 3\nllm-train: /data/train.tok shrank while llm-train read it: another process "
      "truncated it or wrote over it in place; run again once it is whole\n");
  EXPECT_EQ(end.outcome, "failed");
  EXPECT_EQ(end.exit_code, 6);
  EXPECT_EQ(end.error,
            "llm-train: /data/train.tok shrank while llm-train read it: another process truncated "
            "it or wrote over it in place; run again once it is whole");
}

// A stderr tail cut inside a character (or any bytes a trainer wrote) is made UTF-8 before the
// run's files and the gRPC answer carry it: written as JSON, it once threw and left the run
// without its ended.json, so the agent failed on it at every start.
TEST(OutcomeTest, AnErrorFromStderrIsMadeUtf8AndItsEndWritesAndReadsBack) {
  const RunEnd end = DecideOutcome({2, 0}, {}, false, std::nullopt, "llm-train: bad \xe2\x82\n");
  EXPECT_EQ(end.error, "llm-train: bad \xef\xbf\xbd\xef\xbf\xbd");
  const std::string path = testing::TempDir() + "/ended-utf8.json";
  ASSERT_TRUE(WriteJsonFile(path, {{"error", "raw \xff"}}).ok());
  const std::optional<nlohmann::json> back = ReadJsonObject(path);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ((*back)["error"], "raw \xef\xbf\xbd");
}

// The trainer's last stderr line is quoted on one line and cut to kQuotedLineBytes, as the launcher
// and the node's probe quote theirs: a trainer that ended on a line of 100 KB holding escape
// sequences made the run's error that whole line (up to the 64 KiB the agent reads of stderr),
// escapes and all, in the controller's store and in every report of the trial.
TEST(OutcomeTest, AnErrorFromStderrIsOneLineOfAtMostTheQuotedBytes) {
  const std::string long_line =
      "step 9\nllm-train: \x1b[2J\x1b]0;owned\x07"
      "bad " +
      std::string(100'000, 'x') + "\n\n";
  const auto printable = [](const std::string& text) {
    return std::none_of(text.begin(), text.end(),
                        [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
  };
  const RunEnd invalid = DecideOutcome({2, 0}, {}, false, std::nullopt, long_line);
  EXPECT_LE(invalid.error.size(), kQuotedLineBytes);
  EXPECT_TRUE(invalid.error.starts_with("llm-train:  [2J ]0;owned bad xxx")) << invalid.error;
  EXPECT_TRUE(printable(invalid.error));
  const RunEnd failed = DecideOutcome({7, 0}, {}, false, std::nullopt, long_line);
  EXPECT_LE(failed.error.size(),
            std::string("llm-train exited with code 7: ").size() + kQuotedLineBytes);
  EXPECT_TRUE(printable(failed.error));
  // A multi-rank run's last line is its launcher's, which quotes the rank's line (cut to
  // kQuotedLineBytes) in a few words of its own: those words are kept whole.
  const std::string rank_words = "rank 1 of 2 exited with code 2: ";
  const std::string quoted = OnOneLine(LastNonBlankLine(long_line), kQuotedLineBytes);
  const RunEnd rank =
      DecideRankOutcome({1, {2, 0}}, 2, {}, false, std::nullopt,
                        "llm-train: " + rank_words + quoted + "; the other ranks were stopped\n");
  EXPECT_EQ(rank.error, rank_words + quoted + "; the other ranks were stopped");
  const RunEnd rank_of_its_own =
      DecideRankOutcome({1, {2, 0}}, 2, {}, false, std::nullopt,
                        "llm-train: " + rank_words + "\x1b[2J" + std::string(100'000, 'x') + "\n");
  EXPECT_LE(rank_of_its_own.error.size(), 2 * kQuotedLineBytes);
  EXPECT_TRUE(printable(rank_of_its_own.error));
}

// Numbers another process wrote into a run's files are read only within their type's range.
TEST(OutcomeTest, RunFileNumbersOutsideTheirTypeAreLeftOut) {
  const nlohmann::json failure = {{"rank", 4294967296LL}, {"signal", -2147483648LL - 1}};
  EXPECT_EQ(JsonFieldOr(failure, "signal", 0), 0);
  EXPECT_EQ(JsonFieldOr(nlohmann::json{{"pid", 77}}, "pid", 0), 77);
  const std::string path = testing::TempDir() + "/ranks-wide.json";
  ASSERT_TRUE(WriteJsonFile(path, {{"first_failure", failure}}).ok());
  EXPECT_FALSE(ReadFirstFailedRank(path).has_value());  // 2^32 is no rank: not rank 0
}

// One node's ranks are processes of its host: a cpu trial of `devices: 4096` would start 4,096 of
// them, and Recover reads back at most kMaxRanks.
TEST(OutcomeTest, SignalsAndCancels) {
  // SIGKILL after the trainer reported its result was not the OOM killer's doing.
  EXPECT_EQ(DecideOutcome({0, SIGKILL}, {true, ""}, false, 1, "").outcome, "failed");
  const RunEnd segv = DecideOutcome({0, SIGSEGV}, {}, false, std::nullopt, "");
  EXPECT_EQ(segv.outcome, "failed");
  EXPECT_NE(segv.error.find("SIGSEGV"), std::string::npos) << segv.error;
  EXPECT_EQ(DecideOutcome({0, SIGKILL}, {}, true, std::nullopt, "").outcome, "cancelled");
  EXPECT_EQ(DecideOutcome({5, 0}, {}, true, std::nullopt, "").outcome, "cancelled");
  // A worker that finished before the cancel reached it keeps its result.
  EXPECT_EQ(DecideOutcome({0, 0}, {true, ""}, true, std::nullopt, "").outcome, "ok");
}

// A SIGKILL without a result event is the kernel's OOM killer only when the host's count of its
// kills rose during the run: a user's kill -9 of llm-train read as out of memory.
TEST(OutcomeTest, SigkillIsOomOnlyWhenTheKernelsOomKillCountRose) {
  const RunEnd oom = DecideOutcome({0, SIGKILL}, {}, false, 1, "");
  EXPECT_EQ(oom.outcome, "oom");
  EXPECT_EQ(oom.error, "killed by the kernel's out-of-memory killer (host memory)");
  EXPECT_EQ(oom.exit_code, -SIGKILL);
  const RunEnd killed = DecideOutcome({0, SIGKILL}, {}, false, 0, "");
  EXPECT_EQ(killed.outcome, "failed");
  EXPECT_EQ(killed.error, "killed by SIGKILL, not by the kernel's out-of-memory killer");
  EXPECT_EQ(killed.exit_code, -SIGKILL);
  const RunEnd presumed = DecideOutcome({0, SIGKILL}, {}, false, std::nullopt, "");
  EXPECT_EQ(presumed.outcome, "oom");
  EXPECT_EQ(presumed.error, "killed by SIGKILL, presumably by the kernel for host memory");
  const RunEnd rank = DecideRankOutcome({1, {0, SIGKILL}}, 2, {}, false, 0, "");
  EXPECT_EQ(rank.outcome, "failed");
  EXPECT_EQ(rank.error, "rank 1 of 2: killed by SIGKILL, not by the kernel's out-of-memory killer");
}

// llm-train exits 5 on SIGINT or SIGTERM from anyone: without a cancel the agent asked for, the
// run is still cancelled, but its error says llmctl did not stop it (it read as `llmctl cancel`).
TEST(OutcomeTest, ACancelTheAgentDidNotAskForSaysSo) {
  const RunEnd unasked = DecideOutcome({5, 0}, {true, "cancelled at step 7"}, false, 0, "");
  EXPECT_EQ(unasked.outcome, "cancelled");
  EXPECT_EQ(unasked.error, "cancelled at step 7; stopped by a signal llmctl did not send");
  EXPECT_EQ(DecideOutcome({5, 0}, {}, false, 0, "").error,
            "stopped by a signal llmctl did not send");
  EXPECT_EQ(DecideRankOutcome({1, {5, 0}}, 2, {true, "cancelled at step 7"}, false, 0, "").error,
            "rank 1 of 2: cancelled at step 7; stopped by a signal llmctl did not send");
  EXPECT_EQ(DecideOutcome({5, 0}, {true, "cancelled at step 7"}, true, 0, "").error,
            "cancelled on request; the worker exited with code 5");
}

TEST(OutcomeTest, OomKillCountIsVmstatsOomKillLine) {
  EXPECT_EQ(ParseOomKillCount("nr_free_pages 123\npgmajfault 9\noom_kill 7\nnuma_hit 5\n"), 7u);
  EXPECT_EQ(ParseOomKillCount("oom_kill 18446744073709551615"), UINT64_MAX);
  // Before Linux 4.13 there is no such line; a damaged one is no count.
  EXPECT_EQ(ParseOomKillCount("nr_free_pages 123\npgmajfault 9\n"), std::nullopt);
  EXPECT_EQ(ParseOomKillCount("oom_kill x\n"), std::nullopt);
  EXPECT_EQ(ParseOomKillCount("oom_kill_other 3\n"), std::nullopt);
  EXPECT_TRUE(ReadOomKillCount().has_value());  // this host's, Linux 4.13 or later
}

TEST(OutcomeTest, ResultEventIsFoundOnlyOnCompleteLines) {
  EXPECT_TRUE(
      FindResultEvent("{\"type\":\"step\"}\n{\"type\":\"result\",\"error\":\"x\"}\n").present);
  EXPECT_EQ(FindResultEvent("{\"type\":\"result\",\"error\":\"x\"}\n").error, "x");
  EXPECT_FALSE(FindResultEvent("{\"type\":\"step\"}\n{\"type\":\"result\"}").present);
  EXPECT_FALSE(FindResultEvent("{\"type\":\"log\",\"message\":\"\\\"result\\\"\"}\n").present);
}

}  // namespace
}  // namespace llmctl::agent
