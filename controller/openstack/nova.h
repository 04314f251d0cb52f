// Nova (compute v2.1): the flavors a lease needs (a name resolved to an id, the private flavor
// Blazar makes for a KVM reservation), key pairs, and servers created at most once.
#ifndef LLMCTL_CONTROLLER_OPENSTACK_NOVA_H_
#define LLMCTL_CONTROLLER_OPENSTACK_NOVA_H_

#include <chrono>
#include <map>
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

struct Flavor {
  std::string id;
  std::string name;
  int vcpus = 0;
  int ram_mb = 0;
  int disk_gb = 0;
  std::map<std::string, std::string> extra_specs;
};

struct Server {
  std::string id;
  std::string name;
  std::string status;      // BUILD, ACTIVE, ERROR, ...
  std::string task_state;  // "deleting" while a delete is under way
  std::string fault;       // ERROR servers: Nova's fault message
  std::string flavor_id;
  std::vector<std::string> fixed_addresses;
  std::vector<std::string> floating_addresses;
  std::map<std::string, std::string> metadata;
};

// What to boot. At KVM sites: boot_volume_id (a volume made from the image) and the reservation's
// private flavor; at bare-metal sites: image_id, the "baremetal" flavor and reservation_hint.
struct ServerSpec {
  std::string name;
  std::string flavor_id;
  std::string image_id;
  std::string boot_volume_id;
  std::string network_id;
  std::string key_name;                      // empty: no key pair
  std::vector<std::string> security_groups;  // names
  std::string user_data;                     // plain text; sent base64-encoded
  std::string reservation_hint;              // a Blazar reservation id, or empty
  std::map<std::string, std::string> metadata;
};

struct NovaOptions {
  CreateRetry create_retry;
  std::chrono::seconds poll_interval{5};  // python-chi's server wait
};

// Not thread-safe beyond what Session is: one caller at a time per client.
class NovaClient {
 public:
  NovaClient(Session& session, CloudClock& clock, NovaOptions options = {});

  // GET /flavors/detail at microversion 2.61 (so extra_specs come along), every page.
  StatusOr<std::vector<Flavor>> ListFlavors();

  // The flavor whose name (or id) is `name_or_id`. NotFound with the nearest names otherwise.
  StatusOr<Flavor> FindFlavor(std::string_view name_or_id);

  // The private flavor Blazar creates when a flavor:instance reservation starts: the one whose
  // aggregate_instance_extra_specs:reservation extra spec is `reservation_id` (python-chi's way).
  // NotFound before the lease is ACTIVE.
  StatusOr<Flavor> ReservationFlavor(std::string_view reservation_id);

  // NotFound naming the key pair and how to list them when the project has no such key pair.
  Status CheckKeypair(std::string_view name);

  // GET /servers/detail, optionally only those whose name starts with `name_prefix`.
  StatusOr<std::vector<Server>> ListServers(std::string_view name_prefix = "");

  // The server named exactly `name`; nullopt when none. FailedPrecondition when several.
  StatusOr<std::optional<Server>> FindServer(std::string_view name);

  // The server named spec.name, created when there is none. A create that timed out is looked up
  // by name before it is sent again, so at most one server is ever made. InvalidArgument when the
  // user data is over Nova's 65535 bytes once encoded.
  StatusOr<Server> FindOrCreateServer(const ServerSpec& spec);

  // NotFound when it does not exist.
  StatusOr<Server> GetServer(std::string_view id);

  // Polls until ACTIVE. FailedPrecondition with Nova's fault message when it ends in ERROR;
  // DeadlineExceeded after `timeout`.
  StatusOr<Server> WaitUntilActive(std::string_view id, std::chrono::seconds timeout);

  // Deletes the server (OK when already gone) and polls until Nova no longer has it.
  Status DeleteServer(std::string_view id, std::chrono::seconds timeout);

 private:
  Session& session_;
  CloudClock& clock_;
  const NovaOptions options_;
};

// The POST /servers body for `spec`, as the Nova API reference gives it.
nlohmann::json ServerRequestBody(const ServerSpec& spec);

// {"server": ...}'s value or an element of "servers". InternalError when its id is not one
// (IdField).
StatusOr<Server> ParseServer(const nlohmann::json& value);

// RFC 4648 base64 with padding.
std::string Base64Encode(std::string_view data);

}  // namespace llmctl::openstack

#endif  // LLMCTL_CONTROLLER_OPENSTACK_NOVA_H_
