// Mutual TLS and per-node tokens for the controller <-> agent link.
//
// The controller owns a certificate authority; every agent gets a certificate for the fixed name
// agent-<node>.llmctl and the controller one for controller.llmctl, so an agent's floating IP need
// not be known when its certificate is made: the controller dials any address (an IP, a unix
// socket) and checks the name. On top of TLS, every call carries "authorization: Bearer <token>";
// the server compares it in constant time and answers UNAUTHENTICATED to anything else. The token
// is never logged nor put in a message.
#ifndef LLMCTL_RPC_TLS_H_
#define LLMCTL_RPC_TLS_H_

#include <grpcpp/grpcpp.h>
#include <openssl/types.h>
#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace llmctl::rpc {

// PEM texts: the CA certificate that the peer's certificate must chain to, this side's
// certificate and its private key.
struct TlsIdentity {
  std::string ca_pem;
  std::string certificate_pem;
  std::string private_key_pem;
};

// Reads the three PEM files and checks that each parses and that the key belongs to the
// certificate. InvalidArgument / NotFound messages name the file.
StatusOr<TlsIdentity> LoadTlsIdentity(const std::string& ca_file,
                                      const std::string& certificate_file,
                                      const std::string& private_key_file);

// InvalidArgument when a PEM text does not parse, the key is not the certificate's, or the
// certificate is not signed by `ca_pem`'s key: what an agent checks of credentials it is handed.
Status CheckIssuedCertificate(const std::string& ca_pem, const std::string& certificate_pem,
                              const std::string& private_key_pem);

struct IssuedCertificate {
  std::string certificate_pem;
  std::string private_key_pem;
};

// A certificate signing request and the new key it was made with: the agent's side of a renewal,
// so that the key never leaves the node.
struct CertificateRequest {
  std::string request_pem;
  std::string private_key_pem;
};

// A new EC P-256 key and a CSR for `common_name`, signed with that key.
StatusOr<CertificateRequest> NewCertificateRequest(const std::string& common_name);

// When the PEM certificate stops being valid (its notAfter). InvalidArgument when it does not
// parse.
StatusOr<std::chrono::system_clock::time_point> CertificateExpiry(
    const std::string& certificate_pem);
// The certificate's subject common name. InvalidArgument when it does not parse or has none.
StatusOr<std::string> CertificateCommonName(const std::string& certificate_pem);

// An EC P-256 certificate authority kept in a directory (ca.key 0600, ca.crt; the directory 0700).
class CertificateAuthority {
 public:
  // Creates the directory, key and self-signed certificate on first use and loads them afterwards.
  // FailedPrecondition when only one of the two files exists or the key does not match the
  // certificate; InvalidArgument when a file does not parse.
  static StatusOr<std::unique_ptr<CertificateAuthority>> LoadOrCreate(const std::string& dir);
  ~CertificateAuthority();
  CertificateAuthority(const CertificateAuthority&) = delete;
  CertificateAuthority& operator=(const CertificateAuthority&) = delete;

  // A new key and a certificate signed by this CA whose subject CN and DNS subjectAltName are
  // `common_name` ("agent-node1.llmctl", "controller.llmctl"), usable for TLS server and client
  // authentication, valid from an hour ago (clock skew) for `validity_days`, with a random serial.
  StatusOr<IssuedCertificate> Issue(const std::string& common_name, int validity_days) const;

  // A certificate like Issue's for the key of `request_pem` (a CSR, whose signature must verify
  // with that key), valid from an hour ago until `not_after`. The name is `common_name`, whatever
  // the request asks for: the controller decides what a node is called. InvalidArgument for a
  // request that does not parse or verify, or a `not_after` not later than an hour ago.
  StatusOr<std::string> SignRequest(const std::string& request_pem, const std::string& common_name,
                                    std::chrono::system_clock::time_point not_after) const;

  const std::string& ca_certificate_pem() const { return ca_certificate_pem_; }

 private:
  struct Keys;
  // Issue's and SignRequest's certificate for `key` (an EVP_PKEY), in PEM.
  StatusOr<std::string> SignLeaf(const std::string& common_name, EVP_PKEY* key,
                                 std::chrono::system_clock::time_point not_after) const;
  explicit CertificateAuthority(std::unique_ptr<Keys> keys, std::string ca_certificate_pem);
  std::unique_ptr<Keys> keys_;  // constant after construction
  std::string ca_certificate_pem_;
};

// The name in an agent's certificate: "agent-<node>.llmctl".
std::string AgentCertificateName(const std::string& node);
// The name in the certificate of one registration of a node: "agent-<node>.<registration>.llmctl".
// The controller dials a node under its latest registration's name, so the certificate of an
// earlier registration of the same node name (revoked by `node down`) does not pass for it.
std::string AgentCertificateName(const std::string& node, const std::string& registration);
inline constexpr char kControllerCertificateName[] = "controller.llmctl";
// The name in the certificate an agent waiting for enrollment makes for itself:
// "enroll-<node>.llmctl".
std::string EnrollmentCertificateName(const std::string& node);

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
// presents, and the agent, which can check the controller's, shows its token to nobody else.

// A new key and a self-signed certificate for `common_name`, valid for `validity_days`; clients
// must chain to `ca_pem`.
StatusOr<TlsIdentity> SelfSignedIdentity(const std::string& common_name, std::string ca_pem,
                                         int validity_days);

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

// Writes `text` to `path` atomically (WriteFileAtomically), its mode narrowed to `mode` before the
// first byte is written.
Status WriteSecretFile(const std::string& path, const std::string& text, mode_t mode);

// Reads a token file: its content without surrounding white space. InvalidArgument when it is
// empty, and PermissionDenied when the group or others may read it (a secret belongs in a 0600
// file); the messages name the file, never the token.
StatusOr<std::string> ReadTokenFile(const std::string& path);

}  // namespace llmctl::rpc

#endif  // LLMCTL_RPC_TLS_H_
