// The tests' command lines and trees: a word quoted with ShellWord reaches the program whole
// through /bin/sh, and a test binary run on its own (no ctest, so no LLMCTL_BUILD_DIR or
// LLMCTL_SOURCE_DIR) finds the build and source trees, the ones ctest names.
#include "tests/support/shell_command.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <optional>
#include <string>

#include "common/text.h"

namespace llmctl::testing {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::optional<std::string>(value) : std::nullopt;
}

// Sets (or with nullopt unsets) a variable for the scope, then puts it back.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::optional<std::string>& value)
      : name_(name), saved_(Env(name)) {
    Set(value);
  }
  ~ScopedEnv() { Set(saved_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void Set(const std::optional<std::string>& value) {
    if (value.has_value()) {
      ::setenv(name_, value->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  const char* name_;
  std::optional<std::string> saved_;
};

TEST(ShellWordTest, EachWordReachesTheProgramWholeThroughTheShell) {
  for (const std::string word : {"", "plain", "My Drive #1", "this machine's rates", "'", "''\\'",
                                 "$HOME `id` $(id)", "a\\b \"c\" *;|&<>", "two\nlines", "~user"}) {
    const CommandResult printed = RunShellCommand("printf %s " + ShellWord(word));
    EXPECT_EQ(printed.exit_code, 0) << printed.out;
    EXPECT_EQ(printed.out, word);
  }
}

// Both trees are absolute and hold what they should; where the run that started this one passed
// its own (LLMCTL_TEST_EXPECTED_BUILD_DIR and _SOURCE_DIR), they are those.
TEST(TestTreesTest, BothAreNamedAbsolute) {
  const fs::path build = BuildDir();
  const fs::path source = SourceDir();
  EXPECT_TRUE(build.is_absolute()) << build;
  EXPECT_TRUE(fs::equivalent(build / "tests/support/shell_command_test", "/proc/self/exe"))
      << build;
  EXPECT_TRUE(source.is_absolute()) << source;
  EXPECT_TRUE(fs::is_regular_file(source / "cmake/LlmctlTargets.cmake")) << source;
  if (const std::optional<std::string> expected = Env("LLMCTL_TEST_EXPECTED_BUILD_DIR")) {
    EXPECT_TRUE(fs::equivalent(build, *expected)) << build << " for " << *expected;
  }
  if (const std::optional<std::string> expected = Env("LLMCTL_TEST_EXPECTED_SOURCE_DIR")) {
    EXPECT_TRUE(fs::equivalent(source, *expected)) << source << " for " << *expected;
  }
}

// A test binary run on its own from another directory, without ctest's LLMCTL_BUILD_DIR and
// LLMCTL_SOURCE_DIR, finds the trees this run has: its main (tests/support/gtest_main.cc) names
// them from where the binary lies.
TEST(TestTreesTest, ABinaryRunOnItsOwnFromAnotherDirectoryFindsTheSameTrees) {
  const CommandResult run =
      RunShellCommand("cd / && env -u LLMCTL_BUILD_DIR -u LLMCTL_SOURCE_DIR " +
                      ShellWord("LLMCTL_TEST_EXPECTED_BUILD_DIR=" + BuildDir().string()) + " " +
                      ShellWord("LLMCTL_TEST_EXPECTED_SOURCE_DIR=" + SourceDir().string()) + " " +
                      ShellWord(fs::read_symlink("/proc/self/exe").string()) +
                      " --gtest_filter=TestTreesTest.BothAreNamedAbsolute");
  EXPECT_EQ(run.exit_code, 0) << run.out;
  EXPECT_NE(run.out.find("[  PASSED  ] 1 test."), std::string::npos) << run.out;
}

TEST(TestTreesTest, TheEnvironmentOverridesAndARelativePathIsMadeAbsolute) {
  ScopedEnv build("LLMCTL_BUILD_DIR", "elsewhere/build");
  ScopedEnv source("LLMCTL_SOURCE_DIR", "/elsewhere/source");
  EXPECT_EQ(BuildDir(), fs::current_path() / "elsewhere/build");
  EXPECT_EQ(SourceDir(), fs::path("/elsewhere/source"));
}

}  // namespace
}  // namespace llmctl::testing
