// `llmctl node up|list|show|down`: the CLI's node commands, callable from the llmctl binary (and
// tests) without a process of their own.
#ifndef LLMCTL_CONTROLLER_OPENSTACK_NODE_CLI_H_
#define LLMCTL_CONTROLLER_OPENSTACK_NODE_CLI_H_

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "common/http/http_client.h"
#include "common/status.h"
#include "controller/openstack/blazar.h"
#include "controller/openstack/cloud_clock.h"
#include "controller/openstack/credentials.h"
#include "controller/openstack/nodes.h"
#include "controller/openstack/session.h"
#include "controller/openstack/user_data.h"

namespace llmctl::openstack {

// What `node up` brought up, for the controller to dial and to watch the lease of.
struct NodeUp {
  Node node;
  Lease lease;
  std::string site;    // the credentials' region, e.g. KVM@TACC
  std::string flavor;  // the reserved flavor's name ("" for a bare-metal reservation)
};

// Everything the commands take from outside their arguments; the defaults are the real world.
struct NodeCommandContext {
  EnvLookup env = ProcessEnvironment();
  CloudClock* clock = &SystemCloudClock();
  http::ClientOptions http_options;
  SessionOptions session_options;
  NodeOptions node_options;
  // The controller's: the CA certificate and a one-time enrollment token for the node (RegisterNode
  // with `enroll`). Called only when a server is about to be created. Unset: `node up` refuses to
  // boot a server.
  std::function<StatusOr<NodeEnrollment>(const std::string& node)> issue_enrollment;
  // Called once `node up` has the node's floating IP (the caller enrolls the node's agent and waits
  // for it to answer); its error fails the command (the node stays
  // up; rerunning `node up` finishes). Unset: nothing is told.
  std::function<Status(const NodeUp& up)> node_up;
  // Called by `node down` before anything is deleted, so that the controller forgets the node and
  // places no new trial there. Unavailable or DeadlineExceeded (the controller does not answer):
  // `node down` warns, deletes the cloud resources anyway and then fails with that status (exit 3:
  // run it again once the controller answers); any other error stops it before anything is deleted.
  // Unset: nothing is told.
  std::function<Status(const std::string& node)> node_down;
  // Used when `node up` names neither --agent-image nor --agent-git (the controller's config).
  AgentImageSource default_agent_image;
};

// Runs one node command; `args` are the words after "node". Progress, tables and results go to
// `out`, errors and warnings (one line each) to `err`. Returns the exit code (CommandExitCode): 0
// done, 1 the cloud refused or failed, 2 bad usage or input, 3 the controller (or the cloud) did
// not answer.
//
//   node up --lease NAME [--image CC-Ubuntu24.04-CUDA] [--boot-volume 200] [--key-name K]
//           [--agent-port 7443] [--agent-image REF | --agent-git URL --agent-commit SHA]
//   node list | show NAME | down NAME                       (all: [--site S] [--os-cloud C])
int RunNodeCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
                   const NodeCommandContext& context = {});

}  // namespace llmctl::openstack

#endif  // LLMCTL_CONTROLLER_OPENSTACK_NODE_CLI_H_
