#include "rpc/tls.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include "llmctl/v1/agent.grpc.pb.h"
#include "rpc/grpc_status.h"

namespace llmctl::rpc {
namespace {

namespace fs = std::filesystem;
constexpr char kToken[] = "s3cret-token-for-tests";

fs::path FreshDir(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("llmctl_rpc_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Answers GetNodeInfo with a fixed node name: enough to see whether a call got through.
class EchoAgent final : public llmctl::v1::Agent::Service {
  grpc::Status GetNodeInfo(grpc::ServerContext*, const llmctl::v1::GetNodeInfoRequest*,
                           llmctl::v1::NodeInfo* response) override {
    response->set_node("node1");
    return grpc::Status::OK;
  }
};

TlsIdentity IdentityFor(const CertificateAuthority& ca, const std::string& name) {
  auto issued = ca.Issue(name, 30);
  EXPECT_TRUE(issued.ok()) << issued.status().ToString();
  return TlsIdentity{ca.ca_certificate_pem(), issued->certificate_pem, issued->private_key_pem};
}

class TlsTest : public ::testing::TestWithParam<bool> {  // true: unix socket, false: 127.0.0.1:0
 protected:
  void SetUp() override {
    dir_ = FreshDir(GetParam() ? "unix" : "tcp");
    auto ca = CertificateAuthority::LoadOrCreate((dir_ / "ca").string());
    ASSERT_TRUE(ca.ok()) << ca.status().ToString();
    ca_ = std::move(*ca);
    auto other = CertificateAuthority::LoadOrCreate((dir_ / "other-ca").string());
    ASSERT_TRUE(other.ok()) << other.status().ToString();
    other_ca_ = std::move(*other);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    fs::remove_all(dir_);
  }

  void StartServer(const TlsIdentity& identity) {
    grpc::ServerBuilder builder;
    int port = 0;
    if (GetParam()) {
      address_ = "unix:" + (dir_ / "agent.sock").string();
      builder.AddListeningPort(address_, ServerCredentials(identity, kToken));
    } else {
      builder.AddListeningPort("127.0.0.1:0", ServerCredentials(identity, kToken), &port);
    }
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    if (!GetParam()) address_ = "127.0.0.1:" + std::to_string(port);
  }

  grpc::Status Call(const TlsIdentity& client, const std::string& token,
                    const std::string& target = AgentCertificateName("node1")) {
    auto stub =
        llmctl::v1::Agent::NewStub(Dial(address_, target, ChannelCredentials(client, token)));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    llmctl::v1::NodeInfo info;
    grpc::Status status = stub->GetNodeInfo(&context, {}, &info);
    if (status.ok()) {
      EXPECT_EQ(info.node(), "node1");
    }
    return status;
  }

  fs::path dir_;
  std::unique_ptr<CertificateAuthority> ca_;
  std::unique_ptr<CertificateAuthority> other_ca_;
  EchoAgent service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_P(TlsTest, GoodCertificateAndTokenGetThrough) {
  StartServer(IdentityFor(*ca_, AgentCertificateName("node1")));
  const grpc::Status status = Call(IdentityFor(*ca_, kControllerCertificateName), kToken);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_P(TlsTest, WrongOrMissingTokenIsUnauthenticated) {
  StartServer(IdentityFor(*ca_, AgentCertificateName("node1")));
  const TlsIdentity client = IdentityFor(*ca_, kControllerCertificateName);
  const grpc::Status wrong = Call(client, "not-the-token");
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(wrong.error_message().find("not-the-token"), std::string::npos);
  EXPECT_EQ(wrong.error_message().find(kToken), std::string::npos);
  // A token that only shares a prefix with the right one.
  EXPECT_EQ(Call(client, std::string(kToken) + "x").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // No call credentials at all: plain mutual TLS.
  grpc::SslCredentialsOptions options{client.ca_pem, client.private_key_pem,
                                      client.certificate_pem};
  auto stub = llmctl::v1::Agent::NewStub(
      Dial(address_, AgentCertificateName("node1"), grpc::SslCredentials(options)));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  llmctl::v1::NodeInfo info;
  EXPECT_EQ(stub->GetNodeInfo(&context, {}, &info).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_P(TlsTest, ClientCertificateFromAnotherCaIsRefused) {
  StartServer(IdentityFor(*ca_, AgentCertificateName("node1")));
  // The client trusts the right CA but presents a certificate the server's CA never signed.
  TlsIdentity stranger = IdentityFor(*other_ca_, kControllerCertificateName);
  stranger.ca_pem = ca_->ca_certificate_pem();
  EXPECT_EQ(Call(stranger, kToken).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_P(TlsTest, ServerCertificateForAnotherNameIsRefused) {
  StartServer(IdentityFor(*ca_, AgentCertificateName("node2")));
  const TlsIdentity client = IdentityFor(*ca_, kControllerCertificateName);
  EXPECT_EQ(Call(client, kToken, AgentCertificateName("node1")).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(Call(client, kToken, AgentCertificateName("node2")).ok());
}

// A certificate past its notAfter stops passing: the client refuses the handshake, so a node
// whose certificate was not renewed in time is cut off by TLS itself, not only by the controller.
TEST_P(TlsTest, ExpiredServerCertificateIsRefused) {
  auto request = NewCertificateRequest("ignored");
  ASSERT_TRUE(request.ok()) << request.status().ToString();
  const auto now = std::chrono::system_clock::now();
  // Valid from an hour ago until a minute ago: expired, without sleeping.
  auto expired = ca_->SignRequest(request->request_pem, AgentCertificateName("node1"),
                                  now - std::chrono::minutes(1));
  ASSERT_TRUE(expired.ok()) << expired.status().ToString();
  StartServer({ca_->ca_certificate_pem(), *expired, request->private_key_pem});
  const TlsIdentity client = IdentityFor(*ca_, kControllerCertificateName);
  EXPECT_EQ(Call(client, kToken).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_P(TlsTest, WatchedCredentialsServeReplacedFilesToNewConnections) {
  const IdentityFiles files{(dir_ / "ca.pem").string(), (dir_ / "cert.pem").string(),
                            (dir_ / "key.pem").string()};
  const auto write = [&](const TlsIdentity& identity) {
    ASSERT_TRUE(WriteSecretFile(files.ca_file, identity.ca_pem, 0600).ok());
    ASSERT_TRUE(WriteSecretFile(files.private_key_file, identity.private_key_pem, 0600).ok());
    ASSERT_TRUE(WriteSecretFile(files.certificate_file, identity.certificate_pem, 0600).ok());
  };
  write(IdentityFor(*ca_, AgentCertificateName("node1", "first")));
  grpc::ServerBuilder builder;
  int port = 0;
  address_ = GetParam() ? "unix:" + (dir_ / "agent.sock").string() : "127.0.0.1:0";
  builder.AddListeningPort(address_,
                           WatchedServerCredentials(files, kToken, std::chrono::seconds(1)),
                           GetParam() ? nullptr : &port);
  builder.RegisterService(&service_);
  server_ = builder.BuildAndStart();
  ASSERT_NE(server_, nullptr);
  if (!GetParam()) address_ = "127.0.0.1:" + std::to_string(port);
  const TlsIdentity client = IdentityFor(*ca_, kControllerCertificateName);
  ASSERT_TRUE(Call(client, kToken, AgentCertificateName("node1", "first")).ok());
  EXPECT_EQ(Call(client, "wrong", AgentCertificateName("node1", "first")).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  write(IdentityFor(*ca_, AgentCertificateName("node1", "second")));
  // The watcher reads the files again every second: wait for it (bounded) rather than sleep.
  bool swapped = false;
  for (int i = 0; i < 100 && !swapped; ++i) {
    swapped = Call(client, kToken, AgentCertificateName("node1", "second")).ok();
    if (!swapped) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_TRUE(swapped);
  EXPECT_EQ(Call(client, kToken, AgentCertificateName("node1", "first")).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

INSTANTIATE_TEST_SUITE_P(Transports, TlsTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "UnixSocket" : "Loopback"; });

TEST(CertificateAuthorityTest, KeyIsPrivateAndReloadGivesTheSameCa) {
  const fs::path dir = FreshDir("reload");
  auto first = CertificateAuthority::LoadOrCreate((dir / "ca").string());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  struct stat info;
  ASSERT_EQ(::stat((dir / "ca" / "ca.key").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((dir / "ca").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0700u);
  auto second = CertificateAuthority::LoadOrCreate((dir / "ca").string());
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ((*first)->ca_certificate_pem(), (*second)->ca_certificate_pem());
  // Two certificates for one name differ (fresh keys, random serials).
  EXPECT_NE((*first)->Issue("a.llmctl", 1)->certificate_pem,
            (*first)->Issue("a.llmctl", 1)->certificate_pem);

  fs::remove(dir / "ca" / "ca.crt");
  auto incomplete = CertificateAuthority::LoadOrCreate((dir / "ca").string());
  EXPECT_EQ(incomplete.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(incomplete.status().message().find("ca.crt"), std::string::npos);
  fs::remove_all(dir);
}

// A new CA whose certificate cannot be written (a full disk) leaves no key behind: nothing was
// signed with it, and a key without its certificate is refused as an incomplete CA that only the
// user's removing the directory would get past.
TEST(CertificateAuthorityTest, ACertificateThatCannotBeWrittenLeavesNoKeyBehind) {
  const fs::path dir = FreshDir("full");
  const fs::path ca = dir / "ca";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Room for the key's file (a P-256 key's PEM, about 240 bytes), not the certificate's (about
    // 600): writes past 400 bytes fail with EFBIG.
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{400, 400};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(2);
    auto made = CertificateAuthority::LoadOrCreate(ca.string());
    const bool certificate_failed =
        !made.ok() && made.status().message().find("ca.crt") != std::string::npos;
    ::_exit(certificate_failed ? 0 : 3);
  }
  int wait_status = 0;
  ASSERT_EQ(::waitpid(child, &wait_status, 0), child);
  ASSERT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) << wait_status;
  EXPECT_FALSE(fs::exists(ca / "ca.key"));
  EXPECT_FALSE(fs::exists(ca / "ca.crt"));
  auto next = CertificateAuthority::LoadOrCreate(ca.string());
  EXPECT_TRUE(next.ok()) << next.status().ToString();
  fs::remove_all(dir);
}

// One that is there is checked, never narrowed: while it was open, another user could have put
// their own key and certificate in it.
TEST(CertificateAuthorityTest, AnExistingDirectoryOthersMayEnterIsRefusedAndLeftAsItIs) {
  const fs::path dir = FreshDir("open");
  const fs::path ca = dir / "ca";
  fs::create_directory(ca);
  ASSERT_EQ(::chmod(ca.c_str(), 0755), 0);
  auto refused = CertificateAuthority::LoadOrCreate(ca.string());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(),
            "the CA's directory " + ca.string() +
                ": open to other users (mode 0755); no one else may enter it, as it holds the "
                "CA's key");
  struct stat info;
  ASSERT_EQ(::stat(ca.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0755u);
  EXPECT_FALSE(fs::exists(ca / "ca.key"));

  ASSERT_EQ(::chmod(ca.c_str(), 0700), 0);
  EXPECT_TRUE(CertificateAuthority::LoadOrCreate(ca.string()).ok());
  fs::remove_all(dir);
}

TEST(CertificateAuthorityTest, SignsARequestForItsKeyUnderTheNameItChooses) {
  const fs::path dir = FreshDir("csr");
  auto ca = CertificateAuthority::LoadOrCreate((dir / "ca").string());
  ASSERT_TRUE(ca.ok()) << ca.status().ToString();
  auto request = NewCertificateRequest("agent-x.old.llmctl");
  ASSERT_TRUE(request.ok()) << request.status().ToString();
  const auto not_after = std::chrono::system_clock::now() + std::chrono::hours(24 * 7);
  auto certificate = (*ca)->SignRequest(request->request_pem, "agent-x.new.llmctl", not_after);
  ASSERT_TRUE(certificate.ok()) << certificate.status().ToString();
  // The requester's key, the CA's signature, the CA's name for it, and the expiry asked for
  // (a certificate's times are whole seconds).
  EXPECT_TRUE(
      CheckIssuedCertificate((*ca)->ca_certificate_pem(), *certificate, request->private_key_pem)
          .ok());
  EXPECT_EQ(*CertificateCommonName(*certificate), "agent-x.new.llmctl");
  const auto expiry = CertificateExpiry(*certificate);
  ASSERT_TRUE(expiry.ok());
  EXPECT_LE(*expiry, not_after);
  EXPECT_GT(*expiry, not_after - std::chrono::seconds(1));

  // A request changed on the way (a byte of its body) is refused.
  std::string tampered = request->request_pem;
  tampered[tampered.size() / 2] = tampered[tampered.size() / 2] == 'A' ? 'B' : 'A';
  EXPECT_EQ((*ca)->SignRequest(tampered, "agent-x.new.llmctl", not_after).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*ca)->SignRequest("not a csr", "agent-x.new.llmctl", not_after).status().code(),
            StatusCode::kInvalidArgument);
  fs::remove_all(dir);
}

TEST(TlsIdentityTest, FilesAreCheckedAndNamed) {
  const fs::path dir = FreshDir("identity");
  auto ca = CertificateAuthority::LoadOrCreate((dir / "ca").string());
  ASSERT_TRUE(ca.ok());
  auto leaf = (*ca)->Issue("agent-x.llmctl", 1);
  auto other = (*ca)->Issue("agent-y.llmctl", 1);
  ASSERT_TRUE(leaf.ok() && other.ok());
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  const std::string ca_file = write("ca.pem", (*ca)->ca_certificate_pem());
  const std::string cert_file = write("cert.pem", leaf->certificate_pem);
  const std::string key_file = write("key.pem", leaf->private_key_pem);
  EXPECT_TRUE(LoadTlsIdentity(ca_file, cert_file, key_file).ok());

  const std::string wrong_key = write("wrong.pem", other->private_key_pem);
  auto mismatch = LoadTlsIdentity(ca_file, cert_file, wrong_key);
  EXPECT_EQ(mismatch.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.status().message().find("wrong.pem"), std::string::npos);
  const std::string garbage = write("garbage.pem", "not pem");
  EXPECT_NE(LoadTlsIdentity(garbage, cert_file, key_file).status().message().find("garbage.pem"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(TokenFileTest, RefusesReadableByOthersAndEmpty) {
  const fs::path dir = FreshDir("token");
  const std::string path = (dir / "token").string();
  std::ofstream(path) << "  abc\n";
  ::chmod(path.c_str(), 0644);
  auto loose = ReadTokenFile(path);
  EXPECT_EQ(loose.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(loose.status().message().find("abc"), std::string::npos);
  ::chmod(path.c_str(), 0600);
  auto token = ReadTokenFile(path);
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(*token, "abc");
  std::ofstream(path, std::ios::trunc) << "\n";
  EXPECT_EQ(ReadTokenFile(path).status().code(), StatusCode::kInvalidArgument);
  fs::remove_all(dir);
}

TEST(StatusConversionTest, CodesAndMessagesSurviveTheRoundTrip) {
  const Status status = FailedPreconditionError("blob abc missing");
  const grpc::Status wire = ToGrpcStatus(status);
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  const Status back = FromGrpcStatus(wire);
  EXPECT_EQ(back.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(back.message(), "blob abc missing");
  EXPECT_TRUE(ToGrpcStatus(Status::Ok()).ok());
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "x")).code(),
            StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace llmctl::rpc
