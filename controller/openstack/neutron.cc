#include "controller/openstack/neutron.h"

#include "common/http/http_client.h"
#include "controller/openstack/json_fields.h"

namespace llmctl::openstack {

using nlohmann::json;

namespace {

Status MissingMember(std::string_view key, std::string_view kind) {
  std::string message = "Neutron's answer has no '";
  message.append(key).append("' ").append(kind);
  return InternalError(std::move(message));
}

// The array `key` of a list answer. InternalError naming what when it is missing.
StatusOr<json> ListOf(const json& body, const char* key) {
  if (!body.is_object() || !body.contains(key) || !body[key].is_array()) {
    return MissingMember(key, "array");
  }
  return body[key];
}

StatusOr<json> ObjectOf(const json& body, const char* key) {
  if (!body.is_object() || !body.contains(key) || !body[key].is_object()) {
    return MissingMember(key, "object");
  }
  return body[key];
}

// Each member of the array `key` of a list answer, read by `parse`; the first error it meets.
template <typename T>
StatusOr<std::vector<T>> ParseEach(const json& body, const char* key,
                                   StatusOr<T> (*parse)(const json&)) {
  ASSIGN_OR_RETURN(json values, ListOf(body, key));
  std::vector<T> result;
  for (const json& value : values) {
    ASSIGN_OR_RETURN(T item, parse(value));
    result.push_back(std::move(item));
  }
  return result;
}

bool IgnoreNotFound(const Status& status) {
  return status.ok() || status.code() == StatusCode::kNotFound;
}

}  // namespace

StatusOr<SecurityGroup> ParseSecurityGroup(const json& value) {
  SecurityGroup group;
  ASSIGN_OR_RETURN(group.id, IdField(value, "id", "Neutron security group"));
  group.name = StringField(value, "name");
  group.description = StringField(value, "description");
  if (value.contains("security_group_rules") && value["security_group_rules"].is_array()) {
    for (const json& rule : value["security_group_rules"]) {
      if (StringField(rule, "direction") != "ingress" || StringField(rule, "protocol") != "tcp")
        continue;
      if (!rule.contains("port_range_min") || !rule["port_range_min"].is_number_integer() ||
          rule["port_range_min"] != rule.value("port_range_max", json()) ||
          rule["port_range_min"].get<int64_t>() < 1 ||
          rule["port_range_min"].get<int64_t>() > 65535) {
        continue;
      }
      group.ingress_tcp_ports.push_back(rule["port_range_min"].get<int>());
    }
  }
  return group;
}

StatusOr<Port> ParsePort(const json& value) {
  Port port;
  ASSIGN_OR_RETURN(port.id, IdField(value, "id", "Neutron port"));
  port.device_id = StringField(value, "device_id");
  if (value.contains("security_groups") && value["security_groups"].is_array()) {
    for (const json& id : value["security_groups"]) {
      if (id.is_string()) port.security_group_ids.push_back(id.get<std::string>());
    }
  }
  return port;
}

StatusOr<FloatingIp> ParseFloatingIp(const json& value) {
  ASSIGN_OR_RETURN(std::string id, IdField(value, "id", "Neutron floating IP"));
  if (StringField(value, "floating_ip_address").empty()) {
    return InternalError("Neutron floating IP " + id + " without an address");
  }
  return FloatingIp{std::move(id), StringField(value, "floating_ip_address"),
                    StringField(value, "port_id"), StringField(value, "description")};
}

NeutronClient::NeutronClient(Session& session, CloudClock& clock, CreateRetry create_retry)
    : session_(session), clock_(clock), create_retry_(create_retry) {}

StatusOr<Network> NeutronClient::FindNetwork(std::string_view name) {
  ASSIGN_OR_RETURN(
      json body,
      session_.CallJson("network", "GET",
                        "/v2.0/networks?" + http::FormEncode({{"name", std::string(name)}})));
  ASSIGN_OR_RETURN(json networks, ListOf(body, "networks"));
  std::vector<Network> found;
  for (const json& value : networks) {
    if (StringField(value, "name") == name) {
      ASSIGN_OR_RETURN(std::string id, IdField(value, "id", "Neutron network"));
      found.push_back({std::move(id), StringField(value, "name")});
    }
  }
  if (found.empty()) return NotFoundError("no network named '" + std::string(name) + "'");
  if (found.size() > 1) {
    return FailedPreconditionError(std::to_string(found.size()) + " networks are named '" +
                                   std::string(name) + "'");
  }
  return found.front();
}

StatusOr<std::vector<SecurityGroup>> NeutronClient::ListSecurityGroups() {
  ASSIGN_OR_RETURN(json body, session_.CallJson("network", "GET", "/v2.0/security-groups"));
  return ParseEach(body, "security_groups", &ParseSecurityGroup);
}

StatusOr<std::optional<SecurityGroup>> NeutronClient::FindSecurityGroup(std::string_view name) {
  ASSIGN_OR_RETURN(std::vector<SecurityGroup> groups, ListSecurityGroups());
  std::optional<SecurityGroup> found;
  for (SecurityGroup& group : groups) {
    if (group.name != name) continue;
    if (found.has_value()) {
      return FailedPreconditionError("two security groups are named '" + std::string(name) + "' (" +
                                     found->id + ", " + group.id + "); delete one");
    }
    found = std::move(group);
  }
  return found;
}

StatusOr<SecurityGroup> NeutronClient::EnsureSecurityGroup(const std::string& name,
                                                           const std::string& description,
                                                           int port) {
  ASSIGN_OR_RETURN(
      SecurityGroup group,
      FindOrCreate<SecurityGroup>(
          clock_, create_retry_, [&] { return FindSecurityGroup(name); },
          [&]() -> StatusOr<SecurityGroup> {
            json body = {{"security_group", {{"name", name}, {"description", description}}}};
            ASSIGN_OR_RETURN(json answer,
                             session_.CallJson("network", "POST", "/v2.0/security-groups", &body));
            ASSIGN_OR_RETURN(json value, ObjectOf(answer, "security_group"));
            return ParseSecurityGroup(value);
          }));
  for (int open : group.ingress_tcp_ports) {
    if (open == port) return group;
  }
  // Sending the rule twice is harmless: Neutron refuses a duplicate with 409, which means done.
  json rule = {{"security_group_rule",
                {{"direction", "ingress"},
                 {"ethertype", "IPv4"},
                 {"protocol", "tcp"},
                 {"port_range_min", port},
                 {"port_range_max", port},
                 {"security_group_id", group.id}}}};
  StatusOr<json> added = session_.CallJson("network", "POST", "/v2.0/security-group-rules", &rule);
  if (!added.ok() && added.status().code() != StatusCode::kAborted) {
    return added.status().WithContext("opening TCP port " + std::to_string(port) + " in " + name);
  }
  group.ingress_tcp_ports.push_back(port);
  return group;
}

Status NeutronClient::DeleteSecurityGroup(std::string_view id) {
  Status status =
      session_.CallJson("network", "DELETE", "/v2.0/security-groups/" + std::string(id)).status();
  return IgnoreNotFound(status) ? Status::Ok() : status;
}

StatusOr<std::vector<Port>> NeutronClient::ListPorts(std::string_view device_id) {
  std::string path = "/v2.0/ports";
  if (!device_id.empty()) {
    path.append("?").append(http::FormEncode({{"device_id", std::string(device_id)}}));
  }
  ASSIGN_OR_RETURN(json body, session_.CallJson("network", "GET", path));
  ASSIGN_OR_RETURN(std::vector<Port> ports, ParseEach(body, "ports", &ParsePort));
  if (!device_id.empty()) {
    std::erase_if(ports, [&](const Port& port) { return port.device_id != device_id; });
  }
  return ports;
}

StatusOr<std::vector<FloatingIp>> NeutronClient::ListFloatingIps() {
  ASSIGN_OR_RETURN(json body, session_.CallJson("network", "GET", "/v2.0/floatingips"));
  return ParseEach(body, "floatingips", &ParseFloatingIp);
}

StatusOr<std::optional<FloatingIp>> NeutronClient::FindFloatingIp(std::string_view description) {
  ASSIGN_OR_RETURN(std::vector<FloatingIp> addresses, ListFloatingIps());
  for (FloatingIp& address : addresses) {
    if (address.description == description) return std::optional<FloatingIp>(std::move(address));
  }
  return std::optional<FloatingIp>();
}

StatusOr<FloatingIp> NeutronClient::UpdateFloatingIp(const std::string& id, const json& fields) {
  json body = {{"floatingip", fields}};
  ASSIGN_OR_RETURN(json answer,
                   session_.CallJson("network", "PUT", "/v2.0/floatingips/" + id, &body));
  ASSIGN_OR_RETURN(json value, ObjectOf(answer, "floatingip"));
  return ParseFloatingIp(value);
}

StatusOr<FloatingIp> NeutronClient::EnsureFloatingIp(const std::string& description,
                                                     const std::string& public_network_id,
                                                     const std::string& port_id) {
  auto find = [&]() -> StatusOr<std::optional<FloatingIp>> {
    ASSIGN_OR_RETURN(std::optional<FloatingIp> ours, FindFloatingIp(description));
    if (ours.has_value()) return ours;
    // Reuse a free, unlabelled address; labelling it (PUT is idempotent) makes it ours.
    ASSIGN_OR_RETURN(std::vector<FloatingIp> addresses, ListFloatingIps());
    for (const FloatingIp& address : addresses) {
      if (address.port_id.empty() && address.description.empty()) {
        ASSIGN_OR_RETURN(FloatingIp labelled,
                         UpdateFloatingIp(address.id, {{"description", description}}));
        return std::optional<FloatingIp>(std::move(labelled));
      }
    }
    return std::optional<FloatingIp>();
  };
  ASSIGN_OR_RETURN(
      FloatingIp address,
      FindOrCreate<FloatingIp>(clock_, create_retry_, find, [&]() -> StatusOr<FloatingIp> {
        json body = {{"floatingip",
                      {{"floating_network_id", public_network_id}, {"description", description}}}};
        ASSIGN_OR_RETURN(json answer,
                         session_.CallJson("network", "POST", "/v2.0/floatingips", &body));
        ASSIGN_OR_RETURN(json value, ObjectOf(answer, "floatingip"));
        return ParseFloatingIp(value);
      }));
  if (address.port_id == port_id) return address;
  return UpdateFloatingIp(address.id, {{"port_id", port_id}});
}

Status NeutronClient::DeleteFloatingIp(std::string_view id) {
  Status status =
      session_.CallJson("network", "DELETE", "/v2.0/floatingips/" + std::string(id)).status();
  return IgnoreNotFound(status) ? Status::Ok() : status;
}

}  // namespace llmctl::openstack
