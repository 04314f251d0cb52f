// llm-agent's first start on a cloud node (docs/architecture.md, "Credentials"): its user data
// holds only the CA certificate and a one-time enrollment token, so it serves AgentEnrollment
// (proto/llmctl/v1/agent.proto) until the controller has handed it its certificate, key and token,
// keeps those in 0600 files, and then starts the Agent service with them.
#ifndef LLMCTL_AGENT_ENROLLMENT_H_
#define LLMCTL_AGENT_ENROLLMENT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "common/status.h"

namespace llmctl::agent {

struct EnrollmentOptions {
  std::string listen;  // as AgentOptions::listen
  std::string node;
  std::string ca_pem;            // the controller's CA: the caller must hold its controller.llmctl
  std::string enrollment_token;  // shown to the controller only
  // Where the credentials go (0600; their directories are made 0700 when missing, and one that is
  // there must be a directory of this user's, not a link: EnsureOwnDirectory,
  // OthersMay::kAnything). The token file is written last: its presence says the node is enrolled
  // (Enrolled below).
  std::string certificate_file;
  std::string private_key_file;
  std::string token_file;
};

// True when `token_file` exists: an earlier start enrolled the node.
bool Enrolled(const std::string& token_file);

class EnrollmentService;

class EnrollmentServer {
 public:
  // Serves AgentEnrollment on options.listen under a certificate made for the purpose.
  // Unavailable when the address cannot be bound.
  static StatusOr<std::unique_ptr<EnrollmentServer>> Start(EnrollmentOptions options);
  ~EnrollmentServer();
  EnrollmentServer(const EnrollmentServer&) = delete;
  EnrollmentServer& operator=(const EnrollmentServer&) = delete;

  const std::string& address() const { return address_; }
  // Whether the credentials have been written; then the server takes no more calls.
  bool done() const;
  // Stops serving and frees the address (for the Agent service that follows).
  void Shutdown();

 private:
  EnrollmentServer() = default;
  std::unique_ptr<EnrollmentService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_ENROLLMENT_H_
