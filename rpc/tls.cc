#include "rpc/tls.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "common/files.h"
#include "common/text.h"
#include "rpc/connection.h"

namespace llmctl::rpc {

namespace {

constexpr char kAuthorizationHeader[] = "authorization";
constexpr char kBearerPrefix[] = "Bearer ";

class BearerTokenChecker : public grpc::AuthMetadataProcessor {
 public:
  explicit BearerTokenChecker(std::string token) : token_(std::move(token)) {}

  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override {
    if (token_.empty()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "this server has no token configured");
    }
    grpc::Status checked = CheckBearerToken(auth_metadata, token_);
    if (!checked.ok()) return checked;
    // Consumed: the handlers never see the token, so it cannot leak into their logs.
    consumed_auth_metadata->emplace(kAuthorizationHeader, "");
    return grpc::Status::OK;
  }

 private:
  const std::string token_;
};

class BearerTokenAdder : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenAdder(std::string header) : header_(std::move(header)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kAuthorizationHeader, header_);
    }
    methods->Proceed();
  }

 private:
  const std::string header_;
};

class BearerTokenAdderFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenAdderFactory(std::string token) : header_(kBearerPrefix + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerTokenAdder(header_);
  }

 private:
  const std::string header_;
};

class BearerTokenPlugin : public grpc::MetadataCredentialsPlugin {
 public:
  explicit BearerTokenPlugin(std::string token) : header_(kBearerPrefix + token) {}
  bool IsBlocking() const override { return false; }
  const char* GetType() const override { return "llmctl-bearer"; }
  grpc::Status GetMetadata(grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
                           std::multimap<std::string, std::string>* metadata) override {
    metadata->emplace(kAuthorizationHeader, header_);
    return grpc::Status::OK;
  }
  std::string DebugString() override { return "llmctl bearer token (not shown)"; }

 private:
  const std::string header_;
};

}  // namespace

bool SameSecret(std::string_view presented, std::string_view expected) {
  unsigned char a[SHA256_DIGEST_LENGTH];
  unsigned char b[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(presented.data()), presented.size(), a);
  SHA256(reinterpret_cast<const unsigned char*>(expected.data()), expected.size(), b);
  return CRYPTO_memcmp(a, b, sizeof(a)) == 0;
}

grpc::Status CheckBearerToken(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                              std::string_view token) {
  const auto range = metadata.equal_range(kAuthorizationHeader);
  if (range.first == range.second) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing bearer token");
  }
  bool accepted = false;
  for (auto it = range.first; it != range.second; ++it) {
    const std::string_view value(it->second.data(), it->second.size());
    const std::string_view prefix(kBearerPrefix);
    // Every entry is compared, so the time taken does not say which one matched.
    if (value.substr(0, prefix.size()) == prefix &&
        SameSecret(value.substr(prefix.size()), token)) {
      accepted = true;
    }
  }
  if (!accepted) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid bearer token");
  return grpc::Status::OK;
}

std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface> BearerTokenInterceptor(
    std::string token) {
  return std::make_unique<BearerTokenAdderFactory>(std::move(token));
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const TlsIdentity& identity,
                                                           const std::string& token) {
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = identity.ca_pem;
  options.pem_key_cert_pairs.push_back({identity.private_key_pem, identity.certificate_pem});
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(options);
  credentials->SetAuthMetadataProcessor(std::make_shared<BearerTokenChecker>(token));
  return credentials;
}

std::shared_ptr<grpc::ServerCredentials> WatchedServerCredentials(const IdentityFiles& files,
                                                                  const std::string& token,
                                                                  std::chrono::seconds refresh) {
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      files.private_key_file, files.certificate_file, files.ca_file,
      static_cast<unsigned int>(std::max<int64_t>(1, refresh.count())));
  grpc::experimental::TlsServerCredentialsOptions options(std::move(provider));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  std::shared_ptr<grpc::ServerCredentials> credentials =
      grpc::experimental::TlsServerCredentials(options);
  credentials->SetAuthMetadataProcessor(std::make_shared<BearerTokenChecker>(token));
  return credentials;
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const TlsIdentity& identity,
                                                             const std::string& token) {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = identity.ca_pem;
  options.pem_private_key = identity.private_key_pem;
  options.pem_cert_chain = identity.certificate_pem;
  return grpc::CompositeChannelCredentials(
      grpc::SslCredentials(options),
      grpc::MetadataCredentialsFromPlugin(std::make_unique<BearerTokenPlugin>(token)));
}

std::shared_ptr<grpc::ServerCredentials> EnrollmentServerCredentials(const TlsIdentity& identity) {
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = identity.ca_pem;
  options.pem_key_cert_pairs.push_back({identity.private_key_pem, identity.certificate_pem});
  return grpc::SslServerCredentials(options);
}

bool CallerIsController(const grpc::ServerContext& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return false;
  for (const grpc::string_ref& name : auth->GetPeerIdentity()) {
    if (std::string_view(name.data(), name.size()) == kControllerCertificateName) return true;
  }
  return false;
}

std::shared_ptr<grpc::ChannelCredentials> EnrollmentChannelCredentials(
    const TlsIdentity& identity) {
  auto provider = std::make_shared<grpc::experimental::StaticDataCertificateProvider>(
      std::vector<grpc::experimental::IdentityKeyCertPair>{
          {identity.private_key_pem, identity.certificate_pem}});
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(std::move(provider));
  options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(false);
  options.set_certificate_verifier(std::make_shared<grpc::experimental::NoOpCertificateVerifier>());
  options.set_check_call_host(false);
  return grpc::experimental::TlsCredentials(options);
}

std::shared_ptr<grpc::Channel> Dial(const std::string& address, const std::string& target_name,
                                    const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  grpc::ChannelArguments arguments;
  arguments.SetSslTargetNameOverride(target_name);
  SetClientKeepalive(arguments);
  return grpc::CreateCustomChannel(GrpcAddress(address), credentials, arguments);
}

StatusOr<std::string> ReadTokenFile(const std::string& path) {
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) {
    return NotFoundError("token file " + path + ": " + std::strerror(errno));
  }
  if ((info.st_mode & 077) != 0) {
    return Status(StatusCode::kPermissionDenied,
                  "token file " + path + " may be read by others; chmod 600 it");
  }
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path, 4096));
  const std::string_view token = Trim(text);
  if (token.empty()) return InvalidArgumentError("token file " + path + " is empty");
  return std::string(token);
}

}  // namespace llmctl::rpc
