#include "controller/openstack/cinder.h"

#include "common/http/http_client.h"
#include "controller/openstack/json_fields.h"

namespace llmctl::openstack {

using nlohmann::json;

StatusOr<Volume> ParseVolume(const json& value) {
  Volume volume;
  ASSIGN_OR_RETURN(volume.id, IdField(value, "id", "Cinder volume"));
  if (!value.contains("status") || !value["status"].is_string()) {
    return InternalError("Cinder volume " + volume.id + " without a status");
  }
  volume.status = value["status"].get<std::string>();
  if (value.contains("name") && value["name"].is_string()) volume.name = value["name"];
  // IntField: a size past an int reads as 0 (unknown), not as the int it would wrap to
  // (4294967496 GiB would otherwise read as 200).
  volume.size_gb = IntField(value, "size");
  if (value.contains("attachments") && value["attachments"].is_array()) {
    for (const json& attachment : value["attachments"]) {
      if (attachment.is_object() && attachment.contains("server_id") &&
          attachment["server_id"].is_string()) {
        volume.attached_to.push_back(attachment["server_id"].get<std::string>());
      }
    }
  }
  return volume;
}

CinderClient::CinderClient(Session& session, CloudClock& clock, CinderOptions options)
    : session_(session), clock_(clock), options_(options) {}

StatusOr<std::optional<Volume>> CinderClient::FindByName(std::string_view name) {
  std::string path = "/volumes/detail?" + http::FormEncode({{"name", std::string(name)}});
  ASSIGN_OR_RETURN(json body, session_.CallJson("block-storage", "GET", path));
  if (!body.is_object() || !body.contains("volumes") || !body["volumes"].is_array()) {
    return InternalError("Cinder's volume list has no 'volumes' array");
  }
  std::optional<Volume> found;
  for (const json& value : body["volumes"]) {
    ASSIGN_OR_RETURN(Volume volume, ParseVolume(value));
    if (volume.name != name) continue;  // older Cinders ignore the name filter
    if (found.has_value()) {
      return FailedPreconditionError("two volumes are named '" + std::string(name) + "' (" +
                                     found->id + ", " + volume.id + "); delete one");
    }
    found = std::move(volume);
  }
  return found;
}

StatusOr<Volume> CinderClient::FindOrCreateFromImage(const std::string& name,
                                                     const std::string& image_id, int size_gb) {
  return FindOrCreate<Volume>(
      clock_, options_.create_retry, [&] { return FindByName(name); },
      [&]() -> StatusOr<Volume> {
        json body = {{"volume", {{"name", name}, {"size", size_gb}, {"imageRef", image_id}}}};
        ASSIGN_OR_RETURN(json answer,
                         session_.CallJson("block-storage", "POST", "/volumes", &body));
        if (!answer.is_object() || !answer.contains("volume")) {
          return InternalError("Cinder's create answer has no 'volume'");
        }
        return ParseVolume(answer["volume"]);
      });
}

StatusOr<Volume> CinderClient::Get(std::string_view id) {
  ASSIGN_OR_RETURN(json body,
                   session_.CallJson("block-storage", "GET", "/volumes/" + std::string(id)));
  if (!body.is_object() || !body.contains("volume")) {
    return InternalError("Cinder's volume answer has no 'volume'");
  }
  return ParseVolume(body["volume"]);
}

StatusOr<Volume> CinderClient::WaitUntilAvailable(std::string_view id,
                                                  std::chrono::seconds timeout) {
  const std::string what = "volume " + std::string(id);
  return PollUntil<Volume>(
      clock_, options_.poll_interval, timeout, what + " is still not available",
      [&]() -> StatusOr<std::optional<Volume>> {
        ASSIGN_OR_RETURN(Volume volume, Get(id));
        if (volume.status == "available" || volume.status == "in-use") return volume;
        if (volume.status.starts_with("error")) {
          return FailedPreconditionError(what + " (" + volume.name + ") is " + volume.status +
                                         "; delete it (llmctl node down) and try again");
        }
        return std::nullopt;
      });
}

Status CinderClient::Delete(std::string_view id) {
  StatusOr<json> answer =
      session_.CallJson("block-storage", "DELETE", "/volumes/" + std::string(id));
  if (!answer.ok() && answer.status().code() != StatusCode::kNotFound) return answer.status();
  return Status::Ok();
}

}  // namespace llmctl::openstack
