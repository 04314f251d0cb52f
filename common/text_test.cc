#include "common/text.h"

#include <gtest/gtest.h>

namespace llmctl {
namespace {

TEST(TrimTest, DropsSurroundingWhiteSpaceOnly) {
  EXPECT_EQ(Trim("  a b \t\n"), "a b");
  EXPECT_EQ(Trim(""), "");
}

TEST(FirstInvalidUtf8Test, FindsTheBreakingByte) {
  EXPECT_EQ(FirstInvalidUtf8("plain – ok"), std::string_view::npos);
  EXPECT_EQ(FirstInvalidUtf8("ab\xC0\xAF"), 2u);  // overlong '/'
}

TEST(PrintableTextProblemTest, NamesLengthControlCharactersAndBadUtf8) {
  EXPECT_EQ(PrintableTextProblem("NVIDIA H200 – 141 GB", 64), "");
  EXPECT_EQ(PrintableTextProblem(std::string(65, 'x'), 64), "longer than 64 bytes");
  EXPECT_EQ(PrintableTextProblem("a\x1b[2J", 64), "holds a control character");
  EXPECT_EQ(PrintableTextProblem("a\x7f", 64), "holds a control character");
  EXPECT_EQ(PrintableTextProblem("a\xff", 64), "not valid UTF-8");
}

TEST(OnOneLineTest, ControlCharactersBecomeSpaces) {
  EXPECT_EQ(OnOneLine("CUDA error\nat step 3\x1b[2J"), "CUDA error at step 3 [2J");
  EXPECT_EQ(OnOneLine("plain – ok"), "plain – ok");
  // C1 controls (U+009B is CSI to many terminals) too, one space each; other two-byte characters
  // stay.
  EXPECT_EQ(OnOneLine("a\u009b2Jb\u0085c\u00a0d\u00e9"), "a 2Jb c\u00a0d\u00e9");
  EXPECT_EQ(ForTerminal("line 1\n\tline 2\x1b[2J\r"), "line 1\n\tline 2 [2J ");
}

TEST(ReplaceInvalidUtf8Test, ReplacesEachBreakingByteAndKeepsTheRest) {
  EXPECT_EQ(ReplaceInvalidUtf8("plain – ok"), "plain – ok");
  EXPECT_EQ(ReplaceInvalidUtf8("cut \xe2\x82"), "cut \xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(ReplaceInvalidUtf8("\xff–\xff"), "\xef\xbf\xbd–\xef\xbf\xbd");
  EXPECT_EQ(FirstInvalidUtf8(ReplaceInvalidUtf8("a\xC0\xAF"
                                                "b\xed\xa0\x80")),
            std::string_view::npos);
}

TEST(FormatColumnsTest, AlignsByCharactersAndRightAlignsNumbers) {
  const std::string table = FormatColumns(
      {{"trial", "outcome", "MiB"}, {"baseline", "oom", "212.2"}, {"qlora", "ok", "–"}}, 2);
  EXPECT_EQ(table,
            "trial     outcome    MiB\n"
            "baseline  oom      212.2\n"
            "qlora     ok           –\n");
}

TEST(FormatColumnsTest, LeftAlignedRaggedRowsEndWithoutSpaces) {
  EXPECT_EQ(FormatColumns({{"NAME", "STATUS"}, {"a"}, {"longer-name", "ACTIVE"}}),
            "NAME         STATUS\n"
            "a\n"
            "longer-name  ACTIVE\n");
}

TEST(JoinTest, PutsTheSeparatorBetweenItemsOnly) {
  EXPECT_EQ(Join({}, ", "), "");
  EXPECT_EQ(Join({"a"}, ", "), "a");
  EXPECT_EQ(Join({"a", "b", "c"}, ", "), "a, b, c");
  EXPECT_EQ(Join({"x", "y"}, " | "), "x | y");
}

TEST(NameInputsTest, ReplacesEveryPathLongestFirst) {
  const std::map<std::string, std::string> names = {
      {"/agent/cache/trees/b4", "model"},
      {"/agent/cache/trees/b4/x.jsonl", "data/x.jsonl"},
      {"", "never"}};
  EXPECT_EQ(NameInputs("/agent/cache/trees/b4/x.jsonl:2: invalid JSON; see /agent/cache/trees/"
                       "b4/x.jsonl and /agent/cache/trees/b4/config.json",
                       names),
            "data/x.jsonl:2: invalid JSON; see data/x.jsonl and model/config.json");
  EXPECT_EQ(NameInputs("nothing to name", names), "nothing to name");
}

}  // namespace
}  // namespace llmctl
