#include "controller/enrollment.h"

#include <grpcpp/grpcpp.h>

#include "llmctl/v1/agent.grpc.pb.h"
#include "rpc/connection.h"
#include "rpc/grpc_status.h"
#include "rpc/tls.h"

namespace llmctl::controller {
namespace {

// The call's end as the reason `what` did not happen (Unavailable when gRPC says nothing worse).
Status Ended(grpc::ClientReaderWriter<v1::EnrollmentGrant, v1::EnrollmentOffer>& stream,
             const std::string& what) {
  const Status finished = rpc::FromGrpcStatus(stream.Finish());
  if (finished.ok()) return UnavailableError(what);
  return Status(finished.code(), what + ": " + std::string(finished.message()));
}

}  // namespace

Status EnrollAgent(const std::string& address, const std::string& node,
                   const rpc::TlsIdentity& identity, std::chrono::milliseconds deadline,
                   const EnrollmentDecision& decide) {
  // The name is not checked (the agent made its certificate itself); naming it keeps gRPC from
  // comparing the certificate with the address.
  grpc::ChannelArguments arguments;
  arguments.SetSslTargetNameOverride(rpc::EnrollmentCertificateName(node));
  auto stub = v1::AgentEnrollment::NewStub(grpc::CreateCustomChannel(
      rpc::GrpcAddress(address), rpc::EnrollmentChannelCredentials(identity), arguments));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + deadline);
  auto stream = stub->Enroll(&context);
  v1::EnrollmentOffer offer;
  if (!stream->Read(&offer)) return Ended(*stream, "no agent waits for enrollment at " + address);
  if (offer.node() != node) {
    context.TryCancel();
    return Status(StatusCode::kPermissionDenied, "the agent at " + address + " is node '" +
                                                     offer.node() + "', not '" + node + "'");
  }
  StatusOr<v1::EnrollmentGrant> grant = decide(offer.enrollment_token());
  if (!grant.ok()) {
    // The agent sees its call cancelled and keeps waiting; it learns nothing of why.
    context.TryCancel();
    return grant.status();
  }
  if (!stream->Write(*grant) || !stream->WritesDone() || !stream->Read(&offer) ||
      !offer.installed()) {
    return Ended(*stream, "node '" + node + "' at " + address + " did not install its credentials");
  }
  return rpc::FromGrpcStatus(stream->Finish());
}

Status CheckAgentHoldsGrant(const std::string& address, const std::string& certificate_name,
                            const std::string& token, const rpc::TlsIdentity& identity,
                            std::chrono::milliseconds deadline) {
  auto stub = v1::Agent::NewStub(
      rpc::Dial(address, certificate_name, rpc::ChannelCredentials(identity, token)));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + deadline);
  v1::NodeInfo info;
  return rpc::FromGrpcStatus(stub->GetNodeInfo(&context, {}, &info));
}

}  // namespace llmctl::controller
