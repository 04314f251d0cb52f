// Fuzz target for what llmctl reads out of an OpenStack cloud's answers (controller/openstack/):
// bytes a server sends, which `llmctl lease` and `llmctl node` take no one's word for. The first
// byte picks the reader, the rest is the answer's body (for the token answer, its first line is
// the X-Subject-Token header and the rest the body):
//
//   l  a Blazar lease (ParseLease), bare or as {"lease": ...} / {"leases": [...]}
//   s  a Nova server (ParseServer, {"server"} / {"servers"}), its node (NodeOfServer) and agent
//      port (AgentPortOf)
//   i  a Glance image (ParseImage, {"images"})
//   v  a Cinder volume (ParseVolume, {"volume"} / {"volumes"})
//   g  a Neutron security group (ParseSecurityGroup, {"security_group"} / {"security_groups"})
//   p  a Neutron port (ParsePort, {"ports"})
//   f  a Neutron floating IP (ParseFloatingIp, {"floatingip"} / {"floatingips"})
//   c  a Keystone catalog (Catalog::FromJson and Url), bare or as {"token": {"catalog"}}
//   t  a UTC timestamp as the services write them (ParseUtcTimestamp), the raw text
//   k  Keystone's token answer (ParseTokenAnswer): "<X-Subject-Token>\n<body>"
//   h  Blazar's host calendar (FirstFreeHostSlot), one object holding both "hosts" and
//      "allocations"
//   e  an error answer (ServiceMessage, ApiError, IsNoCapacityAnswer); the second byte picks its
//      HTTP status
//
// Any other first byte picks one of these by its value modulo 12. A body is parsed the way the
// clients parse it (ParseForeignJson: no exception, a discarded value for what is not JSON or
// nests past 64 levels, which the clients refuse before any reader sees it; an empty body is null,
// as Session::CallJson returns it).
//
// Beyond "no crash, no exception, no hang": a refusal has the code its header names (InternalError
// for a service object without its id, InvalidArgument for a timestamp or a catalog) and a message
// (a timestamp's quotes the text); what is accepted keeps its header's promises: every id (a
// lease's and its reservations', a server's, image's, volume's, security group's, port's, floating
// IP's) is the answer's string and can stand in a URL path (IdField: not empty, ".", "..", no '/',
// '?', '#', '%', '\\', control character), a lease or a
// token's times lie within kMinUtcYear-kMaxUtcYear and FormatUtc's text parses back to them, a
// security group's ports are 1-65535, a volume's size is the answer's when it fits an int (else
// 0), an agent port is 0 or 1-65535 written as such, a node's server name is NamesForNode's, the
// next free host slot is never before the time asked from, and an HTTP error's code is the one
// ResponseError maps its status to.
//
// Replayed over tests/fuzz/corpus/openstack_response/ by the `openstack_response_fuzz_replay` test,
// with seeded mutations. To fuzz for real (clang with libFuzzer: apt-get install clang
// libclang-rt-14-dev), from the repository root, in bash:
//
//   SRCS="tests/fuzz/openstack_response_fuzz.cc
//         $(ls controller/openstack/*.cc | grep -v _test.cc) common/foreign_json.cc
//         common/spelling.cc common/status.cc common/text.cc common/http/http_client.cc
//         common/digest/digest.cc common/utc_time.cc common/files.cc common/yaml_document.cc
//         common/home_directory.cc common/errno_status.cc common/byte_size.cc
//         common/atomic_file.cc"
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
//       -I. $SRCS $(pkg-config --cflags --libs libcurl openssl yaml-cpp)
//       -o /tmp/openstack_response_fuzz                                              # one line
//   mkdir -p /tmp/openstack_response_corpus
//   /tmp/openstack_response_fuzz -max_total_time=300 -max_len=4096 -timeout=10
//       -dict=tests/fuzz/openstack_response_fuzz.dict /tmp/openstack_response_corpus
//       tests/fuzz/corpus/openstack_response                                      # one line
//
// Inputs that crash go into tests/fuzz/corpus/openstack_response/ with the fix.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "common/foreign_json.h"
#include "common/http/http_client.h"
#include "common/status.h"
#include "common/utc_time.h"
#include "controller/openstack/blazar.h"
#include "controller/openstack/cinder.h"
#include "controller/openstack/cloud_clock.h"
#include "controller/openstack/glance.h"
#include "controller/openstack/neutron.h"
#include "controller/openstack/nodes.h"
#include "controller/openstack/nova.h"
#include "controller/openstack/session.h"

namespace {

using llmctl::Status;
using llmctl::StatusCode;
using llmctl::StatusOr;
using nlohmann::json;
namespace os = llmctl::openstack;

void Check(bool condition) {
  if (!condition) std::abort();
}

// The first bytes that pick each reader, in the order of the file comment.
constexpr std::string_view kKinds = "lsivgpfctkhe";

// A refusal of a service object: what List, Get and Create return to the command.
// What IdField promises of an id it accepts, checked independently.
void CheckId(const std::string& id) {
  Check(!id.empty() && id != "." && id != "..");
  for (char c : id) {
    Check(c != '/' && c != '?' && c != '#' && c != '%' && c != '\\');
    Check(static_cast<unsigned char>(c) >= 0x20 && c != 0x7f);
  }
}

void CheckInternal(const Status& status) {
  Check(status.code() == StatusCode::kInternal);
  Check(!status.message().empty());
}

// A time the readers accept: within the header's years, exact to the second, and FormatUtc's
// text in both of the spellings llmctl writes reads back as the same time.
void CheckTime(os::TimePoint time) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(time);
  std::tm tm{};
  Check(gmtime_r(&seconds, &tm) != nullptr);
  Check(tm.tm_year + 1900 >= os::kMinUtcYear && tm.tm_year + 1900 <= os::kMaxUtcYear);
  Check(std::chrono::system_clock::from_time_t(seconds) == time);
  const StatusOr<os::TimePoint> iso =
      os::ParseUtcTimestamp(llmctl::FormatUtc(time, "%Y-%m-%dT%H:%M:%SZ"));
  Check(iso.ok() && *iso == time);
  const StatusOr<os::TimePoint> blazar =
      os::ParseUtcTimestamp(llmctl::FormatUtc(time, "%Y-%m-%d %H:%M"));
  Check(blazar.ok() && *blazar == time - std::chrono::seconds(tm.tm_sec));
}

// `reader` on the body itself, on `one`'s value and on each element of `many`'s array: how the
// clients call it on a create's or a get's answer and on a list's.
template <typename Reader>
void EachObject(const json& body, const char* one, const char* many, Reader reader) {
  reader(body);
  if (!body.is_object()) return;
  if (one != nullptr && body.contains(one)) reader(body[one]);
  if (many != nullptr && body.contains(many) && body[many].is_array()) {
    for (const json& value : body[many]) reader(value);
  }
}

void Lease(const json& value) {
  const StatusOr<os::Lease> lease = os::ParseLease(value);
  if (!lease.ok()) return CheckInternal(lease.status());
  CheckId(lease->id);
  CheckTime(lease->start);
  CheckTime(lease->end);
  for (const os::Reservation& reservation : lease->reservations) {
    CheckId(reservation.id);
    volatile size_t described = os::DescribeReservation(reservation).size();
    (void)described;
    (void)os::ReservesServers(reservation);
  }
}

void Server(const json& value) {
  const StatusOr<os::Server> server = os::ParseServer(value);
  if (!server.ok()) return CheckInternal(server.status());
  CheckId(server->id);
  Check(server->id == value["id"].get<std::string>());
  for (const std::string& address : server->fixed_addresses) Check(!address.empty());
  for (const std::string& address : server->floating_addresses) Check(!address.empty());
  const int port = os::AgentPortOf(*server);
  Check(port >= 0 && port <= 65535);
  if (port != 0) {
    // The metadata is that number in decimal digits, leading zeros allowed ("07443").
    const std::string& text = server->metadata.at(os::kAgentPortMetadata);
    const size_t first = text.find_first_not_of('0');
    Check(first != std::string::npos && text.substr(first) == std::to_string(port));
  }
  const std::optional<std::string> node = os::NodeOfServer(server->name);
  if (node.has_value()) Check(!node->empty() && os::NamesForNode(*node).server == server->name);
}

void Image(const json& value) {
  const StatusOr<os::Image> image = os::ParseImage(value);
  if (!image.ok()) return CheckInternal(image.status());
  CheckId(image->id);
  Check(image->id == value["id"].get<std::string>());
  Check(image->name == value["name"].get<std::string>());
}

void Volume(const json& value) {
  const StatusOr<os::Volume> volume = os::ParseVolume(value);
  if (!volume.ok()) return CheckInternal(volume.status());
  CheckId(volume->id);
  Check(volume->id == value["id"].get<std::string>());
  // The size as Cinder wrote it when an int holds it, else 0: never a wrapped one.
  int expected = 0;
  if (value.contains("size") && value["size"].is_number_integer()) {
    const json& size = value["size"];
    if (size.is_number_unsigned() ? std::in_range<int>(size.get<uint64_t>())
                                  : std::in_range<int>(size.get<int64_t>())) {
      expected = size.get<int>();
    }
  }
  Check(volume->size_gb == expected);
}

void SecurityGroup(const json& value) {
  const StatusOr<os::SecurityGroup> group = os::ParseSecurityGroup(value);
  if (!group.ok()) return CheckInternal(group.status());
  CheckId(group->id);
  for (int port : group->ingress_tcp_ports) Check(port >= 1 && port <= 65535);
}

void Port(const json& value) {
  const StatusOr<os::Port> port = os::ParsePort(value);
  if (!port.ok()) return CheckInternal(port.status());
  CheckId(port->id);
}

void FloatingIp(const json& value) {
  const StatusOr<os::FloatingIp> address = os::ParseFloatingIp(value);
  if (!address.ok()) return CheckInternal(address.status());
  CheckId(address->id);
  Check(!address->address.empty());
}

void Catalog(const json& value) {
  const StatusOr<os::Catalog> catalog = os::Catalog::FromJson(value);
  if (!catalog.ok()) {
    Check(catalog.status().code() == StatusCode::kInvalidArgument);
    Check(!catalog.status().message().empty());
    return;
  }
  for (const char* type : {"reservation", "compute", "block-storage", "network", "image"}) {
    for (const char* interface : {"public", "internal"}) {
      for (const char* region : {"", "CHI@UC", "KVM@TACC"}) {
        const StatusOr<std::string> url = catalog->Url(type, interface, region);
        if (url.ok()) continue;
        Check(url.status().code() == StatusCode::kNotFound ||
              url.status().code() == StatusCode::kFailedPrecondition);
        Check(!url.status().message().empty());
      }
    }
  }
}

// The calendar fields strptime reads from `text` with the formats ParseUtcTimestamp documents
// (its "Z", fraction and "T" taken off as it takes them off), or nullopt.
std::optional<std::tm> FieldsOf(std::string_view text) {
  std::string rest(text);
  if (rest.ends_with('Z')) rest.pop_back();
  if (const size_t dot = rest.find('.', 10); dot != std::string::npos) rest.resize(dot);
  if (rest.size() > 10 && rest[10] == 'T') rest[10] = ' ';
  for (const char* format : {"%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M"}) {
    std::tm tm{};
    const char* end = strptime(rest.c_str(), format, &tm);
    if (end != nullptr && *end == '\0') return tm;
  }
  return std::nullopt;
}

void Timestamp(std::string_view text) {
  const StatusOr<os::TimePoint> time = os::ParseUtcTimestamp(text);
  if (!time.ok()) {
    Check(time.status().code() == StatusCode::kInvalidArgument);
    Check(time.status().message().starts_with(std::string("'").append(text).append("'")));
    return;
  }
  CheckTime(*time);
  // The time is the one the text names, not one timegm rolled over to: "2030-02-31" is no
  // March 3rd, "23:59:60" no midnight.
  const std::optional<std::tm> named = FieldsOf(text);
  Check(named.has_value());
  const std::time_t seconds = std::chrono::system_clock::to_time_t(*time);
  std::tm parsed{};
  Check(gmtime_r(&seconds, &parsed) != nullptr);
  Check(parsed.tm_year == named->tm_year && parsed.tm_mon == named->tm_mon &&
        parsed.tm_mday == named->tm_mday && parsed.tm_hour == named->tm_hour &&
        parsed.tm_min == named->tm_min && parsed.tm_sec == named->tm_sec);
}

void TokenAnswer(std::string_view input) {
  const size_t newline = input.find('\n');
  llmctl::http::Response response;
  response.status = 201;
  const std::string_view subject = input.substr(0, newline);
  if (!subject.empty()) response.headers.Add("X-Subject-Token", std::string(subject));
  if (newline != std::string_view::npos) response.body = std::string(input.substr(newline + 1));
  const StatusOr<os::Token> token = os::ParseTokenAnswer(
      response, "https://kvm.tacc.chameleoncloud.org:5000/v3/auth/tokens", "authenticating");
  if (!token.ok()) {
    Check(token.status().code() == StatusCode::kInternal ||
          token.status().code() == StatusCode::kInvalidArgument);
    Check(!token.status().message().empty());
    return;
  }
  Check(!token->id.empty() && token->id == subject);
  CheckTime(token->expires_at);
}

void HostCalendar(const json& body, int hosts) {
  const StatusOr<os::TimePoint> from = os::ParseUtcTimestamp("2030-01-01T00:00:00Z");
  Check(from.ok());
  const StatusOr<std::optional<os::TimePoint>> slot = os::FirstFreeHostSlot(
      body, body, "gpu_a100_pcie", hosts, *from, std::chrono::hours(2) + std::chrono::minutes(50));
  if (!slot.ok()) return CheckInternal(slot.status());
  if (slot->has_value()) Check(**slot >= *from);
}

// ResponseError's mapping of an HTTP status to a code (common/http/http_client.h).
StatusCode CodeOf(int status) {
  switch (status) {
    case 400:
      return StatusCode::kInvalidArgument;
    case 401:
      return StatusCode::kUnauthenticated;
    case 403:
      return StatusCode::kPermissionDenied;
    case 404:
      return StatusCode::kNotFound;
    case 409:
      return StatusCode::kAborted;
    case 429:
      return StatusCode::kUnavailable;
    default:
      return status >= 500 ? StatusCode::kUnavailable : StatusCode::kFailedPrecondition;
  }
}

void ErrorAnswer(std::string_view input) {
  constexpr int kStatuses[] = {500, 400, 401, 403, 404, 409, 429, 502, 503, 504, 413, 418};
  llmctl::http::Response response;
  response.status =
      input.empty() ? 500 : kStatuses[static_cast<unsigned char>(input[0]) % std::size(kStatuses)];
  if (!input.empty()) input.remove_prefix(1);
  response.body = std::string(input);
  response.headers.Add("X-Openstack-Request-Id", "req-0a1b2c3d");
  volatile size_t message = os::ServiceMessage(response).size();
  (void)message;
  llmctl::http::Request request;
  request.method = "POST";
  request.url = "https://kvm.tacc.chameleoncloud.org:6001/v1/leases";
  const Status error = os::ApiError(request, response);
  Check(error.code() == CodeOf(response.status));
  Check(
      error.message().starts_with("POST https://kvm.tacc.chameleoncloud.org:6001/v1/leases: HTTP " +
                                  std::to_string(response.status) + " (request req-0a1b2c3d)"));
  if (os::IsNoCapacityAnswer(response)) Check(response.status == 500);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t picked = kKinds.find(static_cast<char>(data[0]));
  const char kind = kKinds[picked != std::string_view::npos ? picked : data[0] % kKinds.size()];
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  // Raw text, not a JSON body.
  if (kind == 't') {
    Timestamp(rest);
    return 0;
  }
  if (kind == 'k') {
    TokenAnswer(rest);
    return 0;
  }
  if (kind == 'e') {
    ErrorAnswer(rest);
    return 0;
  }
  // Session::CallJson: an empty body (204) is null; what is not JSON is refused before any reader.
  const json body = rest.empty() ? json() : llmctl::ParseForeignJson(rest);
  if (body.is_discarded()) return 0;
  switch (kind) {
    case 'l':
      EachObject(body, "lease", "leases", Lease);
      break;
    case 's':
      EachObject(body, "server", "servers", Server);
      break;
    case 'i':
      EachObject(body, nullptr, "images", Image);
      break;
    case 'v':
      EachObject(body, "volume", "volumes", Volume);
      break;
    case 'g':
      EachObject(body, "security_group", "security_groups", SecurityGroup);
      break;
    case 'p':
      EachObject(body, "port", "ports", Port);
      break;
    case 'f':
      EachObject(body, "floatingip", "floatingips", FloatingIp);
      break;
    case 'c':
      Catalog(body);
      if (body.is_object() && body.contains("token") && body["token"].is_object() &&
          body["token"].contains("catalog")) {
        Catalog(body["token"]["catalog"]);
      }
      break;
    case 'h':
      HostCalendar(body, 1 + static_cast<int>(rest.size() % 3));
      break;
    default:
      break;
  }
  return 0;
}
