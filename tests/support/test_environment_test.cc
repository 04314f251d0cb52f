// llmctl_test's environment reaches every discovered test: the fixed thread counts, both trees, and
// each ENV argument (gtest_discover_tests once dropped all but the first variable).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace {

namespace fs = std::filesystem;

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

TEST(TestEnvironmentTest, EveryVariableArrives) {
  EXPECT_EQ(Env("OMP_NUM_THREADS"), "2");
  EXPECT_EQ(Env("MKL_NUM_THREADS"), "2");
  EXPECT_TRUE(fs::is_regular_file(fs::path(Env("LLMCTL_SOURCE_DIR")) / "cmake/LlmctlTargets.cmake"))
      << "LLMCTL_SOURCE_DIR='" << Env("LLMCTL_SOURCE_DIR") << "'";
  EXPECT_TRUE(fs::is_regular_file(fs::path(Env("LLMCTL_BUILD_DIR")) / "CMakeCache.txt"))
      << "LLMCTL_BUILD_DIR='" << Env("LLMCTL_BUILD_DIR") << "'";
  EXPECT_EQ(Env("LLMCTL_TEST_FIRST"), "one");
  EXPECT_EQ(Env("LLMCTL_TEST_SECOND"), "two words");
}

}  // namespace
