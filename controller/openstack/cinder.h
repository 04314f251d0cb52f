// Cinder (block-storage v3): a node's boot volume, made from an image, at most once.
#ifndef LLMCTL_CONTROLLER_OPENSTACK_CINDER_H_
#define LLMCTL_CONTROLLER_OPENSTACK_CINDER_H_

#include <chrono>
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

struct Volume {
  std::string id;
  std::string name;
  std::string status;                    // creating, available, in-use, deleting, error, ...
  int size_gb = 0;                       // 0 when Cinder's answer has none within an int
  std::vector<std::string> attached_to;  // server ids
};

struct CinderOptions {
  CreateRetry create_retry;
  std::chrono::seconds poll_interval{5};
};

// Not thread-safe beyond what Session is: one caller at a time per client.
class CinderClient {
 public:
  CinderClient(Session& session, CloudClock& clock, CinderOptions options = {});

  // The volume named `name`; nullopt when none. FailedPrecondition when several share it.
  StatusOr<std::optional<Volume>> FindByName(std::string_view name);

  // The volume named `name`, created from `image_id` with `size_gb` GiB when there is none yet.
  // A create that timed out is looked up by name before it is sent again.
  StatusOr<Volume> FindOrCreateFromImage(const std::string& name, const std::string& image_id,
                                         int size_gb);

  // NotFound when it does not exist.
  StatusOr<Volume> Get(std::string_view id);

  // Polls until the volume is available (or in-use). FailedPrecondition when it goes to an error
  // state; DeadlineExceeded after `timeout`.
  StatusOr<Volume> WaitUntilAvailable(std::string_view id, std::chrono::seconds timeout);

  // Deletes the volume; OK when it is already gone.
  Status Delete(std::string_view id);

 private:
  Session& session_;
  CloudClock& clock_;
  const CinderOptions options_;
};

// {"volume": ...}'s value or an element of "volumes". InternalError when its id is not one
// (IdField) or it has no status.
StatusOr<Volume> ParseVolume(const nlohmann::json& value);

}  // namespace llmctl::openstack

#endif  // LLMCTL_CONTROLLER_OPENSTACK_CINDER_H_
