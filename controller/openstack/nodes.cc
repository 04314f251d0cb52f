#include "controller/openstack/nodes.h"

#include <algorithm>
#include <charconv>
#include <set>

#include "controller/openstack/glance.h"

namespace llmctl::openstack {
namespace {

constexpr char kServerPrefix[] = "llmctl-";
constexpr char kServerSuffix[] = "-server";
constexpr char kBareMetalFlavor[] = "baremetal";  // python-chi's default at bare-metal sites

bool BusyVolumeStatus(const std::string& status) {
  return status == "in-use" || status == "attaching" || status == "detaching" ||
         status == "creating" || status == "deleting" || status == "reserved";
}

}  // namespace

NodeNames NamesForNode(std::string_view lease_name) {
  std::string lease(lease_name);
  return {lease, kServerPrefix + lease + kServerSuffix, kServerPrefix + lease + "-boot",
          kServerPrefix + lease + "-ip"};
}

std::optional<std::string> NodeOfServer(std::string_view server_name) {
  const std::string_view prefix = kServerPrefix;
  const std::string_view suffix = kServerSuffix;
  // Longer than both, so that they do not overlap and the lease's name is not empty.
  if (server_name.size() <= prefix.size() + suffix.size() || !server_name.starts_with(prefix) ||
      !server_name.ends_with(suffix)) {
    return std::nullopt;
  }
  server_name.remove_prefix(prefix.size());
  server_name.remove_suffix(suffix.size());
  return std::string(server_name);
}

int AgentPortOf(const Server& server) {
  auto found = server.metadata.find(kAgentPortMetadata);
  if (found == server.metadata.end()) return 0;
  const std::string& text = found->second;
  int port = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), port);
  // atoi read "99999999999" as whatever strtol's LONG_MAX became and "70000" or "-5" as such: an
  // address no agent listens on.
  if (error != std::errc() || end != text.data() + text.size() || port < 1 || port > 65535) {
    return 0;
  }
  return port;
}

std::string Node::AgentAddress() const {
  if (!floating_ip.has_value() || agent_port == 0) return "";
  return floating_ip->address + ":" + std::to_string(agent_port);
}

NodeManager::NodeManager(Session& session, CloudClock& clock, NodeOptions options,
                         std::function<void(const std::string&)> progress)
    : session_(session),
      clock_(clock),
      options_(options),
      progress_(std::move(progress)),
      nova_(session, clock, NovaOptions{options.create_retry, options.poll_interval}),
      cinder_(session, clock, CinderOptions{options.create_retry, options.poll_interval}),
      neutron_(session, clock, options.create_retry) {}

void NodeManager::Progress(const std::string& line) const {
  if (progress_) progress_(line);
}

StatusOr<Server> NodeManager::CreateServer(const NodeSpec& spec, const Reservation& reservation,
                                           const NodeNames& names, const Network& network,
                                           const std::vector<std::string>& security_groups) {
  GlanceClient glance(session_);
  ASSIGN_OR_RETURN(Image image, glance.FindImage(spec.image));
  ServerSpec server;
  server.name = names.server;
  server.network_id = network.id;
  server.key_name = spec.key_name;
  server.security_groups = security_groups;
  server.metadata[kAgentPortMetadata] = std::to_string(spec.agent_port);
  if (reservation.resource_type == "flavor:instance") {
    // KVM: the private flavor Blazar made for the reservation, booted from our own volume.
    ASSIGN_OR_RETURN(Flavor flavor, nova_.ReservationFlavor(reservation.id));
    server.flavor_id = flavor.id;
    ASSIGN_OR_RETURN(Volume volume,
                     cinder_.FindOrCreateFromImage(names.volume, image.id, spec.boot_volume_gb));
    Progress("boot volume " + names.volume + " (" + volume.id + "): " + volume.status);
    ASSIGN_OR_RETURN(volume, cinder_.WaitUntilAvailable(volume.id, options_.volume_timeout));
    server.boot_volume_id = volume.id;
  } else {
    // Bare metal: the image straight onto a reserved host, chosen by the scheduler hint.
    ASSIGN_OR_RETURN(Flavor flavor, nova_.FindFlavor(kBareMetalFlavor));
    server.flavor_id = flavor.id;
    server.image_id = image.id;
    server.reservation_hint = reservation.id;
  }
  if (spec.user_data) {
    ASSIGN_OR_RETURN(server.user_data, spec.user_data(names.node));
  }
  ASSIGN_OR_RETURN(Server created, nova_.FindOrCreateServer(server));
  Progress("server " + names.server + " (" + created.id + "): " + created.status);
  return created;
}

StatusOr<Node> NodeManager::Up(const NodeSpec& spec) {
  if (spec.boot_volume_gb < 1) return InvalidArgumentError("the boot volume needs at least 1 GiB");
  if (spec.agent_port < 1 || spec.agent_port > 65535) {
    return InvalidArgumentError("agent port " + std::to_string(spec.agent_port) +
                                " is not in 1-65535");
  }
  BlazarClient blazar(session_, clock_);
  ASSIGN_OR_RETURN(Lease lease, blazar.Get(spec.lease));
  if (lease.status != "ACTIVE") {
    return FailedPreconditionError("lease " + lease.name + " is " + lease.status +
                                   "; a node needs an ACTIVE lease (llmctl lease show " +
                                   lease.name + ")");
  }
  // A lease may also hold floating IPs or (on Chameleon) a network: the server boots on its hosts
  // or flavor.
  auto reservation =
      std::find_if(lease.reservations.begin(), lease.reservations.end(), ReservesServers);
  if (reservation == lease.reservations.end()) {
    std::string holds;
    for (const Reservation& other : lease.reservations) {
      holds += (holds.empty() ? "" : ", ") + DescribeReservation(other);
    }
    return FailedPreconditionError("lease " + lease.name +
                                   " reserves no hosts or flavor to boot a node on" +
                                   (holds.empty() ? "" : " (it holds " + holds + ")"));
  }
  const NodeNames names = NamesForNode(lease.name);
  if (!spec.key_name.empty()) RETURN_IF_ERROR(nova_.CheckKeypair(spec.key_name));

  ASSIGN_OR_RETURN(Network network, neutron_.FindNetwork(spec.network));
  // KVM@TACC lets nothing in, SSH included, unless a security group allows it.
  ASSIGN_OR_RETURN(SecurityGroup ssh,
                   neutron_.EnsureSecurityGroup(
                       "allow-ssh", std::string(kSecurityGroupMark) + " SSH (TCP 22)", 22));
  const std::string agent_group = "allow-llmctl-agent-" + std::to_string(spec.agent_port);
  ASSIGN_OR_RETURN(SecurityGroup agent, neutron_.EnsureSecurityGroup(
                                            agent_group,
                                            std::string(kSecurityGroupMark) + " llm-agent (TCP " +
                                                std::to_string(spec.agent_port) + ")",
                                            spec.agent_port));

  ASSIGN_OR_RETURN(std::optional<Server> existing, nova_.FindServer(names.server));
  Server server;
  if (existing.has_value()) {
    server = *std::move(existing);
    Progress("server " + names.server + " (" + server.id + ") exists: " + server.status);
  } else {
    ASSIGN_OR_RETURN(server,
                     CreateServer(spec, *reservation, names, network, {ssh.name, agent.name}));
  }
  ASSIGN_OR_RETURN(server, nova_.WaitUntilActive(server.id, options_.server_timeout));

  ASSIGN_OR_RETURN(std::vector<Port> ports, neutron_.ListPorts(server.id));
  if (ports.empty()) {
    return InternalError("server " + server.id + " is ACTIVE but Neutron lists no port for it");
  }
  ASSIGN_OR_RETURN(Network public_network, neutron_.FindNetwork(spec.public_network));
  ASSIGN_OR_RETURN(FloatingIp address, neutron_.EnsureFloatingIp(
                                           names.floating_ip, public_network.id, ports.front().id));
  Progress("floating IP " + address.address + " on server " + names.server);
  return Show(names.node);
}

StatusOr<Node> NodeManager::Show(std::string_view name) {
  const NodeNames names = NamesForNode(name);
  Node node;
  node.name = names.node;
  ASSIGN_OR_RETURN(node.server, nova_.FindServer(names.server));
  ASSIGN_OR_RETURN(node.volume, cinder_.FindByName(names.volume));
  ASSIGN_OR_RETURN(node.floating_ip, neutron_.FindFloatingIp(names.floating_ip));
  if (node.server.has_value()) node.agent_port = AgentPortOf(*node.server);
  if (!node.server && !node.volume && !node.floating_ip) {
    return NotFoundError("no node '" + names.node + "' (no server " + names.server + ", volume " +
                         names.volume + " or floating IP)");
  }
  return node;
}

StatusOr<std::vector<Node>> NodeManager::List() {
  ASSIGN_OR_RETURN(std::vector<Server> servers, nova_.ListServers(kServerPrefix));
  std::vector<Node> nodes;
  for (const Server& server : servers) {
    // A name Nova's prefix filter let through may still not be a node's ("llmctl-server" is
    // shorter than prefix and suffix together, and cutting both off it overran the name).
    std::optional<std::string> name = NodeOfServer(server.name);
    if (!name.has_value()) continue;
    ASSIGN_OR_RETURN(Node node, Show(*name));
    nodes.push_back(std::move(node));
  }
  std::sort(nodes.begin(), nodes.end(),
            [](const Node& a, const Node& b) { return a.name < b.name; });
  return nodes;
}

Status NodeManager::Down(std::string_view name) {
  const NodeNames names = NamesForNode(name);
  ASSIGN_OR_RETURN(std::optional<Server> server, nova_.FindServer(names.server));
  if (server.has_value()) {
    RETURN_IF_ERROR(nova_.DeleteServer(server->id, options_.delete_timeout));
    Progress("deleted server " + names.server + " (" + server->id + ")");
  }
  ASSIGN_OR_RETURN(std::optional<FloatingIp> address, neutron_.FindFloatingIp(names.floating_ip));
  if (address.has_value()) {
    RETURN_IF_ERROR(neutron_.DeleteFloatingIp(address->id));
    Progress("released floating IP " + address->address);
  }
  ASSIGN_OR_RETURN(std::optional<Volume> volume, cinder_.FindByName(names.volume));
  if (volume.has_value()) {
    // Cinder detaches a deleted server's volume on its own time.
    StatusOr<bool> settled = PollUntil<bool>(
        clock_, options_.poll_interval, options_.delete_timeout,
        "volume " + volume->id + " is still attached", [&]() -> StatusOr<std::optional<bool>> {
          StatusOr<Volume> now = cinder_.Get(volume->id);
          if (!now.ok() && now.status().code() == StatusCode::kNotFound) return true;
          if (!now.ok()) return now.status();
          if (BusyVolumeStatus(now->status)) return std::nullopt;
          return true;
        });
    RETURN_IF_ERROR(settled.status());
    RETURN_IF_ERROR(cinder_.Delete(volume->id));
    Progress("deleted boot volume " + names.volume + " (" + volume->id + ")");
  }
  ASSIGN_OR_RETURN(std::vector<SecurityGroup> groups, neutron_.ListSecurityGroups());
  ASSIGN_OR_RETURN(std::vector<Port> ports, neutron_.ListPorts());
  std::set<std::string> used;
  for (const Port& port : ports)
    used.insert(port.security_group_ids.begin(), port.security_group_ids.end());
  for (const SecurityGroup& group : groups) {
    if (!group.description.starts_with(kSecurityGroupMark) || used.contains(group.id)) continue;
    Status deleted = neutron_.DeleteSecurityGroup(group.id);
    // Aborted: a server took the group between the listing and now; it stays, as it should.
    if (!deleted.ok() && deleted.code() != StatusCode::kAborted) return deleted;
    if (deleted.ok()) Progress("deleted security group " + group.name);
  }
  return Status::Ok();
}

}  // namespace llmctl::openstack
