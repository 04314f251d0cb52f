// Which network interface a multi-node trial's ranks talk over. Gloo and NCCL pick one themselves
// from the host name unless GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME name it, and on cloud nodes
// with several networks (a public one, a private one, docker's bridge) the host name often
// resolves to the wrong one: the ranks then wait for each other until the rendezvous times out.
// The agent knows better: the interface that carries node rank 0's address, or the one the kernel
// routes to it through.
#ifndef LLMCTL_AGENT_SOCKET_INTERFACE_H_
#define LLMCTL_AGENT_SOCKET_INTERFACE_H_

#include <string>

#include "common/status.h"

namespace llmctl::agent {

// The name of the local interface that holds `host` (a numeric IPv4 or IPv6 address, or a name
// that resolves to one) when it is this machine's own address, else of the interface the kernel
// would send a packet to `host` through ("lo" for a loopback address). NotFound when no local
// interface carries the source address the route chose (a NAT'd floating address); InvalidArgument
// when `host` does not resolve; Unavailable when there is no route.
StatusOr<std::string> InterfaceReaching(const std::string& host);

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_SOCKET_INTERFACE_H_
