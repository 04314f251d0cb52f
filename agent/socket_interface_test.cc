#include "agent/socket_interface.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <string>
#include <utility>
#include <vector>

namespace llmctl::agent {
namespace {

// Every IPv4 address this machine's interfaces hold, with its interface: loopback's at least.
std::vector<std::pair<std::string, std::string>> LocalAddresses() {
  std::vector<std::pair<std::string, std::string>> addresses;
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) return addresses;
  for (const ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, text,
                sizeof(text));
    addresses.emplace_back(text, i->ifa_name);
  }
  ::freeifaddrs(interfaces);
  return addresses;
}

// Node rank 0's agent is given its own address: the interface that holds it.
TEST(InterfaceReachingTest, AnAddressOfThisMachineIsItsInterfaces) {
  const auto addresses = LocalAddresses();
  ASSERT_FALSE(addresses.empty());
  for (const auto& [address, interface] : addresses) {
    StatusOr<std::string> found = InterfaceReaching(address);
    ASSERT_TRUE(found.ok()) << address << ": " << found.status().message();
    EXPECT_EQ(*found, interface) << address;
  }
}

// The other nodes' agents are given node rank 0's: the interface the route leaves from. Any
// loopback address routes through lo, whether or not lo holds that exact address.
TEST(InterfaceReachingTest, ALoopbackAddressIsReachedThroughLo) {
  for (const char* host : {"127.0.0.1", "127.0.0.2", "localhost"}) {
    StatusOr<std::string> found = InterfaceReaching(host);
    ASSERT_TRUE(found.ok()) << host << ": " << found.status().message();
    EXPECT_EQ(*found, "lo") << host;
  }
}

TEST(InterfaceReachingTest, AnUnresolvableHostIsNamed) {
  StatusOr<std::string> found = InterfaceReaching("no-such-host.invalid");
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(found.status().message().find("no-such-host.invalid"), std::string::npos);
}

}  // namespace
}  // namespace llmctl::agent
