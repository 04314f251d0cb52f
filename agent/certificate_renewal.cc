#include "agent/certificate_renewal.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "common/files.h"
#include "common/logging.h"

namespace llmctl::agent {

namespace {

grpc::Status Refused(grpc::StatusCode code, const std::string& message) {
  std::cerr << LogLinePrefix(LogLevel::kWarning)
            << "llm-agent: certificate renewal refused: " << message << std::endl;
  return grpc::Status(code, "certificate renewal: " + message);
}

Status RenameKey(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return UnavailableError("cannot rename " + from + " to " + to + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace

grpc::Status CertificateRenewer::Renew(
    grpc::ServerContext& context,
    grpc::ServerReaderWriter<v1::CertificateRenewal, v1::CertificateGrant>& stream) {
  // Every node's certificate chains to the same CA: the chain alone would let another node replace
  // this one's certificate.
  if (!rpc::CallerIsController(context)) {
    return Refused(grpc::StatusCode::PERMISSION_DENIED,
                   "only the controller may renew (caller " + context.peer() + ")");
  }
  MutexLock lock(mutex_);
  StatusOr<std::string> current = ReadFileToString(files_.certificate_file, 1 << 20);
  StatusOr<std::string> name =
      current.ok() ? rpc::CertificateCommonName(*current) : StatusOr<std::string>(current.status());
  if (!name.ok()) {
    return Refused(grpc::StatusCode::FAILED_PRECONDITION,
                   files_.certificate_file + ": " + std::string(name.status().message()));
  }
  StatusOr<rpc::CertificateRequest> request = rpc::NewCertificateRequest(*name);
  if (!request.ok()) return Refused(grpc::StatusCode::INTERNAL, request.status().message());
  v1::CertificateRenewal renewal;
  renewal.set_request_pem(request->request_pem);
  v1::CertificateGrant grant;
  if (!stream.Write(renewal) || !stream.Read(&grant)) {
    return Refused(grpc::StatusCode::CANCELLED, "no certificate arrived");
  }
  if (Status installed = Install(*name, grant.certificate_pem(), request->private_key_pem);
      !installed.ok()) {
    return Refused(grpc::StatusCode::INVALID_ARGUMENT, installed.message());
  }
  v1::CertificateRenewal answer;
  answer.set_installed(true);
  stream.Write(answer);
  StatusOr<std::chrono::system_clock::time_point> expiry =
      rpc::CertificateExpiry(grant.certificate_pem());
  std::cerr << LogLinePrefix(LogLevel::kInfo) << "llm-agent: certificate " << *name
            << " renewed in " << files_.certificate_file
            << (expiry.ok() ? ", valid until unix time " +
                                  std::to_string(std::chrono::system_clock::to_time_t(*expiry))
                            : std::string())
            << std::endl;
  return grpc::Status::OK;
}

Status CertificateRenewer::Install(const std::string& name, const std::string& certificate_pem,
                                   const std::string& private_key_pem) {
  ASSIGN_OR_RETURN(const std::string ca_pem, ReadFileToString(files_.ca_file, 1 << 20));
  RETURN_IF_ERROR(rpc::CheckIssuedCertificate(ca_pem, certificate_pem, private_key_pem));
  ASSIGN_OR_RETURN(const std::string granted_name, rpc::CertificateCommonName(certificate_pem));
  if (granted_name != name) {
    return InvalidArgumentError("the certificate names " + granted_name + ", not " + name);
  }
  const std::string next_key = NextKeyFile(files_);
  RETURN_IF_ERROR(rpc::WriteSecretFile(next_key, private_key_pem, 0600));
  RETURN_IF_ERROR(rpc::WriteSecretFile(files_.certificate_file, certificate_pem, 0600));
  return RenameKey(next_key, files_.private_key_file);
}

std::string NextKeyFile(const rpc::IdentityFiles& files) {
  return files.private_key_file + ".next";
}

Status FinishInterruptedRenewal(const rpc::IdentityFiles& files) {
  const std::string next_key = NextKeyFile(files);
  std::error_code error;
  const bool interrupted = std::filesystem::exists(next_key, error);
  if (error) return UnavailableError("cannot look up " + next_key + ": " + error.message());
  if (!interrupted) return Status::Ok();
  if (rpc::LoadTlsIdentity(files.ca_file, files.certificate_file, next_key).ok()) {
    std::cerr << LogLinePrefix(LogLevel::kWarning)
              << "llm-agent: finishing a certificate renewal: " << next_key << " becomes "
              << files.private_key_file << std::endl;
    return RenameKey(next_key, files.private_key_file);
  }
  if (!std::filesystem::remove(next_key, error) && error) {
    return UnavailableError("cannot remove " + next_key + ": " + error.message());
  }
  return Status::Ok();
}

}  // namespace llmctl::agent
