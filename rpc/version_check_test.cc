#include "rpc/version_check.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "llmctl/v1/agent.grpc.pb.h"

namespace llmctl::rpc {
namespace {

namespace pb = llmctl::v1;

// A server of `version` (none: one older than the announcement, which neither says nor checks
// one) that checks its callers' when `checks`, and answers `answer`.
class VersionedServer final : public pb::Agent::Service {
 public:
  VersionedServer(std::optional<std::string> version, bool checks,
                  grpc::Status answer = grpc::Status::OK)
      : version_(std::move(version)), checks_(checks), answer_(std::move(answer)) {}

  grpc::Status GetNodeInfo(grpc::ServerContext* context, const pb::GetNodeInfoRequest*,
                           pb::NodeInfo* response) override {
    if (grpc::Status checked = AnnounceAndCheck(*context); !checked.ok()) return checked;
    response->set_node("node1");
    return answer_;
  }

  // A stream that ends with `answer` before any message.
  grpc::Status StreamEvents(grpc::ServerContext* context, const pb::StreamEventsRequest*,
                            grpc::ServerWriter<pb::StreamEventsResponse>*) override {
    if (grpc::Status checked = AnnounceAndCheck(*context); !checked.ok()) return checked;
    return answer_;
  }

 private:
  grpc::Status AnnounceAndCheck(grpc::ServerContext& context) const {
    if (version_.has_value()) AnnounceVersion(context, *version_);
    if (!checks_) return grpc::Status::OK;
    return CheckClientVersion(context.client_metadata(), *version_);
  }

  const std::optional<std::string> version_;
  const bool checks_;
  const grpc::Status answer_;
};

enum class Method { kUnary, kEmptyStream };

// One GetNodeInfo (kUnary), or one StreamEvents read to its end (kEmptyStream), from a client of
// `client_version` (none: one older than the header, which sends none) to `server`; `hint` is the
// client's (VersionInterceptor).
grpc::Status Call(VersionedServer& server, const std::optional<std::string>& client_version,
                  Method method = Method::kUnary, EmbeddedHint hint = EmbeddedHint::kInclude) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&server);
  const std::unique_ptr<grpc::Server> running = builder.BuildAndStart();
  EXPECT_NE(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (client_version.has_value()) interceptors.push_back(VersionInterceptor(*client_version, hint));
  auto stub = pb::Agent::NewStub(grpc::experimental::CreateCustomChannelWithInterceptors(
      address, grpc::InsecureChannelCredentials(), grpc::ChannelArguments(),
      std::move(interceptors)));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::Status status;
  if (method == Method::kUnary) {
    pb::NodeInfo info;
    status = stub->GetNodeInfo(&context, {}, &info);
    if (status.ok()) {
      EXPECT_EQ(info.node(), "node1");
    }
  } else {
    const auto reader = stub->StreamEvents(&context, {});
    pb::StreamEventsResponse event;
    EXPECT_FALSE(reader->Read(&event));
    status = reader->Finish();
  }
  running->Shutdown();
  return status;
}

TEST(VersionCheckTest, AClientAndAServerOfOneVersionTalk) {
  VersionedServer server("0.4.0", /*checks=*/true);
  const grpc::Status status = Call(server, "0.4.0");
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST(VersionCheckTest, TheServerRefusesAClientOfAnotherVersionNamingBoth) {
  VersionedServer server("0.4.0", /*checks=*/true);
  const grpc::Status status = Call(server, "0.3.9");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message(),
            "this llmctl is 0.3.9 and the controller llmctl 0.4.0; they must be the same version: "
            "install llmctl 0.4.0 here");
}

TEST(VersionCheckTest, TheServerRefusesAClientThatDoesNotSayItsVersion) {
  VersionedServer server("0.4.0", /*checks=*/true);
  const grpc::Status status = Call(server, std::nullopt);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message(),
            "this llmctl does not say its version (it is older than the controller's, llmctl "
            "0.4.0); they must be the same version: install llmctl 0.4.0 here");
}

// A server that announces another version but runs the call anyway (as a later release might
// accept a range) is refused by the client.
TEST(VersionCheckTest, TheClientRefusesTheAnswerOfAServerOfAnotherVersion) {
  VersionedServer server("0.4.1", /*checks=*/false);
  const grpc::Status status = Call(server, "0.4.0");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message(),
            "the controller is llmctl 0.4.1 and this llmctl 0.4.0; they must be the same version: "
            "install llmctl 0.4.1 here, or run llmctl 0.4.0's llmctld (the embedded one: llmctl "
            "daemon stop)");
}

// A version is the other process's text: a long one is quoted cut to 64 bytes, on either side.
TEST(VersionCheckTest, ALongVersionIsQuotedCut) {
  const std::string long_version(4000, '9');
  const std::string quoted = std::string(61, '9') + "\u2026";  // 64 bytes with its "…"
  VersionedServer client_refused("0.4.0", /*checks=*/true);
  const grpc::Status refused = Call(client_refused, long_version);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(refused.error_message(),
            "this llmctl is " + quoted +
                " and the controller llmctl 0.4.0; they must be the same version: install llmctl "
                "0.4.0 here");

  VersionedServer announcing(long_version, /*checks=*/false);
  const grpc::Status answer = Call(announcing, "0.4.0");
  EXPECT_EQ(answer.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(answer.error_message(),
            "the controller is llmctl " + quoted +
                " and this llmctl 0.4.0; they must be the same version: install llmctl " + quoted +
                " here, or run llmctl 0.4.0's llmctld (the embedded one: llmctl daemon stop)");
}

// Every llmctld since the header announces its version: one that announces none is older and
// speaks an older API, so its answer is refused saying so and how to run this llmctl's (it was
// taken as it was, and the CLI failed later on what that llmctld made of its request).
TEST(VersionCheckTest, TheClientRefusesTheAnswerOfAServerThatAnnouncesNoVersion) {
  const std::string refusal =
      "the controller does not say its version (it is older than this llmctl, 0.4.0); they must be "
      "the same version: run llmctl 0.4.0's llmctld (the embedded one: llmctl daemon stop, and the "
      "next llmctl command starts this llmctl's)";
  for (const Method method : {Method::kUnary, Method::kEmptyStream}) {
    VersionedServer server(std::nullopt, /*checks=*/false);
    const grpc::Status status = Call(server, "0.4.0", method);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(status.error_message(), refusal);
  }
}

// A client that stops an llmctld it started itself (llmctl's embedded one) is refused without the
// step for an embedded llmctld, whole: it cut that step out of the text.
TEST(VersionCheckTest, TheClientsRefusalLeavesOutTheEmbeddedStepWhenAsked) {
  VersionedServer another("0.4.1", /*checks=*/false);
  const grpc::Status refused = Call(another, "0.4.0", Method::kUnary, EmbeddedHint::kLeaveOut);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(refused.error_message(),
            "the controller is llmctl 0.4.1 and this llmctl 0.4.0; they must be the same version: "
            "install llmctl 0.4.1 here, or run llmctl 0.4.0's llmctld");

  VersionedServer unsaid(std::nullopt, /*checks=*/false);
  const grpc::Status unknown = Call(unsaid, "0.4.0", Method::kUnary, EmbeddedHint::kLeaveOut);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(unknown.error_message(),
            "the controller does not say its version (it is older than this llmctl, 0.4.0); they "
            "must be the same version: run llmctl 0.4.0's llmctld");
}

// A stream that ends OK before any message still carries the server's announcement (gRPC sends
// custom initial metadata ahead of the status rather than a trailers-only answer), so the check
// above does not refuse an llmctld of this version whose Watch or FetchArtifacts sends nothing.
TEST(VersionCheckTest, AnEmptyStreamOfAServerOfTheSameVersionIsTaken) {
  VersionedServer server("0.4.0", /*checks=*/true);
  const grpc::Status status = Call(server, "0.4.0", Method::kEmptyStream);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

// A failure is the server's to describe: the client does not put a version refusal over it.
TEST(VersionCheckTest, TheClientLeavesAFailedCallsStatusAlone) {
  VersionedServer server(std::nullopt, /*checks=*/false,
                         grpc::Status(grpc::StatusCode::NOT_FOUND, "no such node"));
  const grpc::Status status = Call(server, "0.4.0");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(), "no such node");
}

}  // namespace
}  // namespace llmctl::rpc
