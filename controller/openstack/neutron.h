// Neutron (network v2.0): the network a node joins, the security groups that open SSH and the
// agent's port, and the floating IP the controller dials.
#ifndef LLMCTL_CONTROLLER_OPENSTACK_NEUTRON_H_
#define LLMCTL_CONTROLLER_OPENSTACK_NEUTRON_H_

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "controller/openstack/cloud_clock.h"
#include "controller/openstack/polling.h"
#include "controller/openstack/session.h"

namespace llmctl::openstack {

struct Network {
  std::string id;
  std::string name;
};

struct SecurityGroup {
  std::string id;
  std::string name;
  std::string description;
  std::vector<int> ingress_tcp_ports;  // single-port ingress TCP rules
};

struct Port {
  std::string id;
  std::string device_id;  // the server
  std::vector<std::string> security_group_ids;
};

struct FloatingIp {
  std::string id;
  std::string address;
  std::string port_id;  // empty: not associated
  std::string description;
};

// Not thread-safe beyond what Session is: one caller at a time per client.
class NeutronClient {
 public:
  NeutronClient(Session& session, CloudClock& clock, CreateRetry create_retry = {});

  // The one network named `name`. NotFound when none, FailedPrecondition when several.
  StatusOr<Network> FindNetwork(std::string_view name);

  StatusOr<std::vector<SecurityGroup>> ListSecurityGroups();

  // The group named `name` with an ingress rule for TCP `port`: an existing group of that name is
  // reused (and given the rule when it lacks it); otherwise one is made with `description`.
  StatusOr<SecurityGroup> EnsureSecurityGroup(const std::string& name,
                                              const std::string& description, int port);

  // Deletes the group; OK when already gone. Aborted (Neutron's 409) while a port uses it.
  Status DeleteSecurityGroup(std::string_view id);

  // All ports of the project, or those of one server.
  StatusOr<std::vector<Port>> ListPorts(std::string_view device_id = "");

  StatusOr<std::vector<FloatingIp>> ListFloatingIps();

  // A floating IP on `port_id` whose description is `description`: the one already described so
  // (a rerun), else an unassociated one with no description (reused, as python-chi does), else a
  // new one from `public_network_id`. It is (re)associated to the port when it is not yet.
  StatusOr<FloatingIp> EnsureFloatingIp(const std::string& description,
                                        const std::string& public_network_id,
                                        const std::string& port_id);

  // The floating IP whose description is `description`; nullopt when none.
  StatusOr<std::optional<FloatingIp>> FindFloatingIp(std::string_view description);

  // Releases the address; OK when already gone.
  Status DeleteFloatingIp(std::string_view id);

 private:
  StatusOr<std::optional<SecurityGroup>> FindSecurityGroup(std::string_view name);
  StatusOr<FloatingIp> UpdateFloatingIp(const std::string& id, const nlohmann::json& fields);

  Session& session_;
  CloudClock& clock_;
  const CreateRetry create_retry_;
};

// One object of Neutron's answers. InternalError when its id is not one (IdField), or a floating
// IP has no address.
StatusOr<SecurityGroup> ParseSecurityGroup(const nlohmann::json& value);
StatusOr<Port> ParsePort(const nlohmann::json& value);
StatusOr<FloatingIp> ParseFloatingIp(const nlohmann::json& value);

}  // namespace llmctl::openstack

#endif  // LLMCTL_CONTROLLER_OPENSTACK_NEUTRON_H_
