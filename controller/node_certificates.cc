#include "controller/node_certificates.h"

#include <spdlog/spdlog.h>

#include "rpc/grpc_status.h"

namespace llmctl::controller {

namespace {

// The error a renewal ended with, the agent's code kept (PERMISSION_DENIED, ...).
Status Finished(const std::string& node, const grpc::Status& finished) {
  if (finished.ok()) {
    return UnavailableError("renew the certificate of node " + node + ": no request arrived");
  }
  return rpc::FromGrpcStatus(finished).WithContext("renew the certificate of node " + node);
}

}  // namespace

Status RecordCertificateExpiry(SecretsFile& secrets, const std::string& node,
                               const std::string& certificate_pem) {
  ASSIGN_OR_RETURN(const store::Time expiry, rpc::CertificateExpiry(certificate_pem));
  return secrets.SetNodeCertificateExpiry(node, store::UnixSeconds(expiry));
}

Status NodeCertificates::CheckUnexpired(const std::string& node, store::Time now) const {
  StatusOr<int64_t> expiry = secrets_.NodeCertificateExpiry(node);
  if (!expiry.ok() || store::UnixSeconds(now) < *expiry) return Status::Ok();
  return FailedPreconditionError("node " + node + ": its certificate expired at unix time " +
                                 std::to_string(*expiry) +
                                 " without renewal (the controller did not reach it in time); it "
                                 "is not dialled: `llmctl node down " +
                                 node + "` and register it again");
}

namespace {

// FailedPrecondition unless `dialled` is the node's current certificate name.
Status CheckSameRegistration(const SecretsFile& secrets, const std::string& node,
                             const std::string& dialled) {
  StatusOr<std::string> name = secrets.NodeCertificateName(node);
  if (!name.ok()) {
    return FailedPreconditionError("renew the certificate of node " + node +
                                   ": it has no credentials (down)");
  }
  if (*name != dialled) {
    return FailedPreconditionError("renew the certificate of node " + node +
                                   ": it was registered again since its link was dialled; not "
                                   "renewed over the old link");
  }
  return Status::Ok();
}

}  // namespace

Status NodeCertificates::RenewIfDue(const std::string& node,
                                    const std::string& dialled_certificate_name,
                                    v1::Agent::Stub& stub, store::Time now,
                                    MonotonicTime monotonic_now,
                                    std::chrono::milliseconds deadline) {
  RETURN_IF_ERROR(CheckSameRegistration(secrets_, node, dialled_certificate_name));
  StatusOr<int64_t> expiry = secrets_.NodeCertificateExpiry(node);
  const auto half = std::chrono::duration_cast<std::chrono::seconds>(kNodeCertificateLifetime / 2);
  if (expiry.ok() && *expiry - store::UnixSeconds(now) > half.count()) return Status::Ok();
  {
    MutexLock lock(mutex_);
    auto retry = retry_at_.find(node);
    if (retry != retry_at_.end() && monotonic_now < retry->second) return Status::Ok();
  }
  Status renewed = Renew(node, dialled_certificate_name, stub, now, deadline);
  MutexLock lock(mutex_);
  if (renewed.ok()) {
    retry_at_.erase(node);
  } else {
    retry_at_[node] = monotonic_now + kRenewalRetry;
  }
  return renewed;
}

Status NodeCertificates::Renew(const std::string& node, const std::string& certificate_name,
                               v1::Agent::Stub& stub, store::Time now,
                               std::chrono::milliseconds deadline) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + deadline);
  auto stream = stub.RenewCertificate(&context);
  v1::CertificateRenewal request;
  if (!stream->Read(&request)) {
    stream->WritesDone();
    return Finished(node, stream->Finish());
  }
  // Checked again once the request is here: a registration meanwhile ends the renewal.
  if (Status same = CheckSameRegistration(secrets_, node, certificate_name); !same.ok()) {
    context.TryCancel();
    return same;
  }
  StatusOr<std::string> certificate =
      ca_.SignRequest(request.request_pem(), certificate_name, now + kNodeCertificateLifetime);
  if (!certificate.ok()) {
    context.TryCancel();
    return certificate.status().WithContext("renew the certificate of node " + node);
  }
  v1::CertificateGrant grant;
  grant.set_certificate_pem(*certificate);
  v1::CertificateRenewal answer;
  const bool installed = stream->Write(grant) && stream->Read(&answer) && answer.installed();
  stream->WritesDone();
  const grpc::Status finished = stream->Finish();
  if (!finished.ok()) return Finished(node, finished);
  if (!installed) {
    return UnavailableError("renew the certificate of node " + node +
                            ": the agent did not say it installed it");
  }
  RETURN_IF_ERROR(RecordCertificateExpiry(secrets_, node, *certificate));
  spdlog::info("node {}: certificate {} renewed until unix time {}", node, certificate_name,
               store::UnixSeconds(now + kNodeCertificateLifetime));
  return Status::Ok();
}

}  // namespace llmctl::controller
