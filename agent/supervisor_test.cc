// The supervisor (llm-agent --supervise): its arguments and their grace's bound, its refusal's log
// line from the real llm-agent, and the exit.json it writes read back.
#include "agent/supervisor.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <string>
#include <string_view>

#include "agent/agent_test_support.h"
#include "common/run_command.h"
#include "common/status.h"
#include "common/text.h"
#include "tests/support/shell_command.h"

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;
using test_support::FreshTestDir;

// The supervisor adds its grace to the steady clock's now in nanoseconds: a grace near int64's
// end of milliseconds overflowed there (found by run_files_fuzz.cc). It is refused, and the agent's
// own flag is bounded alike.
TEST(SupervisorTest, RefusesAGraceItCannotAddToItsClock) {
  const SupervisorCommand longest{"/r", kMaxSupervisorGrace, {"/bin/true", "a"}};
  const StatusOr<SupervisorCommand> parsed =
      ParseSupervisorArgs(SupervisorArgv("llm-agent", longest));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->grace, kMaxSupervisorGrace);
  EXPECT_EQ(parsed->run_dir, "/r");
  EXPECT_EQ(parsed->worker_argv, longest.worker_argv);
  for (const std::string& grace :
       {std::to_string(kMaxSupervisorGrace.count() + 1), std::string("9223372036854775807")}) {
    const StatusOr<SupervisorCommand> refused = ParseSupervisorArgs(
        {"llm-agent", kSuperviseFlag, "/r", "--grace-ms", grace, "--", "/bin/true"});
    ASSERT_FALSE(refused.ok()) << grace;
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(refused.status().message(), "--grace-ms " + grace + ": at most 2147483647 ms");
  }
}

// llm-agent's log lines begin with their time in UTC with its Z, then their level, as llmctld's do,
// whatever TZ says: here the line of a supervisor given no run (the real llm-agent, under a zone
// 5 h 30 min east of UTC), a refusal that ends it and so an error.
TEST(SupervisorTest, ItsRefusalIsAnErrorLineBeginningWithItsTimeInUtc) {
  const StatusOr<CommandOutput> refused = RunCommand(
      {"env", "TZ=IST-5:30", (llmctl::testing::BuildDir() / "agent" / "llm-agent").string(),
       std::string(kSuperviseFlag)},
      std::chrono::seconds(60));
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_TRUE(std::regex_match(
      refused->stderr_tail,
      std::regex(R"(\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\] \[error\] llm-agent: [^\n]+\n)")))
      << refused->stderr_tail;
}

// exit.json read back: a signal of 0 or 2^32 read as a clean exit, 2^32 + 9 as SIGKILL (the
// kernel's OOM killer), an exit code of 2^32 as 0 (found by run_files_fuzz.cc). What the
// supervisor never writes is DataLoss, as a file that does not parse is.
TEST(SupervisorTest, AnExitFileOutsideItsRangesIsDataLoss) {
  const fs::path dir = FreshTestDir("exit_json");
  const auto read = [&](const std::string& text) {
    std::ofstream(dir / kExitFile) << text;
    return ReadWorkerExit(dir.string());
  };
  const StatusOr<std::optional<WorkerExit>> killed = read(R"({"signal":9})");
  ASSERT_TRUE(killed.ok() && killed->has_value());
  EXPECT_EQ((*killed)->signal, 9);
  const StatusOr<std::optional<WorkerExit>> failed = read(R"({"exit_code":255})");
  ASSERT_TRUE(failed.ok() && failed->has_value());
  EXPECT_EQ((*failed)->exit_code, 255);
  EXPECT_EQ((*failed)->signal, 0);
  for (const char* text :
       {R"({"signal":0})", R"({"signal":4294967296})", R"({"signal":4294967305})",
        R"({"signal":-9})", R"({"signal":65,"exit_code":0})", R"({"exit_code":4294967296})",
        R"({"exit_code":-1})", R"({"exit_code":256})", R"({"exit_code":18446744073709551615})"}) {
    const StatusOr<std::optional<WorkerExit>> exit = read(text);
    ASSERT_FALSE(exit.ok()) << text << " read as exit code " << (*exit)->exit_code << ", signal "
                            << (*exit)->signal;
    EXPECT_EQ(exit.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(exit.status().message().find("exit.json does not say how the worker ended"),
              std::string::npos)
        << exit.status().message();
  }
  // What the file holds is quoted on one line, cut at a character's start: no escape sequence, and
  // no 'é' split at the 200th byte into bytes that break UTF-8.
  const StatusOr<std::optional<WorkerExit>> hostile =
      read("{\"signal\":\"\x1b]0;T\x07\n" + std::string(182, 'x') + "\xc3\xa9\"}");
  ASSERT_FALSE(hostile.ok());
  EXPECT_EQ(hostile.status().message().find_first_of("\x1b\x07\n"), std::string::npos)
      << hostile.status().message();
  EXPECT_EQ(FirstInvalidUtf8(hostile.status().message()), std::string_view::npos)
      << hostile.status().message();
}

}  // namespace
}  // namespace llmctl::agent
