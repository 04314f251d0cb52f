#include "common/text.h"

#include <gtest/gtest.h>

namespace llmctl {
namespace {

TEST(TrimTest, DropsSurroundingWhiteSpaceOnly) {
  EXPECT_EQ(Trim("  a b \t\n"), "a b");
  EXPECT_EQ(Trim(""), "");
}

TEST(LastNonBlankLineTest, IsTheLastLineThatIsNotBlankTrimmed) {
  EXPECT_EQ(LastNonBlankLine("loading\nllm-train: x.yaml:3:1: unknown key\n\n"),
            "llm-train: x.yaml:3:1: unknown key");
  EXPECT_EQ(LastNonBlankLine("first\n  last  "), "last");  // no newline at its end
  EXPECT_EQ(LastNonBlankLine("first\r\nlast\r\n \t\r\n"), "last");
  EXPECT_EQ(LastNonBlankLine("only"), "only");
  EXPECT_EQ(LastNonBlankLine(" \n\t\n\n"), "");
  EXPECT_EQ(LastNonBlankLine(""), "");
}

TEST(AppendKeepingTailTest, KeepsTheLastBytes) {
  std::string tail;
  AppendKeepingTail(tail, "abc", 4);
  EXPECT_EQ(tail, "abc");
  AppendKeepingTail(tail, "de", 4);
  EXPECT_EQ(tail, "bcde");
  AppendKeepingTail(tail, "0123456789", 4);
  EXPECT_EQ(tail, "6789");
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
  // C1 (U+009B is CSI to many terminals), the line separator, and bidirectional controls, which
  // reorder what is shown ("\u202Egnp.exe" shows as "exe.png").
  EXPECT_EQ(PrintableTextProblem("a\u009b2J", 64), "holds a control character");
  EXPECT_EQ(PrintableTextProblem("a\u2028b", 64), "holds a control character");
  for (const char* bidi : {"\u202a", "\u202e", "\u2066", "\u2069", "\u200e", "\u200f", "\u061c"}) {
    EXPECT_EQ(PrintableTextProblem(std::string("gnp") + bidi + ".exe", 64),
              "holds a bidirectional text control")
        << bidi;
  }
  EXPECT_EQ(PrintableTextProblem("\u00e9\u2013\u4e2d\U0001F600", 64), "");
}

TEST(OnOneLineTest, ControlCharactersBecomeSpaces) {
  EXPECT_EQ(OnOneLine("CUDA error\nat step 3\x1b[2J"), "CUDA error at step 3 [2J");
  EXPECT_EQ(OnOneLine("plain – ok"), "plain – ok");
  // C1 controls (U+009B is CSI to many terminals) too, one space each; other two-byte characters
  // stay.
  EXPECT_EQ(OnOneLine("a\u009b2Jb\u0085c\u00a0d\u00e9"), "a 2Jb c\u00a0d\u00e9");
  EXPECT_EQ(ForTerminal("line 1\n\tline 2\x1b[2J\r"), "line 1\n\tline 2 [2J ");
}

TEST(OnOneLineTest, BidirectionalControlsBecomeSpacesAndBadBytesReplacementCharacters) {
  EXPECT_EQ(OnOneLine("a\u202egnp.exe\u2066b\u2069c\u200e\u200f\u061cd\u2028e"),
            "a gnp.exe b c   d e");
  // A byte that breaks UTF-8 is U+FFFD, one each, and never joins what follows.
  EXPECT_EQ(OnOneLine("cut \xe2\x82"), "cut \ufffd\ufffd");
  EXPECT_EQ(OnOneLine("\xc2\x1b[2J\xff"), "\ufffd [2J\ufffd");
  EXPECT_EQ(ForTerminal("\xed\xa0\x80\u202e"), "\ufffd\ufffd\ufffd ");
}

TEST(OnOneLineTest, LongTextIsCutAtACharactersStartWithinTheLimit) {
  EXPECT_EQ(OnOneLine("abcdef", 6), "abcdef");
  EXPECT_EQ(OnOneLine("abcdefg", 6), "abc\u2026");
  // "é" is two bytes: the cut moves back to its start rather than split it.
  EXPECT_EQ(OnOneLine("ab\u00e9\u00e9\u00e9", 6), "ab\u2026");
  EXPECT_EQ(OnOneLine("a\u4e2d\u4e2d", 6), "a\u2026");
  EXPECT_EQ(OnOneLine("abc", 2), "ab");
  // The limit counts what is shown: a control's space, a bad byte's three bytes.
  EXPECT_EQ(OnOneLine("\xff\xff", 6), "\ufffd\ufffd");
  EXPECT_EQ(OnOneLine("\xff\xff\xff", 8), "\ufffd\u2026");
  const std::string long_error = "x" + std::string(60000, '\n');
  EXPECT_EQ(OnOneLine(long_error, 200).size(), 200u);
  EXPECT_EQ(FirstInvalidUtf8(OnOneLine(std::string(300, '\xe2'), 200)), std::string_view::npos);
}

// A message of several lines keeps its lines, but a line of another party's cannot pass for one
// of the program's own: each starts with white space.
TEST(ForTerminalTest, LinesAfterTheFirstStartWithWhiteSpace) {
  EXPECT_EQ(ForTerminal("unknown model_type 'llama\x1b]0;T\x07\r\nllmctl: FORGED'"),
            "unknown model_type 'llama ]0;T  \n  llmctl: FORGED'");
  EXPECT_EQ(ForTerminal("two problems:\n  first\n\tsecond\n\nthird\n"),
            "two problems:\n  first\n\tsecond\n\n  third\n");
  EXPECT_EQ(ForTerminal("a\nb\nc", 7), "a\n  \u2026");
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

// A file's own name and the path the user wrote may both hold '=' (and a backslash): PATH still
// ends where InputNameArgument says.
TEST(InputNameArgumentTest, PathsAndNamesHoldingEqualsSignsComeBackWhole) {
  const std::pair<std::string, std::string> named = {"/cache/trees/c0/a=b\\c=.jsonl",
                                                     "data/x=y/a=b\\c=.jsonl"};
  const std::string argument = InputNameArgument(named.first, named.second);
  EXPECT_EQ(argument, "/cache/trees/c0/a\\=b\\\\c\\=.jsonl=data/x=y/a=b\\c=.jsonl");
  EXPECT_EQ(ParseInputNameArgument(argument), named);
  // What agents wrote before paths were escaped parses the same when PATH holds neither.
  const std::pair<std::string, std::string> unescaped = {"/cache/x.jsonl", "data/x.jsonl"};
  EXPECT_EQ(ParseInputNameArgument("/cache/x.jsonl=data/x.jsonl"), unescaped);
}

TEST(InputNameArgumentTest, ABadFormIsRefused) {
  for (const char* bad : {"", "no-equals-sign", "=name",
                          "/cache/x.jsonl=", "/cache/x\\=", "/cache/x\\y=name", "/cache/x\\"}) {
    EXPECT_EQ(ParseInputNameArgument(bad), std::nullopt) << bad;
  }
}

TEST(PercentEncodeTest, KeepsUnreservedBytesAndEncodesTheRest) {
  EXPECT_EQ(PercentEncode("a-z.0_9~", /*keep_slash=*/false), "a-z.0_9~");
  EXPECT_EQ(PercentEncode("/My Drive/#1?\u00e9%", /*keep_slash=*/true),
            "/My%20Drive/%231%3F%C3%A9%25");
  EXPECT_EQ(PercentEncode("refs/pr/1", /*keep_slash=*/false), "refs%2Fpr%2F1");
}

// What tests/support/shell_command_test.cc reads back through /bin/sh.
TEST(ShellWordTest, PlainWordsStayAndOthersAreSingleQuoted) {
  EXPECT_EQ(ShellWord("--site=KVM@TACC/g1.h100,x+y:50%"), "--site=KVM@TACC/g1.h100,x+y:50%");
  EXPECT_EQ(ShellWord(""), "''");
  EXPECT_EQ(ShellWord("My Drive"), "'My Drive'");
  EXPECT_EQ(ShellWord("this machine's rates"), "'this machine'\\''s rates'");
  EXPECT_EQ(ShellWord("$HOME `id` \\ \"*\""), "'$HOME `id` \\ \"*\"'");
}

TEST(CountOfTest, OneIsSingularAndEveryOtherCountPlural) {
  EXPECT_EQ(CountOf(1, "trial", "trials"), "1 trial");
  EXPECT_EQ(CountOf(0, "trial", "trials"), "0 trials");
  EXPECT_EQ(CountOf(2, "micro-batch", "micro-batches"), "2 micro-batches");
  EXPECT_EQ(CountOf(-1, "trial", "trials"), "-1 trials");
}

}  // namespace
}  // namespace llmctl
