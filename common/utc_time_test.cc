#include "common/utc_time.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "tests/support/scoped_time_zone.h"

namespace llmctl {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::system_clock;

using testing::ScopedTimeZone;

// 1'700'000'000 s is 2023-11-14 22:13:20 UTC, 2023-11-15 03:43:20 in IST: each caller's form
// gives the UTC time, not the local one.
TEST(FormatUtcTest, GivesEachCallersFormInUtcWhateverTheZone) {
  ScopedTimeZone zone("IST-5:30");
  const system_clock::time_point time{seconds(1'700'000'000)};
  EXPECT_EQ(FormatUtc(time, "%Y-%m-%d %H:%M"), "2023-11-14 22:13");          // Blazar's dates
  EXPECT_EQ(FormatUtc(time, "%Y-%m-%d %H:%M UTC"), "2023-11-14 22:13 UTC");  // lease notices
  EXPECT_EQ(FormatUtc(time, "%Y-%m-%dT%H:%M:%SZ"), "2023-11-14T22:13:20Z");  // ISO 8601
  EXPECT_EQ(FormatUtc(time, "%Y%m%d-%H%M"), "20231114-2213");                // lease names
}

// A fraction of a second is dropped, not rounded; the ends of the years a cloud's timestamp may
// name (cloud_clock.h) format as themselves.
TEST(FormatUtcTest, DropsAFractionOfASecondAndHoldsTheCloudsYears) {
  const system_clock::time_point time{milliseconds(1'700'000'000'999)};
  EXPECT_EQ(FormatUtc(time, "%Y-%m-%dT%H:%M:%SZ"), "2023-11-14T22:13:20Z");
  // -2'208'988'800 s is 1900-01-01 00:00:00, 7'258'118'399 s 2199-12-31 23:59:59.
  EXPECT_EQ(FormatUtc(system_clock::time_point{seconds(-2'208'988'800)}, "%Y-%m-%d %H:%M:%S"),
            "1900-01-01 00:00:00");
  EXPECT_EQ(FormatUtc(system_clock::time_point{seconds(7'258'118'399)}, "%Y-%m-%d %H:%M:%S"),
            "2199-12-31 23:59:59");
}

}  // namespace
}  // namespace llmctl
