// Mutual TLS and per-node tokens for the controller <-> agent link: gRPC's channel and server
// credentials made from the certificates of rpc/certificates.h, and the bearer token.
//
// Each side checks the other's certificate against a fixed name (AgentCertificateName,
// kControllerCertificateName), not the address it dials. On top of TLS, every call carries
// "authorization: Bearer <token>"; the server compares it in constant time and answers
// UNAUTHENTICATED to anything else. The token is never logged nor put in a message.
#ifndef LLMCTL_RPC_TLS_H_
#define LLMCTL_RPC_TLS_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "rpc/certificates.h"

namespace llmctl::rpc {

// Server side: presents `identity`'s certificate, requires a client certificate that chains to
// `identity.ca_pem`, and refuses calls whose bearer token is not `token` with UNAUTHENTICATED.
// `token` must not be empty.
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const TlsIdentity& identity,
                                                           const std::string& token);

// Where an agent keeps its identity: the files it serves from and a renewal replaces.
struct IdentityFiles {
  std::string ca_file;
  std::string certificate_file;
  std::string private_key_file;
};

// ServerCredentials read from `files`, and read again every `refresh` (gRPC's
// FileWatcherCertificateProvider): a renewal that replaces the files changes the certificate new
// connections see, while the connections open keep theirs. Check the files first (LoadTlsIdentity):
// gRPC only logs a file it cannot read.
std::shared_ptr<grpc::ServerCredentials> WatchedServerCredentials(const IdentityFiles& files,
                                                                  const std::string& token,
                                                                  std::chrono::seconds refresh);

// Client side: presents `identity`'s certificate, trusts only servers whose certificate chains to
// `identity.ca_pem`, and sends `token` as "authorization: Bearer <token>" on every call.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const TlsIdentity& identity,
                                                             const std::string& token);

// A channel to `address` ("unix:/path", "host:port") that checks the server's certificate against
// `target_name` (e.g. AgentCertificateName("node1")) instead of the address.
std::shared_ptr<grpc::Channel> Dial(const std::string& address, const std::string& target_name,
                                    const std::shared_ptr<grpc::ChannelCredentials>& credentials);

// Enrollment (a cloud node's first contact, before it has credentials; docs/architecture.md,
// "Credentials"). The agent serves AgentEnrollment under a certificate it made for itself; the
// controller, which cannot check that certificate, believes the enrollment token the agent
// presents, and the agent, which can check the controller's, shows its token to nobody else. The
// agent's certificate is SelfSignedIdentity's (rpc/certificates.h).

// Server side of enrollment: presents `identity`'s certificate and takes only calls whose client
// certificate chains to `identity.ca_pem`; no token.
std::shared_ptr<grpc::ServerCredentials> EnrollmentServerCredentials(const TlsIdentity& identity);

// True when the call's client certificate names kControllerCertificateName (every agent's
// certificate chains to the same CA, so the chain alone does not say it is the controller).
bool CallerIsController(const grpc::ServerContext& context);

// Client side of enrollment: presents `identity`'s certificate and encrypts, but does not check
// the server's certificate (the agent made it itself).
std::shared_ptr<grpc::ChannelCredentials> EnrollmentChannelCredentials(const TlsIdentity& identity);

// Compares two secrets in constant time (their sha256 digests with CRYPTO_memcmp): the time taken
// says nothing about either, not even their lengths.
bool SameSecret(std::string_view presented, std::string_view expected);

// The one check of a bearer token, for the agents' AuthMetadataProcessor and the controller's API:
// OK when one "authorization" entry of `metadata` is "Bearer <token>" (compared in constant time),
// else UNAUTHENTICATED ("missing bearer token" / "invalid bearer token"; never the token).
// `token` must not be empty.
grpc::Status CheckBearerToken(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                              std::string_view token);

// Sends "authorization: Bearer <token>" on every call of a channel without TLS (gRPC attaches
// call credentials only to secure channels): for the CLI's TCP channel to the controller.
std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface> BearerTokenInterceptor(
    std::string token);

// Reads a token file: its content without surrounding white space. InvalidArgument when it is
// empty, and PermissionDenied when the group or others may read it (a secret belongs in a 0600
// file); the messages name the file, never the token.
StatusOr<std::string> ReadTokenFile(const std::string& path);

}  // namespace llmctl::rpc

#endif  // LLMCTL_RPC_TLS_H_
