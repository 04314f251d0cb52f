#include "controller/json_fields.h"

#include <gtest/gtest.h>

#include "common/result_event.h"

namespace llmctl::controller {
namespace {

// The store's events are another process's numbers: a float or an unsigned past int64_t reads as
// 0, not as a conversion's undefined value (a report once showed INT64_MIN for 1e19).
TEST(JsonFieldsTest, IntFieldReadsWholeNumbersAndZeroPastInt64) {
  const nlohmann::json event = nlohmann::json::parse(
      R"({"a":7,"b":1e3,"c":1e19,"d":-1e19,"e":18446744073709551615,"f":"7","g":-5})");
  EXPECT_EQ(IntField(event, "a"), 7);
  EXPECT_EQ(IntField(event, "b"), 1000);
  EXPECT_EQ(IntField(event, "c"), 0);
  EXPECT_EQ(IntField(event, "d"), 0);
  EXPECT_EQ(IntField(event, "e"), 0);
  EXPECT_EQ(IntField(event, "f"), 0);
  EXPECT_EQ(IntField(event, "g"), -5);
  EXPECT_EQ(IntField(nlohmann::json::array(), "a"), 0);
}

// Callers count the step after a checkpoint's: INT64_MAX is refused rather than overflowed.
TEST(JsonFieldsTest, ACheckpointAtTheLastInt64StepIsNone) {
  auto result = [](const std::string& step) {
    return nlohmann::json::parse(R"({"checkpoint":{"step":)" + step + R"(,"path":"/o/c"}})");
  };
  ASSERT_TRUE(result_event::CheckpointOf(result("41")).has_value());
  EXPECT_EQ(result_event::CheckpointOf(result("41"))->step, 41);
  EXPECT_FALSE(result_event::CheckpointOf(result("9223372036854775807")).has_value());
  EXPECT_FALSE(result_event::CheckpointOf(result("18446744073709551615")).has_value());
}

}  // namespace
}  // namespace llmctl::controller
