#include "trainer/dist/rank_env.h"

#include <charconv>
#include <cstdlib>
#include <limits>

namespace llmctl::dist {
namespace {

constexpr char kTorchrunVariables[] = "RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT";

StatusOr<std::string> Required(const EnvLookup& lookup, const char* name) {
  std::optional<std::string> value = lookup(name);
  if (!value.has_value()) {
    return InvalidArgumentError(std::string(name) + " is not set (a distributed rank needs " +
                                kTorchrunVariables + ", as torchrun sets them)");
  }
  return *std::move(value);
}

// A whole number in [min, max] (both inclusive), or an error naming the variable and its value.
StatusOr<int> ParseInt(const char* name, const std::string& value, int min, int max,
                       std::string_view range) {
  int parsed = 0;
  const char* end = value.data() + value.size();
  const auto [ptr, error] = std::from_chars(value.data(), end, parsed);
  if (value.empty() || error != std::errc() || ptr != end) {
    return InvalidArgumentError(std::string(name) + "='" + value + "' is not a whole number");
  }
  if (parsed < min || parsed > max) {
    return InvalidArgumentError(std::string(name) + "=" + value +
                                " is out of range: " + std::string(range));
  }
  return parsed;
}

}  // namespace

StatusOr<RankEnv> ParseRankEnv(const EnvLookup& lookup) {
  constexpr int kMaxInt = std::numeric_limits<int>::max();
  RankEnv env;
  ASSIGN_OR_RETURN(const std::string world_text, Required(lookup, "WORLD_SIZE"));
  ASSIGN_OR_RETURN(env.world_size, ParseInt("WORLD_SIZE", world_text, 1, kMaxInt, "at least 1"));
  ASSIGN_OR_RETURN(const std::string rank_text, Required(lookup, "RANK"));
  ASSIGN_OR_RETURN(env.rank, ParseInt("RANK", rank_text, 0, env.world_size - 1,
                                      "0 up to WORLD_SIZE-1 (WORLD_SIZE=" + world_text + ")"));
  if (std::optional<std::string> local_world_text = lookup("LOCAL_WORLD_SIZE")) {
    ASSIGN_OR_RETURN(env.local_world_size,
                     ParseInt("LOCAL_WORLD_SIZE", *local_world_text, 1, env.world_size,
                              "1 up to WORLD_SIZE (WORLD_SIZE=" + world_text + ")"));
  }
  ASSIGN_OR_RETURN(const std::string local_rank_text, Required(lookup, "LOCAL_RANK"));
  const int local_ranks = env.local_world_size.value_or(env.world_size);
  ASSIGN_OR_RETURN(env.local_rank,
                   ParseInt("LOCAL_RANK", local_rank_text, 0, local_ranks - 1,
                            env.local_world_size.has_value()
                                ? "0 up to LOCAL_WORLD_SIZE-1 (LOCAL_WORLD_SIZE=" +
                                      std::to_string(local_ranks) + ")"
                                : "0 up to WORLD_SIZE-1 (WORLD_SIZE=" + world_text + ")"));
  ASSIGN_OR_RETURN(env.master_addr, Required(lookup, "MASTER_ADDR"));
  if (env.master_addr.empty()) {
    return InvalidArgumentError("MASTER_ADDR is empty: it names the host of rank 0");
  }
  ASSIGN_OR_RETURN(const std::string port_text, Required(lookup, "MASTER_PORT"));
  ASSIGN_OR_RETURN(const int port, ParseInt("MASTER_PORT", port_text, 1, 65535, "1 up to 65535"));
  env.master_port = static_cast<uint16_t>(port);
  return env;
}

StatusOr<RankEnv> RankEnvFromEnvironment() {
  return ParseRankEnv([](const char* name) -> std::optional<std::string> {
    const char* value = std::getenv(name);
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  });
}

std::vector<std::string> RankEnvVariables(const RankEnv& env) {
  std::vector<std::string> variables = {
      "RANK=" + std::to_string(env.rank),
      "LOCAL_RANK=" + std::to_string(env.local_rank),
      "WORLD_SIZE=" + std::to_string(env.world_size),
      "MASTER_ADDR=" + env.master_addr,
      "MASTER_PORT=" + std::to_string(env.master_port),
  };
  if (env.local_world_size.has_value()) {
    variables.push_back("LOCAL_WORLD_SIZE=" + std::to_string(*env.local_world_size));
  }
  return variables;
}

}  // namespace llmctl::dist
