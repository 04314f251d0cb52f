#include "common/trial_name.h"

#include <gtest/gtest.h>

#include <string>

namespace llmctl {
namespace {

TEST(TrialNameTest, EncodingRoundTripsAndIsOneDirectoryName) {
  for (const std::string name : {"base", "base/precision=bf16-true", "a,b=c d%", "\u00fcn\u00ef"}) {
    const std::string encoded = EncodeTrialName(name);
    EXPECT_EQ(encoded.find('/'), std::string::npos);
    EXPECT_EQ(DecodeTrialName(encoded), name);
  }
  EXPECT_EQ(EncodeTrialName("base/precision=bf16-true"), "base%2Fprecision%3Dbf16-true");
  EXPECT_EQ(DecodeTrialName("a%2fb"), "a/b");
  EXPECT_FALSE(DecodeTrialName("bad%2").has_value());
  EXPECT_FALSE(DecodeTrialName("bad%zz").has_value());
  EXPECT_FALSE(DecodeTrialName("bad%+1").has_value());
}

// A name a node can run fits a directory's name once escaped: a sweep's name of 200 bytes whose
// '/', '=' and ',' take 3 bytes each does not.
TEST(TrialNameTest, ANameMustFitADirectoryNameOnceEscaped) {
  EXPECT_EQ(TrialNameProblem("base"), "");
  EXPECT_EQ(TrialNameProblem(std::string(200, 'a')), "");
  EXPECT_EQ(TrialNameProblem(std::string(201, 'a')), "must be 1 to 200 bytes and not '.' or '..'");
  EXPECT_EQ(TrialNameProblem(""), "must be 1 to 200 bytes and not '.' or '..'");
  EXPECT_EQ(TrialNameProblem(".."), "must be 1 to 200 bytes and not '.' or '..'");
  // 171 + 3 x 28 = 255 bytes escaped: the most that fits.
  EXPECT_EQ(TrialNameProblem(std::string(171, 'a') + std::string(28, '=')), "");
  EXPECT_EQ(TrialNameProblem(std::string(170, 'a') + std::string(29, '=')),
            "is 257 bytes as a directory name ('/', '=', ',' and other bytes than letters, "
            "digits, '.', '_' and '-' take 3), over 255");
}

// Every listing of trials prints their names: none may hold what a terminal acts on.
TEST(TrialNameTest, ANameMustBePrintable) {
  EXPECT_EQ(TrialNameProblem("base/model=\u00fcn\u00ef"), "");
  EXPECT_EQ(TrialNameProblem("base/model=m\x1b]0;T\x07"), "holds a control character");
  EXPECT_EQ(TrialNameProblem("base/model=m\u202egnp"), "holds a bidirectional text control");
  EXPECT_EQ(TrialNameProblem("base/model=m\xff"), "not valid UTF-8");
}

}  // namespace
}  // namespace llmctl
