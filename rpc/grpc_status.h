// llmctl::Status <-> grpc::Status. The codes are the same numbers (both are gRPC's codes), so a
// code travels unchanged from SQLite or a parser through gRPC to the CLI.
#ifndef LLMCTL_RPC_GRPC_STATUS_H_
#define LLMCTL_RPC_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "common/status.h"

namespace llmctl::rpc {

inline grpc::Status ToGrpcStatus(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), status.message());
}

inline Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return Status::Ok();
  return Status(static_cast<StatusCode>(status.error_code()), status.error_message());
}

}  // namespace llmctl::rpc

#endif  // LLMCTL_RPC_GRPC_STATUS_H_
