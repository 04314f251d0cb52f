// The enrollment server as the controller calls it: where it keeps the credentials it is granted.
#include "agent/enrollment.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include "llmctl/v1/agent.grpc.pb.h"
#include "rpc/tls.h"

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;
namespace v1 = llmctl::v1;

// A CA, the controller's identity and the node's grant, and the enrollment server of node n1 that
// keeps its credentials under a directory of the test's.
class EnrollmentServerTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) /
           ("enrollment_" + std::to_string(::getpid()) + "_" +
            testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    auto ca = rpc::CertificateAuthority::LoadOrCreate((dir_ / "ca").string());
    ASSERT_TRUE(ca.ok()) << ca.status().ToString();
    ca_ = std::move(*ca);
    auto controller = ca_->Issue(rpc::kControllerCertificateName, 1);
    auto node = ca_->Issue(rpc::AgentCertificateName("n1"), 1);
    ASSERT_TRUE(controller.ok() && node.ok());
    controller_ = {ca_->ca_certificate_pem(), controller->certificate_pem,
                   controller->private_key_pem};
    grant_.set_certificate_pem(node->certificate_pem);
    grant_.set_private_key_pem(node->private_key_pem);
    grant_.set_token("node-token");
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    fs::remove_all(dir_);
  }

  // Starts the server, its credentials under dir_/credentials, and a stub that calls it as the
  // controller does.
  void StartServer() {
    const fs::path credentials = dir_ / "credentials";
    auto server = EnrollmentServer::Start({.listen = "127.0.0.1:0",
                                           .node = "n1",
                                           .ca_pem = ca_->ca_certificate_pem(),
                                           .enrollment_token = "enrollment-token",
                                           .certificate_file = (credentials / "agent.crt").string(),
                                           .private_key_file = (credentials / "agent.key").string(),
                                           .token_file = (credentials / "token").string()});
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    grpc::ChannelArguments arguments;
    arguments.SetSslTargetNameOverride(rpc::EnrollmentCertificateName("n1"));
    stub_ = v1::AgentEnrollment::NewStub(grpc::CreateCustomChannel(
        server_->address(), rpc::EnrollmentChannelCredentials(controller_), arguments));
  }

  // One call as the controller makes it: the offer read, grant_ sent; whether the server answered
  // `installed`, and how the call ended.
  grpc::Status EnrollWithTheGrant(bool& installed) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto stream = stub_->Enroll(&context);
    v1::EnrollmentOffer offer;
    installed = false;
    if (stream->Read(&offer) && stream->Write(grant_)) {
      stream->WritesDone();
      installed = stream->Read(&offer) && offer.installed();
    }
    return stream->Finish();
  }

  fs::path dir_;
  std::unique_ptr<rpc::CertificateAuthority> ca_;
  rpc::TlsIdentity controller_;
  v1::EnrollmentGrant grant_;
  std::unique_ptr<EnrollmentServer> server_;
  std::unique_ptr<v1::AgentEnrollment::Stub> stub_;
};

// A link in the place of the credentials' directory is refused, not followed to a directory
// elsewhere that the node's key and token would be written into; the node stays unenrolled.
TEST_F(EnrollmentServerTest, ALinkInTheCredentialsDirectorysPlaceIsRefusedAndNothingIsWritten) {
  fs::create_directories(dir_ / "elsewhere");
  fs::create_directory_symlink(dir_ / "elsewhere", dir_ / "credentials");
  ASSERT_NO_FATAL_FAILURE(StartServer());

  bool installed = true;
  const grpc::Status finished = EnrollWithTheGrant(installed);
  EXPECT_FALSE(installed);
  EXPECT_EQ(finished.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(finished.error_message(), "enrollment: " + (dir_ / "credentials").string() +
                                          ": a symbolic link, not a directory");
  EXPECT_FALSE(server_->done());
  EXPECT_TRUE(fs::is_empty(dir_ / "elsewhere"));
}

// A controller that calls again after its grant was installed (the answer was lost) is told to try
// later, not refused: until the agent serves its Agent API with the grant, "already enrolled" would
// end `llmctl node up`, which retries only UNAVAILABLE, where the next try finds the grant held.
TEST_F(EnrollmentServerTest, ACallAfterTheGrantWasInstalledIsToldToTryLater) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  bool installed = false;
  const grpc::Status first = EnrollWithTheGrant(installed);
  ASSERT_TRUE(first.ok()) << first.error_message();
  EXPECT_TRUE(installed);
  ASSERT_TRUE(server_->done());

  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub_->Enroll(&context);
  v1::EnrollmentOffer offer;
  EXPECT_FALSE(stream->Read(&offer));
  const grpc::Status again = stream->Finish();
  EXPECT_EQ(again.error_code(), grpc::StatusCode::UNAVAILABLE) << again.error_message();
  EXPECT_EQ(again.error_message(), "enrollment: enrolled; restarting as the node's agent");
}

}  // namespace
}  // namespace llmctl::agent
