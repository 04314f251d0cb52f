#include "trainer/dist/rank_env.h"

#include <gtest/gtest.h>

#include <map>

namespace llmctl::dist {
namespace {

using Env = std::map<std::string, std::string>;

StatusOr<RankEnv> Parse(const Env& env) {
  return ParseRankEnv([&env](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

Env Torchrun() {
  return {{"RANK", "3"},         {"LOCAL_RANK", "1"},      {"WORLD_SIZE", "4"},
          {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "29500"}, {"LOCAL_WORLD_SIZE", "2"}};
}

TEST(RankEnvTest, ReadsTorchrunsVariables) {
  StatusOr<RankEnv> env = Parse(Torchrun());
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  EXPECT_EQ(env->rank, 3);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->world_size, 4);
  EXPECT_EQ(env->local_world_size, 2);
  EXPECT_EQ(env->master_addr, "n0");
  EXPECT_EQ(env->master_port, 29500);
}

TEST(RankEnvTest, LocalWorldSizeIsOptional) {
  Env variables = Torchrun();
  variables.erase("LOCAL_WORLD_SIZE");
  variables["LOCAL_RANK"] = "3";  // then bounded by WORLD_SIZE
  StatusOr<RankEnv> env = Parse(variables);
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  EXPECT_FALSE(env->local_world_size.has_value());
  EXPECT_EQ(env->local_rank, 3);
}

TEST(RankEnvTest, VariablesRoundTrip) {
  const RankEnv env = *Parse(Torchrun());
  Env written;
  for (const std::string& entry : RankEnvVariables(env)) {
    const size_t equals = entry.find('=');
    written[entry.substr(0, equals)] = entry.substr(equals + 1);
  }
  EXPECT_EQ(written, Torchrun());
}

struct BadCase {
  std::string variable;
  std::optional<std::string> value;  // nullopt: unset
  std::string message;
};

class RankEnvBadTest : public testing::TestWithParam<BadCase> {};

TEST_P(RankEnvBadTest, NamesTheVariableAndValue) {
  Env variables = Torchrun();
  if (GetParam().value.has_value()) {
    variables[GetParam().variable] = *GetParam().value;
  } else {
    variables.erase(GetParam().variable);
  }
  StatusOr<RankEnv> env = Parse(variables);
  ASSERT_FALSE(env.ok());
  EXPECT_EQ(env.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(env.status().message(), GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(
    EachVariable, RankEnvBadTest,
    testing::Values(
        BadCase{"RANK", std::nullopt,
                "RANK is not set (a distributed rank needs RANK, LOCAL_RANK, WORLD_SIZE, "
                "MASTER_ADDR and MASTER_PORT, as torchrun sets them)"},
        BadCase{"RANK", "one", "RANK='one' is not a whole number"},
        BadCase{"RANK", "4", "RANK=4 is out of range: 0 up to WORLD_SIZE-1 (WORLD_SIZE=4)"},
        BadCase{"RANK", "-1", "RANK=-1 is out of range: 0 up to WORLD_SIZE-1 (WORLD_SIZE=4)"},
        BadCase{"LOCAL_RANK", std::nullopt,
                "LOCAL_RANK is not set (a distributed rank needs RANK, LOCAL_RANK, WORLD_SIZE, "
                "MASTER_ADDR and MASTER_PORT, as torchrun sets them)"},
        BadCase{"LOCAL_RANK", "2",
                "LOCAL_RANK=2 is out of range: 0 up to LOCAL_WORLD_SIZE-1 (LOCAL_WORLD_SIZE=2)"},
        BadCase{"LOCAL_RANK", "1 ", "LOCAL_RANK='1 ' is not a whole number"},
        BadCase{"WORLD_SIZE", std::nullopt,
                "WORLD_SIZE is not set (a distributed rank needs RANK, LOCAL_RANK, WORLD_SIZE, "
                "MASTER_ADDR and MASTER_PORT, as torchrun sets them)"},
        BadCase{"WORLD_SIZE", "0", "WORLD_SIZE=0 is out of range: at least 1"},
        BadCase{"WORLD_SIZE", "", "WORLD_SIZE='' is not a whole number"},
        BadCase{"WORLD_SIZE", "99999999999", "WORLD_SIZE='99999999999' is not a whole number"},
        BadCase{"LOCAL_WORLD_SIZE", "5",
                "LOCAL_WORLD_SIZE=5 is out of range: 1 up to WORLD_SIZE (WORLD_SIZE=4)"},
        BadCase{"LOCAL_WORLD_SIZE", "2x", "LOCAL_WORLD_SIZE='2x' is not a whole number"},
        BadCase{"MASTER_ADDR", std::nullopt,
                "MASTER_ADDR is not set (a distributed rank needs RANK, LOCAL_RANK, WORLD_SIZE, "
                "MASTER_ADDR and MASTER_PORT, as torchrun sets them)"},
        BadCase{"MASTER_ADDR", "", "MASTER_ADDR is empty: it names the host of rank 0"},
        BadCase{"MASTER_PORT", std::nullopt,
                "MASTER_PORT is not set (a distributed rank needs RANK, LOCAL_RANK, WORLD_SIZE, "
                "MASTER_ADDR and MASTER_PORT, as torchrun sets them)"},
        BadCase{"MASTER_PORT", "0", "MASTER_PORT=0 is out of range: 1 up to 65535"},
        BadCase{"MASTER_PORT", "65536", "MASTER_PORT=65536 is out of range: 1 up to 65535"},
        BadCase{"MASTER_PORT", "http", "MASTER_PORT='http' is not a whole number"}));

}  // namespace
}  // namespace llmctl::dist
