#include "controller/cli/client.h"

#include "common/text.h"
#include "common/version.h"
#include "rpc/connection.h"
#include "rpc/grpc_status.h"
#include "rpc/tls.h"

namespace llmctl::cli {

std::shared_ptr<grpc::Channel> OpenControllerChannel(const std::string& target,
                                                     const std::string& token) {
  grpc::ChannelArguments arguments;
  // Uploads send 1 MiB chunks; reports and artifacts may come back larger than gRPC's 4 MiB
  // default.
  arguments.SetMaxReceiveMessageSize(64 << 20);
  // `watch` on a controller that went away without closing ends instead of waiting for ever.
  rpc::SetClientKeepalive(arguments);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(rpc::VersionInterceptor(std::string(kVersion)));
  if (!token.empty()) interceptors.push_back(rpc::BearerTokenInterceptor(token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      rpc::GrpcAddress(target), grpc::InsecureChannelCredentials(), arguments,
      std::move(interceptors));
}

std::shared_ptr<grpc::Channel> OpenStartingControllerChannel(const std::string& target,
                                                             std::chrono::milliseconds retry,
                                                             rpc::EmbeddedHint hint) {
  grpc::ChannelArguments arguments;
  const int retry_ms = static_cast<int>(retry.count());
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, retry_ms);
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, retry_ms);
  // Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC also takes it as the connect timeout, and a
  // handshake cut at `retry` never completes on a loaded machine.
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(rpc::VersionInterceptor(std::string(kVersion), hint));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      rpc::GrpcAddress(target), grpc::InsecureChannelCredentials(), arguments,
      std::move(interceptors));
}

std::unique_ptr<grpc::ClientContext> UnaryContext() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + kCallDeadline);
  return context;
}

StatusOr<v1::NodeStatus> ListedNode(v1::Controller::Stub& stub, const std::string& name,
                                    grpc::ClientContext& context) {
  v1::ListNodesResponse nodes;
  RETURN_IF_ERROR(rpc::FromGrpcStatus(stub.ListNodes(&context, v1::ListNodesRequest(), &nodes)));
  for (v1::NodeStatus& node : *nodes.mutable_nodes()) {
    if (node.name() == name) return std::move(node);
  }
  return NotFoundError("no node named " + OnOneLine(name) + " is listed (llmctl nodes)");
}

bool AgentAnswers(const v1::NodeStatus& node) {
  return node.state() == "connected" || node.state() == "unusable";
}

}  // namespace llmctl::cli
