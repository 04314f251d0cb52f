// The controller's side of a cloud node's enrollment (docs/architecture.md, "Credentials"): it
// dials the agent waiting with its one-time token (AgentEnrollment in agent.proto), hears the
// token, and hands over the node's credentials only when the token checks out.
#ifndef LLMCTL_CONTROLLER_ENROLLMENT_H_
#define LLMCTL_CONTROLLER_ENROLLMENT_H_

#include <chrono>
#include <functional>
#include <string>

#include "common/status.h"
#include "llmctl/v1/agent.pb.h"
#include "rpc/certificates.h"

namespace llmctl::controller {

// Decides on the enrollment token an agent presented: the credentials to hand it, or the refusal.
using EnrollmentDecision = std::function<StatusOr<v1::EnrollmentGrant>(const std::string& token)>;

// Dials the agent of node `node` at `address` with the controller's `identity` and runs one
// enrollment within `deadline`. OK once the agent has said it installed the grant. Unavailable or
// DeadlineExceeded while no agent answers there; PermissionDenied when the agent names another
// node; `decide`'s refusal as it is (the agent gets nothing).
Status EnrollAgent(const std::string& address, const std::string& node,
                   const rpc::TlsIdentity& identity, std::chrono::milliseconds deadline,
                   const EnrollmentDecision& decide);

// OK when the agent at `address` answers the Agent API (GetNodeInfo, within `deadline`) over
// mutual TLS under `certificate_name` with node token `token`: it holds the credentials of an
// enrollment grant. The call's error otherwise (Unavailable when the TLS handshake fails: an agent
// still waiting for enrollment serves a certificate of its own making).
Status CheckAgentHoldsGrant(const std::string& address, const std::string& certificate_name,
                            const std::string& token, const rpc::TlsIdentity& identity,
                            std::chrono::milliseconds deadline);

}  // namespace llmctl::controller

#endif  // LLMCTL_CONTROLLER_ENROLLMENT_H_
