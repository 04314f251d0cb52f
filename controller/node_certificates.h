// Node certificates' lifetime and their renewal over the controller's link to each agent
// (docs/architecture.md, "Credentials"). A certificate lasts kNodeCertificateLifetime and is
// renewed (Agent.RenewCertificate: the agent's CSR, signed by the controller's CA) at the
// dispatcher's health check once less than half of it is left; one that expired is not dialled, and
// its node is reported until it is registered again.
#ifndef LLMCTL_CONTROLLER_NODE_CERTIFICATES_H_
#define LLMCTL_CONTROLLER_NODE_CERTIFICATES_H_

#include <chrono>
#include <map>
#include <string>

#include "common/mutex.h"
#include "common/status.h"
#include "controller/clock.h"
#include "controller/secrets.h"
#include "controller/store/records.h"
#include "llmctl/v1/agent.grpc.pb.h"
#include "rpc/certificates.h"

namespace llmctl::controller {

// A week: a stolen node key works for at most that long (and not at all after `node down`), while
// renewal, due after half of it, leaves 3.5 days for a controller that is off (the user's laptop
// over a long weekend) before a node needs registering again.
inline constexpr std::chrono::hours kNodeCertificateLifetime{24 * 7};
// After a failed renewal: many tries fit in the half week left.
inline constexpr std::chrono::hours kRenewalRetry{1};

// Records the expiry of the certificate just issued to `node` (RegisterNode, EnrollNode, a
// renewal) in `secrets`.
Status RecordCertificateExpiry(SecretsFile& secrets, const std::string& node,
                               const std::string& certificate_pem);

// Thread-safe (SecretsFile and the CA are).
class NodeCertificates {
 public:
  NodeCertificates(const rpc::CertificateAuthority& ca, SecretsFile& secrets)
      : ca_(ca), secrets_(secrets) {}

  // FailedPrecondition naming the expiry and the way out when the node's certificate has expired
  // at `now`: the agent's TLS would refuse it anyway, and a renewal cannot ride a link that no
  // longer authenticates. OK when its expiry is unknown (registered before expiries were kept).
  Status CheckUnexpired(const std::string& node, store::Time now) const;

  // Renews the node's certificate through `stub` (its link, whose channel checks the agent's
  // certificate against `dialled_certificate_name`) when less than half the lifetime is left at
  // `now` (the wall clock, as the certificate's dates), or its expiry is unknown; OK without a call
  // otherwise, and for kRenewalRetry on the monotonic clock (`monotonic_now`) after a failed
  // renewal of the node (the health checks come every few seconds; an agent too old to renew would
  // be asked, and logged, at each; chrony stepping the wall clock moves the retry neither sooner
  // nor later). FailedPrecondition for a node without credentials
  // (`node down`), and for a link dialled under another name than the node's current one: the node
  // was registered again since, and the holder of the old key must not get a certificate of the
  // new registration. The agent's error when it refuses.
  Status RenewIfDue(const std::string& node, const std::string& dialled_certificate_name,
                    v1::Agent::Stub& stub, store::Time now, MonotonicTime monotonic_now,
                    std::chrono::milliseconds deadline) LLMCTL_EXCLUDES(mutex_);

 private:
  Status Renew(const std::string& node, const std::string& certificate_name, v1::Agent::Stub& stub,
               store::Time now, std::chrono::milliseconds deadline);

  const rpc::CertificateAuthority& ca_;
  SecretsFile& secrets_;
  Mutex mutex_;
  // When a node whose renewal failed is tried again.
  std::map<std::string, MonotonicTime> retry_at_ LLMCTL_GUARDED_BY(mutex_);
};

}  // namespace llmctl::controller

#endif  // LLMCTL_CONTROLLER_NODE_CERTIFICATES_H_
