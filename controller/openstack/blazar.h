// Blazar (reservation v1): leases for KVM flavors (flavor:instance) and bare-metal node types
// (physical:host), created at most once however often a create times out.
#ifndef LLMCTL_CONTROLLER_OPENSTACK_BLAZAR_H_
#define LLMCTL_CONTROLLER_OPENSTACK_BLAZAR_H_

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "controller/openstack/cloud_clock.h"
#include "controller/openstack/session.h"

namespace llmctl::openstack {

// llmctl makes "physical:host" and "flavor:instance" reservations; a lease made elsewhere may also
// hold upstream's "virtual:floatingip" or Chameleon's "network" and "device" ones.
struct Reservation {
  std::string id;
  std::string resource_type;
  std::string status;               // pending, active, deleted, error
  std::string flavor_id;            // flavor:instance: the flavor asked for, not Blazar's copy
  int amount = 0;                   // flavor:instance, virtual:floatingip
  std::string resource_properties;  // a JSON-encoded string (flavor:instance: the flavor asked for)
  int min = 0, max = 0;             // physical:host, device
  std::string network_id;           // virtual:floatingip
};

// What one reservation holds, as Blazar shows it: "1 x flavor F", "2 x physical:host PROPS",
// "1 x floating IP on network N", or for Chameleon's network reservations (whose details the
// fork does not show) just "network".
std::string DescribeReservation(const Reservation& reservation);

// A server can be booted on it: a physical:host or flavor:instance reservation.
bool ReservesServers(const Reservation& reservation);

struct Lease {
  std::string id;
  std::string name;
  std::string status;  // PENDING, ACTIVE, TERMINATED, ERROR, or a transitional one
  TimePoint start;
  TimePoint end;
  std::vector<Reservation> reservations;
};

// What to reserve. Exactly one of flavor_id and node_type is set.
struct LeaseSpec {
  std::string name;
  std::optional<TimePoint> start;  // nullopt: "now"
  TimePoint end;
  std::string flavor_id;  // flavor:instance: a Nova flavor id (not its name), `amount` instances
  int amount = 1;
  std::string node_type;  // physical:host: `hosts` nodes whose node_type matches
  int hosts = 1;
};

struct BlazarOptions {
  int create_attempts = 3;  // POSTs at most, each after a lookup by name found nothing
  std::chrono::milliseconds create_retry_delay{std::chrono::seconds(2)};
  std::chrono::seconds poll_interval{5};  // python-chi's lease wait
};

// Not thread-safe beyond what Session is: one caller at a time per client.
class BlazarClient {
 public:
  BlazarClient(Session& session, CloudClock& clock, BlazarOptions options = {});

  // Creates the lease. AlreadyExists when a lease of that name exists. After a timeout or a
  // gateway error the lease may exist anyway: it is looked up by name before any re-send, so at
  // most one lease is ever made. ResourceExhausted "no capacity for that period" (with the next
  // free slot for node types, from the host calendar) when Blazar has no hosts.
  StatusOr<Lease> Create(const LeaseSpec& spec);

  StatusOr<std::vector<Lease>> List();

  // By id or name. NotFound (with the nearest name) or FailedPrecondition when a name is shared.
  StatusOr<Lease> Get(std::string_view name_or_id);

  // Moves the end date, for node-type and flavor leases alike (upstream Blazar and Chameleon's fork
  // both extend flavor:instance reservations when their hosts stay free). ResourceExhausted when
  // Blazar has no room; FailedPrecondition while the lease is changing (UPDATING, STARTING, ...).
  StatusOr<Lease> Extend(std::string_view name_or_id, TimePoint new_end);

  Status Delete(std::string_view name_or_id);

  // Polls until ACTIVE. FailedPrecondition when the lease ends in ERROR or TERMINATED;
  // DeadlineExceeded when still not active `timeout` after its start date. `progress` (may be
  // empty) gets one line each time Blazar answers a new status: "lease L is PENDING; Blazar starts
  // it at 2030-01-01 00:00 UTC", "lease L is STARTING", "lease L is ACTIVE".
  StatusOr<Lease> WaitUntilActive(std::string_view name_or_id, std::chrono::seconds timeout,
                                  const std::function<void(const std::string&)>& progress = {});
  // The same from `lease` as Blazar last answered it (e.g. its create's answer, which is PENDING).
  StatusOr<Lease> WaitUntilActive(Lease lease, std::chrono::seconds timeout,
                                  const std::function<void(const std::string&)>& progress = {});

 private:
  StatusOr<std::string> LeasesPath();
  StatusOr<std::optional<Lease>> FindByName(std::string_view name);
  Status CapacityError(const LeaseSpec& spec, TimePoint start, const std::string& detail);
  StatusOr<std::optional<TimePoint>> NextFreeHostSlot(const std::string& node_type, int hosts,
                                                      TimePoint from,
                                                      std::chrono::seconds duration);

  Session& session_;
  CloudClock& clock_;
  const BlazarOptions options_;
};

// How much of a 500 answer's message IsNoCapacityAnswer reads.
inline constexpr size_t kMaxNoCapacityMessageBytes = 1024;

// Blazar's no-capacity answer, python-chi's way: HTTP 500 whose message (ServiceMessage) says
// "not enough <resource> available" within its first kMaxNoCapacityMessageBytes.
bool IsNoCapacityAnswer(const http::Response& response);

// The POST /leases body exactly as python-chi sends it.
nlohmann::json LeaseRequestBody(const LeaseSpec& spec);

// One lease object ({"lease": ...}'s value or an element of "leases"); reservations may come as
// a JSON string. InternalError when the lease's or a reservation's id is not one (IdField).
StatusOr<Lease> ParseLease(const nlohmann::json& value);

// The first time from `from` on when `hosts` hosts of `node_type` are all free for `duration`,
// by Blazar's host calendar: GET /os-hosts (`host_list`, {"hosts": [...]}, node_type a top-level
// field of each host) and GET /os-hosts/allocations (`allocations`). Never before `from`; nullopt
// when the site has fewer such hosts. InternalError when either answer has another shape.
StatusOr<std::optional<TimePoint>> FirstFreeHostSlot(const nlohmann::json& host_list,
                                                     const nlohmann::json& allocations,
                                                     const std::string& node_type, int hosts,
                                                     TimePoint from, std::chrono::seconds duration);

}  // namespace llmctl::openstack

#endif  // LLMCTL_CONTROLLER_OPENSTACK_BLAZAR_H_
