#include "agent/socket_interface.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

namespace llmctl::agent {
namespace {

// Whether two socket addresses hold the same IP (the port is not compared).
bool SameAddress(const sockaddr* a, const sockaddr* b) {
  if (a == nullptr || b == nullptr || a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
  }
  if (a->sa_family == AF_INET6) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr, sizeof(in6_addr)) == 0;
  }
  return false;
}

// The interface that holds `address`, if one does.
std::optional<std::string> InterfaceHolding(const sockaddr* address) {
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) return std::nullopt;
  std::optional<std::string> name;
  for (const ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
    if (SameAddress(i->ifa_addr, address)) {
      name = i->ifa_name;
      break;
    }
  }
  ::freeifaddrs(interfaces);
  return name;
}

}  // namespace

StatusOr<std::string> InterfaceReaching(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* resolved = nullptr;
  // Any port: connect() on a datagram socket sends nothing, it only picks the route.
  if (const int rc = ::getaddrinfo(host.c_str(), "9", &hints, &resolved); rc != 0) {
    return InvalidArgumentError("cannot resolve '" + host + "': " + ::gai_strerror(rc));
  }
  const std::optional<std::string> local = InterfaceHolding(resolved->ai_addr);
  if (local) {
    ::freeaddrinfo(resolved);
    return *local;
  }
  const int fd = ::socket(resolved->ai_family, SOCK_DGRAM, 0);
  if (fd < 0) {
    ::freeaddrinfo(resolved);
    return UnavailableError(std::string("cannot open a socket: ") + std::strerror(errno));
  }
  const int connected = ::connect(fd, resolved->ai_addr, resolved->ai_addrlen);
  const int error = errno;
  ::freeaddrinfo(resolved);
  sockaddr_storage source{};
  socklen_t length = sizeof(source);
  const bool named =
      connected == 0 && ::getsockname(fd, reinterpret_cast<sockaddr*>(&source), &length) == 0;
  ::close(fd);
  if (connected != 0) {
    return UnavailableError("no route to '" + host + "': " + std::strerror(error));
  }
  if (!named) return UnavailableError("cannot tell the route to '" + host + "'");
  std::optional<std::string> through = InterfaceHolding(reinterpret_cast<sockaddr*>(&source));
  if (!through) {
    return NotFoundError("no local interface holds the address the route to '" + host +
                         "' leaves from");
  }
  return *through;
}

}  // namespace llmctl::agent
