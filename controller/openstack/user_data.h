// Bootstrap of a GPU node through cloud-init: the user data that installs Docker and the NVIDIA
// container toolkit, writes the controller's CA certificate and the node's one-time enrollment
// token, and starts llm-agent in a container with every GPU, where it waits for the controller to
// enroll it (agent/enrollment.h). User data stays readable from the metadata service by any
// process on the node, so it carries no credential that works after the enrollment.
#ifndef LLMCTL_CONTROLLER_OPENSTACK_USER_DATA_H_
#define LLMCTL_CONTROLLER_OPENSTACK_USER_DATA_H_

#include <cstddef>
#include <string>

#include "common/status.h"

namespace llmctl::openstack {

// What the controller issues for one node's enrollment (RegisterNode with `enroll`). The token is
// a secret until it is used (once, within the hour): it appears in the user data and nowhere
// else, never in a message.
struct NodeEnrollment {
  std::string ca_pem;  // the controller's CA certificate (public)
  std::string enrollment_token;
};

// Where the agent's image comes from: exactly one of `image` (pulled from a registry) and
// `git_url` + `git_commit` (a 40-hex commit, built on the node with deploy/Dockerfile).
struct AgentImageSource {
  std::string image;  // e.g. ghcr.io/org/llmctl-agent:1.2.0
  std::string git_url;
  std::string git_commit;
};

struct BootstrapConfig {
  std::string node;  // llm-agent's --node
  int agent_port = 7443;
  AgentImageSource source;
  NodeEnrollment enrollment;
};

// cloud-init's limit on user data, which Nova's 65535 base64 bytes also imply.
inline constexpr size_t kMaxUserDataBytes = 64 * 1024;

// Where the bootstrap writes its files on the node: the CA certificate and the enrollment token.
inline constexpr char kNodeConfigDir[] = "/etc/llmctl";
// Where the agent keeps the credentials the enrollment brings (0600 files, the directory 0700),
// in its data directory, the one the container may write.
inline constexpr char kNodeCredentialsDir[] = "/var/lib/llmctl/credentials";

// The shell script the user data runs (no secrets in it: it reads them from files).
// InvalidArgument naming the field when the node name, port or image source is unusable.
StatusOr<std::string> BootstrapScript(const BootstrapConfig& config);

// "#cloud-config" with write_files (the CA certificate and enrollment token 0600 in /etc/llmctl,
// the script 0700) and runcmd.
// InvalidArgument naming the field (never its value when it is a secret) when an input is not
// what it should be, or when the result is over kMaxUserDataBytes.
StatusOr<std::string> AgentUserData(const BootstrapConfig& config);

}  // namespace llmctl::openstack

#endif  // LLMCTL_CONTROLLER_OPENSTACK_USER_DATA_H_
