// docs/experiment-files.md's table of trial keys is generated from the registry (`make
// readme-keys`); this test fails when they disagree, so the documentation cannot drift from the
// keys the code accepts.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "common/trial_keys.h"
#include "tests/support/shell_command.h"

namespace llmctl {
namespace {

TEST(ReadmeKeysTest, ReadmeTableEqualsTheRegistry) {
  std::ifstream in(testing::SourceDir() / "docs/experiment-files.md");
  ASSERT_TRUE(in) << "docs/experiment-files.md not found";
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string readme = buffer.str();
  const std::string begin = "<!-- trial-keys:begin -->\n";
  const std::string end = "<!-- trial-keys:end -->";
  const size_t from = readme.find(begin);
  const size_t to = readme.find(end);
  ASSERT_NE(from, std::string::npos);
  ASSERT_NE(to, std::string::npos);
  const std::string table = readme.substr(from + begin.size(), to - from - begin.size());
  EXPECT_EQ(table, TrialKeysMarkdownTable())
      << "docs/experiment-files.md's key table is stale: run `make readme-keys`";
}

}  // namespace
}  // namespace llmctl
