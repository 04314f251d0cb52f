// The CLI's side of the Controller service: channels and the calls' deadlines (statuses convert
// with rpc/grpc_status.h).
#ifndef LLMCTL_CONTROLLER_CLI_CLIENT_H_
#define LLMCTL_CONTROLLER_CLI_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"
#include "llmctl/v1/controller.grpc.pb.h"
#include "rpc/version_check.h"

namespace llmctl::cli {

// Deadline of every unary call. Streams differ: watch has none, an upload gets this plus its size
// at the minimum transfer rate, and fetch is abandoned after this long without a chunk
// (rpc/transfer.h).
inline constexpr std::chrono::seconds kCallDeadline{60};

// A channel to the controller at `target` ("unix:/path" or "host:port"). The CLI API is served on a
// unix socket or on localhost (see controller/), so the channel carries no TLS; a non-empty
// `token` (the controller's API token, which a TCP listener requires) goes with every call as
// "authorization: Bearer <token>". Every call says this llmctl's version, and one answered by a
// controller of another version fails FAILED_PRECONDITION naming both (rpc/version_check.h).
std::shared_ptr<grpc::Channel> OpenControllerChannel(const std::string& target,
                                                     const std::string& token = "");

// The same, for waiting on a controller that is starting: a failed connection is tried again after
// `retry`, not after gRPC's reconnect backoff (1 s growing 1.6 times per failure), so that the
// first call after the socket appears is not held up by the refusals before it. The version is
// said and checked as above; `hint` says whether a refusal of the controller's version says how to
// stop an embedded llmctld (kLeaveOut for one that llmctl started and stops itself).
std::shared_ptr<grpc::Channel> OpenStartingControllerChannel(const std::string& target,
                                                             std::chrono::milliseconds retry,
                                                             rpc::EmbeddedHint hint);

// A context whose deadline is kCallDeadline from now.
std::unique_ptr<grpc::ClientContext> UnaryContext();

// The controller's node `name` as ListNodes shows it, asked under `context`; NotFound when it is
// not listed, the call's own status when it fails.
StatusOr<v1::NodeStatus> ListedNode(v1::Controller::Stub& stub, const std::string& name,
                                    grpc::ClientContext& context);

// Whether the controller reaches `node`'s agent: connected, or unusable (its agent answers, and
// says why it takes no trial).
bool AgentAnswers(const v1::NodeStatus& node);

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_CLIENT_H_
