// A cloud node's enrollment through the controller's API (RegisterNode with `enroll`, EnrollNode)
// against a stand-in for the agent's AgentEnrollment service (agent/enrollment.h is the real one,
// which tests/integration/cloud_e2e_test.cc runs): what the node is given, once, and what is
// refused.
#include "controller/enrollment.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "common/files.h"
#include "controller/controller_service_test_support.h"
#include "controller/daemon.h"
#include "llmctl/v1/agent.grpc.pb.h"
#include "llmctl/v1/controller.grpc.pb.h"
#include "rpc/tls.h"

namespace llmctl::controller {
namespace {

namespace fs = std::filesystem;

// Presents `token` as node `node` to whoever holds the controller's certificate and keeps the
// grant it is handed, as llm-agent does (without writing files).
class StandInAgent final : public v1::AgentEnrollment::Service {
 public:
  // How its call ends once the grant came: answered `installed`, or broken (UNAVAILABLE) before the
  // grant was kept or after.
  enum class Ending { kAnswered, kBrokenBeforeInstalling, kBrokenAfterInstalling };
  // A `held` agent answers only once Release is called (or the call ends): a node that is slow
  // to speak.
  StandInAgent(std::string node, std::string token, const std::string& ca_pem, bool held = false,
               Ending ending = Ending::kAnswered)
      : node_(std::move(node)), token_(std::move(token)), held_(held), ending_(ending) {
    auto identity = rpc::SelfSignedIdentity(rpc::EnrollmentCertificateName(node_), ca_pem, 1);
    EXPECT_TRUE(identity.ok()) << identity.status().ToString();
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", rpc::EnrollmentServerCredentials(*identity), &port);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    address_ = "127.0.0.1:" + std::to_string(port);
  }
  ~StandInAgent() override { server_->Shutdown(); }

  grpc::Status Enroll(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::EnrollmentOffer, v1::EnrollmentGrant>* stream) override {
    {
      std::lock_guard lock(mutex_);
      ++calls_;
    }
    while (held_ && !released_ && !context->IsCancelled()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::lock_guard lock(mutex_);
    if (!rpc::CallerIsController(*context)) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "not the controller");
    }
    v1::EnrollmentOffer offer;
    offer.set_node(node_);
    offer.set_enrollment_token(token_);
    v1::EnrollmentGrant grant;
    if (!stream->Write(offer) || !stream->Read(&grant)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "no grant");
    }
    if (ending_ == Ending::kBrokenBeforeInstalling) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection lost");
    }
    grant_ = grant;
    if (ending_ == Ending::kBrokenAfterInstalling) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection lost");
    }
    v1::EnrollmentOffer installed;
    installed.set_installed(true);
    stream->Write(installed);
    return grpc::Status::OK;
  }

  void Release() { released_ = true; }
  const std::string& address() const { return address_; }
  int calls() {
    std::lock_guard lock(mutex_);
    return calls_;
  }
  std::optional<v1::EnrollmentGrant> grant() {
    std::lock_guard lock(mutex_);
    return grant_;
  }

 private:
  const std::string node_;
  const std::string token_;
  const bool held_;
  const Ending ending_;
  std::atomic<bool> released_{false};
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::mutex mutex_;
  int calls_ = 0;                             // guarded by mutex_
  std::optional<v1::EnrollmentGrant> grant_;  // guarded by mutex_
};

// The Agent API as an enrolled llm-agent serves it (agent/server.h), with `identity` and `token`:
// GetNodeInfo only, counting its calls.
class StandInAgentApi final : public v1::Agent::Service {
 public:
  StandInAgentApi(const rpc::TlsIdentity& identity, const std::string& token) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", rpc::ServerCredentials(identity, token), &port);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    address_ = "127.0.0.1:" + std::to_string(port);
  }
  ~StandInAgentApi() override { server_->Shutdown(); }

  grpc::Status GetNodeInfo(grpc::ServerContext*, const v1::GetNodeInfoRequest*,
                           v1::NodeInfo*) override {
    ++calls_;
    return grpc::Status::OK;
  }

  const std::string& address() const { return address_; }
  int calls() const { return calls_; }

 private:
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::atomic<int> calls_{0};
};

// The controller's daemon (no dispatcher) as ControllerServiceTest starts it, called as llmctl node
// up calls it.
class EnrollmentTest : public test_support::ControllerServiceTest {
 protected:
  v1::NodeCredentials RegisterForEnrollment(const std::string& node) {
    grpc::ClientContext context;
    v1::RegisterNodeRequest request;
    request.set_name(node);
    request.set_enroll(true);
    v1::NodeCredentials issued;
    const grpc::Status status = stub_->RegisterNode(&context, request, &issued);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return issued;
  }

  void SetAddress(const std::string& node, const std::string& address) {
    grpc::ClientContext context;
    v1::UpdateNodeRequest request;
    request.set_name(node);
    request.set_address(address);
    v1::NodeStatus updated;
    const grpc::Status status = stub_->UpdateNode(&context, request, &updated);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }

  grpc::Status Enroll(const std::string& node, v1::EnrollNodeResponse* response = nullptr) {
    grpc::ClientContext context;
    v1::EnrollNodeRequest request;
    request.set_name(node);
    v1::EnrollNodeResponse ignored;
    return stub_->EnrollNode(&context, request, response != nullptr ? response : &ignored);
  }

  std::string Secrets() { return *ReadFileToString(root_ + "/data/secrets.json", 1 << 20); }
  nlohmann::json SecretsJson() { return nlohmann::json::parse(Secrets()); }
  std::string CaPem() { return *ReadFileToString(root_ + "/data/ca/ca.crt", 1 << 20); }
};

TEST_F(EnrollmentTest, RegisteringForEnrollmentIssuesOnlyAnHourLongTokenStoredHashed) {
  const v1::NodeCredentials issued = RegisterForEnrollment("cloud-1");
  EXPECT_EQ(issued.name(), "cloud-1");
  EXPECT_EQ(issued.enrollment_token().size(), 64u);
  EXPECT_EQ(issued.enrollment_expires_unix(), 1'700'000'000 + 3600);
  EXPECT_EQ(issued.ca_certificate_pem(), CaPem());
  EXPECT_EQ(issued.certificate_pem(), "");
  EXPECT_EQ(issued.private_key_pem(), "");
  EXPECT_EQ(issued.token(), "");
  EXPECT_EQ(Secrets().find(issued.enrollment_token()), std::string::npos);
  // No agent waits yet at an address the node does not have.
  EXPECT_EQ(Enroll("cloud-1").error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(EnrollmentTest, TheAgentHoldingTheTokenGetsItsCredentialsOnce) {
  const v1::NodeCredentials issued = RegisterForEnrollment("cloud-1");
  StandInAgent agent("cloud-1", issued.enrollment_token(), issued.ca_certificate_pem());
  SetAddress("cloud-1", agent.address());
  v1::EnrollNodeResponse response;
  const grpc::Status enrolled = Enroll("cloud-1", &response);
  ASSERT_TRUE(enrolled.ok()) << enrolled.error_message();
  EXPECT_FALSE(response.already_enrolled());
  const std::optional<v1::EnrollmentGrant> grant = agent.grant();
  ASSERT_TRUE(grant.has_value());
  EXPECT_TRUE(
      rpc::CheckIssuedCertificate(CaPem(), grant->certificate_pem(), grant->private_key_pem())
          .ok());
  EXPECT_NE(grant->certificate_pem(), "");
  EXPECT_EQ(grant->token().size(), 64u);
  EXPECT_NE(Secrets().find(grant->token()), std::string::npos);

  // The token is spent: a second agent presenting it (one that read the user data back from the
  // metadata service) is not even called, and the node keeps its credentials.
  StandInAgent replay("cloud-1", issued.enrollment_token(), issued.ca_certificate_pem());
  SetAddress("cloud-1", replay.address());
  const grpc::Status again = Enroll("cloud-1", &response);
  ASSERT_TRUE(again.ok()) << again.error_message();
  EXPECT_TRUE(response.already_enrolled());
  EXPECT_EQ(replay.calls(), 0);
  EXPECT_NE(Secrets().find(grant->token()), std::string::npos);
}

TEST_F(EnrollmentTest, AWrongExpiredOrStaleTokenAndAnotherNodeAreRefusedAndGetNothing) {
  const v1::NodeCredentials issued = RegisterForEnrollment("cloud-1");
  {
    StandInAgent wrong("cloud-1", std::string(64, 'a'), issued.ca_certificate_pem());
    SetAddress("cloud-1", wrong.address());
    const grpc::Status refused = Enroll("cloud-1");
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(refused.error_message(),
              "enroll node cloud-1: the enrollment token presented for node 'cloud-1' is not its "
              "own");
    EXPECT_EQ(wrong.calls(), 1);
    EXPECT_FALSE(wrong.grant().has_value());
  }
  {
    StandInAgent other("cloud-2", issued.enrollment_token(), issued.ca_certificate_pem());
    SetAddress("cloud-1", other.address());
    const grpc::Status refused = Enroll("cloud-1");
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_NE(refused.error_message().find("is node 'cloud-2', not 'cloud-1'"), std::string::npos)
        << refused.error_message();
    EXPECT_FALSE(other.grant().has_value());
  }
  {
    // Registered again: the first token is stale.
    const v1::NodeCredentials second = RegisterForEnrollment("cloud-1");
    StandInAgent stale("cloud-1", issued.enrollment_token(), issued.ca_certificate_pem());
    SetAddress("cloud-1", stale.address());
    EXPECT_EQ(Enroll("cloud-1").error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_FALSE(stale.grant().has_value());

    clock_.Advance(std::chrono::hours(1));
    StandInAgent late("cloud-1", second.enrollment_token(), second.ca_certificate_pem());
    SetAddress("cloud-1", late.address());
    const grpc::Status expired = Enroll("cloud-1");
    EXPECT_EQ(expired.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_NE(expired.error_message().find("enrollment token expired 0 s ago (it lasts an hour)"),
              std::string::npos)
        << expired.error_message();
    EXPECT_FALSE(late.grant().has_value());
  }
  EXPECT_EQ(Secrets().find("\"cloud-1\": \""), std::string::npos) << "no node token was stored";
}

TEST_F(EnrollmentTest, NodeDownDropsTheEnrollmentAndNoAgentMeansUnavailable) {
  const v1::NodeCredentials issued = RegisterForEnrollment("cloud-1");
  SetAddress("cloud-1", "127.0.0.1:1");  // nobody listens on port 1
  EXPECT_EQ(Enroll("cloud-1").error_code(), grpc::StatusCode::UNAVAILABLE);

  StandInAgent agent("cloud-1", issued.enrollment_token(), issued.ca_certificate_pem());
  SetAddress("cloud-1", agent.address());
  grpc::ClientContext context;
  v1::DeregisterNodeRequest request;
  request.set_name("cloud-1");
  v1::DeregisterNodeResponse removed;
  ASSERT_TRUE(stub_->DeregisterNode(&context, request, &removed).ok());
  EXPECT_EQ(Secrets().find("cloud-1"), std::string::npos);
  EXPECT_EQ(Enroll("cloud-1").error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(agent.calls(), 0);
}

// An enrollment waiting on a node that is slow to answer (up to 20 s) holds only that node's name:
// another node registers and enrolls meanwhile, and the slow node's own registration waits.
TEST_F(EnrollmentTest, AnEnrollmentThatWaitsHoldsOnlyItsOwnNode) {
  const v1::NodeCredentials slow_issued = RegisterForEnrollment("slow-1");
  StandInAgent slow("slow-1", slow_issued.enrollment_token(), slow_issued.ca_certificate_pem(),
                    /*held=*/true);
  SetAddress("slow-1", slow.address());
  std::atomic<int> order{0};
  grpc::Status slow_enrollment;
  grpc::Status slow_registration;
  std::thread enrolling([&] {
    slow_enrollment = Enroll("slow-1");
    ++order;
  });
  while (slow.calls() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::thread registering([&] {
    grpc::ClientContext context;
    v1::RegisterNodeRequest request;
    request.set_name("slow-1");
    request.set_enroll(true);
    v1::NodeCredentials issued;
    slow_registration = stub_->RegisterNode(&context, request, &issued);
    ++order;
  });

  const v1::NodeCredentials issued = RegisterForEnrollment("cloud-2");
  StandInAgent agent("cloud-2", issued.enrollment_token(), issued.ca_certificate_pem());
  SetAddress("cloud-2", agent.address());
  const grpc::Status enrolled = Enroll("cloud-2");
  EXPECT_TRUE(enrolled.ok()) << enrolled.error_message();
  const int other_done = ++order;
  // Time for a registration of slow-1 that did not wait to end first.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  slow.Release();
  enrolling.join();
  registering.join();

  // Nothing of slow-1's had ended when cloud-2 was done.
  EXPECT_EQ(other_done, 1);
  EXPECT_TRUE(slow_enrollment.ok()) << slow_enrollment.error_message();
  // The registration ran after the enrollment, which gave slow-1 a token: registering again needs
  // it. Run before, it would have found only the pending enrollment and replaced it. (Which of the
  // two answers reached its client thread first is not the order the controller ran them in.)
  EXPECT_EQ(slow_registration.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << slow_registration.error_message();
}

// The agent installed its grant but its `installed` never reached the controller (the call broke
// after the agent wrote its files): it serves the Agent API with that grant from then on, where no
// enrollment answers. The next EnrollNode finds it holding the grant and completes the enrollment
// with it; before, every later EnrollNode was refused there and the node needed a new server.
TEST_F(EnrollmentTest, AnAgentWhoseInstalledAnswerWasLostIsEnrolledWithWhatItInstalled) {
  const v1::NodeCredentials issued = RegisterForEnrollment("cloud-1");
  {
    // A grant lost on its way: the agent still waits, and the next call gives it another.
    StandInAgent lost("cloud-1", issued.enrollment_token(), issued.ca_certificate_pem(), false,
                      StandInAgent::Ending::kBrokenBeforeInstalling);
    SetAddress("cloud-1", lost.address());
    EXPECT_EQ(Enroll("cloud-1").error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_FALSE(lost.grant().has_value());
  }
  std::optional<v1::EnrollmentGrant> grant;
  {
    StandInAgent agent("cloud-1", issued.enrollment_token(), issued.ca_certificate_pem(), false,
                       StandInAgent::Ending::kBrokenAfterInstalling);
    SetAddress("cloud-1", agent.address());
    EXPECT_EQ(Enroll("cloud-1").error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(agent.calls(), 1) << "the grant in waiting was not tried on an enrolling agent";
    grant = agent.grant();
    ASSERT_TRUE(grant.has_value());
  }
  EXPECT_FALSE(SecretsJson()["node_tokens"].contains("cloud-1"));

  // A server with the grant's token but a key of its own (another CA's certificate for the
  // grant's name) is not taken for the node, and is told nothing.
  const std::string certificate_name =
      SecretsJson()["enrollments"]["cloud-1"]["certificate_name"].get<std::string>();
  auto other_ca = rpc::CertificateAuthority::LoadOrCreate(root_ + "/other-ca");
  ASSERT_TRUE(other_ca.ok());
  auto forged = (*other_ca)->Issue(certificate_name, 1);
  ASSERT_TRUE(forged.ok());
  {
    StandInAgentApi impostor({CaPem(), forged->certificate_pem, forged->private_key_pem},
                             grant->token());
    SetAddress("cloud-1", impostor.address());
    EXPECT_FALSE(Enroll("cloud-1").ok());
    EXPECT_EQ(impostor.calls(), 0);
    EXPECT_FALSE(SecretsJson()["node_tokens"].contains("cloud-1"));
  }

  // The agent that installed the grant, serving the Agent API with it: enrolled with it.
  StandInAgentApi installed({CaPem(), grant->certificate_pem(), grant->private_key_pem()},
                            grant->token());
  SetAddress("cloud-1", installed.address());
  v1::EnrollNodeResponse response;
  const grpc::Status enrolled = Enroll("cloud-1", &response);
  ASSERT_TRUE(enrolled.ok()) << enrolled.error_message();
  EXPECT_FALSE(response.already_enrolled());
  EXPECT_EQ(installed.calls(), 1);
  const nlohmann::json secrets = SecretsJson();
  EXPECT_EQ(secrets["node_tokens"]["cloud-1"], grant->token());
  EXPECT_EQ(secrets["node_certificate_names"]["cloud-1"], certificate_name);
  EXPECT_TRUE(secrets["node_certificate_expiry"].contains("cloud-1"));
  EXPECT_FALSE(secrets["enrollments"].contains("cloud-1"));
  ASSERT_TRUE(Enroll("cloud-1", &response).ok());
  EXPECT_TRUE(response.already_enrolled());
}

// Only the controller hears a token: an agent's own certificate (same CA) is not enough.
TEST_F(EnrollmentTest, TheAgentTellsItsTokenOnlyToTheControllersCertificate) {
  const v1::NodeCredentials issued = RegisterForEnrollment("cloud-1");
  StandInAgent agent("cloud-1", issued.enrollment_token(), issued.ca_certificate_pem());
  auto ca = rpc::CertificateAuthority::LoadOrCreate(root_ + "/data/ca");
  ASSERT_TRUE(ca.ok());
  auto other_node = (*ca)->Issue(rpc::AgentCertificateName("cloud-2"), 1);
  ASSERT_TRUE(other_node.ok());
  const rpc::TlsIdentity impostor{CaPem(), other_node->certificate_pem,
                                  other_node->private_key_pem};
  const Status heard = EnrollAgent(agent.address(), "cloud-1", impostor, std::chrono::seconds(5),
                                   [](const std::string&) -> StatusOr<v1::EnrollmentGrant> {
                                     ADD_FAILURE() << "the impostor heard the token";
                                     return v1::EnrollmentGrant();
                                   });
  EXPECT_EQ(heard.code(), StatusCode::kPermissionDenied) << heard.ToString();
  EXPECT_EQ(agent.calls(), 1);
}

}  // namespace
}  // namespace llmctl::controller
