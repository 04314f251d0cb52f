#include "controller/openstack/nova.h"

#include "common/spelling.h"

namespace llmctl::openstack {
namespace {

using nlohmann::json;

constexpr char kMicroversion[] = "compute 2.61";

StatusOr<Flavor> ParseFlavor(const json& value) {
  if (!value.is_object() || !value.contains("id") || !value["id"].is_string() ||
      !value.contains("name") || !value["name"].is_string()) {
    return InternalError("Nova flavor without an id or name: " + value.dump().substr(0, 200));
  }
  Flavor flavor;
  flavor.id = value["id"].get<std::string>();
  flavor.name = value["name"].get<std::string>();
  auto number = [&](const char* key) {
    return value.contains(key) && value[key].is_number_integer() ? value[key].get<int>() : 0;
  };
  flavor.vcpus = number("vcpus");
  flavor.ram_mb = number("ram");
  flavor.disk_gb = number("disk");
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

}  // namespace

StatusOr<std::vector<Flavor>> NovaClient::ListFlavors() {
  http::Headers headers;
  headers.Add("OpenStack-API-Version", kMicroversion);
  std::vector<Flavor> flavors;
  std::string path = "/flavors/detail";
  while (!path.empty()) {
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
        if (link.value("rel", "") == "next" && link.contains("href") && link["href"].is_string()) {
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

}  // namespace llmctl::openstack
