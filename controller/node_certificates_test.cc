// Certificate renewal end to end: the controller's NodeCertificates over a real mutual-TLS link to
// an agent's CertificateRenewer serving from files (as llm-agent does), with time moved by hand.
#include "controller/node_certificates.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <thread>

#include "agent/certificate_renewal.h"
#include "common/files.h"
#include "controller/clock.h"

namespace llmctl::controller {
namespace {

namespace fs = std::filesystem;
constexpr char kNode[] = "node1";
constexpr char kToken[] = "node1-token-for-renewal-tests";

// The agent's RenewCertificate, as AgentService delegates it, and a GetNodeInfo to see a call pass.
class RenewingAgent final : public v1::Agent::Service {
 public:
  explicit RenewingAgent(rpc::IdentityFiles files) : renewer_(std::move(files)) {}
  grpc::Status GetNodeInfo(grpc::ServerContext*, const v1::GetNodeInfoRequest*,
                           v1::NodeInfo* info) override {
    info->set_node(kNode);
    return grpc::Status::OK;
  }
  grpc::Status RenewCertificate(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::CertificateRenewal, v1::CertificateGrant>* stream) override {
    return renewer_.Renew(*context, *stream);
  }

 private:
  agent::CertificateRenewer renewer_;
};

class NodeCertificatesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("llmctl_node_certificates_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    auto ca = rpc::CertificateAuthority::LoadOrCreate((dir_ / "ca").string());
    ASSERT_TRUE(ca.ok()) << ca.status().ToString();
    ca_ = std::move(*ca);
    auto secrets = SecretsFile::Open((dir_ / "secrets.json").string());
    ASSERT_TRUE(secrets.ok());
    secrets_ = std::move(*secrets);
    name_ = rpc::AgentCertificateName(kNode, "r1");
    auto issued = ca_->Issue(name_, kNodeCertificateLifetime / std::chrono::hours(24));
    ASSERT_TRUE(issued.ok());
    ASSERT_TRUE(secrets_->PutNodeToken(kNode, kToken, name_).ok());
    ASSERT_TRUE(RecordCertificateExpiry(*secrets_, kNode, issued->certificate_pem).ok());
    files_ = {(dir_ / "ca.pem").string(), (dir_ / "cert.pem").string(),
              (dir_ / "key.pem").string()};
    ASSERT_TRUE(rpc::WriteSecretFile(files_.ca_file, ca_->ca_certificate_pem(), 0600).ok());
    ASSERT_TRUE(rpc::WriteSecretFile(files_.certificate_file, issued->certificate_pem, 0600).ok());
    ASSERT_TRUE(rpc::WriteSecretFile(files_.private_key_file, issued->private_key_pem, 0600).ok());
    auto controller = ca_->Issue(rpc::kControllerCertificateName, 1);
    ASSERT_TRUE(controller.ok());
    controller_ = {ca_->ca_certificate_pem(), controller->certificate_pem,
                   controller->private_key_pem};

    agent_ = std::make_unique<RenewingAgent>(files_);
    grpc::ServerBuilder builder;
    address_ = "unix:" + (dir_ / "agent.sock").string();
    builder.AddListeningPort(
        address_, rpc::WatchedServerCredentials(files_, kToken, std::chrono::seconds(1)));
    builder.RegisterService(agent_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    certificates_ = std::make_unique<NodeCertificates>(*ca_, *secrets_);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    fs::remove_all(dir_);
  }

  std::unique_ptr<v1::Agent::Stub> Stub(const rpc::TlsIdentity& identity,
                                        const std::string& token) {
    return v1::Agent::NewStub(rpc::Dial(address_, name_, rpc::ChannelCredentials(identity, token)));
  }

  // The certificate the agent serves to a new connection, once it is `expected` (the watcher reads
  // the files every second: waited for, bounded, rather than slept).
  bool ServesCertificate(const std::string& expected) {
    for (int i = 0; i < 100; ++i) {
      auto stub = Stub(controller_, kToken);
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      v1::NodeInfo info;
      if (stub->GetNodeInfo(&context, {}, &info).ok()) {
        for (const grpc::string_ref& pem :
             context.auth_context()->FindPropertyValues("x509_pem_cert")) {
          if (std::string(pem.data(), pem.size()) == expected) return true;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return false;
  }

  std::string Read(const std::string& path) { return *ReadFileToString(path, 1 << 20); }

  // The dispatcher's health check asking for a renewal over `link` at `clock`'s times.
  Status RenewIfDue(v1::Agent::Stub& link, const ManualClock& clock) {
    return certificates_->RenewIfDue(kNode, name_, link, clock.Now(), clock.Monotonic(),
                                     std::chrono::seconds(10));
  }

  fs::path dir_;
  std::unique_ptr<rpc::CertificateAuthority> ca_;
  std::unique_ptr<SecretsFile> secrets_;
  std::string name_;
  rpc::IdentityFiles files_;
  rpc::TlsIdentity controller_;
  std::unique_ptr<RenewingAgent> agent_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<NodeCertificates> certificates_;
};

TEST_F(NodeCertificatesTest, RenewalAfterHalfTheLifetimeReplacesTheServedCertificate) {
  ManualClock clock(std::chrono::system_clock::now());
  auto link = Stub(controller_, kToken);
  const std::string first = Read(files_.certificate_file);
  const std::string first_key = Read(files_.private_key_file);
  ASSERT_TRUE(ServesCertificate(first));

  // More than half the week left: nothing to do.
  ASSERT_TRUE(RenewIfDue(*link, clock).ok());
  EXPECT_EQ(Read(files_.certificate_file), first);

  clock.Advance(std::chrono::hours(24 * 4));
  const Status renewed = RenewIfDue(*link, clock);
  ASSERT_TRUE(renewed.ok()) << renewed.ToString();
  const std::string second = Read(files_.certificate_file);
  EXPECT_NE(second, first);
  EXPECT_NE(Read(files_.private_key_file), first_key);  // a new key, made on the node
  EXPECT_FALSE(fs::exists(agent::NextKeyFile(files_)));
  for (const std::string& file : {files_.certificate_file, files_.private_key_file}) {
    struct stat info;
    ASSERT_EQ(::stat(file.c_str(), &info), 0);
    EXPECT_EQ(info.st_mode & 0777, 0600u) << file;
  }
  EXPECT_EQ(*rpc::CertificateCommonName(second), name_);
  // A week from the controller's now, recorded for `llmctl nodes` and the next check.
  const int64_t expected = std::chrono::duration_cast<std::chrono::seconds>(
                               (clock.Now() + kNodeCertificateLifetime).time_since_epoch())
                               .count();
  EXPECT_EQ(*secrets_->NodeCertificateExpiry(kNode), expected);
  EXPECT_TRUE(certificates_->CheckUnexpired(kNode, clock.Now() + std::chrono::hours(24 * 5)).ok());

  // New connections get the new certificate; the link kept talking throughout.
  EXPECT_TRUE(ServesCertificate(second));
  grpc::ClientContext context;
  v1::NodeInfo info;
  EXPECT_TRUE(link->GetNodeInfo(&context, {}, &info).ok());
  // Renewed: not due again.
  EXPECT_TRUE(RenewIfDue(*link, clock).ok());
  EXPECT_EQ(Read(files_.certificate_file), second);
}

TEST_F(NodeCertificatesTest, RenewalWithAWrongTokenOrForANodeDownIsRefused) {
  ManualClock clock(std::chrono::system_clock::now() + std::chrono::hours(24 * 4));
  const std::string first = Read(files_.certificate_file);

  auto wrong_token = Stub(controller_, "not-the-token");
  EXPECT_EQ(RenewIfDue(*wrong_token, clock).code(), StatusCode::kUnauthenticated);
  // Not asked again at the next health check, seconds later, but after kRenewalRetry.
  auto link = Stub(controller_, kToken);
  EXPECT_TRUE(RenewIfDue(*link, clock).ok());
  EXPECT_EQ(Read(files_.certificate_file), first);
  clock.Advance(kRenewalRetry);
  // Another node's certificate (every agent's chains to the same CA) with the right token.
  auto other = ca_->Issue(rpc::AgentCertificateName("node2", "r1"), 1);
  ASSERT_TRUE(other.ok());
  auto other_node =
      Stub({ca_->ca_certificate_pem(), other->certificate_pem, other->private_key_pem}, kToken);
  EXPECT_EQ(RenewIfDue(*other_node, clock).code(), StatusCode::kPermissionDenied);

  clock.Advance(kRenewalRetry);
  ASSERT_TRUE(secrets_->RemoveNodeToken(kNode).ok());  // `llmctl node down node1`
  EXPECT_EQ(RenewIfDue(*link, clock).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Read(files_.certificate_file), first);
}

// The retry after a failed renewal waits kRenewalRetry on the monotonic clock: chrony stepping the
// wall clock forward made it retry at the next health check, and stepping it back delayed it by
// the step. The renewal stays due throughout (more than 3.5 days of the week are gone).
TEST_F(NodeCertificatesTest, AWallClockStepMovesTheRetryOfAFailedRenewalNeitherSoonerNorLater) {
  ManualClock clock(std::chrono::system_clock::now() + std::chrono::hours(24 * 4));
  auto wrong_token = Stub(controller_, "not-the-token");
  EXPECT_EQ(RenewIfDue(*wrong_token, clock).code(), StatusCode::kUnauthenticated);

  clock.StepWallClock(std::chrono::hours(2));
  EXPECT_TRUE(RenewIfDue(*wrong_token, clock).ok()) << "tried again before kRenewalRetry passed";
  clock.Advance(kRenewalRetry);
  EXPECT_EQ(RenewIfDue(*wrong_token, clock).code(), StatusCode::kUnauthenticated);

  clock.StepWallClock(-std::chrono::hours(3));
  clock.Advance(kRenewalRetry);
  EXPECT_EQ(RenewIfDue(*wrong_token, clock).code(), StatusCode::kUnauthenticated)
      << "not tried again once kRenewalRetry passed";
}

TEST_F(NodeCertificatesTest, NoRenewalRunsOverALinkDialledForAnEarlierRegistration) {
  ManualClock clock(std::chrono::system_clock::now() + std::chrono::hours(24 * 4));
  const std::string first = Read(files_.certificate_file);
  auto link = Stub(controller_, kToken);
  // The node is registered again: new token, new registration's name. The old link (and the old
  // key's holder on its other end) must not get a certificate under the new name.
  const std::string registered_again = rpc::AgentCertificateName(kNode, "r2");
  ASSERT_TRUE(secrets_->PutNodeToken(kNode, "node1-new-token", registered_again).ok());
  const Status refused = RenewIfDue(*link, clock);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  EXPECT_NE(refused.message().find("registered again"), std::string::npos) << refused.ToString();
  EXPECT_EQ(Read(files_.certificate_file), first);
}

TEST_F(NodeCertificatesTest, ACertificateNotRenewedInTimeIsReportedExpired) {
  const auto now = std::chrono::system_clock::now();
  EXPECT_TRUE(certificates_->CheckUnexpired(kNode, now).ok());
  EXPECT_TRUE(
      certificates_->CheckUnexpired(kNode, now + kNodeCertificateLifetime - std::chrono::hours(1))
          .ok());
  const Status expired =
      certificates_->CheckUnexpired(kNode, now + kNodeCertificateLifetime + std::chrono::hours(1));
  EXPECT_EQ(expired.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(expired.message().find("expired"), std::string::npos);
  EXPECT_NE(expired.message().find("llmctl node down node1"), std::string::npos);
}

// A renewal that stopped between its renames is finished at the agent's next start (the
// certificate was replaced: its key is `<key>.next`) or dropped (it was not: the old pair stands).
TEST_F(NodeCertificatesTest, AnInterruptedRenewalIsFinishedOrDroppedAtTheAgentsStart) {
  const std::string old_key = Read(files_.private_key_file);
  auto stray = ca_->Issue(name_, 1);
  ASSERT_TRUE(stray.ok());
  ASSERT_TRUE(rpc::WriteSecretFile(agent::NextKeyFile(files_), stray->private_key_pem, 0600).ok());
  ASSERT_TRUE(agent::FinishInterruptedRenewal(files_).ok());
  EXPECT_FALSE(fs::exists(agent::NextKeyFile(files_)));
  EXPECT_EQ(Read(files_.private_key_file), old_key);

  auto renewed = ca_->Issue(name_, 1);
  ASSERT_TRUE(renewed.ok());
  ASSERT_TRUE(
      rpc::WriteSecretFile(agent::NextKeyFile(files_), renewed->private_key_pem, 0600).ok());
  ASSERT_TRUE(rpc::WriteSecretFile(files_.certificate_file, renewed->certificate_pem, 0600).ok());
  ASSERT_TRUE(agent::FinishInterruptedRenewal(files_).ok());
  EXPECT_FALSE(fs::exists(agent::NextKeyFile(files_)));
  EXPECT_EQ(Read(files_.private_key_file), renewed->private_key_pem);
  EXPECT_TRUE(
      rpc::LoadTlsIdentity(files_.ca_file, files_.certificate_file, files_.private_key_file).ok());
}

}  // namespace
}  // namespace llmctl::controller
