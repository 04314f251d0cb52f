// The Llmctl methods for the cloud's leases and nodes: `llmctl lease` and `llmctl node`, and
// `submit --provision`'s lease and node for an experiment's target.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "common/text.h"
#include "controller/cli/client.h"
#include "controller/cli/commands.h"
#include "controller/cli/llmctl.h"
#include "controller/openstack/lease_cli.h"
#include "controller/openstack/node_cli.h"
#include "rpc/grpc_status.h"

namespace llmctl::cli {
namespace {

constexpr std::chrono::milliseconds kFirstAgentPoll{100};

// An experiment's `target:` as a lease names it: a KVM site's flavor, or a bare-metal site's node
// type (a lease reserves either, and a node's lease names whichever it reserved).
struct TargetLease {
  std::string site;  // "" for any
  std::string flavor;
  bool node_type = false;  // `flavor` is a bare-metal node type
};

StatusOr<TargetLease> TargetLeaseOf(const Experiment& experiment) {
  for (const auto& [key, value] : experiment.target) {
    if (key != "site" && key != "flavor" && key != "node_type") {
      return InvalidArgumentError("unknown key '" + key +
                                  "' (target takes site, and flavor or node_type)");
    }
  }
  const auto target_value = [&](const char* key) {
    auto found = experiment.target.find(key);
    return found == experiment.target.end() ? std::string() : found->second;
  };
  const std::string node_type = target_value("node_type");
  if (target_value("flavor").empty() == node_type.empty()) {
    return InvalidArgumentError(
        "the target needs a flavor (KVM sites) or a node_type (bare-metal sites), one of them");
  }
  return TargetLease{.site = target_value("site"),
                     .flavor = node_type.empty() ? target_value("flavor") : node_type,
                     .node_type = !node_type.empty()};
}

// The controller's node on a lease of `target` that has not ended, saying so on `err`; whether
// there is one.
StatusOr<bool> FindTargetNode(v1::Controller::Stub& stub, const TargetLease& target,
                              std::ostream& err) {
  v1::ListNodesResponse nodes;
  RETURN_IF_ERROR(
      rpc::FromGrpcStatus(stub.ListNodes(UnaryContext().get(), v1::ListNodesRequest(), &nodes)));
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  for (const v1::NodeStatus& node : nodes.nodes()) {
    if (!node.has_lease() || node.lease().flavor() != target.flavor) continue;
    if (!target.site.empty() && node.lease().site() != target.site) continue;
    if (node.lease().ends_unix() <= now) continue;
    err << "target " << OnOneLine(target.flavor) << ": node " << OnOneLine(node.name())
        << " (lease " << OnOneLine(node.lease().name()) << ")\n";
    return true;
  }
  return false;
}

// The `llmctl lease` and `llmctl node` arguments that provision lease `lease` of `target` for
// `duration` and bring its node up with `node_flags`.
struct ProvisionCommands {
  std::vector<std::string> create;  // lease create ... --wait
  std::vector<std::string> up;      // node up --lease ...
};

ProvisionCommands ProvisionCommandsFor(const TargetLease& target, const std::string& lease,
                                       const std::string& duration,
                                       const std::vector<std::string>& node_flags) {
  ProvisionCommands commands;
  commands.create = {"create",      target.node_type ? "--node-type" : "--flavor",
                     target.flavor, "--name",
                     lease,         "--duration",
                     duration,      "--wait"};
  if (!target.site.empty()) commands.create.insert(commands.create.end(), {"--site", target.site});
  commands.up = {"up", "--lease", lease};
  commands.up.insert(commands.up.end(), node_flags.begin(), node_flags.end());
  if (!target.site.empty()) commands.up.insert(commands.up.begin(), {"--site", target.site});
  return commands;
}

// Tells the controller that node `up`'s agent is at `address`, on `up`'s lease.
Status TellNodeAddress(v1::Controller::Stub& stub, const openstack::NodeUp& up,
                       const std::string& address) {
  v1::UpdateNodeRequest request;
  request.set_name(up.node.name);
  request.set_address(address);
  v1::NodeLease* lease = request.mutable_lease();
  lease->set_name(up.lease.name);
  lease->set_site(up.site);
  lease->set_flavor(up.flavor);
  lease->set_ends_unix(
      std::chrono::duration_cast<std::chrono::seconds>(up.lease.end.time_since_epoch()).count());
  v1::NodeStatus updated;
  const Status told = rpc::FromGrpcStatus(stub.UpdateNode(UnaryContext().get(), request, &updated));
  if (told.code() == StatusCode::kNotFound) {
    return FailedPreconditionError(
        "the controller does not know node " + up.node.name +
        " (its server was made for another controller): llmctl node down " + up.node.name +
        ", then node up again");
  }
  return told;
}

// One attempt to enroll node `name` through the controller, saying on `out` when it was enrolled
// now: whether it is enrolled; Unavailable or DeadlineExceeded (no agent waits there yet, the node
// is still booting) is false, any other refusal is returned, since waiting does not change it.
StatusOr<bool> TryEnroll(v1::Controller::Stub& stub, const std::string& name, std::ostream& out) {
  v1::EnrollNodeRequest enroll;
  enroll.set_name(name);
  v1::EnrollNodeResponse response;
  const Status told = rpc::FromGrpcStatus(stub.EnrollNode(UnaryContext().get(), enroll, &response));
  if (told.ok() && !response.already_enrolled()) {
    out << "node " << name << ": enrolled (its certificate and token went over the link)\n"
        << std::flush;
  }
  if (!told.ok() && told.code() != StatusCode::kUnavailable &&
      told.code() != StatusCode::kDeadlineExceeded) {
    return told;
  }
  return told.ok();
}

// Whether the controller's node `name` is connected, saying so on `out`; FailedPrecondition when
// its agent answers but the node cannot run llm-train, which waiting does not change.
StatusOr<bool> AgentConnected(v1::Controller::Stub& stub, const std::string& name,
                              std::ostream& out) {
  StatusOr<v1::NodeStatus> node = ListedNode(stub, name, *UnaryContext());
  if (node.status().code() == StatusCode::kNotFound) return false;
  RETURN_IF_ERROR(node.status());
  if (!node->unusable().empty()) return FailedPreconditionError(node->unusable());
  if (node->state() != "connected") return false;
  out << "node " << OnOneLine(node->name()) << ": the agent answers ("
      << CountOf(node->devices_size(), "device", "devices") << ")\n";
  return true;
}

}  // namespace

Status Llmctl::EnsureTargetNode(v1::Controller::Stub& stub, const Experiment& experiment,
                                bool provision, const std::vector<std::string>& node_flags,
                                const LeaseSizing& lease_sizing) {
  ASSIGN_OR_RETURN(const TargetLease target, TargetLeaseOf(experiment));
  ASSIGN_OR_RETURN(const bool found, FindTargetNode(stub, target, context_.err));
  if (found) return Status::Ok();
  const std::string lease = ProvisionLeaseName(experiment.name, target.flavor);
  const ProvisionCommands commands =
      ProvisionCommandsFor(target, lease, lease_sizing.duration, node_flags);
  if (!provision) {
    // Lines to paste into a shell: each word quoted as the shell needs (a site or an image may hold
    // a space or a quote), the whole on one line whatever the experiment file's target holds.
    std::string create_line = "llmctl lease", up_line = "llmctl node";
    for (const std::string& word : commands.create) create_line.append(" ").append(ShellWord(word));
    for (const std::string& word : commands.up) up_line.append(" ").append(ShellWord(word));
    return FailedPreconditionError(OnOneLine(
        "no node of the controller's is on a lease of " + target.flavor +
        (target.site.empty() ? "" : " at " + target.site) +
        ". `llmctl submit --provision` makes one (it spends your allocation), or run: " +
        create_line + " && " + up_line + (node_flags.empty() ? " --agent-image REF" : "")));
  }
  context_.err << "provisioning lease " << lease << " and its node for target "
               << OnOneLine(target.flavor) << ", " << lease_sizing.duration << " ("
               << lease_sizing.explanation << ")\n";
  return Provision(lease, target.site, commands.create, commands.up);
}

Status Llmctl::Provision(const std::string& lease, const std::string& site,
                         const std::vector<std::string>& create,
                         const std::vector<std::string>& up) {
  // Rerunning finds the lease of the earlier run (or one the user reserved ahead under that name)
  // and waits for it as create --wait does: a node needs it ACTIVE.
  std::vector<std::string> show = {"show", lease};
  if (!site.empty()) show.insert(show.end(), {"--site", site});
  std::ostringstream ignored;
  if (Lease(show, ignored) != kExitOk) {
    if (Lease(create, context_.err) != kExitOk) {
      return FailedPreconditionError("lease " + lease + " could not be made (see above)");
    }
  } else {
    show.push_back("--wait");
    if (Lease(show, ignored) != kExitOk) {
      return FailedPreconditionError("lease " + lease + " did not become ACTIVE (see above)");
    }
  }
  if (Node(up, context_.err) != kExitOk) {
    return FailedPreconditionError("node " + lease + " could not be brought up (see above)");
  }
  return Status::Ok();
}

int Llmctl::Lease(const std::vector<std::string>& args, std::ostream& out) {
  openstack::LeaseCommandContext lease_context;
  lease_context.env = [this](const std::string& name) { return context_.env(name); };
  if (context_.cloud_clock != nullptr) lease_context.clock = context_.cloud_clock;
  return openstack::RunLeaseCommand(args, out, context_.err, lease_context);
}

int Llmctl::Node(const std::vector<std::string>& args, std::ostream& out) {
  openstack::NodeCommandContext node_context;
  node_context.env = [this](const std::string& name) { return context_.env(name); };
  if (context_.cloud_clock != nullptr) node_context.clock = context_.cloud_clock;
  node_context.issue_enrollment =
      [this](const std::string& node) -> StatusOr<openstack::NodeEnrollment> {
    ASSIGN_OR_RETURN(std::unique_ptr<v1::Controller::Stub> stub, Connect());
    // The floating IP comes after the server, so the address follows with UpdateNode, and the
    // node's credentials with EnrollNode once its agent waits there.
    v1::RegisterNodeRequest request;
    request.set_name(node);
    request.set_enroll(true);
    v1::NodeCredentials issued;
    RETURN_IF_ERROR(
        rpc::FromGrpcStatus(stub->RegisterNode(UnaryContext().get(), request, &issued)));
    return openstack::NodeEnrollment{.ca_pem = issued.ca_certificate_pem(),
                                     .enrollment_token = issued.enrollment_token()};
  };
  node_context.node_up = [this, &out](const openstack::NodeUp& up) { return AwaitAgent(up, out); };
  node_context.node_down = [this, &out](const std::string& node) {
    return DeregisterNode(node, out);
  };
  return openstack::RunNodeCommand(args, out, context_.err, node_context);
}

Status Llmctl::DeregisterNode(const std::string& node, std::ostream& out) {
  StatusOr<std::unique_ptr<v1::Controller::Stub>> stub = Connect();
  v1::DeregisterNodeResponse response;
  Status told = stub.status();
  if (stub.ok()) {
    v1::DeregisterNodeRequest request;
    request.set_name(node);
    told = rpc::FromGrpcStatus((*stub)->DeregisterNode(UnaryContext().get(), request, &response));
  }
  if (!told.ok()) {
    const std::string controller =
        target_.empty() ? "the controller"
                        : "the controller at " + target_ + " (from " + target_source_ + ")";
    return Status(told.code(), "cannot tell " + controller + " that node " + node +
                                   " is going: " + told.message());
  }
  if (response.result() == "removed") {
    out << "controller: node " << node << " removed";
    if (response.requeued_size() > 0) {
      out << "; its running trials are queued again:";
      for (const std::string& attempt : response.requeued()) out << " " << OnOneLine(attempt);
    }
    out << "\n";
  } else if (response.result() == "already_removed") {
    out << "controller: node " << node << " was already removed at "
        << FormatUnixTime(response.removed_unix()) << "\n";
  } else {
    out << "controller: node " << node << " was not registered there\n";
  }
  return Status::Ok();
}

Status Llmctl::AwaitAgent(const openstack::NodeUp& up, std::ostream& out) {
  const std::string address = up.node.AgentAddress();
  if (address.empty()) {
    return FailedPreconditionError("node " + up.node.name +
                                   " has no agent address yet (no floating IP or agent port)");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<v1::Controller::Stub> stub, Connect());
  RETURN_IF_ERROR(TellNodeAddress(*stub, up, address));
  const auto minutes =
      std::chrono::duration_cast<std::chrono::minutes>(context_.agent_ready_timeout);
  out << "waiting for the agent at " << OnOneLine(address) << " (up to " << minutes.count()
      << " min: cloud-init installs Docker and the agent first)\n"
      << std::flush;
  const auto deadline = std::chrono::steady_clock::now() + context_.agent_ready_timeout;
  // The first polls come quickly (an agent that is already running answers within a dispatcher
  // round), then double up to agent_poll_interval for a node that is still booting.
  std::chrono::milliseconds poll = std::min(kFirstAgentPoll, context_.agent_poll_interval);
  bool enrolled = false;
  while (true) {
    if (!enrolled) {
      ASSIGN_OR_RETURN(enrolled, TryEnroll(*stub, up.node.name, out));
    }
    ASSIGN_OR_RETURN(const bool connected, AgentConnected(*stub, up.node.name, out));
    if (connected) return Status::Ok();
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status(
          StatusCode::kDeadlineExceeded,
          "the controller could not reach node " + up.node.name + "'s agent at " + address +
              " within " + std::to_string(minutes.count()) +
              " min; the server is up: look at its console log (openstack console log show " +
              openstack::NamesForNode(up.node.name).server + ") and run `llmctl node up --lease " +
              up.lease.name + "` again to wait once more");
    }
    std::this_thread::sleep_for(poll);
    poll = std::min(poll * 2, context_.agent_poll_interval);
  }
}

std::string ProvisionLeaseName(std::string_view experiment, std::string_view flavor) {
  std::string name = "llmctl-" + std::string(experiment) + "-" + std::string(flavor);
  for (char& c : name) {
    c = std::isalnum(static_cast<unsigned char>(c))
            ? static_cast<char>(std::tolower(static_cast<unsigned char>(c)))
            : '-';
  }
  name.resize(std::min<size_t>(name.size(), 63));
  while (name.back() == '-') name.pop_back();
  return name;
}

}  // namespace llmctl::cli
