#include "controller/openstack/nova.h"

#include <openssl/evp.h>

#include <utility>

#include "common/http/http_client.h"
#include "common/spelling.h"
#include "controller/openstack/json_fields.h"

namespace llmctl::openstack {
namespace {

using nlohmann::json;

constexpr char kMicroversion[] = "compute 2.61";

StatusOr<Flavor> ParseFlavor(const json& value) {
  Flavor flavor;
  ASSIGN_OR_RETURN(flavor.id, IdField(value, "id", "Nova flavor"));
  if (!value.contains("name") || !value["name"].is_string()) {
    return InternalError("Nova flavor " + flavor.id + " without a name");
  }
  flavor.name = value["name"].get<std::string>();
  flavor.vcpus = IntField(value, "vcpus");
  flavor.ram_mb = IntField(value, "ram");
  flavor.disk_gb = IntField(value, "disk");
  if (value.contains("extra_specs") && value["extra_specs"].is_object()) {
    for (const auto& [key, spec] : value["extra_specs"].items()) {
      if (spec.is_string()) flavor.extra_specs[key] = spec.get<std::string>();
    }
  }
  return flavor;
}

// The path and query of a "next" link, relative to the compute endpoint (which ends in /v2.1
// or /v2.1/<project>): what follows "/flavors".
std::string RelativeNext(const std::string& href) {
  size_t at = href.find("/flavors");
  return at == std::string::npos ? "" : href.substr(at);
}

constexpr size_t kMaxEncodedUserData = 65535;  // Nova's limit on the base64 text

http::Headers MicroversionHeader() {
  http::Headers headers;
  headers.Add("OpenStack-API-Version", kMicroversion);
  return headers;
}

}  // namespace

NovaClient::NovaClient(Session& session, CloudClock& clock, NovaOptions options)
    : session_(session), clock_(clock), options_(options) {}

StatusOr<std::vector<Flavor>> NovaClient::ListFlavors() {
  http::Headers headers;
  headers.Add("OpenStack-API-Version", kMicroversion);
  std::vector<Flavor> flavors;
  std::string path = "/flavors/detail";
  for (int page = 0; !path.empty(); ++page) {
    if (page == kMaxListPages) {
      return InternalError("Nova's flavor list did not end after " + std::to_string(kMaxListPages) +
                           " pages");
    }
    ASSIGN_OR_RETURN(json body, session_.CallJson("compute", "GET", path, nullptr, headers));
    if (!body.is_object() || !body.contains("flavors") || !body["flavors"].is_array()) {
      return InternalError("Nova's flavor list has no 'flavors' array");
    }
    for (const json& value : body["flavors"]) {
      ASSIGN_OR_RETURN(Flavor flavor, ParseFlavor(value));
      flavors.push_back(std::move(flavor));
    }
    path.clear();
    if (body.contains("flavors_links") && body["flavors_links"].is_array()) {
      for (const json& link : body["flavors_links"]) {
        if (StringField(link, "rel") == "next" && StringField(link, "href") != "") {
          path = RelativeNext(link["href"].get<std::string>());
        }
      }
    }
  }
  return flavors;
}

StatusOr<Flavor> NovaClient::FindFlavor(std::string_view name_or_id) {
  ASSIGN_OR_RETURN(std::vector<Flavor> flavors, ListFlavors());
  std::vector<std::string_view> names;
  for (const Flavor& flavor : flavors) {
    if (flavor.name == name_or_id || flavor.id == name_or_id) return flavor;
    if (!flavor.name.starts_with("reservation:")) names.push_back(flavor.name);
  }
  std::string message = "no flavor '" + std::string(name_or_id) + "' at this site";
  std::string_view close = ClosestMatch(name_or_id, names);
  if (!close.empty()) message += " (did you mean '" + std::string(close) + "'?)";
  std::string list;
  for (auto name : names) list += (list.empty() ? "" : ", ") + std::string(name);
  return NotFoundError(message + "; flavors: " + (list.empty() ? "none" : list));
}

StatusOr<Flavor> NovaClient::ReservationFlavor(std::string_view reservation_id) {
  ASSIGN_OR_RETURN(std::vector<Flavor> flavors, ListFlavors());
  for (const Flavor& flavor : flavors) {
    auto spec = flavor.extra_specs.find("aggregate_instance_extra_specs:reservation");
    if (spec != flavor.extra_specs.end() && spec->second == reservation_id) return flavor;
  }
  return NotFoundError("no flavor for reservation " + std::string(reservation_id) +
                       " yet (Blazar creates it when the lease becomes ACTIVE)");
}

std::string Base64Encode(std::string_view data) {
  std::string out(4 * ((data.size() + 2) / 3), '\0');
  int written = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(data.data()),
                                static_cast<int>(data.size()));
  out.resize(static_cast<size_t>(written));
  return out;
}

json ServerRequestBody(const ServerSpec& spec) {
  json server = {{"name", spec.name},
                 {"flavorRef", spec.flavor_id},
                 {"networks", json::array({{{"uuid", spec.network_id}}})}};
  if (!spec.boot_volume_id.empty()) {
    // The volume is ours (made and deleted by name), so Nova must not delete it with the server.
    server["block_device_mapping_v2"] = json::array({{{"boot_index", 0},
                                                      {"uuid", spec.boot_volume_id},
                                                      {"source_type", "volume"},
                                                      {"destination_type", "volume"},
                                                      {"delete_on_termination", false}}});
  } else {
    server["imageRef"] = spec.image_id;
  }
  if (!spec.key_name.empty()) server["key_name"] = spec.key_name;
  if (!spec.security_groups.empty()) {
    server["security_groups"] = json::array();
    for (const std::string& group : spec.security_groups) {
      server["security_groups"].push_back({{"name", group}});
    }
  }
  if (!spec.metadata.empty()) server["metadata"] = spec.metadata;
  if (!spec.user_data.empty()) server["user_data"] = Base64Encode(spec.user_data);
  json body = {{"server", server}};
  if (!spec.reservation_hint.empty()) {
    body["OS-SCH-HNT:scheduler_hints"] = {{"reservation", spec.reservation_hint}};
  }
  return body;
}

StatusOr<Server> ParseServer(const json& value) {
  Server server;
  ASSIGN_OR_RETURN(server.id, IdField(value, "id", "Nova server"));
  auto text = [](const json& object, const char* key) {
    return object.is_object() && object.contains(key) && object[key].is_string()
               ? object[key].get<std::string>()
               : std::string();
  };
  server.name = text(value, "name");
  server.status = text(value, "status");
  server.task_state = text(value, "OS-EXT-STS:task_state");
  if (value.contains("fault")) server.fault = text(value["fault"], "message");
  if (value.contains("flavor")) server.flavor_id = text(value["flavor"], "id");
  if (value.contains("metadata") && value["metadata"].is_object()) {
    for (const auto& [key, item] : value["metadata"].items()) {
      if (item.is_string()) server.metadata[key] = item.get<std::string>();
    }
  }
  if (value.contains("addresses") && value["addresses"].is_object()) {
    for (const auto& [network, entries] : value["addresses"].items()) {
      if (!entries.is_array()) continue;
      for (const json& entry : entries) {
        std::string address = text(entry, "addr");
        if (address.empty()) continue;
        (text(entry, "OS-EXT-IPS:type") == "floating" ? server.floating_addresses
                                                      : server.fixed_addresses)
            .push_back(address);
      }
    }
  }
  return server;
}

Status NovaClient::CheckKeypair(std::string_view name) {
  StatusOr<json> answer = session_.CallJson("compute", "GET", "/os-keypairs/" + std::string(name),
                                            nullptr, MicroversionHeader());
  if (answer.ok()) return Status::Ok();
  if (answer.status().code() == StatusCode::kNotFound) {
    return NotFoundError("no key pair '" + std::string(name) +
                         "' in this project at this site (openstack keypair list shows them)");
  }
  return answer.status();
}

StatusOr<std::vector<Server>> NovaClient::ListServers(std::string_view name_prefix) {
  std::string path = "/servers/detail";
  // Nova's name filter is a regular expression; llmctl's names hold only [A-Za-z0-9._-], and the
  // dots are escaped so they match themselves.
  if (!name_prefix.empty()) {
    std::string pattern = "^";
    for (char c : name_prefix) pattern += c == '.' ? std::string("\\.") : std::string(1, c);
    path.append("?").append(http::FormEncode({{"name", pattern}}));
  }
  ASSIGN_OR_RETURN(json body,
                   session_.CallJson("compute", "GET", path, nullptr, MicroversionHeader()));
  if (!body.is_object() || !body.contains("servers") || !body["servers"].is_array()) {
    return InternalError("Nova's server list has no 'servers' array");
  }
  std::vector<Server> servers;
  for (const json& value : body["servers"]) {
    ASSIGN_OR_RETURN(Server server, ParseServer(value));
    if (server.name.starts_with(name_prefix)) servers.push_back(std::move(server));
  }
  return servers;
}

StatusOr<std::optional<Server>> NovaClient::FindServer(std::string_view name) {
  ASSIGN_OR_RETURN(std::vector<Server> servers, ListServers(name));
  std::optional<Server> found;
  for (Server& server : servers) {
    if (server.name != name) continue;
    if (found.has_value()) {
      return FailedPreconditionError("two servers are named '" + std::string(name) + "' (" +
                                     found->id + ", " + server.id + "); delete one");
    }
    found = std::move(server);
  }
  return found;
}

StatusOr<Server> NovaClient::FindOrCreateServer(const ServerSpec& spec) {
  json body = ServerRequestBody(spec);
  if (body["server"].contains("user_data") &&
      body["server"]["user_data"].get<std::string>().size() > kMaxEncodedUserData) {
    return InvalidArgumentError(
        "the user data is " +
        std::to_string(body["server"]["user_data"].get<std::string>().size()) +
        " bytes once base64-encoded; Nova takes at most 65535");
  }
  return FindOrCreate<Server>(
      clock_, options_.create_retry, [&] { return FindServer(spec.name); },
      [&]() -> StatusOr<Server> {
        ASSIGN_OR_RETURN(json answer, session_.CallJson("compute", "POST", "/servers", &body,
                                                        MicroversionHeader()));
        if (!answer.is_object() || !answer.contains("server")) {
          return InternalError("Nova's create answer has no 'server'");
        }
        ASSIGN_OR_RETURN(Server created, ParseServer(answer["server"]));
        // The create answer is partial (no name, no status): read the server back.
        return GetServer(created.id);
      });
}

StatusOr<Server> NovaClient::GetServer(std::string_view id) {
  ASSIGN_OR_RETURN(json body, session_.CallJson("compute", "GET", "/servers/" + std::string(id),
                                                nullptr, MicroversionHeader()));
  if (!body.is_object() || !body.contains("server")) {
    return InternalError("Nova's server answer has no 'server'");
  }
  return ParseServer(body["server"]);
}

StatusOr<Server> NovaClient::WaitUntilActive(std::string_view id, std::chrono::seconds timeout) {
  const std::string what = "server " + std::string(id);
  return PollUntil<Server>(
      clock_, options_.poll_interval, timeout, what + " is still not ACTIVE",
      [&]() -> StatusOr<std::optional<Server>> {
        ASSIGN_OR_RETURN(Server server, GetServer(id));
        if (server.status == "ACTIVE") return server;
        if (server.status == "ERROR") {
          return FailedPreconditionError(
              what + " (" + server.name + ") failed to build: " +
              (server.fault.empty() ? "Nova gives no reason" : server.fault) +
              "; llmctl node down removes it");
        }
        if (server.status != "BUILD") {
          return FailedPreconditionError(what + " is " + server.status + ", not building");
        }
        return std::nullopt;
      });
}

Status NovaClient::DeleteServer(std::string_view id, std::chrono::seconds timeout) {
  const std::string path = "/servers/" + std::string(id);
  StatusOr<json> answer =
      session_.CallJson("compute", "DELETE", path, nullptr, MicroversionHeader());
  if (!answer.ok()) {
    return answer.status().code() == StatusCode::kNotFound ? Status::Ok() : answer.status();
  }
  StatusOr<bool> gone = PollUntil<bool>(
      clock_, options_.poll_interval, timeout, "server " + std::string(id) + " is still deleting",
      [&]() -> StatusOr<std::optional<bool>> {
        StatusOr<Server> server = GetServer(id);
        if (!server.ok() && server.status().code() == StatusCode::kNotFound) return true;
        if (!server.ok()) return server.status();
        return std::nullopt;
      });
  return gone.status();
}

}  // namespace llmctl::openstack
