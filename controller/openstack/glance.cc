#include "controller/openstack/glance.h"

#include <vector>

#include "common/http/http_client.h"
#include "controller/openstack/json_fields.h"

namespace llmctl::openstack {

using nlohmann::json;

StatusOr<Image> ParseImage(const json& value) {
  ASSIGN_OR_RETURN(std::string id, IdField(value, "id", "Glance image"));
  if (!value.contains("name") || !value["name"].is_string()) {
    return InternalError("Glance image " + id + " without a name");
  }
  return Image{std::move(id), value["name"].get<std::string>(), StringField(value, "status")};
}

StatusOr<Image> GlanceClient::FindImage(std::string_view name) {
  std::vector<Image> found;
  std::string path = "/v2/images?" + http::FormEncode({{"name", std::string(name)}});
  // Glance's "next" is relative to the endpoint ("/v2/images?marker=...").
  for (int page = 0; !path.empty(); ++page) {
    if (page == kMaxListPages) {
      return InternalError("Glance's image list did not end after " +
                           std::to_string(kMaxListPages) + " pages");
    }
    ASSIGN_OR_RETURN(json body, session_.CallJson("image", "GET", path));
    if (!body.is_object() || !body.contains("images") || !body["images"].is_array()) {
      return InternalError("Glance's image list has no 'images' array");
    }
    for (const json& value : body["images"]) {
      ASSIGN_OR_RETURN(Image image, ParseImage(value));
      if (image.name == name) found.push_back(std::move(image));
    }
    path = body.contains("next") && body["next"].is_string() ? body["next"].get<std::string>() : "";
  }
  if (found.empty()) {
    return NotFoundError("no image named '" + std::string(name) +
                         "' at this site (openstack image list shows the names)");
  }
  if (found.size() > 1) {
    std::string ids;
    for (const Image& image : found) ids += (ids.empty() ? "" : ", ") + image.id;
    return FailedPreconditionError(std::to_string(found.size()) + " images are named '" +
                                   std::string(name) + "' (" + ids + "); pass an unambiguous name");
  }
  if (found.front().status != "active") {
    const std::string& status = found.front().status;
    return FailedPreconditionError(
        "image '" + std::string(name) + "' (" + found.front().id + ") is " +
        (status.empty() ? "of no status Glance names" : status) + ", not active");
  }
  return found.front();
}

}  // namespace llmctl::openstack
