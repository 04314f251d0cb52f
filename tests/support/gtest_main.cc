// The main of every llmctl_test binary, in place of GoogleTest's gtest_main. ctest tells a skipped
// test from a passed or failed one by its exit code alone (SKIP_RETURN_CODE, cmake/
// LlmctlTargets.cmake): a run in which nothing failed and at least one test skipped exits
// kSkippedExitCode; any failure, a suite's SetUpTestSuite or TearDownTestSuite included, exits 1
// whatever else skipped. Each skip's reason (its GTEST_SKIP message) is printed on one line,
// "skip reason: SUITE.TEST: MESSAGE", which scripts/check_skips.py reads from ctest's JUnit file.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

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

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (RUN_ALL_TESTS() != 0) return 1;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
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
