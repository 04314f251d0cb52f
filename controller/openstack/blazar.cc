#include "controller/openstack/blazar.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <utility>

#include "common/foreign_json.h"
#include "common/spelling.h"
#include "common/utc_time.h"
#include "controller/openstack/json_fields.h"

namespace llmctl::openstack {
namespace {

using nlohmann::json;

constexpr char kBlazarDate[] = "%Y-%m-%d %H:%M";

// The longest the wait for a lease's start sleeps at once. The start is a date on the wall clock,
// so a sleep to it is reckoned on that clock: one long sleep would miss chrony stepping a node's
// wrong clock (hours at once) or a laptop's suspend, which the sleep does not count, and wake
// hours late. A minute: a start date's own precision, and 60 polls an hour, where python-chi's
// wait polls every 5 s.
constexpr std::chrono::minutes kLongestStartSleep{1};

// Blazar answers its own refusals with HTTP 500 and the exception's text ("Invalid lease status.",
// "Not enough hosts available", a trust Keystone would not give it), where the generic mapping says
// the cloud did not answer: these are refusals (exit 1), with Blazar's words.
Status BlazarError(const Exchange& exchange) {
  Status error = ApiError(exchange.request, exchange.response);
  if (exchange.response.status != 500) return error;
  return FailedPreconditionError(error.message());
}

// Blazar's InvalidStatus: the lease is in a transitional state (CREATING, STARTING, UPDATING,
// TERMINATING, DELETING) while its manager works on it.
bool IsInvalidStatus(const http::Response& response) {
  return response.status == 500 && ServiceMessage(response) == "Invalid lease status.";
}

// After these the server may have acted on a POST we never heard back from.
bool MayHaveCreated(int status) { return status == 502 || status == 503 || status == 504; }

std::string Describe(const LeaseSpec& spec) {
  if (!spec.flavor_id.empty()) {
    return std::to_string(spec.amount) + " x flavor " + spec.flavor_id;
  }
  return std::to_string(spec.hosts) + " x node type " + spec.node_type;
}

// A JSON-encoded string, spelled as python-chi's json.dumps spells it: ["==", "$node_type", "x"].
std::string NodeTypeProperties(const std::string& node_type) {
  return "[\"==\", \"$node_type\", " + json(node_type).dump() + "]";
}

}  // namespace

bool IsNoCapacityAnswer(const http::Response& response) {
  if (response.status != 500) return false;
  static const std::regex kPattern("not enough [a-z_ ]+ available", std::regex::icase);
  // libstdc++'s regex recurses once per character a repetition takes: "not enough " and 100,000
  // letters overflowed the stack. Blazar's own message is a few words ("Not enough hosts
  // available"), so the head of a longer one is enough to tell.
  const std::string message = ServiceMessage(response).substr(0, kMaxNoCapacityMessageBytes);
  return std::regex_search(message, kPattern);
}

json LeaseRequestBody(const LeaseSpec& spec) {
  json reservation;
  if (!spec.flavor_id.empty()) {
    // amount, flavor_id and affinity are all required; affinity must be null.
    reservation = {{"resource_type", "flavor:instance"},
                   {"flavor_id", spec.flavor_id},
                   {"amount", spec.amount},
                   {"affinity", nullptr}};
  } else {
    reservation = {{"resource_type", "physical:host"},
                   {"resource_properties", NodeTypeProperties(spec.node_type)},
                   {"hypervisor_properties", ""},
                   {"min", spec.hosts},
                   {"max", spec.hosts}};
  }
  return {{"name", spec.name},
          {"start_date", spec.start ? FormatUtc(*spec.start, kBlazarDate) : "now"},
          {"end_date", FormatUtc(spec.end, kBlazarDate)},
          {"reservations", json::array({reservation})},
          {"events", json::array()},
          {"before_end_date", nullptr}};
}

StatusOr<Lease> ParseLease(const json& value) {
  Lease lease;
  ASSIGN_OR_RETURN(lease.id, IdField(value, "id", "Blazar lease"));
  lease.name = StringField(value, "name");
  lease.status = StringField(value, "status");
  StatusOr<TimePoint> start = ParseUtcTimestamp(StringField(value, "start_date"));
  StatusOr<TimePoint> end = ParseUtcTimestamp(StringField(value, "end_date"));
  if (!start.ok() || !end.ok()) {
    return InternalError("Blazar lease " + lease.id +
                         " has unreadable dates: " + (start.ok() ? end : start).status().message());
  }
  lease.start = *start;
  lease.end = *end;
  json reservations = value.contains("reservations") ? value["reservations"] : json::array();
  if (reservations.is_string()) {
    reservations = ParseForeignJson(reservations.get<std::string>());
  }
  if (!reservations.is_array()) {
    return InternalError("Blazar lease " + lease.id + " has unreadable reservations");
  }
  for (const json& item : reservations) {
    Reservation reservation;
    ASSIGN_OR_RETURN(reservation.id,
                     IdField(item, "id", "Blazar lease " + lease.id + "'s reservation"));
    reservation.resource_type = StringField(item, "resource_type");
    reservation.status = StringField(item, "status");
    reservation.flavor_id = StringField(item, "flavor_id");
    reservation.amount = IntField(item, "amount");
    reservation.resource_properties = StringField(item, "resource_properties");
    if (reservation.resource_type == "flavor:instance") {
      // Blazar 18's flavor plugin answers flavor_id with the private flavor it made for the
      // reservation, and keeps the flavor asked for, as Nova showed it, in resource_properties.
      json asked = ParseForeignJson(reservation.resource_properties);
      if (asked.is_object() && asked.contains("id") && asked["id"].is_string()) {
        reservation.flavor_id = asked["id"].get<std::string>();
      }
    }
    reservation.min = IntField(item, "min");
    reservation.max = IntField(item, "max");
    reservation.network_id = StringField(item, "network_id");
    lease.reservations.push_back(std::move(reservation));
  }
  return lease;
}

StatusOr<std::optional<TimePoint>> FirstFreeHostSlot(const json& host_list, const json& allocations,
                                                     const std::string& node_type, int hosts,
                                                     TimePoint from,
                                                     std::chrono::seconds duration) {
  if (!host_list.contains("hosts") || !host_list["hosts"].is_array() ||
      !allocations.contains("allocations") || !allocations["allocations"].is_array()) {
    return InternalError("Blazar's host calendar has an unexpected shape");
  }
  std::set<std::string> matching;
  for (const json& host : host_list["hosts"]) {
    // Extra capabilities such as node_type are top-level fields of a host; ids may be numbers.
    std::string id =
        host.contains("id") && host["id"].is_number() ? host["id"].dump() : StringField(host, "id");
    if (StringField(host, "node_type") == node_type) matching.insert(id);
  }
  if (static_cast<int>(matching.size()) < hosts) return std::optional<TimePoint>();
  std::map<std::string, std::vector<std::pair<TimePoint, TimePoint>>> busy;
  std::vector<TimePoint> candidates = {from};
  for (const json& allocation : allocations["allocations"]) {
    std::string id = allocation.contains("resource_id") && allocation["resource_id"].is_number()
                         ? allocation["resource_id"].dump()
                         : StringField(allocation, "resource_id");
    if (!matching.contains(id) || !allocation.contains("reservations")) continue;
    for (const json& reservation : allocation["reservations"]) {
      StatusOr<TimePoint> start = ParseUtcTimestamp(StringField(reservation, "start_date"));
      StatusOr<TimePoint> end = ParseUtcTimestamp(StringField(reservation, "end_date"));
      if (!start.ok() || !end.ok()) continue;
      busy[id].emplace_back(*start, *end);
      if (*end > from) candidates.push_back(*end);
    }
  }
  std::sort(candidates.begin(), candidates.end());
  for (TimePoint candidate : candidates) {
    int free = 0;
    for (const std::string& id : matching) {
      bool overlaps = false;
      for (const auto& [start, end] : busy[id]) {
        overlaps = overlaps || (start < candidate + duration && candidate < end);
      }
      if (!overlaps) ++free;
    }
    if (free >= hosts) return std::optional<TimePoint>(candidate);
  }
  return std::optional<TimePoint>();
}

std::string DescribeReservation(const Reservation& reservation) {
  if (reservation.resource_type == "flavor:instance") {
    return std::to_string(reservation.amount) + " x flavor " + reservation.flavor_id;
  }
  if (reservation.resource_type == "virtual:floatingip") {
    return std::to_string(reservation.amount) + " x floating IP on network " +
           reservation.network_id;
  }
  std::string what = reservation.resource_type;
  if (reservation.min > 0) what = std::to_string(reservation.min) + " x " + what;
  if (!reservation.resource_properties.empty()) what += " " + reservation.resource_properties;
  return what;
}

bool ReservesServers(const Reservation& reservation) {
  return reservation.resource_type == "physical:host" ||
         reservation.resource_type == "flavor:instance";
}

BlazarClient::BlazarClient(Session& session, CloudClock& clock, BlazarOptions options)
    : session_(session), clock_(clock), options_(options) {}

StatusOr<std::string> BlazarClient::LeasesPath() {
  // Whether the catalog's reservation URL already ends in /v1 is not confirmed for Chameleon.
  ASSIGN_OR_RETURN(std::string base, session_.EndpointUrl("reservation"));
  while (base.ends_with('/')) base.pop_back();
  return base.ends_with("/v1") ? std::string("/leases") : std::string("/v1/leases");
}

StatusOr<std::vector<Lease>> BlazarClient::List() {
  ASSIGN_OR_RETURN(std::string path, LeasesPath());
  ASSIGN_OR_RETURN(json body, session_.CallJson("reservation", "GET", path));
  if (!body.is_object() || !body.contains("leases") || !body["leases"].is_array()) {
    return InternalError("Blazar's lease list has no 'leases' array");
  }
  std::vector<Lease> leases;
  for (const json& value : body["leases"]) {
    ASSIGN_OR_RETURN(Lease lease, ParseLease(value));
    leases.push_back(std::move(lease));
  }
  return leases;
}

StatusOr<std::optional<Lease>> BlazarClient::FindByName(std::string_view name) {
  ASSIGN_OR_RETURN(std::vector<Lease> leases, List());
  for (Lease& lease : leases) {
    if (lease.name == name) return std::optional<Lease>(std::move(lease));
  }
  return std::optional<Lease>();
}

StatusOr<Lease> BlazarClient::Get(std::string_view name_or_id) {
  ASSIGN_OR_RETURN(std::vector<Lease> leases, List());
  std::vector<const Lease*> named;
  std::vector<std::string_view> names;
  for (const Lease& lease : leases) {
    if (lease.id == name_or_id) return lease;
    if (lease.name == name_or_id) named.push_back(&lease);
    names.push_back(lease.name);
  }
  if (named.size() == 1) return *named.front();
  if (named.size() > 1) {
    std::string ids;
    for (const Lease* lease : named) ids += (ids.empty() ? "" : ", ") + lease->id;
    return FailedPreconditionError("several leases are named '" + std::string(name_or_id) + "' (" +
                                   ids + "): use an id");
  }
  std::string message = "no lease named '" + std::string(name_or_id) + "'";
  std::string_view close = ClosestMatch(name_or_id, names);
  if (!close.empty()) message += " (did you mean '" + std::string(close) + "'?)";
  return NotFoundError(message);
}

StatusOr<Lease> BlazarClient::Create(const LeaseSpec& spec) {
  if (spec.name.empty()) return InvalidArgumentError("a lease needs a name");
  if (spec.flavor_id.empty() == spec.node_type.empty()) {
    return InvalidArgumentError("a lease reserves either a flavor or a node type, not " +
                                std::string(spec.flavor_id.empty() ? "neither" : "both"));
  }
  TimePoint start = spec.start.value_or(clock_.Now());
  if (spec.end <= start) {
    return InvalidArgumentError("lease '" + spec.name + "' would end (" +
                                FormatUtc(spec.end, kBlazarDate) + ") before it starts (" +
                                FormatUtc(start, kBlazarDate) + ")");
  }
  ASSIGN_OR_RETURN(std::optional<Lease> existing, FindByName(spec.name));
  if (existing) {
    return AlreadyExistsError("a lease named '" + spec.name + "' already exists (" +
                              existing->status + ", id " + existing->id +
                              "): pick another name or delete it");
  }
  ASSIGN_OR_RETURN(std::string path, LeasesPath());
  const json body = LeaseRequestBody(spec);
  Status last_error;
  for (int attempt = 1; attempt <= options_.create_attempts; ++attempt) {
    http::Request request;
    request.method = "POST";
    request.url = path;
    request.body = body.dump();
    request.connect_timeout = session_.options().connect_timeout;
    request.total_timeout = session_.options().request_timeout;
    StatusOr<Exchange> exchange = session_.Call("reservation", request);
    if (exchange.ok()) {
      const http::Response& response = exchange->response;
      if (response.status == 200 || response.status == 201) {
        json answer = ParseForeignJson(response.body);
        if (!answer.is_object() || !answer.contains("lease")) {
          return InternalError("Blazar created lease '" + spec.name +
                               "' but its answer has no lease object");
        }
        return ParseLease(answer["lease"]);
      }
      if (IsNoCapacityAnswer(response)) {
        return CapacityError(spec, start, ApiError(exchange->request, response).message());
      }
      Status error = BlazarError(*exchange);
      if (!MayHaveCreated(response.status)) {
        if (response.status == 500 &&
            session_.credentials().auth_type == AuthType::kApplicationCredential) {
          // Blazar's 500 says only "Internal Server Error" when Keystone refused it a trust.
          return Status(error.code(),
                        error.message() +
                            " (Blazar makes a Keystone trust from your token, and Keystone refuses "
                            "one to a restricted application credential, and since its fix for "
                            "application-credential trust escalation to any application credential "
                            "unless the site allows it: create one with --unrestricted, or use a "
                            "password or OIDC login)");
        }
        return error;
      }
      last_error = error;
    } else if (exchange.status().code() == StatusCode::kDeadlineExceeded ||
               exchange.status().code() == StatusCode::kUnavailable) {
      last_error = exchange.status();
    } else {
      return exchange.status();
    }
    // The POST may have reached Blazar: give it time to finish, then a lease with our name
    // means it did.
    clock_.SleepFor(options_.create_retry_delay * attempt);
    ASSIGN_OR_RETURN(std::optional<Lease> created, FindByName(spec.name));
    if (created) return *created;
  }
  return last_error.WithContext("lease '" + spec.name + "' was not created after " +
                                std::to_string(options_.create_attempts) +
                                " attempts (none of them left a lease behind)");
}

StatusOr<std::optional<TimePoint>> BlazarClient::NextFreeHostSlot(const std::string& node_type,
                                                                  int hosts, TimePoint from,
                                                                  std::chrono::seconds duration) {
  ASSIGN_OR_RETURN(std::string leases_path, LeasesPath());
  std::string prefix = leases_path.substr(0, leases_path.size() - std::string("/leases").size());
  ASSIGN_OR_RETURN(json host_list, session_.CallJson("reservation", "GET", prefix + "/os-hosts"));
  ASSIGN_OR_RETURN(json allocations,
                   session_.CallJson("reservation", "GET", prefix + "/os-hosts/allocations"));
  return FirstFreeHostSlot(host_list, allocations, node_type, hosts, from, duration);
}

Status BlazarClient::CapacityError(const LeaseSpec& spec, TimePoint start,
                                   const std::string& detail) {
  std::string message = "no capacity for that period: " + Describe(spec) + " from " +
                        FormatUtc(start, kBlazarDate) + " to " + FormatUtc(spec.end, kBlazarDate) +
                        " UTC";
  if (!spec.node_type.empty()) {
    auto duration = std::chrono::duration_cast<std::chrono::seconds>(spec.end - start);
    StatusOr<std::optional<TimePoint>> slot =
        NextFreeHostSlot(spec.node_type, spec.hosts, start, duration);
    if (slot.ok() && *slot) {
      message += "; the host calendar's next free slot of that length starts at " +
                 FormatUtc(**slot, kBlazarDate) + " UTC";
    } else if (slot.ok()) {
      message += "; the site has fewer than " + std::to_string(spec.hosts) + " '" + spec.node_type +
                 "' hosts";
    }
  } else {
    // Chameleon's flavor availability endpoint exists but its answer's shape is unconfirmed.
    message += "; try a later --start or another flavor";
  }
  return ResourceExhaustedError(message + " [" + detail + "]");
}

StatusOr<Lease> BlazarClient::Extend(std::string_view name_or_id, TimePoint new_end) {
  ASSIGN_OR_RETURN(Lease lease, Get(name_or_id));
  if (new_end <= lease.start) {
    return InvalidArgumentError("the new end " + FormatUtc(new_end, kBlazarDate) +
                                " is before lease '" + lease.name + "' starts");
  }
  ASSIGN_OR_RETURN(std::string path, LeasesPath());
  json body = {{"end_date", FormatUtc(new_end, kBlazarDate)}};
  http::Request request;
  request.method = "PUT";
  request.url = path + "/" + lease.id;
  request.body = body.dump();
  request.connect_timeout = session_.options().connect_timeout;
  request.total_timeout = session_.options().request_timeout;
  ASSIGN_OR_RETURN(Exchange exchange, session_.Call("reservation", request));
  if (IsNoCapacityAnswer(exchange.response)) {
    return ResourceExhaustedError("no capacity to extend lease '" + lease.name + "' to " +
                                  FormatUtc(new_end, kBlazarDate) + " UTC [" +
                                  ApiError(exchange.request, exchange.response).message() + "]");
  }
  if (IsInvalidStatus(exchange.response)) {
    StatusOr<Lease> now = Get(lease.id);
    return FailedPreconditionError(
        "lease '" + lease.name + "' is " + (now.ok() ? now->status : std::string("changing")) +
        ": Blazar changes a lease only while it is PENDING, ACTIVE, TERMINATED or ERROR; try again "
        "in a few seconds [" +
        ApiError(exchange.request, exchange.response).message() + "]");
  }
  if (exchange.response.status != 200) {
    return BlazarError(exchange).WithContext("extending lease '" + lease.name + "'");
  }
  json answer = ParseForeignJson(exchange.response.body);
  if (!answer.is_object() || !answer.contains("lease")) {
    return InternalError("Blazar's answer to extending '" + lease.name + "' has no lease");
  }
  return ParseLease(answer["lease"]);
}

Status BlazarClient::Delete(std::string_view name_or_id) {
  ASSIGN_OR_RETURN(Lease lease, Get(name_or_id));
  ASSIGN_OR_RETURN(std::string path, LeasesPath());
  StatusOr<json> answer = session_.CallJson("reservation", "DELETE", path + "/" + lease.id);
  // A retried DELETE whose first try went through answers 404: the lease is gone either way.
  if (!answer.ok() && answer.status().code() != StatusCode::kNotFound) {
    return answer.status().WithContext("deleting lease '" + lease.name + "'");
  }
  return Status::Ok();
}

StatusOr<Lease> BlazarClient::WaitUntilActive(
    std::string_view name_or_id, std::chrono::seconds timeout,
    const std::function<void(const std::string&)>& progress) {
  ASSIGN_OR_RETURN(Lease lease, Get(name_or_id));
  return WaitUntilActive(std::move(lease), timeout, progress);
}

StatusOr<Lease> BlazarClient::WaitUntilActive(
    Lease lease, std::chrono::seconds timeout,
    const std::function<void(const std::string&)>& progress) {
  ASSIGN_OR_RETURN(std::string path, LeasesPath());
  // The timeout counts from the start date, on the time since boot from when the wall clock was
  // first seen past it: a step of the wall clock after that moves no deadline.
  std::optional<std::chrono::milliseconds> started;
  std::string reported;
  while (true) {
    if (progress && lease.status != reported) {
      reported = lease.status;
      progress("lease " + lease.name + " is " + lease.status +
               (lease.status == "PENDING"
                    ? "; Blazar starts it at " + FormatUtc(lease.start, kBlazarDate) + " UTC"
                    : ""));
    }
    if (lease.status == "ACTIVE") return lease;
    if (lease.status == "ERROR") {
      return FailedPreconditionError("lease '" + lease.name + "' (" + lease.id +
                                     ") went to ERROR: Blazar could not start it; delete it and "
                                     "try another period or site");
    }
    if (lease.status == "TERMINATED" || lease.status == "DELETED") {
      return FailedPreconditionError("lease '" + lease.name + "' is " + lease.status +
                                     ": it ended before it became usable");
    }
    if (!started && clock_.Now() >= lease.start) started = clock_.SinceBoot();
    if (started && clock_.SinceBoot() - *started >= timeout) {
      return Status(StatusCode::kDeadlineExceeded,
                    "lease '" + lease.name + "' is still " + lease.status + " " +
                        std::to_string(timeout.count()) + " s after its start (" +
                        FormatUtc(lease.start, kBlazarDate) + " UTC)");
    }
    // Nothing can change before the start date: sleep until then rather than poll every few
    // seconds for an hour, a minute at most at once.
    const auto until_start =
        std::chrono::duration_cast<std::chrono::milliseconds>(lease.start - clock_.Now());
    clock_.SleepFor(std::max<std::chrono::milliseconds>(
        options_.poll_interval,
        std::min<std::chrono::milliseconds>(until_start, kLongestStartSleep)));
    ASSIGN_OR_RETURN(json answer, session_.CallJson("reservation", "GET", path + "/" + lease.id));
    if (!answer.is_object() || !answer.contains("lease")) {
      return InternalError("Blazar's answer for lease " + lease.id + " has no lease object");
    }
    ASSIGN_OR_RETURN(lease, ParseLease(answer["lease"]));
  }
}

}  // namespace llmctl::openstack
