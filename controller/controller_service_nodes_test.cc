// ControllerService's handlers of nodes (controller_service_nodes.cc) over real gRPC on a unix
// socket: registration and its credentials, a lease's update, deregistration, and registrations
// and removals of one name at once.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/files.h"
#include "controller/controller_service.h"
#include "controller/controller_service_test_support.h"
#include "controller/secrets.h"
#include "rpc/certificates.h"

namespace llmctl::controller {
namespace {

namespace fs = std::filesystem;
using test_support::ControllerServiceTest;
using test_support::kExperiment;
using test_support::ReadAll;

TEST_F(ControllerServiceTest, RegisterNodeIssuesCredentialsThatAreStoredOnlyInTheSecretsFile) {
  grpc::ClientContext context;
  v1::RegisterNodeRequest request;
  request.set_name("gpu-1");
  request.set_address("127.0.0.1:7443");
  v1::NodeCredentials credentials;
  grpc::Status status = stub_->RegisterNode(&context, request, &credentials);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(credentials.name(), "gpu-1");
  EXPECT_EQ(credentials.token().size(), 64u);
  EXPECT_NE(credentials.certificate_pem().find("BEGIN CERTIFICATE"), std::string::npos);
  EXPECT_NE(credentials.private_key_pem().find("PRIVATE KEY"), std::string::npos);
  EXPECT_EQ(credentials.ca_certificate_pem(), ReadAll(root_ + "/data/ca/ca.crt"));

  EXPECT_NE(ReadAll(root_ + "/data/secrets.json").find(credentials.token()), std::string::npos);
  for (const fs::directory_entry& entry : fs::directory_iterator(root_ + "/data")) {
    if (entry.path().filename().string().starts_with("llmctl.db")) {
      EXPECT_EQ(ReadAll(entry.path()).find(credentials.token()), std::string::npos) << entry.path();
    }
  }
  grpc::ClientContext list_context;
  v1::ListNodesResponse nodes;
  ASSERT_TRUE(stub_->ListNodes(&list_context, {}, &nodes).ok());
  ASSERT_EQ(nodes.nodes_size(), 1);
  EXPECT_EQ(nodes.nodes(0).address(), "127.0.0.1:7443");

  // A bad name is quoted in the refusal without its controls and cut to 80 bytes: it is another
  // party's text, and one of 3,000 bytes was quoted whole before.
  for (const std::string& name :
       {std::string(), std::string("has space"), std::string("-lead"), std::string("under_score"),
        std::string("x.y"), std::string("evil\x1b]0;x\x07"), std::string(3000, 'n')}) {
    grpc::ClientContext bad_context;
    v1::RegisterNodeRequest bad;
    bad.set_name(name);
    bad.set_address("127.0.0.1:1");
    const grpc::Status refused = stub_->RegisterNode(&bad_context, bad, &credentials);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << name;
    EXPECT_EQ(refused.error_message().find_first_of("\x1b\x07"), std::string::npos);
    EXPECT_LT(refused.error_message().size(), 200u) << refused.error_message();
    EXPECT_NE(refused.error_message().find("use 1 to 63 letters"), std::string::npos)
        << refused.error_message();
  }
  // An address is shown and stored: no spaces (but in a socket's path), controls (an escape
  // sequence, a forged line) or kilobytes of it.
  for (const std::string& address :
       {std::string("not an address"), std::string("evil\x1b]0;x\x07:7443"),
        std::string("10.0.0.1:7443\nnode gpu-2"), std::string("del\x7f:1"),
        std::string(2000, 'h').append(":1")}) {
    grpc::ClientContext bad_address_context;
    request.set_address(address);
    grpc::Status refused = stub_->RegisterNode(&bad_address_context, request, &credentials);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << address;
    EXPECT_EQ(refused.error_message().find_first_of("\x1b\x07\n\x7f"), std::string::npos);
  }
  // A socket's path may hold a space: the embedded agent's is in LLMCTL_HOME.
  grpc::ClientContext spaced_socket_context;
  request.set_name("gpu-2");
  request.set_address("unix:/home/ana/My Drive/llmctl/agent.sock");
  const grpc::Status spaced_socket =
      stub_->RegisterNode(&spaced_socket_context, request, &credentials);
  EXPECT_TRUE(spaced_socket.ok()) << spaced_socket.error_message();
  request.set_name("gpu-1");
  // The address shown is cut at a character's start: no half of the "é" that straddles its
  // 200th byte, which would read as U+FFFD.
  std::string accented(199, 'h');
  for (int i = 0; i < 600; ++i) accented.append("\u00e9");
  request.set_address(accented.append(":1"));
  grpc::ClientContext long_address_context;
  grpc::Status refused = stub_->RegisterNode(&long_address_context, request, &credentials);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.error_message().find("\ufffd"), std::string::npos) << refused.error_message();
  EXPECT_NE(refused.error_message().find("h\u2026' is neither"), std::string::npos)
      << refused.error_message();
}

// A lease's end is in seconds up to the year 2261, the last a store::Time holds (one sent in
// milliseconds wrapped to 1892 and stopped the node's trials; one in 2571 overflowed the time, as
// the year 9999 was taken before), and its names are printable text.
TEST_F(ControllerServiceTest, ALeasesEndPastTheYear2261OrAControlCharacterInItsNameIsRefused) {
  grpc::ClientContext register_context;
  v1::RegisterNodeRequest node;
  node.set_name("gpu-1");
  node.set_address("127.0.0.1:7443");
  v1::NodeCredentials credentials;
  ASSERT_TRUE(stub_->RegisterNode(&register_context, node, &credentials).ok());
  auto update = [&](int64_t ends_unix, const std::string& name) {
    grpc::ClientContext context;
    v1::UpdateNodeRequest request;
    request.set_name("gpu-1");
    request.mutable_lease()->set_name(name);
    request.mutable_lease()->set_ends_unix(ends_unix);
    v1::NodeStatus status;
    return stub_->UpdateNode(&context, request, &status);
  };
  EXPECT_TRUE(update(1'800'000'000, "my-lease").ok());
  const grpc::Status millis = update(int64_t{1'800'000'000} * 1000, "my-lease");
  EXPECT_EQ(millis.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(millis.error_message(),
            "update node gpu-1: the lease's end 1800000000000 is past the year 2261 (ends_unix is "
            "in seconds)");
  // tests/fuzz/corpus/controller_rpc/crash-update-node-lease-ends-in-2571.
  EXPECT_EQ(update(18'979'869'184, "lab").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(update(store::kMaxUnixSeconds, "lab").ok());
  EXPECT_EQ(update(1'800'000'000, "lease\x1b[2J").error_message(),
            "update node gpu-1: the lease's name holds a control character");
}

TEST_F(ControllerServiceTest, DeregisterNodeRequeuesItsTrialsRevokesItsTokenAndIsIdempotent) {
  auto register_node = [&](v1::NodeCredentials* credentials) {
    grpc::ClientContext context;
    v1::RegisterNodeRequest request;
    request.set_name("gpu-1");
    request.set_address("127.0.0.1:7443");
    return stub_->RegisterNode(&context, request, credentials);
  };
  auto deregister = [&](const std::string& name, v1::DeregisterNodeResponse* response) {
    grpc::ClientContext context;
    v1::DeregisterNodeRequest request;
    request.set_name(name);
    return stub_->DeregisterNode(&context, request, response);
  };
  auto listed = [&] {
    grpc::ClientContext context;
    v1::ListNodesResponse nodes;
    EXPECT_TRUE(stub_->ListNodes(&context, {}, &nodes).ok());
    std::vector<std::string> names;
    for (const v1::NodeStatus& node : nodes.nodes()) names.push_back(node.name());
    return names;
  };
  v1::NodeCredentials first;
  ASSERT_TRUE(register_node(&first).ok());
  v1::SubmitResponse submitted;
  ASSERT_TRUE(Submit("tiny.yaml", kExperiment, &submitted).ok());
  store::Store& store = daemon_->store();
  const std::vector<store::TrialRecord> trials = *store.ListTrials(submitted.experiment_id());
  ASSERT_EQ(*store.StartAttempt(trials[0].id, "gpu-1", clock_.Now()), 1);

  v1::DeregisterNodeResponse removed;
  grpc::Status status = deregister("gpu-1", &removed);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(removed.result(), "removed");
  EXPECT_EQ(removed.removed_unix(), 1'700'000'000);
  ASSERT_EQ(removed.requeued_size(), 1);
  EXPECT_EQ(removed.requeued(0), std::to_string(submitted.experiment_id()) + "/a#1");
  // At once, with the clock where it was: no requeue_after to wait for.
  EXPECT_EQ(store.GetTrial(trials[0].id)->state, store::TrialState::kQueued);
  EXPECT_EQ(store.GetTrial(trials[0].id)->current_attempt, 1);
  EXPECT_TRUE(listed().empty());
  // The token is revoked: gone from the secrets file, so the controller can never present it.
  EXPECT_EQ(ReadAll(root_ + "/data/secrets.json").find(first.token()), std::string::npos);
  EXPECT_EQ(store.GetSecretRef("gpu-1").status().code(), StatusCode::kNotFound);
  grpc::ClientContext update_context;
  v1::UpdateNodeRequest update;
  update.set_name("gpu-1");
  update.set_address("127.0.0.1:7444");
  v1::NodeStatus updated;
  EXPECT_EQ(stub_->UpdateNode(&update_context, update, &updated).error_code(),
            grpc::StatusCode::NOT_FOUND);

  clock_.Advance(std::chrono::seconds(60));
  v1::DeregisterNodeResponse again;
  ASSERT_TRUE(deregister("gpu-1", &again).ok());
  EXPECT_EQ(again.result(), "already_removed");
  EXPECT_EQ(again.removed_unix(), 1'700'000'000);
  EXPECT_EQ(again.requeued_size(), 0);
  v1::DeregisterNodeResponse unknown;
  ASSERT_TRUE(deregister("never-seen", &unknown).ok());
  EXPECT_EQ(unknown.result(), "unknown");
  EXPECT_EQ(unknown.removed_unix(), 0);
  EXPECT_EQ(deregister("bad name", &unknown).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // `node up` again under the same name: a new node with fresh credentials.
  v1::NodeCredentials second;
  ASSERT_TRUE(register_node(&second).ok());
  EXPECT_NE(second.token(), first.token());
  EXPECT_NE(second.certificate_pem(), first.certificate_pem());
  EXPECT_NE(ReadAll(root_ + "/data/secrets.json").find(second.token()), std::string::npos);
  EXPECT_EQ(listed(), std::vector<std::string>{"gpu-1"});
  EXPECT_EQ(*store.StartAttempt(trials[0].id, "gpu-1", clock_.Now()), 2);
}

TEST_F(ControllerServiceTest, RegisteringALiveNodeAgainNeedsItsCurrentToken) {
  auto register_node = [&](const std::string& current_token, v1::NodeCredentials* credentials) {
    grpc::ClientContext context;
    v1::RegisterNodeRequest request;
    request.set_name("gpu-1");
    request.set_address("127.0.0.1:7443");
    request.set_current_token(current_token);
    return stub_->RegisterNode(&context, request, credentials);
  };
  v1::NodeCredentials first;
  ASSERT_TRUE(register_node("", &first).ok());
  auto secrets = [&] { return *ReadFileToString(root_ + "/data/secrets.json", 1 << 20); };

  // A caller without the node's token cannot take its name over (and its trials with it).
  v1::NodeCredentials hijacked;
  grpc::Status without = register_node("", &hijacked);
  EXPECT_EQ(without.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(without.error_message(),
            "register node: node 'gpu-1' is registered; registering it again needs its current "
            "token (current_token), or remove it first (llmctl node down gpu-1)");
  grpc::Status wrong = register_node(std::string(64, '0'), &hijacked);
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(wrong.error_message().find(std::string(64, '0')), std::string::npos);
  EXPECT_NE(secrets().find(first.token()), std::string::npos) << "the refusals changed nothing";

  // Its holder may: new credentials, under a certificate name of their own.
  v1::NodeCredentials second;
  ASSERT_TRUE(register_node(first.token(), &second).ok());
  EXPECT_NE(second.token(), first.token());
  EXPECT_EQ(secrets().find(first.token()), std::string::npos);
  EXPECT_NE(secrets().find(second.token()), std::string::npos);

  // After `node down` the name is free, for a node that shares nothing with the old one.
  grpc::ClientContext down_context;
  v1::DeregisterNodeRequest down;
  down.set_name("gpu-1");
  v1::DeregisterNodeResponse removed;
  ASSERT_TRUE(stub_->DeregisterNode(&down_context, down, &removed).ok());
  v1::NodeCredentials third;
  ASSERT_TRUE(register_node("", &third).ok());
  EXPECT_NE(third.token(), second.token());
}

// `node up` again and `node down` of one name at once: each is whole before the other starts, so
// the name ends either listed with the new token stored, or removed with no token left.
// Interleaved, a removed node kept a live token, or a listed one had none the controller could
// present.
TEST_F(ControllerServiceTest, RegisteringAndRemovingOneNameAtOnceLeaveItWholeEitherWay) {
  auto secrets = [&] { return *ReadFileToString(root_ + "/data/secrets.json", 1 << 20); };
  auto listed = [&] {
    grpc::ClientContext context;
    v1::ListNodesResponse nodes;
    EXPECT_TRUE(stub_->ListNodes(&context, {}, &nodes).ok());
    return nodes.nodes_size() == 1;
  };
  v1::NodeCredentials current;
  {
    grpc::ClientContext context;
    v1::RegisterNodeRequest request;
    request.set_name("gpu-1");
    ASSERT_TRUE(stub_->RegisterNode(&context, request, &current).ok());
  }
  for (int round = 0; round < 60; ++round) {
    v1::NodeCredentials renewed;
    grpc::Status registered;
    std::thread renewal([&] {
      grpc::ClientContext context;
      v1::RegisterNodeRequest request;
      request.set_name("gpu-1");
      request.set_current_token(current.token());
      registered = stub_->RegisterNode(&context, request, &renewed);
    });
    {
      grpc::ClientContext context;
      v1::DeregisterNodeRequest down;
      down.set_name("gpu-1");
      v1::DeregisterNodeResponse removed;
      ASSERT_TRUE(stub_->DeregisterNode(&context, down, &removed).ok());
    }
    renewal.join();
    ASSERT_TRUE(registered.ok()) << registered.error_message();
    const bool token_stored = secrets().find(renewed.token()) != std::string::npos;
    ASSERT_EQ(listed(), token_stored) << "round " << round;
    if (!token_stored) {
      // Removed: back to a registered node for the next round.
      grpc::ClientContext context;
      v1::RegisterNodeRequest request;
      request.set_name("gpu-1");
      ASSERT_TRUE(stub_->RegisterNode(&context, request, &renewed).ok());
    }
    current = renewed;
  }
}

TEST_F(ControllerServiceTest, EachRegistrationHasACertificateNameOfItsOwnInTheSecretsFile) {
  auto names = [&]() -> std::vector<std::string> {
    auto secrets = SecretsFile::Open(root_ + "/data/secrets.json");
    EXPECT_TRUE(secrets.ok());
    StatusOr<std::string> name = (*secrets)->NodeCertificateName("gpu-1");
    return name.ok() ? std::vector<std::string>{*name} : std::vector<std::string>{};
  };
  v1::NodeCredentials first;
  {
    grpc::ClientContext context;
    v1::RegisterNodeRequest request;
    request.set_name("gpu-1");
    ASSERT_TRUE(stub_->RegisterNode(&context, request, &first).ok());
  }
  const std::vector<std::string> first_name = names();
  ASSERT_EQ(first_name.size(), 1u);
  EXPECT_TRUE(first_name[0].starts_with("agent-gpu-1.") && first_name[0].ends_with(".llmctl"))
      << first_name[0];
  EXPECT_NE(first_name[0], rpc::AgentCertificateName("gpu-1"));
  {
    grpc::ClientContext context;
    v1::DeregisterNodeRequest down;
    down.set_name("gpu-1");
    v1::DeregisterNodeResponse removed;
    ASSERT_TRUE(stub_->DeregisterNode(&context, down, &removed).ok());
  }
  EXPECT_TRUE(names().empty()) << "node down forgets the name with the token";
  v1::NodeCredentials second;
  {
    grpc::ClientContext context;
    v1::RegisterNodeRequest request;
    request.set_name("gpu-1");
    ASSERT_TRUE(stub_->RegisterNode(&context, request, &second).ok());
  }
  ASSERT_EQ(names().size(), 1u);
  EXPECT_NE(names()[0], first_name[0]);
}
}  // namespace
}  // namespace llmctl::controller
