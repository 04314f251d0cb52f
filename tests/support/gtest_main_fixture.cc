// Tests for gtest_main.cc's exit codes, which scripts/check_skips_test.py runs through ctest:
// LLMCTL_FIXTURE_MODE says what they do. "pass": all pass (exit 0). "skip": one skips (77). "fail":
// one fails (1). "skip-then-teardown-fails": one skips and a suite's TearDownTestSuite fails (1;
// ctest's old SKIP_REGULAR_EXPRESSION called it skipped).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace {

std::string Mode() {
  const char* mode = std::getenv("LLMCTL_FIXTURE_MODE");
  return mode != nullptr ? mode : "pass";
}

TEST(FixtureTest, Passes) {}

TEST(FixtureTest, FailsWhenAsked) { EXPECT_NE(Mode(), "fail") << "asked to fail"; }

TEST(FixtureTest, SkipsWhenAsked) {
  if (Mode() == "skip" || Mode() == "skip-then-teardown-fails") {
    GTEST_SKIP() << "nothing to run it on\nhere";
  }
}

class TornDownTest : public ::testing::Test {
 protected:
  static void TearDownTestSuite() {
    if (Mode() == "skip-then-teardown-fails") ADD_FAILURE() << "the suite's tear-down failed";
  }
};

TEST_F(TornDownTest, Passes) {}

}  // namespace
