// llmctld assembled: the data directory's store, blobs, secrets and CA, the dispatcher and the
// CLI's gRPC API on the configured address.
//
// DATA/llmctl.db       the SQLite store
// DATA/blobs/, trees/  uploaded inputs
// DATA/secrets.json    node tokens (0600)
// DATA/ca/             the CA (rpc::CertificateAuthority; key 0600)
// DATA/controller/     the controller's client certificate for controller.llmctl (key 0600)
#ifndef LLMCTL_CONTROLLER_DAEMON_H_
#define LLMCTL_CONTROLLER_DAEMON_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "common/mutex.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "controller/blob_store.h"
#include "controller/change_notifier.h"
#include "controller/clock.h"
#include "controller/config.h"
#include "controller/controller_service.h"
#include "controller/dispatcher.h"
#include "controller/node_certificates.h"
#include "controller/secrets.h"
#include "controller/store/store.h"
#include "rpc/tls.h"

namespace llmctl::controller {

struct DaemonOptions {
  // False: nothing runs dispatcher rounds by itself; the owner calls dispatcher().Tick() (tests
  // with a ManualClock).
  bool run_dispatcher = true;
  std::chrono::milliseconds backoff_initial = std::chrono::seconds(1);
  std::chrono::milliseconds backoff_max = std::chrono::seconds(30);
  // DispatcherOptions::inline_upload_bytes.
  int64_t inline_upload_bytes = int64_t{64} << 20;
};

class Daemon {
 public:
  // Creates what the data directory lacks (mode 0700, first start: the CA and the controller's
  // certificate), opens the store and starts serving. A unix socket is the owner's alone (0700)
  // from its bind (rpc::BuildAndStartServer), in its directory, which llmctld creates 0700 or which
  // must already be this user's with mode 0700 (FailedPrecondition otherwise: a directory it did
  // not create is never chmodded; the data directory likewise); a stale socket file from an earlier
  // run is replaced, a live one (another llmctld) is FailedPrecondition, and so is a data directory
  // another llmctld uses (its lock, DATA/llmctld.lock, is held; the message names the directory and
  // that process's pid). A TCP address needs config.token_file (CheckListenCredential; the file's
  // errors are rpc::ReadTokenFile's), and every call on it the token. Unavailable when the address
  // cannot be bound.
  static StatusOr<std::unique_ptr<Daemon>> Start(const ControllerConfig& config, const Clock& clock,
                                                 DaemonOptions options = {});
  ~Daemon();  // Shutdown()
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Stops accepting calls, ends open ones (Watch streams included) and the dispatcher.
  void Shutdown();
  // Blocks until Shutdown.
  void Wait();

  // The address clients dial: "unix:/path" or "127.0.0.1:<bound port>".
  const std::string& address() const { return address_; }
  Dispatcher& dispatcher() { return *dispatcher_; }
  store::Store& store() { return *store_; }
  // The API's handlers, for calls in this process without a channel
  // (tests/fuzz/controller_rpc_fuzz.cc).
  ControllerService& service() { return *service_; }

 private:
  Daemon() = default;

  // DATA/llmctld.lock, held (flock) for the daemon's lifetime: first, so it is released last.
  UniqueFd data_lock_;
  std::string address_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<BlobStore> blobs_;
  std::unique_ptr<SecretsFile> secrets_;
  std::unique_ptr<rpc::CertificateAuthority> ca_;
  std::unique_ptr<NodeCertificates> certificates_;
  ChangeNotifier changes_;
  std::unique_ptr<Dispatcher> dispatcher_;
  std::unique_ptr<ControllerService> service_;
  std::unique_ptr<grpc::Server> server_;
  Mutex shutdown_mutex_;
  bool shut_down_ LLMCTL_GUARDED_BY(shutdown_mutex_) = false;
};

// Loads DATA/controller/{client.crt,client.key} with the CA's certificate, issuing them on first
// use.
StatusOr<rpc::TlsIdentity> LoadOrCreateControllerIdentity(const std::string& data_dir,
                                                          const rpc::CertificateAuthority& ca);

}  // namespace llmctl::controller

#endif  // LLMCTL_CONTROLLER_DAEMON_H_
