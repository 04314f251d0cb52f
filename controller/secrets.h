// The controller's secrets file, DATA/secrets.json (mode 0600, replaced atomically on every
// change): each node's token, the name in its current certificate (the one the controller
// dials it under) and that certificate's expiry, and each pending enrollment (a cloud node's
// one-time token, as its sha256 only, with its expiry, and the credentials last sent to its
// agent). The database holds only references to entries here.
#ifndef LLMCTL_CONTROLLER_SECRETS_H_
#define LLMCTL_CONTROLLER_SECRETS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "common/mutex.h"
#include "common/status.h"

namespace llmctl::controller {

// `bytes` random bytes (OpenSSL's CSPRNG) as 2 * `bytes` hex digits.
StatusOr<std::string> RandomHex(size_t bytes);
// 32 random bytes as 64 hex digits.
StatusOr<std::string> NewNodeToken();

// Thread-safe.
class SecretsFile {
 public:
  // Reads `path` when it exists (DataLoss when it is damaged; FailedPrecondition when its mode
  // lets anyone but the owner read it), else starts empty and creates it on the first change.
  static StatusOr<std::unique_ptr<SecretsFile>> Open(std::string path);

  // Stores the node's token and its certificate's name (replacing older ones; an empty name is
  // none), drops its pending enrollment, if any, and rewrites the file before returning.
  Status PutNodeToken(std::string_view node, std::string_view token,
                      std::string_view certificate_name = "");
  // Forgets the node's token, certificate name and expiry, and pending enrollment (nothing to do
  // when it has none) and rewrites the file before returning: the controller can no longer present
  // the token to the node's agent, nor accept the certificate's name for any later node of the same
  // name.
  Status RemoveNodeToken(std::string_view node);
  // NotFound when the node has no token.
  StatusOr<std::string> NodeToken(std::string_view node) const;
  // The name the node's certificate must carry when the controller dials it: its current
  // registration's (rpc::AgentCertificateName(node, registration)), or for a node registered
  // before these names were kept, rpc::AgentCertificateName(node). NotFound when the node has no
  // token.
  StatusOr<std::string> NodeCertificateName(std::string_view node) const;

  // When the node's current certificate expires (unix seconds; kept so that a node whose
  // certificate expired while the controller was down is reported, not dialled in vain).
  // SetNodeCertificateExpiry: NotFound when the node has no token (it is down: nothing to renew).
  // NodeCertificateExpiry: NotFound when no expiry is known (a node registered before they were
  // kept) or the node has no token.
  Status SetNodeCertificateExpiry(std::string_view node, int64_t expires_unix);
  StatusOr<int64_t> NodeCertificateExpiry(std::string_view node) const;

  // Stores a one-time enrollment token for the node (its sha256, not the token), valid until
  // `expires_unix`, for the certificate name the node is then issued under; replaces an earlier
  // one. Rewrites the file before returning.
  Status PutEnrollment(std::string_view node, std::string_view token, int64_t expires_unix,
                       std::string_view certificate_name);
  // The certificate name of the node's pending enrollment when `token` is its token and it has not
  // expired at `now_unix`. PermissionDenied for a wrong token or a node already enrolled (a token
  // works once); Unauthenticated for an expired one; FailedPrecondition when the node has none.
  StatusOr<std::string> CheckEnrollment(std::string_view node, std::string_view token,
                                        int64_t now_unix) const;
  // Whether the node has an enrollment pending.
  bool HasEnrollment(std::string_view node) const;
  // Ends the node's enrollment: its token becomes `token` under the pending certificate name, and
  // the enrollment token is dropped, all in one rewrite. FailedPrecondition when none is pending.
  Status CompleteEnrollment(std::string_view node, std::string_view token);

  // The credentials last sent to the agent of a pending enrollment, kept from before they are sent
  // until the enrollment completes: an agent that installed them while its answer was lost serves
  // the Agent API with them and never enrolls again, and is recognised by them instead.
  struct SentGrant {
    std::string token;
    std::string certificate_pem;
    std::string certificate_name;  // the pending enrollment's
  };
  // Keeps `token` and `certificate_pem` as the node's sent grant (replacing an earlier one) and
  // rewrites the file before returning. FailedPrecondition when no enrollment is pending.
  Status RecordSentGrant(std::string_view node, std::string_view token,
                         std::string_view certificate_pem);
  // NotFound when no enrollment is pending or none of its grants was sent.
  StatusOr<SentGrant> SentGrantOf(std::string_view node) const;

  // How the database refers to a node's token: "secrets.json#node_tokens/<node>".
  static std::string NodeTokenRef(std::string_view node);

 private:
  explicit SecretsFile(std::string path) : path_(std::move(path)) {}
  Status WriteLocked() LLMCTL_REQUIRES(mutex_);

  struct Enrollment {
    std::string token_sha256;
    int64_t expires_unix = 0;
    std::string certificate_name;
    std::string sent_token;            // "" until a grant is sent
    std::string sent_certificate_pem;  // with it
  };

  const std::string path_;
  mutable Mutex mutex_;
  std::map<std::string, std::string, std::less<>> node_tokens_ LLMCTL_GUARDED_BY(mutex_);
  std::map<std::string, std::string, std::less<>> node_certificate_names_ LLMCTL_GUARDED_BY(mutex_);
  std::map<std::string, Enrollment, std::less<>> enrollments_ LLMCTL_GUARDED_BY(mutex_);
  std::map<std::string, int64_t, std::less<>> node_certificate_expiry_ LLMCTL_GUARDED_BY(mutex_);
};

}  // namespace llmctl::controller

#endif  // LLMCTL_CONTROLLER_SECRETS_H_
