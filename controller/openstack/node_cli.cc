#include "controller/openstack/node_cli.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <memory>

#include "common/text.h"
#include "controller/openstack/command_words.h"
#include "controller/openstack/lease_cli.h"

namespace llmctl::openstack {
namespace {

struct NodeFlags {
  std::string os_cloud, site;
  std::string name;  // show / down
  NodeSpec spec;
  AgentImageSource image;
};

std::string Join(const std::vector<std::string>& items) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : ", ") + item;
  return text.empty() ? "-" : text;
}

// Every word here but the labels is the cloud's: server, volume and node names (a node's name is
// cut from its server's, which anyone in the project can name), statuses, Nova's fault message,
// ids and addresses. Each cell and field goes through OnOneLine, so that no escape sequence of
// theirs reaches the terminal and no newline forges a line (a fault may be a traceback).
void PrintTable(const std::vector<Node>& nodes, std::ostream& out) {
  std::vector<std::vector<std::string>> rows = {{"NODE", "STATUS", "AGENT", "SERVER ID"}};
  for (const Node& node : nodes) {
    rows.push_back({OnOneLine(node.name), node.server ? OnOneLine(node.server->status) : "-",
                    node.AgentAddress().empty() ? "-" : OnOneLine(node.AgentAddress()),
                    node.server ? OnOneLine(node.server->id) : "-"});
  }
  out << FormatColumns(rows);
}

void PrintNode(const Node& node, std::ostream& out) {
  out << "node:         " << OnOneLine(node.name) << "\n";
  if (node.server) {
    out << "server:       "
        << OnOneLine(node.server->name + " (" + node.server->id + ") " + node.server->status +
                     (node.server->fault.empty() ? "" : ": " + node.server->fault))
        << "\n"
        << "addresses:    " << OnOneLine(Join(node.server->fixed_addresses)) << "\n";
  } else {
    out << "server:       -\n";
  }
  out << "boot volume:  "
      << (node.volume
              ? OnOneLine(node.volume->name + " (" + node.volume->id + ") " + node.volume->status +
                          ", " + std::to_string(node.volume->size_gb) + " GiB")
              : "-")
      << "\n"
      << "floating IP:  " << (node.floating_ip ? OnOneLine(node.floating_ip->address) : "-") << "\n"
      << "agent:        " << (node.AgentAddress().empty() ? "-" : OnOneLine(node.AgentAddress()))
      << "\n";
}

// The agent image `node up` bootstraps (the flags', else the context's default); InvalidArgument
// without one or with a git URL and no commit, FailedPrecondition without a controller to issue
// the node's enrollment.
StatusOr<AgentImageSource> CheckUpFlags(const NodeFlags& flags, const NodeCommandContext& context) {
  AgentImageSource image = flags.image;
  if (image.image.empty() && image.git_url.empty()) image = context.default_agent_image;
  if (image.image.empty() && image.git_url.empty()) {
    return InvalidArgumentError(
        "node up needs the agent's image: --agent-image REF, or --agent-git URL "
        "--agent-commit SHA to build it on the node");
  }
  if (!image.git_url.empty() && image.git_commit.empty()) {
    return InvalidArgumentError("--agent-git needs --agent-commit (the build is pinned)");
  }
  if (!context.issue_enrollment) {
    return FailedPreconditionError("node up needs the controller to issue the node's enrollment");
  }
  return image;
}

// The name of the flavor `lease` reserved instances of; "" for a lease of hosts.
StatusOr<std::string> ReservedFlavor(Session& session, CloudClock& clock, const Lease& lease) {
  std::string flavor;
  for (const Reservation& reservation : lease.reservations) {
    if (reservation.resource_type != "flavor:instance") continue;
    NovaClient nova(session, clock);
    ASSIGN_OR_RETURN(Flavor reserved, nova.FindFlavor(reservation.flavor_id));
    flavor = reserved.name;
  }
  return flavor;
}

// `node up`: the node on `flags.spec`'s lease, its agent bootstrapped from `image` with an
// enrollment the controller issues, then handed to context.node_up.
Status Up(NodeManager& nodes, Session& session, const NodeFlags& flags,
          const AgentImageSource& image, std::ostream& out, const NodeCommandContext& context) {
  NodeSpec spec = flags.spec;
  const int agent_port = spec.agent_port;
  spec.user_data = [&](const std::string& node) -> StatusOr<std::string> {
    BootstrapConfig config;
    config.node = node;
    config.agent_port = agent_port;
    config.source = image;
    ASSIGN_OR_RETURN(config.enrollment, context.issue_enrollment(node));
    return AgentUserData(config);
  };
  // The bootstrap's inputs are checked before anything is made in the cloud.
  BootstrapConfig check;
  check.node = NamesForNode(spec.lease).node;
  check.agent_port = agent_port;
  check.source = image;
  RETURN_IF_ERROR(BootstrapScript(check).status());
  ASSIGN_OR_RETURN(Node node, nodes.Up(spec));
  PrintNode(node, out);
  if (!context.node_up) return Status::Ok();
  BlazarClient blazar(session, *context.clock);
  ASSIGN_OR_RETURN(Lease lease, blazar.Get(spec.lease));
  ASSIGN_OR_RETURN(std::string flavor, ReservedFlavor(session, *context.clock, lease));
  return context.node_up(NodeUp{.node = std::move(node),
                                .lease = std::move(lease),
                                .site = session.credentials().region_name,
                                .flavor = std::move(flavor)});
}

// `node down`: the controller told first (context.node_down), then the node's cloud resources
// deleted, also when the controller does not answer, which is then returned with what to rerun.
Status Down(NodeManager& nodes, const std::string& name, std::ostream& out, std::ostream& err,
            const NodeCommandContext& context) {
  Status told = context.node_down ? context.node_down(name) : Status::Ok();
  const bool unanswered =
      told.code() == StatusCode::kUnavailable || told.code() == StatusCode::kDeadlineExceeded;
  if (!told.ok() && !unanswered) return told;
  if (unanswered) {
    // The controller's words (or its gRPC library's): one line, no escapes.
    err << "llmctl node down: warning: " << OnOneLine(told.message())
        << "; deleting the node's cloud resources anyway\n";
  }
  RETURN_IF_ERROR(nodes.Down(name));
  // The name is the user's, but may be one copied from `node list`, a server's name.
  out << "node " << OnOneLine(name) << " is down\n";
  if (unanswered) {
    return Status(told.code(), "node " + name +
                                   "'s cloud resources are deleted, but the controller still "
                                   "lists it: once the controller answers, run `llmctl node "
                                   "down " +
                                   name + "` again");
  }
  return Status::Ok();
}

Status Run(const std::string& command, const NodeFlags& flags, std::ostream& out, std::ostream& err,
           const NodeCommandContext& context) {
  AgentImageSource image;
  if (command == "up") {
    ASSIGN_OR_RETURN(image, CheckUpFlags(flags, context));
  }
  ASSIGN_OR_RETURN(Credentials creds, LoadCredentials(flags.os_cloud, context.env));
  RETURN_IF_ERROR(MoveCredentialsToSite(creds, flags.site, "--site " + flags.site));
  http::ClientOptions options = context.http_options;
  if (!creds.cacert.empty()) options.ca_bundle_path = creds.cacert;
  http::HttpClient http(options);
  Session session(std::move(creds), http, *context.clock, context.session_options);
  NodeManager nodes(session, *context.clock, context.node_options,
                    // Progress quotes the cloud's names, ids and statuses.
                    [&out](const std::string& line) { out << OnOneLine(line) << "\n"; });
  if (command == "up") return Up(nodes, session, flags, image, out, context);
  if (command == "list") {
    ASSIGN_OR_RETURN(std::vector<Node> all, nodes.List());
    PrintTable(all, out);
  } else if (command == "show") {
    ASSIGN_OR_RETURN(Node node, nodes.Show(flags.name));
    PrintNode(node, out);
  } else if (command == "down") {
    return Down(nodes, flags.name, out, err, context);
  }
  return Status::Ok();
}

}  // namespace

int RunNodeCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
                   const NodeCommandContext& context) {
  CLI::App app{"GPU nodes on a Blazar lease", "llmctl node"};
  app.require_subcommand(1);
  NodeFlags flags;
  app.add_option("--os-cloud", flags.os_cloud, "cloud in clouds.yaml (default: OS_* variables)");
  app.add_option("--site", flags.site, "site (default: the credentials' region)");

  CLI::App* up = app.add_subcommand("up", "bring up (or finish bringing up) a lease's node");
  up->add_option("--lease", flags.spec.lease, "an ACTIVE lease's name or id")->required();
  up->add_option("--image", flags.spec.image, "Glance image")->default_val(flags.spec.image);
  up->add_option("--boot-volume", flags.spec.boot_volume_gb, "boot volume GiB (KVM sites)")
      ->default_val(flags.spec.boot_volume_gb);
  up->add_option("--key-name", flags.spec.key_name, "Nova key pair for SSH");
  up->add_option("--agent-port", flags.spec.agent_port, "llm-agent's TCP port")
      ->default_val(flags.spec.agent_port);
  up->add_option("--agent-image", flags.image.image, "agent image to pull, e.g. REGISTRY/IMG:TAG");
  up->add_option("--agent-git", flags.image.git_url, "git URL to build the agent image from");
  up->add_option("--agent-commit", flags.image.git_commit, "the commit to build (40 hex)");
  app.add_subcommand("list", "llmctl's nodes");
  CLI::App* show = app.add_subcommand("show", "one node");
  show->add_option("node", flags.name, "node (lease) name")->required();
  CLI::App* down = app.add_subcommand("down", "remove a node's server, volume and floating IP");
  down->add_option("node", flags.name, "node (lease) name")->required();

  if (std::optional<int> stop = ParseCommandWords(app, args, "node", out, err)) return *stop;
  if (!flags.image.image.empty() && !flags.image.git_url.empty()) {
    err << "llmctl node up: give --agent-image or --agent-git, not both\n";
    return 2;
  }
  std::string command = app.get_subcommands().front()->get_name();
  return CommandExitCode(Run(command, flags, out, err, context), "node", command, err);
}

}  // namespace llmctl::openstack
