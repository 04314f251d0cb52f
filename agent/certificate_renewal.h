// The agent's side of certificate renewal (Agent.RenewCertificate; docs/architecture.md,
// "Credentials"): the controller dials the agent, the agent makes a new key and a CSR, the
// controller's CA signs it, and the agent replaces the files it serves from.
#ifndef LLMCTL_AGENT_CERTIFICATE_RENEWAL_H_
#define LLMCTL_AGENT_CERTIFICATE_RENEWAL_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/sync_stream.h>

#include <string>

#include "common/mutex.h"
#include "common/status.h"
#include "llmctl/v1/agent.grpc.pb.h"
#include "rpc/tls.h"

namespace llmctl::agent {

// The key file's companion while a renewal replaces the pair.
std::string NextKeyFile(const rpc::IdentityFiles& files);

// At the agent's start: when a renewal stopped between its renames, puts `<key>.next` in place if
// it is the certificate's key, else removes it (the renewal stopped before the certificate was
// replaced, and the old pair stands).
Status FinishInterruptedRenewal(const rpc::IdentityFiles& files);

class CertificateRenewer {
 public:
  // `files`: the identity the agent serves (rpc::WatchedServerCredentials), which a renewal
  // replaces.
  explicit CertificateRenewer(rpc::IdentityFiles files) : files_(std::move(files)) {}

  // One renewal over `stream`, as agent.proto's RenewCertificate describes it. The new key goes to
  // `<key file>.next` first, then the certificate replaces its file, then the key replaces its
  // own (each a rename): a crash in between is finished by FinishInterruptedRenewal.
  grpc::Status Renew(grpc::ServerContext& context,
                     grpc::ServerReaderWriter<v1::CertificateRenewal, v1::CertificateGrant>& stream)
      LLMCTL_EXCLUDES(mutex_);

 private:
  // Checks `certificate_pem` (the CA's, the key's, named `name`) and writes the pair.
  Status Install(const std::string& name, const std::string& certificate_pem,
                 const std::string& private_key_pem);

  const rpc::IdentityFiles files_;
  // One renewal at a time: the two files are replaced as a pair.
  Mutex mutex_;
};

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_CERTIFICATE_RENEWAL_H_
