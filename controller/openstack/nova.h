// Nova (compute v2.1): the flavors a lease needs (a name resolved to an id, the private flavor
// Blazar makes for a KVM reservation).
#ifndef LLMCTL_CONTROLLER_OPENSTACK_NOVA_H_
#define LLMCTL_CONTROLLER_OPENSTACK_NOVA_H_

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
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

class NovaClient {
 public:
  explicit NovaClient(Session& session) : session_(session) {}

  // GET /flavors/detail at microversion 2.61 (so extra_specs come along), every page.
  StatusOr<std::vector<Flavor>> ListFlavors();

  // The flavor whose name (or id) is `name_or_id`. NotFound with the nearest names otherwise.
  StatusOr<Flavor> FindFlavor(std::string_view name_or_id);

  // The private flavor Blazar creates when a flavor:instance reservation starts: the one whose
  // aggregate_instance_extra_specs:reservation extra spec is `reservation_id` (python-chi's way).
  // NotFound before the lease is ACTIVE.
  StatusOr<Flavor> ReservationFlavor(std::string_view reservation_id);

 private:
  Session& session_;
};

}  // namespace llmctl::openstack

#endif  // LLMCTL_CONTROLLER_OPENSTACK_NOVA_H_
