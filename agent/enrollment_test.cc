// The enrollment server as the controller calls it: where it keeps the credentials it is granted.
#include "agent/enrollment.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "llmctl/v1/agent.grpc.pb.h"
#include "rpc/tls.h"

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;
namespace v1 = llmctl::v1;

// A link in the place of the credentials' directory is refused, not followed to a directory
// elsewhere that the node's key and token would be written into; the node stays unenrolled.
TEST(EnrollmentServerTest, ALinkInTheCredentialsDirectorysPlaceIsRefusedAndNothingIsWritten) {
  const fs::path dir = fs::path(testing::TempDir()) / ("enrollment_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "elsewhere");
  fs::create_directory_symlink(dir / "elsewhere", dir / "credentials");
  auto ca = rpc::CertificateAuthority::LoadOrCreate((dir / "ca").string());
  ASSERT_TRUE(ca.ok()) << ca.status().ToString();
  auto controller = (*ca)->Issue(rpc::kControllerCertificateName, 1);
  auto node = (*ca)->Issue(rpc::AgentCertificateName("n1"), 1);
  ASSERT_TRUE(controller.ok() && node.ok());

  auto server =
      EnrollmentServer::Start({.listen = "127.0.0.1:0",
                               .node = "n1",
                               .ca_pem = (*ca)->ca_certificate_pem(),
                               .enrollment_token = "enrollment-token",
                               .certificate_file = (dir / "credentials" / "agent.crt").string(),
                               .private_key_file = (dir / "credentials" / "agent.key").string(),
                               .token_file = (dir / "credentials" / "token").string()});
  ASSERT_TRUE(server.ok()) << server.status().ToString();

  const rpc::TlsIdentity identity{(*ca)->ca_certificate_pem(), controller->certificate_pem,
                                  controller->private_key_pem};
  grpc::ChannelArguments arguments;
  arguments.SetSslTargetNameOverride(rpc::EnrollmentCertificateName("n1"));
  auto stub = v1::AgentEnrollment::NewStub(grpc::CreateCustomChannel(
      (*server)->address(), rpc::EnrollmentChannelCredentials(identity), arguments));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub->Enroll(&context);
  v1::EnrollmentOffer offer;
  ASSERT_TRUE(stream->Read(&offer));
  v1::EnrollmentGrant grant;
  grant.set_certificate_pem(node->certificate_pem);
  grant.set_private_key_pem(node->private_key_pem);
  grant.set_token("node-token");
  ASSERT_TRUE(stream->Write(grant));
  stream->WritesDone();
  EXPECT_FALSE(stream->Read(&offer) && offer.installed());
  const grpc::Status finished = stream->Finish();
  EXPECT_EQ(finished.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(finished.error_message(),
            "enrollment: " + (dir / "credentials").string() + ": a symbolic link, not a directory");
  EXPECT_FALSE((*server)->done());
  EXPECT_TRUE(fs::is_empty(dir / "elsewhere"));
  (*server)->Shutdown();
  fs::remove_all(dir);
}

// A controller that calls again after its grant was installed (the answer was lost) is told to try
// later, not refused: until the agent serves its Agent API with the grant, "already enrolled" would
// end `llmctl node up`, which retries only UNAVAILABLE, where the next try finds the grant held.
TEST(EnrollmentServerTest, ACallAfterTheGrantWasInstalledIsToldToTryLater) {
  const fs::path dir = fs::path(testing::TempDir()) / ("enrolled_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto ca = rpc::CertificateAuthority::LoadOrCreate((dir / "ca").string());
  ASSERT_TRUE(ca.ok()) << ca.status().ToString();
  auto controller = (*ca)->Issue(rpc::kControllerCertificateName, 1);
  auto node = (*ca)->Issue(rpc::AgentCertificateName("n1"), 1);
  ASSERT_TRUE(controller.ok() && node.ok());
  auto server =
      EnrollmentServer::Start({.listen = "127.0.0.1:0",
                               .node = "n1",
                               .ca_pem = (*ca)->ca_certificate_pem(),
                               .enrollment_token = "enrollment-token",
                               .certificate_file = (dir / "credentials" / "agent.crt").string(),
                               .private_key_file = (dir / "credentials" / "agent.key").string(),
                               .token_file = (dir / "credentials" / "token").string()});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const rpc::TlsIdentity identity{(*ca)->ca_certificate_pem(), controller->certificate_pem,
                                  controller->private_key_pem};
  grpc::ChannelArguments arguments;
  arguments.SetSslTargetNameOverride(rpc::EnrollmentCertificateName("n1"));
  auto stub = v1::AgentEnrollment::NewStub(grpc::CreateCustomChannel(
      (*server)->address(), rpc::EnrollmentChannelCredentials(identity), arguments));
  v1::EnrollmentGrant grant;
  grant.set_certificate_pem(node->certificate_pem);
  grant.set_private_key_pem(node->private_key_pem);
  grant.set_token("node-token");
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto stream = stub->Enroll(&context);
    v1::EnrollmentOffer offer;
    ASSERT_TRUE(stream->Read(&offer));
    ASSERT_TRUE(stream->Write(grant));
    stream->WritesDone();
    ASSERT_TRUE(stream->Read(&offer));
    EXPECT_TRUE(offer.installed());
    ASSERT_TRUE(stream->Finish().ok());
  }
  ASSERT_TRUE((*server)->done());

  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub->Enroll(&context);
  v1::EnrollmentOffer offer;
  EXPECT_FALSE(stream->Read(&offer));
  const grpc::Status again = stream->Finish();
  EXPECT_EQ(again.error_code(), grpc::StatusCode::UNAVAILABLE) << again.error_message();
  EXPECT_EQ(again.error_message(), "enrollment: enrolled; restarting as the node's agent");
  (*server)->Shutdown();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace llmctl::agent
