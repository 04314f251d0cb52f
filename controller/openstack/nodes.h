// GPU nodes on a lease: `node up` brings one up (boot volume, server, security groups, floating
// IP) and resumes after a failure; `node down` removes what it made and is safe to repeat.
// Everything is found by names derived from the lease, so nothing is ever made twice.
#ifndef LLMCTL_CONTROLLER_OPENSTACK_NODES_H_
#define LLMCTL_CONTROLLER_OPENSTACK_NODES_H_

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "controller/openstack/blazar.h"
#include "controller/openstack/cinder.h"
#include "controller/openstack/cloud_clock.h"
#include "controller/openstack/neutron.h"
#include "controller/openstack/nova.h"
#include "controller/openstack/session.h"

namespace llmctl::openstack {

// The deterministic names of one lease's node.
struct NodeNames {
  std::string node;         // the lease's name: llm-agent's --node
  std::string server;       // llmctl-<lease>-server
  std::string volume;       // llmctl-<lease>-boot
  std::string floating_ip;  // the floating IP's description, llmctl-<lease>-ip
};
NodeNames NamesForNode(std::string_view lease_name);

// The node whose server Nova calls `server_name` (llmctl-<lease>-server, NamesForNode's server);
// nullopt for any other name, "llmctl-server" (prefix and suffix overlapping) and
// "llmctl--server" (no lease) included.
std::optional<std::string> NodeOfServer(std::string_view server_name);

// The security groups llmctl makes carry this description prefix; `node down` deletes only
// those, and only when no port uses them.
inline constexpr char kSecurityGroupMark[] = "llmctl:";
// Nova metadata key on the server: the agent's port, so list/show can print its address.
inline constexpr char kAgentPortMetadata[] = "llmctl-agent-port";

// The agent's port from the server's kAgentPortMetadata: 1-65535, or 0 when it is missing or not
// a port in decimal digits (Nova's metadata is anyone's in the project to change).
int AgentPortOf(const Server& server);

struct NodeSpec {
  std::string lease;  // name or id; must be ACTIVE
  std::string image = "CC-Ubuntu24.04-CUDA";
  int boot_volume_gb = 200;  // KVM sites only
  std::string key_name;      // empty: no key pair
  int agent_port = 7443;
  std::string network = "sharednet1";
  std::string public_network = "public";
  // The server's user data for node `node`; called only when the server must be created (so
  // secrets are issued only then). Unset: no user data.
  std::function<StatusOr<std::string>(const std::string& node)> user_data;
};

struct Node {
  std::string name;
  std::optional<Server> server;
  std::optional<Volume> volume;
  std::optional<FloatingIp> floating_ip;
  int agent_port = 0;  // from the server's metadata; 0 when unknown
  // "<floating ip>:<agent port>" once both are known.
  std::string AgentAddress() const;
};

struct NodeOptions {
  std::chrono::seconds volume_timeout{600};
  std::chrono::seconds server_timeout{1200};  // python-chi: 20 min, bare metal takes ~10
  std::chrono::seconds delete_timeout{300};
  std::chrono::seconds poll_interval{5};
  CreateRetry create_retry;
};

// Not thread-safe: one command at a time.
class NodeManager {
 public:
  // `progress` receives one line per step taken ("created boot volume ..."); may be empty.
  NodeManager(Session& session, CloudClock& clock, NodeOptions options = {},
              std::function<void(const std::string&)> progress = {});

  // Brings up the lease's node, or finishes one an earlier call began. FailedPrecondition when
  // the lease is not ACTIVE or the server ended in ERROR (its fault quoted; `Down` clears it).
  StatusOr<Node> Up(const NodeSpec& spec);

  // The nodes whose servers llmctl named, by name.
  StatusOr<std::vector<Node>> List();

  // What exists of node `name` (a lease name). NotFound when nothing does.
  StatusOr<Node> Show(std::string_view name);

  // Removes the server, its boot volume and floating IP, then llmctl's security groups that no
  // port uses any more. OK when there is nothing left to remove.
  Status Down(std::string_view name);

 private:
  void Progress(const std::string& line) const;
  StatusOr<Server> CreateServer(const NodeSpec& spec, const Reservation& reservation,
                                const NodeNames& names, const Network& network,
                                const std::vector<std::string>& security_groups);

  Session& session_;
  CloudClock& clock_;
  const NodeOptions options_;
  std::function<void(const std::string&)> progress_;
  NovaClient nova_;
  CinderClient cinder_;
  NeutronClient neutron_;
};

}  // namespace llmctl::openstack

#endif  // LLMCTL_CONTROLLER_OPENSTACK_NODES_H_
