// Glance (image v2): the image a node boots, found by name.
#ifndef LLMCTL_CONTROLLER_OPENSTACK_GLANCE_H_
#define LLMCTL_CONTROLLER_OPENSTACK_GLANCE_H_

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/status.h"
#include "controller/openstack/session.h"

namespace llmctl::openstack {

struct Image {
  std::string id;
  std::string name;
  std::string status;  // queued, saving, active, killed, deleted, ...
};

class GlanceClient {
 public:
  explicit GlanceClient(Session& session) : session_(session) {}

  // The one image named `name` (GET /v2/images?name=, every page via "next"). NotFound when there
  // is none, FailedPrecondition naming the ids when several share the name or when it is not
  // active.
  StatusOr<Image> FindImage(std::string_view name);

 private:
  Session& session_;
};

// One element of "images". InternalError when its id is not one (IdField) or it has no name.
StatusOr<Image> ParseImage(const nlohmann::json& value);

}  // namespace llmctl::openstack

#endif  // LLMCTL_CONTROLLER_OPENSTACK_GLANCE_H_
