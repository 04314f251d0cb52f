// The main of every llmctl_test binary, in place of GoogleTest's gtest_main. ctest tells a skipped
// test from a passed or failed one by its exit code alone (SKIP_RETURN_CODE, cmake/
// LlmctlTargets.cmake): a run in which nothing failed and at least one test skipped exits
// kSkippedExitCode; any failure, a suite's SetUpTestSuite or TearDownTestSuite included, exits 1
// whatever else skipped. Each skip's reason (its GTEST_SKIP message) is printed on one line,
// "skip reason: SUITE.TEST: MESSAGE", which scripts/check_skips.py reads from ctest's JUnit file.
//
// --llmctl_expect_tests=N (llmctl_test_rerun's ctest tests pass it): the run fails unless exactly N
// tests ran and all N passed, so a --gtest_filter that stops matching, or a test that skips, is a
// failure rather than a pass with less checked.
//
// Each test process gets its own temporary directory (TMPDIR and TEST_TMPDIR, which
// std::filesystem::temp_directory_path, GoogleTest's TempDir, mkdtemp callers and the Python
// services it starts all read), removed when the process passes and kept, with its path printed,
// when it fails. Before, every run left its trial caches and rank directories in /tmp: 1,752
// directories, 17 GB after a few days of suites.
//
// A binary run on its own, outside ctest, gets the two trees ctest names
// (cmake/LlmctlTargets.cmake): LLMCTL_BUILD_DIR, the build tree it lies in, and LLMCTL_SOURCE_DIR,
// the tree that build was configured from, each absolute; one already set stays as it is, made
// absolute. Without them, the tests that start the built llmctl, llm-agent and llm-train looked for
// them under a relative "build", which the agent's supervisor, starting llm-train in the run's
// directory, did not find ("cannot execute the worker").
#include <gtest/gtest.h>
#include <stdlib.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>

namespace {

// The exit code ctest reads as "skipped": automake's convention, which no test uses otherwise.
constexpr int kSkippedExitCode = 77;

// The message of `result`'s first skip, on one line.
std::string SkipReason(const ::testing::TestResult& result) {
  for (int i = 0; i < result.total_part_count(); ++i) {
    const ::testing::TestPartResult& part = result.GetTestPartResult(i);
    if (!part.skipped()) continue;
    std::string message = part.message();
    for (char& c : message) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    return message;
  }
  return "";
}

// A fresh directory under the inherited temporary directory, made this process's TMPDIR; "" when
// it cannot be made (the tests then use the inherited one, as before). The name is short: unix
// socket paths under it must stay within sun_path's 108 bytes.
std::string UseOwnTemporaryDirectory() {
  std::error_code error;
  std::string pattern = std::filesystem::temp_directory_path(error).string();
  if (error) return "";
  pattern += "/lt-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) return "";
  ::setenv("TMPDIR", pattern.c_str(), 1);
  ::setenv("TEST_TMPDIR", pattern.c_str(), 1);
  return pattern;
}

// Removes the process's temporary directory after a run with no failure; keeps it otherwise.
void FinishTemporaryDirectory(const std::string& directory, bool failed) {
  if (directory.empty()) return;
  if (failed) {
    std::fprintf(stderr, "kept this test process's temporary files: %s\n", directory.c_str());
    return;
  }
  std::error_code error;
  std::filesystem::remove_all(directory, error);
}

// The build tree this binary lies in: the nearest directory above it that holds CMakeCache.txt
// (a test binary is BUILD/<folder>/NAME); empty when none does.
std::filesystem::path BuildTreeOfThisBinary() {
  std::error_code error;
  const std::filesystem::path binary = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return {};
  for (std::filesystem::path dir = binary.parent_path(); dir.has_relative_path();
       dir = dir.parent_path()) {
    if (std::filesystem::is_regular_file(dir / "CMakeCache.txt", error)) return dir;
  }
  return {};
}

// The source tree `build` was configured from (its CMakeCache.txt's CMAKE_HOME_DIRECTORY); empty
// when it names none.
std::filesystem::path SourceTreeOf(const std::filesystem::path& build) {
  constexpr std::string_view kKey = "CMAKE_HOME_DIRECTORY:INTERNAL=";
  std::ifstream cache(build / "CMakeCache.txt");
  for (std::string line; std::getline(cache, line);) {
    if (line.starts_with(kKey)) return line.substr(kKey.size());
  }
  return {};
}

// Makes the path in variable `name` absolute, or sets it to `otherwise()`, absolute, where it is
// unset or empty; leaves it unset when that is empty too.
template <typename Otherwise>
void SetAbsolutePath(const char* name, Otherwise otherwise) {
  const char* value = std::getenv(name);
  const std::filesystem::path path =
      value != nullptr && *value != '\0' ? std::filesystem::path(value) : otherwise();
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(path, error);
  if (!path.empty() && !error) ::setenv(name, absolute.c_str(), 1);
}

// LLMCTL_BUILD_DIR and LLMCTL_SOURCE_DIR as ctest sets them, for a binary run on its own.
void SetTreesAsCtestDoes() {
  SetAbsolutePath("LLMCTL_BUILD_DIR", BuildTreeOfThisBinary);
  SetAbsolutePath("LLMCTL_SOURCE_DIR", [] {
    const char* build = std::getenv("LLMCTL_BUILD_DIR");
    return build != nullptr ? SourceTreeOf(build) : std::filesystem::path();
  });
}

constexpr std::string_view kExpectTestsFlag = "--llmctl_expect_tests=";

// The value of --llmctl_expect_tests=N among the arguments GoogleTest left; -1 when absent, -2 when
// it is not a positive count.
int ExpectedTestCount(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view argument = argv[i];
    if (!argument.starts_with(kExpectTestsFlag)) continue;
    const std::string_view value = argument.substr(kExpectTestsFlag.size());
    int count = 0;
    const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), count);
    return error == std::errc() && end == value.data() + value.size() && count > 0 ? count : -2;
  }
  return -1;
}

// Whether the run ran and passed exactly `expected` tests; prints why not.
bool RanAndPassedExactly(const ::testing::UnitTest& unit, int expected) {
  if (unit.test_to_run_count() == expected && unit.successful_test_count() == expected) return true;
  std::fprintf(stderr,
               "--llmctl_expect_tests=%d: %d tests ran (the filter selected them), %d passed, %d "
               "skipped, %d failed\n",
               expected, unit.test_to_run_count(), unit.successful_test_count(),
               unit.skipped_test_count(), unit.failed_test_count());
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  SetTreesAsCtestDoes();
  const std::string temporary_directory = UseOwnTemporaryDirectory();
  ::testing::InitGoogleTest(&argc, argv);
  const int expected_tests = ExpectedTestCount(argc, argv);
  if (expected_tests == -2) {
    std::fprintf(stderr, "%.*s takes a positive count of tests\n",
                 static_cast<int>(kExpectTestsFlag.size() - 1), kExpectTestsFlag.data());
    return 1;
  }
  bool failed = RUN_ALL_TESTS() != 0;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  if (expected_tests > 0 && !RanAndPassedExactly(unit, expected_tests)) failed = true;
  FinishTemporaryDirectory(temporary_directory, failed);
  if (failed) return 1;
  if (unit.skipped_test_count() == 0) return 0;
  for (int s = 0; s < unit.total_test_suite_count(); ++s) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(s);
    for (int t = 0; t < suite.total_test_count(); ++t) {
      const ::testing::TestInfo& test = *suite.GetTestInfo(t);
      if (!test.should_run() || !test.result()->Skipped()) continue;
      std::string reason = SkipReason(*test.result());
      if (reason.empty()) reason = "(GTEST_SKIP gave no message)";
      std::printf("skip reason: %s.%s: %s\n", suite.name(), test.name(), reason.c_str());
    }
  }
  std::fflush(stdout);
  return kSkippedExitCode;
}
