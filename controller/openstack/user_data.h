// Bootstrap of a GPU node through cloud-init: the user data that installs Docker and the NVIDIA
// container toolkit, writes the agent's certificate, key, CA and token, and starts llm-agent in a
// container with every GPU.
#ifndef LLMCTL_CONTROLLER_OPENSTACK_USER_DATA_H_
#define LLMCTL_CONTROLLER_OPENSTACK_USER_DATA_H_

#include <cstddef>
#include <string>

#include "common/status.h"

namespace llmctl::openstack {

// What the controller issues for one node (rpc::CertificateAuthority, the node's token). Secret:
// these values appear in the user data and nowhere else, never in a message.
struct AgentSecrets {
  std::string ca_pem;           // the controller's CA certificate
  std::string certificate_pem;  // for agent-<node>.llmctl
  std::string private_key_pem;
  std::string token;
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
  AgentSecrets secrets;
};

// cloud-init's limit on user data, which Nova's 65535 base64 bytes also imply.
inline constexpr size_t kMaxUserDataBytes = 64 * 1024;

// Where the bootstrap writes its files on the node (deploy/llm-agent.service reads the same).
inline constexpr char kNodeConfigDir[] = "/etc/llmctl";

// The shell script the user data runs (no secrets in it: it reads them from files).
// InvalidArgument naming the field when the node name, port or image source is unusable.
StatusOr<std::string> BootstrapScript(const BootstrapConfig& config);

// "#cloud-config" with write_files (secrets 0600 in /etc/llmctl, the script 0700) and runcmd.
// InvalidArgument naming the field (never its value when it is a secret) when an input is not
// what it should be, or when the result is over kMaxUserDataBytes.
StatusOr<std::string> AgentUserData(const BootstrapConfig& config);

}  // namespace llmctl::openstack

#endif  // LLMCTL_CONTROLLER_OPENSTACK_USER_DATA_H_
