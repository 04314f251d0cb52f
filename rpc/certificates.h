// X.509 for the controller <-> agent link: the certificate authority, the certificates it issues
// and the requests they renew from, the names in them, and the PEM identity files each side loads.
//
// The controller owns a certificate authority; every agent gets a certificate for the fixed name
// agent-<node>.llmctl and the controller one for controller.llmctl, so an agent's floating IP need
// not be known when its certificate is made: the controller dials any address (an IP, a unix
// socket) and checks the name (rpc/tls.h makes the credentials that do).
#ifndef LLMCTL_RPC_CERTIFICATES_H_
#define LLMCTL_RPC_CERTIFICATES_H_

#include <openssl/types.h>
#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>

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
  // FailedPrecondition when the directory cannot be made, or is there but not one of this user's
  // that no one else may enter (EnsureOwnDirectory, OthersMay::kNothing: never narrowed), when only
  // one of the two files exists or the key does not match the certificate; InvalidArgument when a
  // file does not parse.
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

// Enrollment (rpc/tls.h): a new key and a self-signed certificate for `common_name`, valid for
// `validity_days`; clients must chain to `ca_pem`.
StatusOr<TlsIdentity> SelfSignedIdentity(const std::string& common_name, std::string ca_pem,
                                         int validity_days);

// Writes `text` to `path` atomically (WriteFileAtomically), its mode narrowed to `mode` before the
// first byte is written.
Status WriteSecretFile(const std::string& path, const std::string& text, mode_t mode);

}  // namespace llmctl::rpc

#endif  // LLMCTL_RPC_CERTIFICATES_H_
