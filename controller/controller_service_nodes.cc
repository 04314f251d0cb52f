// ControllerService's handlers of nodes: list, register (credentials or an enrollment token),
// enroll, update and deregister.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/foreign_json.h"
#include "common/text.h"
#include "controller/controller_service.h"
#include "controller/json_fields.h"
#include "controller/node_certificates.h"

namespace llmctl::controller {

using nlohmann::json;

namespace {

// Longer than any host name (253 bytes), port or socket path (108).
constexpr size_t kMaxAgentAddressBytes = 1024;

Status ValidateAgentAddress(std::string_view address) {
  // The address is shown in `llmctl nodes` and stored: no control character (an escape sequence
  // from whoever set it, a newline that forges a line), and no space but in a socket's path (the
  // embedded agent's is in LLMCTL_HOME, which may be "/home/ana/My Drive/llmctl").
  const bool unix_socket = address.starts_with("unix:");
  const bool printable = std::all_of(address.begin(), address.end(), [&](char c) {
    const auto byte = static_cast<unsigned char>(c);
    return (byte > 0x20 || (byte == 0x20 && unix_socket)) && byte != 0x7f;
  });
  if (printable && address.size() <= kMaxAgentAddressBytes) {
    if (unix_socket) {
      if (address.size() > 5 && address[5] == '/') return Status::Ok();
    } else if (const size_t colon = address.rfind(':');
               colon != std::string_view::npos && colon > 0 && colon + 1 < address.size()) {
      return Status::Ok();
    }
  }
  return InvalidArgumentError(
      "register node: address '" + OnOneLine(address, 200) +
      "' is neither host:port nor unix:/absolute/path (printable, at most " +
      std::to_string(kMaxAgentAddressBytes) + " bytes)");
}

}  // namespace

Status ValidateNodeName(std::string_view name) {
  constexpr size_t kShownNodeNameBytes = 80;
  const bool good_length = !name.empty() && name.size() <= 63;
  const bool good_chars = std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
  });
  if (!good_length || !good_chars || name.front() == '-' || name.back() == '-') {
    // The name is another party's: quoted without controls, and no longer than a good one could be
    // with room to see where it went wrong (a 3,000-byte name was quoted whole before).
    return InvalidArgumentError("node name '" + OnOneLine(name, kShownNodeNameBytes) +
                                "': use 1 to 63 letters, digits and '-' (not at either end)");
  }
  return Status::Ok();
}

StatusOr<v1::NodeStatus> ControllerService::BuildNodeStatus(
    const store::NodeRecord& node, const std::vector<store::RunningAttempt>& running) {
  v1::NodeStatus row;
  row.set_name(node.name);
  row.set_address(node.address);
  row.set_state(node.state);
  row.set_unusable(dispatcher_.NodeUnusable(node.name));
  dispatch::RatesNote rates = dispatcher_.NodeRatesPending(node.name);
  row.set_rate_probe_pending(std::move(rates.pending));
  row.set_rate_probe_underway(rates.underway);
  if (StatusOr<int64_t> expiry = secrets_.NodeCertificateExpiry(node.name); expiry.ok()) {
    row.set_certificate_expires_unix(*expiry);
  }
  row.set_last_seen_unix(store::UnixSeconds(node.last_seen));
  const json devices = ParseForeignJson(node.devices_json);
  if (devices.is_array()) {
    for (const json& device : devices) {
      v1::Device* proto = row.add_devices();
      proto->set_type(StringField(device, "type"));
      proto->set_index(static_cast<int32_t>(IntField(device, "index")));
      proto->set_name(StringField(device, "name"));
      proto->set_memory_bytes(IntField(device, "memory_bytes"));
    }
  }
  std::string runs;
  for (const store::RunningAttempt& attempt : running) {
    if (!attempt.RunsOn(node.name)) continue;
    ASSIGN_OR_RETURN(store::TrialRecord trial, store_.GetTrial(attempt.trial_id));
    if (!runs.empty()) runs += ",";
    runs += std::to_string(attempt.experiment_id) + "/" + trial.name + "#" +
            std::to_string(attempt.attempt);
  }
  row.set_running(runs);
  if (node.lease.has_value()) {
    v1::NodeLease* lease = row.mutable_lease();
    lease->set_name(node.lease->name);
    lease->set_site(node.lease->site);
    lease->set_flavor(node.lease->flavor);
    lease->set_ends_unix(store::UnixSeconds(node.lease->ends));
  }
  return row;
}

grpc::Status ControllerService::ListNodes(grpc::ServerContext* context, const v1::ListNodesRequest*,
                                          v1::ListNodesResponse* response) {
  return Guard(context, "ListNodes", [&]() -> Status {
    ASSIGN_OR_RETURN(std::vector<store::NodeRecord> nodes, store_.ListNodes());
    ASSIGN_OR_RETURN(std::vector<store::RunningAttempt> running, store_.ListRunningAttempts());
    ASSIGN_OR_RETURN(const auto rates, store_.NodeRates());
    for (const store::NodeRecord& node : nodes) {
      v1::NodeStatus* status = response->add_nodes();
      ASSIGN_OR_RETURN(*status, BuildNodeStatus(node, running));
      if (auto measured = rates.find(node.name); measured != rates.end()) {
        status->set_rate_probe_json(measured->second);
      }
    }
    return Status::Ok();
  });
}

grpc::Status ControllerService::MeasureNodeRates(grpc::ServerContext* context,
                                                 const v1::MeasureNodeRatesRequest* request,
                                                 v1::MeasureNodeRatesResponse* response) {
  return Guard(context, "MeasureNodeRates", [&]() -> Status {
    RETURN_IF_ERROR(ValidateNodeName(request->name()));
    ASSIGN_OR_RETURN(std::vector<store::NodeRecord> known, store_.ListNodes());
    if (std::none_of(known.begin(), known.end(), [&](const store::NodeRecord& record) {
          return record.name == request->name();
        })) {
      return NotFoundError("no node named " + request->name() + " is registered (llmctl nodes)");
    }
    ASSIGN_OR_RETURN(std::string pending, dispatcher_.MeasureNodeRates(request->name()));
    response->set_pending(std::move(pending));
    return Status::Ok();
  });
}

grpc::Status ControllerService::RegisterNode(grpc::ServerContext* context,
                                             const v1::RegisterNodeRequest* request,
                                             v1::NodeCredentials* response) {
  return Guard(context, "RegisterNode", [&]() -> Status {
    RETURN_IF_ERROR(ValidateNodeName(request->name()));
    if (!request->address().empty()) RETURN_IF_ERROR(ValidateAgentAddress(request->address()));
    // Held from the check of the current token to the new one's storing, so that two calls
    // cannot both find the name free.
    const NameLocks::Held registering = registration_locks_.Lock(request->name());
    StatusOr<std::string> current_token = secrets_.NodeToken(request->name());
    if (current_token.ok()) {
      // A live node: only a holder of its token may replace its credentials, else any caller
      // could take over its name (and the trials, inputs and artifacts sent to it).
      if (request->current_token().empty()) {
        return Status(StatusCode::kPermissionDenied,
                      "register node: node '" + request->name() +
                          "' is registered; registering it again needs its current token "
                          "(current_token), or remove it first (llmctl node down " +
                          request->name() + ")");
      }
      if (!rpc::SameSecret(request->current_token(), *current_token)) {
        return Status(StatusCode::kPermissionDenied,
                      "register node: current_token is not node '" + request->name() + "''s token");
      }
    } else if (current_token.status().code() != StatusCode::kNotFound) {
      return current_token.status();
    }
    // Told as soon as the secrets changed, even if what follows fails: the old link's channel
    // carries the old token and accepts the old certificate's name, and left up, the holder of the
    // old key would keep getting trials and inputs.
    const Status issued = request->enroll() ? IssueEnrollment(request->name(), *response)
                                            : IssueCredentials(request->name(), *response);
    dispatcher_.NodeCredentialsChanged(request->name());
    RETURN_IF_ERROR(issued);
    store::NodeRecord node{.name = request->name(),
                           .address = request->address(),
                           .devices_json = "[]",
                           .last_seen = {},
                           .state = "registered",
                           .lease = std::nullopt};
    ASSIGN_OR_RETURN(std::vector<store::NodeRecord> known, store_.ListNodes());
    for (const store::NodeRecord& existing : known) {
      if (existing.name == node.name) node.last_seen = existing.last_seen;
    }
    RETURN_IF_ERROR(store_.RegisterNode(node));
    spdlog::info("node {} registered at {}", node.name,
                 node.address.empty() ? "an address not yet known" : node.address);
    response->set_name(node.name);
    response->set_ca_certificate_pem(ca_.ca_certificate_pem());
    dispatcher_.Wake();
    return Status::Ok();
  });
}

namespace {

// How long a cloud node's enrollment token lasts: the node boots and installs Docker and the
// agent first (minutes; a bare-metal host takes about 10 to come up, a driver upgrade reboots it).
constexpr std::chrono::hours kEnrollmentLifetime{1};
// Node certificates: renewed over the link at the health checks (controller/node_certificates.h).
constexpr int kNodeCertificateDays = kNodeCertificateLifetime / std::chrono::hours(24);

}  // namespace

Status ControllerService::IssueCredentials(const std::string& node, v1::NodeCredentials& response) {
  // A name of this registration's own: the controller dials the node under it, so no
  // certificate of an earlier node of this name passes for this one.
  ASSIGN_OR_RETURN(const std::string registration, RandomHex(8));
  const std::string certificate_name = rpc::AgentCertificateName(node, registration);
  ASSIGN_OR_RETURN(rpc::IssuedCertificate certificate,
                   ca_.Issue(certificate_name, kNodeCertificateDays));
  ASSIGN_OR_RETURN(std::string token, NewNodeToken());
  RETURN_IF_ERROR(secrets_.PutNodeToken(node, token, certificate_name));
  RETURN_IF_ERROR(RecordCertificateExpiry(secrets_, node, certificate.certificate_pem));
  RETURN_IF_ERROR(store_.PutSecretRef(node, SecretsFile::NodeTokenRef(node)));
  response.set_certificate_pem(std::move(certificate.certificate_pem));
  response.set_private_key_pem(std::move(certificate.private_key_pem));
  response.set_token(std::move(token));
  return Status::Ok();
}

Status ControllerService::IssueEnrollment(const std::string& node, v1::NodeCredentials& response) {
  // A live node registered again this way loses its credentials at once, as with new ones.
  RETURN_IF_ERROR(secrets_.RemoveNodeToken(node));
  ASSIGN_OR_RETURN(const std::string registration, RandomHex(8));
  ASSIGN_OR_RETURN(std::string enrollment_token, RandomHex(32));
  const int64_t expires = store::UnixSeconds(clock_.Now() + kEnrollmentLifetime);
  RETURN_IF_ERROR(secrets_.PutEnrollment(node, enrollment_token, expires,
                                         rpc::AgentCertificateName(node, registration)));
  spdlog::info("node {}: enrollment token issued, valid until unix time {}", node, expires);
  response.set_enrollment_token(std::move(enrollment_token));
  response.set_enrollment_expires_unix(expires);
  return Status::Ok();
}

StatusOr<v1::EnrollmentGrant> ControllerService::DecideEnrollment(const std::string& node,
                                                                  const std::string& token) {
  ASSIGN_OR_RETURN(const std::string certificate_name,
                   secrets_.CheckEnrollment(node, token, store::UnixSeconds(clock_.Now())));
  ASSIGN_OR_RETURN(rpc::IssuedCertificate certificate,
                   ca_.Issue(certificate_name, kNodeCertificateDays));
  ASSIGN_OR_RETURN(const std::string node_token, NewNodeToken());
  // Kept before it goes: once the agent has it, the controller must know it whatever becomes of
  // the agent's answer.
  RETURN_IF_ERROR(secrets_.RecordSentGrant(node, node_token, certificate.certificate_pem));
  v1::EnrollmentGrant grant;
  grant.set_certificate_pem(std::move(certificate.certificate_pem));
  grant.set_private_key_pem(std::move(certificate.private_key_pem));
  grant.set_token(node_token);
  return grant;
}

grpc::Status ControllerService::EnrollNode(grpc::ServerContext* context,
                                           const v1::EnrollNodeRequest* request,
                                           v1::EnrollNodeResponse* response) {
  return Guard(context, "EnrollNode", [&]() -> Status {
    const std::string& name = request->name();
    RETURN_IF_ERROR(ValidateNodeName(name).WithContext("enroll node"));
    if (controller_identity_.certificate_pem.empty()) {
      return FailedPreconditionError("enroll node: this controller has no client certificate");
    }
    ASSIGN_OR_RETURN(std::vector<store::NodeRecord> known, store_.ListNodes());
    auto node = std::find_if(known.begin(), known.end(),
                             [&](const store::NodeRecord& record) { return record.name == name; });
    if (node == known.end() || node->address.empty()) {
      return FailedPreconditionError("enroll node: node '" + name +
                                     "' is not registered with an address to dial");
    }
    // One enrollment of a name at a time, and none while RegisterNode changes its secrets: the
    // token is checked and spent under the same lock. Other names' go on meanwhile.
    const NameLocks::Held registering = registration_locks_.Lock(name);
    response->set_name(name);
    if (!secrets_.HasEnrollment(name) && secrets_.NodeToken(name).ok()) {
      response->set_already_enrolled(true);
      return Status::Ok();
    }
    // A grant an earlier call sent may have been installed with the agent's answer lost (the call
    // broke, or its deadline passed, after the agent wrote it): that agent now serves the Agent API
    // with it, where no enrollment answers, and would be refused forever. It is the agent's when
    // it answers under the grant's certificate name and token, which only the grant's receiver
    // holds; anything else there (an agent still waiting) is enrolled as usual.
    constexpr std::chrono::seconds kCallDeadline{20};
    const StatusOr<SecretsFile::SentGrant> earlier = secrets_.SentGrantOf(name);
    const bool held =
        earlier.ok() && CheckAgentHoldsGrant(node->address, earlier->certificate_name,
                                             earlier->token, controller_identity_, kCallDeadline)
                            .ok();
    Status enrolled =
        held ? Status::Ok()
             : EnrollAgent(node->address, name, controller_identity_, kCallDeadline,
                           [&](const std::string& presented) -> StatusOr<v1::EnrollmentGrant> {
                             return DecideEnrollment(name, presented);
                           });
    if (enrolled.ok()) {
      // The grant the agent installed is the last one sent.
      const StatusOr<SecretsFile::SentGrant> installed = secrets_.SentGrantOf(name);
      enrolled =
          installed.ok() ? secrets_.CompleteEnrollment(name, installed->token) : installed.status();
      if (enrolled.ok()) {
        enrolled = RecordCertificateExpiry(secrets_, name, installed->certificate_pem);
      }
    }
    if (!enrolled.ok()) {
      if (enrolled.code() != StatusCode::kUnavailable &&
          enrolled.code() != StatusCode::kDeadlineExceeded) {
        spdlog::warn("enroll node {} at {}: refused: {}", name, node->address, enrolled.message());
      }
      return enrolled.WithContext("enroll node " + name);
    }
    RETURN_IF_ERROR(store_.PutSecretRef(name, SecretsFile::NodeTokenRef(name)));
    spdlog::info("node {} at {} enrolled{}", name, node->address,
                 held ? " (it had installed the credentials an earlier call sent)" : "");
    // A link dialled while the enrollment was pending has no token: dialled again with the new.
    dispatcher_.NodeCredentialsChanged(name);
    return Status::Ok();
  });
}

grpc::Status ControllerService::UpdateNode(grpc::ServerContext* context,
                                           const v1::UpdateNodeRequest* request,
                                           v1::NodeStatus* response) {
  return Guard(context, "UpdateNode", [&]() -> Status {
    RETURN_IF_ERROR(ValidateNodeName(request->name()));
    if (!request->address().empty()) RETURN_IF_ERROR(ValidateAgentAddress(request->address()));
    if (request->has_lease() && request->lease().ends_unix() <= 0) {
      return InvalidArgumentError("update node " + request->name() +
                                  ": the lease's end (ends_unix) is missing");
    }
    // Seconds, up to the year 2261: past about 9.2e9 a store::Time (nanoseconds in an int64) wraps,
    // and a lease sent in milliseconds would read as one that ended in 1892, stopping its trials.
    if (request->has_lease() && request->lease().ends_unix() > store::kMaxUnixSeconds) {
      return InvalidArgumentError("update node " + request->name() + ": the lease's end " +
                                  std::to_string(request->lease().ends_unix()) +
                                  " is past the year 2261 (ends_unix is in seconds)");
    }
    for (const auto& [field, text] :
         {std::pair<const char*, const std::string&>{"name", request->lease().name()},
          {"site", request->lease().site()},
          {"flavor", request->lease().flavor()}}) {
      if (const std::string problem = PrintableTextProblem(text, 256); !problem.empty()) {
        return InvalidArgumentError("update node " + request->name() + ": the lease's " + field +
                                    " " + problem);
      }
    }
    ASSIGN_OR_RETURN(std::vector<store::NodeRecord> known, store_.ListNodes());
    auto node = std::find_if(known.begin(), known.end(), [&](const store::NodeRecord& record) {
      return record.name == request->name();
    });
    if (node == known.end()) {
      return NotFoundError("no node '" + request->name() + "' is registered");
    }
    if (!request->address().empty() && request->address() != node->address) {
      node->address = request->address();
      RETURN_IF_ERROR(store_.UpsertNode(*node));
      spdlog::info("node {} is at {}", node->name, node->address);
    }
    if (request->has_lease()) {
      node->lease =
          store::NodeLease{.name = request->lease().name(),
                           .site = request->lease().site(),
                           .flavor = request->lease().flavor(),
                           .ends = store::Time(std::chrono::seconds(request->lease().ends_unix()))};
      RETURN_IF_ERROR(store_.SetNodeLease(node->name, *node->lease));
    }
    ASSIGN_OR_RETURN(std::vector<store::RunningAttempt> running, store_.ListRunningAttempts());
    ASSIGN_OR_RETURN(*response, BuildNodeStatus(*node, running));
    dispatcher_.Wake();
    return Status::Ok();
  });
}

grpc::Status ControllerService::DeregisterNode(grpc::ServerContext* context,
                                               const v1::DeregisterNodeRequest* request,
                                               v1::DeregisterNodeResponse* response) {
  return Guard(context, "DeregisterNode", [&]() -> Status {
    RETURN_IF_ERROR(ValidateNodeName(request->name()).WithContext("deregister node"));
    // Held as RegisterNode holds it: a registration of the same name in between would find the
    // token gone halfway through, or leave a removed node with a live token.
    const NameLocks::Held removing = registration_locks_.Lock(request->name());
    // The token goes first: from the moment the node is removed the controller cannot present it
    // again. Should the removal fail after this, the node is unreachable until a retry removes it.
    RETURN_IF_ERROR(secrets_.RemoveNodeToken(request->name()));
    ASSIGN_OR_RETURN(store::NodeRemoval removal, dispatcher_.RemoveNode(request->name()));
    response->set_name(request->name());
    switch (removal.result) {
      case store::NodeRemoval::Result::kRemoved:
        response->set_result("removed");
        break;
      case store::NodeRemoval::Result::kAlreadyRemoved:
        response->set_result("already_removed");
        break;
      case store::NodeRemoval::Result::kUnknown:
        response->set_result("unknown");
        break;
    }
    if (removal.removed_at.has_value()) {
      response->set_removed_unix(store::UnixSeconds(*removal.removed_at));
    }
    for (const store::RunningAttempt& attempt : removal.lost) {
      ASSIGN_OR_RETURN(store::TrialRecord trial, store_.GetTrial(attempt.trial_id));
      response->add_requeued(std::to_string(attempt.experiment_id) + "/" + trial.name + "#" +
                             std::to_string(attempt.attempt));
    }
    return Status::Ok();
  });
}

}  // namespace llmctl::controller
