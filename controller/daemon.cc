#include "controller/daemon.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

#include "common/atomic_file.h"
#include "common/file_lock.h"
#include "common/files.h"
#include "rpc/connection.h"

namespace llmctl::controller {
namespace {

constexpr char kDataDirAdvice[] = "choose a data_dir that is new or private to this user";

// `dir` made 0700 when missing, else one of this user's that no one else may enter; a refusal
// says what to choose instead (`advice`), since llmctld changes no directory it did not create.
Status MakePrivateDirectory(const std::string& dir, std::string_view advice) {
  const Status made = EnsureOwnDirectory(dir, 0700, OthersMay::kNothing);
  if (made.ok()) return made;
  return FailedPreconditionError(std::string(made.message())
                                     .append("; llmctld changes no directory it did not create: ")
                                     .append(advice));
}

// True when something accepts connections on the unix socket at `path`.
bool SocketIsLive(const std::string& path) {
  sockaddr_un address{};
  if (path.size() >= sizeof(address.sun_path)) return false;
  address.sun_family = AF_UNIX;
  path.copy(address.sun_path, path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool live = connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return live;
}

Status WritePrivateFile(const std::string& path, const std::string& text) {
  return WriteFileAtomically(path, [&](int fd) -> Status {
    if (fchmod(fd, 0600) != 0) return InternalError("cannot make " + path + " private");
    return WriteAll(fd, text.data(), text.size());
  });
}

}  // namespace

StatusOr<rpc::TlsIdentity> LoadOrCreateControllerIdentity(const std::string& data_dir,
                                                          const rpc::CertificateAuthority& ca) {
  const std::string dir = data_dir + "/controller";
  RETURN_IF_ERROR(MakePrivateDirectory(dir, kDataDirAdvice));
  const std::string certificate = dir + "/client.crt";
  const std::string key = dir + "/client.key";
  const std::string ca_file = dir + "/ca.crt";
  std::error_code lookup;
  const bool issued_before =
      std::filesystem::exists(certificate, lookup) && std::filesystem::exists(key, lookup);
  if (lookup) return FailedPreconditionError(dir + ": " + lookup.message());
  if (!issued_before) {
    ASSIGN_OR_RETURN(rpc::IssuedCertificate issued,
                     ca.Issue(rpc::kControllerCertificateName, 3650));
    RETURN_IF_ERROR(WritePrivateFile(key, issued.private_key_pem));
    RETURN_IF_ERROR(WritePrivateFile(certificate, issued.certificate_pem));
  }
  RETURN_IF_ERROR(WritePrivateFile(ca_file, ca.ca_certificate_pem()));
  return rpc::LoadTlsIdentity(ca_file, certificate, key);
}

StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const ControllerConfig& config, const Clock& clock,
                                                DaemonOptions options) {
  std::unique_ptr<Daemon> daemon(new Daemon());
  const std::string& data = config.data_dir;
  RETURN_IF_ERROR(MakePrivateDirectory(data, kDataDirAdvice));
  // Before anything in the directory is opened, let alone written.
  ASSIGN_OR_RETURN(daemon->data_lock_,
                   LockDataDirectory(data, "llmctld.lock", "llmctld",
                                     "stop it, or give this one another data_dir"));
  ASSIGN_OR_RETURN(daemon->store_, store::Store::Open(data + "/llmctl.db"));
  ASSIGN_OR_RETURN(daemon->blobs_, BlobStore::Open(data));
  ASSIGN_OR_RETURN(daemon->secrets_, SecretsFile::Open(data + "/secrets.json"));
  ASSIGN_OR_RETURN(daemon->ca_, rpc::CertificateAuthority::LoadOrCreate(data + "/ca"));
  ASSIGN_OR_RETURN(rpc::TlsIdentity identity, LoadOrCreateControllerIdentity(data, *daemon->ca_));
  daemon->certificates_ = std::make_unique<NodeCertificates>(*daemon->ca_, *daemon->secrets_);

  daemon->dispatcher_ = std::make_unique<Dispatcher>(
      *daemon->store_, *daemon->blobs_, TlsAgentConnector(identity, *daemon->secrets_), clock,
      daemon->changes_,
      DispatcherOptions{.requeue_after = config.requeue_after,
                        .call_deadline = config.agent_call_deadline,
                        .min_transfer_bytes_per_second = config.min_transfer_bytes_per_second,
                        .health_interval = config.health_interval,
                        .backoff_initial = options.backoff_initial,
                        .backoff_max = options.backoff_max,
                        .inline_upload_bytes = options.inline_upload_bytes,
                        .certificates = daemon->certificates_.get()});
  const std::optional<std::string> socket = UnixSocketPath(config.listen);
  // Every listener but the unix socket (0600 in a 0700 directory) takes calls only with the token.
  std::string api_token;
  if (!socket) {
    RETURN_IF_ERROR(CheckListenCredential(config));
    ASSIGN_OR_RETURN(api_token, rpc::ReadTokenFile(config.token_file));
  }
  daemon->service_ = std::make_unique<ControllerService>(
      *daemon->store_, *daemon->blobs_, *daemon->secrets_, *daemon->ca_, *daemon->dispatcher_,
      daemon->changes_, clock, std::move(api_token), std::move(identity));

  if (socket) {
    const std::string socket_dir = std::filesystem::path(*socket).parent_path().string();
    RETURN_IF_ERROR(MakePrivateDirectory(
        socket_dir, std::string("choose a path in a new or private directory (e.g. unix:")
                        .append(socket_dir)
                        .append("/llmctl/controller.sock)")));
    struct stat info;
    if (lstat(socket->c_str(), &info) == 0 && S_ISSOCK(info.st_mode)) {
      if (SocketIsLive(*socket)) {
        return FailedPreconditionError("another llmctld is serving on " + *socket);
      }
      unlink(socket->c_str());  // left by a controller that did not stop cleanly
    }
  }
  grpc::ServerBuilder builder;
  int bound_port = 0;
  // The CLI's API: a unix socket in a private directory, or TCP (loopback unless
  // allow_remote_listen, ValidateListenAddress) whose calls must carry the API token.
  builder.AddListeningPort(rpc::GrpcAddress(config.listen), grpc::InsecureServerCredentials(),
                           socket ? nullptr : &bound_port);
  builder.RegisterService(daemon->service_.get());
  rpc::ApplyServerLimits(builder, {});
  daemon->server_ = rpc::BuildAndStartServer(builder, config.listen);
  if (daemon->server_ == nullptr || (!socket && bound_port == 0)) {
    return UnavailableError("cannot listen on " + config.listen);
  }
  if (socket) {
    daemon->address_ = config.listen;
  } else {
    daemon->address_ =
        config.listen.substr(0, config.listen.rfind(':') + 1) + std::to_string(bound_port);
  }
  if (options.run_dispatcher) daemon->dispatcher_->Start();
  spdlog::info("llmctld: serving on {} with data in {}", daemon->address_, data);
  return daemon;
}

Daemon::~Daemon() { Shutdown(); }

void Daemon::Shutdown() {
  {
    MutexLock lock(shutdown_mutex_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  if (dispatcher_ != nullptr) dispatcher_->Stop();
}

void Daemon::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace llmctl::controller
