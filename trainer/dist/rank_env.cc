#include "trainer/dist/rank_env.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
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

StatusOr<int> ListenOnMasterPort(uint16_t port) {
  const auto in_use = [port](int error) -> Status {
    if (error == EADDRINUSE) {
      return FailedPreconditionError("rank 0 cannot serve the rendezvous store: MASTER_PORT " +
                                     std::to_string(port) +
                                     " is already in use on this host; choose a free port");
    }
    return UnavailableError("rank 0 cannot serve the rendezvous store on MASTER_PORT " +
                            std::to_string(port) + ": " + std::strerror(error));
  };
  // IPv6 with IPv4-mapped addresses accepts both families; a host without IPv6 gets IPv4 only.
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool ipv6 = fd >= 0;
  if (!ipv6) fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return in_use(errno);
  const int on = 1;
  const int off = 0;
  // SO_REUSEADDR only skips TIME_WAIT leftovers of an earlier run; a live listener still conflicts.
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  int bound = 0;
  if (ipv6) {
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
    sockaddr_in6 address{};
    address.sin6_family = AF_INET6;
    address.sin6_addr = in6addr_any;
    address.sin6_port = htons(port);
    bound = ::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  } else {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    address.sin_port = htons(port);
    bound = ::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  }
  if (bound != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const int error = errno;
    ::close(fd);
    return in_use(error);
  }
  return fd;
}

uint16_t ListeningPort(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return 0;
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
  }
  if (address.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
  }
  return 0;
}

}  // namespace llmctl::dist
