#include "agent/sample_recorder.h"

#include <gtest/gtest.h>

namespace llmctl::agent {
namespace {

using std::chrono::hours;
using std::chrono::milliseconds;
using std::chrono::seconds;

const std::chrono::system_clock::time_point kWall{milliseconds(1'732'550'000'123)};
const std::chrono::steady_clock::time_point kSteady{seconds(5000)};

// chrony steps the wall clock an hour back, then two hours ahead, between a run's readings a
// second apart: they stay dated a second apart from the first, in the order they were read.
TEST(ReadingDatesTest, AWallClockStepMovesNoReadingOfARun) {
  ReadingDates dates;
  EXPECT_EQ(dates.UnixMs("run", kWall, kSteady), 1'732'550'000'123);
  EXPECT_EQ(dates.UnixMs("run", kWall + seconds(1) - hours(1), kSteady + seconds(1)),
            1'732'550'001'123);
  EXPECT_EQ(dates.UnixMs("run", kWall + seconds(2) + hours(1), kSteady + seconds(2)),
            1'732'550'002'123);
}

// Each run counts from its own first reading on the wall clock: a run started after the step is
// dated by the wall clock as it is then, and so is a run's next reading once it was forgotten.
TEST(ReadingDatesTest, EachRunStartsFromTheWallClockAtItsFirstReading) {
  ReadingDates dates;
  ASSERT_EQ(dates.UnixMs("first", kWall, kSteady), 1'732'550'000'123);
  EXPECT_EQ(dates.UnixMs("second", kWall + seconds(1) - hours(1), kSteady + seconds(1)),
            1'732'546'401'123);
  dates.Forget("first");
  EXPECT_EQ(dates.UnixMs("first", kWall + seconds(2) - hours(1), kSteady + seconds(2)),
            1'732'546'402'123);
}

}  // namespace
}  // namespace llmctl::agent
