// llmctl's commands under what the user's environment hands them, against the in-process fake
// Controller (commands_test_support.h): arguments and file names whose bytes are not UTF-8, a
// terminal that cannot move its cursor, an output that cannot be written.
#include <gtest/gtest.h>

#include <filesystem>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "controller/cli/commands.h"
#include "controller/cli/commands_test_support.h"
#include "controller/cli/offline_cli_test.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

// A TRIAL that is not UTF-8 names no trial (experiment files are UTF-8) and cannot travel in the
// request's proto3 string: refused as invalid input before anything is sent, where protobuf logged
// a serializing error and llmctl printed an empty 'llmctl: ' and exited 1.
TEST_F(CommandsTest, ATrialNameThatIsNotUtf8IsRefusedBeforeAnythingIsSent) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"cancel", "42", "--trial", "caf\xe9"},
        std::vector<std::string>{"resume", "42", "caf\xe9"},
        std::vector<std::string>{"fetch", "42", "caf\xe9", "--to", (dir_ / "fetched").string()}}) {
    EXPECT_EQ(Run(args), kExitInvalidInput) << args[0] << ": " << err_.str();
    EXPECT_EQ(err_.str(),
              "llmctl: trial 'caf\xef\xbf\xbd' is not UTF-8 text, which every trial's name is\n")
        << args[0];
  }
  std::lock_guard lock(fake_.mutex_);
  EXPECT_EQ(fake_.calls_, 0);
}

// The experiment file's name is the user's, in whatever bytes their file system holds; the
// controller keeps it for status and report, in a proto3 string: a byte that breaks UTF-8 is sent
// as U+FFFD, where the controller could not parse the request and llmctl printed an empty error.
TEST_F(CommandsTest, SubmitSendsAFileNameThatIsNotUtf8WithReplacementCharacters) {
  WriteGoodInputs(Records(4096));
  const std::string file = WriteExperiment();
  const std::string latin1 = (dir_ / "lab" / "caf\xe9.yaml").string();
  fs::rename(file, latin1);
  ASSERT_EQ(Run({"submit", latin1}), kExitOk) << err_.str();
  std::lock_guard lock(fake_.mutex_);
  ASSERT_TRUE(fake_.submitted_.has_value());
  EXPECT_EQ(fake_.submitted_->filename(), (dir_ / "lab" / "caf\xef\xbf\xbd.yaml").string());
}

// On a terminal whose TERM is dumb (Emacs' shell, a CI log) or unset, the cursor does not move:
// watch appends lines as it does into a pipe, where its redraw's escapes showed as text.
TEST_F(CommandsTest, WatchRedrawsInPlaceOnlyOnATerminalThatMovesItsCursor) {
  v1::ExperimentStatus ended;
  ended.set_id(42);
  ended.set_state("ended");
  ended.add_trials()->set_name("a");
  ended.mutable_trials(0)->set_state("ok");
  fake_.watch_ = {ended};
  auto watch_on_a_terminal = [&](std::optional<std::string> term) {
    std::ostringstream out;
    CliContext context = testing::TestCliContext(
        [&](std::string_view name) -> std::optional<std::string> {
          if (name == "LLMCTL_CONTROLLER") return target_;
          if (name == "TERM") return term;
          return std::nullopt;
        },
        out, err_, dir_);
    context.out_is_tty = true;
    EXPECT_EQ(RunLlmctl({"llmctl", "watch", "42"}, context), kExitOk) << err_.str();
    return out.str();
  };
  EXPECT_NE(watch_on_a_terminal("xterm-256color").find("\x1b[2K"), std::string::npos);
  for (const std::optional<std::string>& term :
       {std::optional<std::string>("dumb"), std::optional<std::string>()}) {
    const std::string out = watch_on_a_terminal(term);
    EXPECT_EQ(out.find('\x1b'), std::string::npos) << term.value_or("(unset)") << ": " << out;
    EXPECT_NE(out.find("a      ok "), std::string::npos) << out;
  }
}

// `llmctl watch 42 >&-`, or > a file on a full disk: output that could not be written fails the
// command, exit 1 with a line on stderr, where it exited 0 having written nothing.
TEST_F(CommandsTest, AnOutputThatCannotBeWrittenFailsTheCommand) {
  v1::ExperimentStatus ended;
  ended.set_id(42);
  ended.set_state("ended");
  fake_.watch_ = {ended};
  std::ostream closed(nullptr);  // every write fails, as on a closed descriptor
  CliContext context = testing::TestCliContext(
      [this](std::string_view name) -> std::optional<std::string> {
        if (name == "LLMCTL_CONTROLLER") return target_;
        return std::nullopt;
      },
      closed, err_, dir_);
  EXPECT_EQ(RunLlmctl({"llmctl", "watch", "42"}, context), kExitFailed);
  EXPECT_EQ(err_.str(), "llmctl: cannot write standard output (closed, or its disk is full)\n");
}

}  // namespace
}  // namespace llmctl::cli
