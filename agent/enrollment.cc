#include "agent/enrollment.h"

#include <filesystem>
#include <iostream>

#include "common/files.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "llmctl/v1/agent.grpc.pb.h"
#include "rpc/connection.h"
#include "rpc/tls.h"

namespace llmctl::agent {

namespace v1 = llmctl::v1;

namespace {

// The certificate the enrollment server presents: the controller does not check it (it checks
// the token instead), so a day is more than the wait for the controller needs.
constexpr int kEnrollmentCertificateDays = 1;

// The directory `file` goes in, made 0700 when missing. One that is there is used as it is, mode
// and all (the operator named it: /var/lib/llmctl, or /etc as root), as the embedded daemons use
// theirs, when it is a directory of this user's: not a link to one elsewhere, where the node's key
// would go.
Status MakeParentDirectory(const std::string& file) {
  const std::string parent = std::filesystem::path(file).parent_path().string();
  if (parent.empty()) return Status::Ok();
  return EnsureOwnDirectory(parent, 0700, OthersMay::kAnything);
}

}  // namespace

bool Enrolled(const std::string& token_file) {
  // A token file the system cannot look up is not one to present: enrolment then says why.
  std::error_code error;
  return std::filesystem::exists(token_file, error);
}

class EnrollmentService final : public v1::AgentEnrollment::Service {
 public:
  explicit EnrollmentService(EnrollmentOptions options) : options_(std::move(options)) {}

  grpc::Status Enroll(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::EnrollmentOffer, v1::EnrollmentGrant>* stream) override {
    if (!rpc::CallerIsController(*context)) {
      Log(LogLevel::kWarning,
          "refused a caller that is not the controller (" + context->peer() + ")");
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          "enrollment: only the controller may call");
    }
    MutexLock lock(mutex_);  // one enrollment at a time
    if (done_) {
      // The controller calls again when the answer to its grant was lost. Until this server shuts
      // down and the Agent API serves the grant's credentials here, it is told to try later: the
      // controller and `llmctl node up` take UNAVAILABLE as "not yet" and any other refusal as
      // final, and the next try finds the agent holding the grant.
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "enrollment: enrolled; restarting as the node's agent");
    }
    v1::EnrollmentOffer offer;
    offer.set_node(options_.node);
    offer.set_enrollment_token(options_.enrollment_token);
    v1::EnrollmentGrant grant;
    if (!stream->Write(offer) || !stream->Read(&grant)) {
      Log(LogLevel::kWarning,
          "the controller refused the enrollment token or went away; waiting for another call");
      return grpc::Status(grpc::StatusCode::CANCELLED, "enrollment: no grant arrived");
    }
    const Status installed = Install(grant);
    if (!installed.ok()) {
      Log(LogLevel::kWarning,
          "cannot keep the credentials the controller sent: " + std::string(installed.message()));
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "enrollment: " + std::string(installed.message()));
    }
    done_ = true;
    v1::EnrollmentOffer answer;
    answer.set_node(options_.node);
    answer.set_installed(true);
    stream->Write(answer);
    Log(LogLevel::kInfo, "enrolled: credentials in " + options_.certificate_file + ", " +
                             options_.private_key_file + " and " + options_.token_file);
    return grpc::Status::OK;
  }

  bool done() const {
    MutexLock lock(mutex_);
    return done_;
  }

 private:
  void Log(LogLevel level, const std::string& line) const {
    std::cerr << LogLinePrefix(level) << "llm-agent: node " << options_.node << ": " << line
              << std::endl;
  }

  // Checks the grant and writes it, the token last.
  Status Install(const v1::EnrollmentGrant& grant) {
    if (grant.token().empty() || grant.token().find_first_of(" \t\r\n") != std::string::npos) {
      return InvalidArgumentError("the node token is empty or holds white space");
    }
    RETURN_IF_ERROR(rpc::CheckIssuedCertificate(options_.ca_pem, grant.certificate_pem(),
                                                grant.private_key_pem()));
    for (const std::string* file :
         {&options_.certificate_file, &options_.private_key_file, &options_.token_file}) {
      RETURN_IF_ERROR(MakeParentDirectory(*file));
    }
    RETURN_IF_ERROR(rpc::WriteSecretFile(options_.certificate_file, grant.certificate_pem(), 0600));
    RETURN_IF_ERROR(rpc::WriteSecretFile(options_.private_key_file, grant.private_key_pem(), 0600));
    return rpc::WriteSecretFile(options_.token_file, grant.token() + "\n", 0600);
  }

  const EnrollmentOptions options_;
  mutable Mutex mutex_;
  bool done_ LLMCTL_GUARDED_BY(mutex_) = false;
};

StatusOr<std::unique_ptr<EnrollmentServer>> EnrollmentServer::Start(EnrollmentOptions options) {
  if (options.listen.starts_with("unix:")) {
    return InvalidArgumentError("--listen " + options.listen +
                                ": enrollment is for a node the controller dials over TCP");
  }
  if (options.enrollment_token.empty()) {
    return InvalidArgumentError("the enrollment token is empty");
  }
  ASSIGN_OR_RETURN(rpc::TlsIdentity identity,
                   rpc::SelfSignedIdentity(rpc::EnrollmentCertificateName(options.node),
                                           options.ca_pem, kEnrollmentCertificateDays));
  std::unique_ptr<EnrollmentServer> server(new EnrollmentServer());
  const std::string listen = options.listen;
  server->service_ = std::make_unique<EnrollmentService>(std::move(options));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(rpc::GrpcAddress(listen), rpc::EnrollmentServerCredentials(identity),
                           &port);
  builder.RegisterService(server->service_.get());
  // Any party that reaches the port may call, before anyone is authenticated: few threads.
  rpc::ServerLimits limits;
  limits.max_threads = 16;
  limits.max_streams_per_connection = 4;
  rpc::ApplyServerLimits(builder, limits);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    return UnavailableError("cannot listen on " + listen);
  }
  server->address_ = listen.substr(0, listen.rfind(':')) + ":" + std::to_string(port);
  return server;
}

bool EnrollmentServer::done() const { return service_->done(); }

void EnrollmentServer::Shutdown() {
  if (server_ == nullptr) return;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->Wait();
  server_.reset();
}

EnrollmentServer::~EnrollmentServer() { Shutdown(); }

}  // namespace llmctl::agent
