// The controller's API on TCP: a token in a 0600 file, checked on every method (the unix-socket
// API is controller_service_test.cc's).
#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/version.h"
#include "controller/controller_service.h"
#include "controller/daemon.h"
#include "rpc/tls.h"
#include "rpc/version_check.h"

namespace llmctl::controller {
namespace {

namespace fs = std::filesystem;

// The API on TCP: a token in a 0600 file, checked on every method.
class ControllerTcpTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = testing::TempDir() + "/controller_tcp_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
    token_file_ = root_ + "/api.token";
    std::ofstream(token_file_) << kToken << "\n";
    ASSERT_EQ(chmod(token_file_.c_str(), 0600), 0);
    config_.data_dir = root_ + "/data";
    config_.listen = "127.0.0.1:0";
    config_.token_file = token_file_;
  }
  void TearDown() override {
    daemon_.reset();
    fs::remove_all(root_);
  }

  void Start() {
    auto daemon = Daemon::Start(config_, clock_, {.run_dispatcher = false});
    ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
    daemon_ = std::move(*daemon);
  }

  // A stub whose every call carries `token` (none when empty) and the llmctl `version` (none: an
  // llmctl older than the version header) the CLI's way.
  std::unique_ptr<v1::Controller::Stub> StubWithToken(
      const std::string& token, const std::optional<std::string>& version = std::string(kVersion)) {
    std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> adders;
    if (!token.empty()) adders.push_back(rpc::BearerTokenInterceptor(token));
    if (version.has_value()) adders.push_back(rpc::VersionInterceptor(*version));
    return v1::Controller::NewStub(grpc::experimental::CreateCustomChannelWithInterceptors(
        daemon_->address(), grpc::InsecureChannelCredentials(), grpc::ChannelArguments(),
        std::move(adders)));
  }

  // Calls every method of the service once, with requests that name nothing that exists; the
  // status per method. A method missing here fails the test, so a new one cannot go unchecked.
  std::map<std::string, grpc::Status> CallEveryMethod(v1::Controller::Stub& stub) {
    using Call = std::function<grpc::Status(grpc::ClientContext*)>;
    const std::map<std::string, Call> calls = {
        {"MissingBlobs",
         [&](grpc::ClientContext* c) {
           v1::MissingBlobsResponse r;
           return stub.MissingBlobs(c, {}, &r);
         }},
        {"UploadBlob",
         [&](grpc::ClientContext* c) {
           v1::UploadBlobResponse r;
           auto writer = stub.UploadBlob(c, &r);
           writer->WritesDone();
           return writer->Finish();
         }},
        {"Submit",
         [&](grpc::ClientContext* c) {
           v1::SubmitResponse r;
           return stub.Submit(c, {}, &r);
         }},
        {"ListExperiments",
         [&](grpc::ClientContext* c) {
           v1::ListExperimentsResponse r;
           return stub.ListExperiments(c, {}, &r);
         }},
        {"GetExperiment",
         [&](grpc::ClientContext* c) {
           v1::ExperimentStatus r;
           return stub.GetExperiment(c, {}, &r);
         }},
        {"Watch",
         [&](grpc::ClientContext* c) {
           auto reader = stub.Watch(c, {});
           v1::ExperimentStatus r;
           while (reader->Read(&r)) {
           }
           return reader->Finish();
         }},
        {"Cancel",
         [&](grpc::ClientContext* c) {
           v1::CancelResponse r;
           return stub.Cancel(c, {}, &r);
         }},
        {"Resume",
         [&](grpc::ClientContext* c) {
           v1::ResumeResponse r;
           return stub.Resume(c, {}, &r);
         }},
        {"Report",
         [&](grpc::ClientContext* c) {
           v1::ReportResponse r;
           return stub.Report(c, {}, &r);
         }},
        {"TimedRuns",
         [&](grpc::ClientContext* c) {
           v1::TimedRunsResponse r;
           return stub.TimedRuns(c, {}, &r);
         }},
        {"FetchArtifacts",
         [&](grpc::ClientContext* c) {
           auto reader = stub.FetchArtifacts(c, {});
           v1::ArtifactChunk r;
           while (reader->Read(&r)) {
           }
           return reader->Finish();
         }},
        {"ListNodes",
         [&](grpc::ClientContext* c) {
           v1::ListNodesResponse r;
           return stub.ListNodes(c, {}, &r);
         }},
        {"MeasureNodeRates",
         [&](grpc::ClientContext* c) {
           v1::MeasureNodeRatesResponse r;
           return stub.MeasureNodeRates(c, {}, &r);
         }},
        {"RegisterNode",
         [&](grpc::ClientContext* c) {
           v1::RegisterNodeRequest request;
           request.set_name("intruder");
           v1::NodeCredentials r;
           return stub.RegisterNode(c, request, &r);
         }},
        {"UpdateNode",
         [&](grpc::ClientContext* c) {
           v1::NodeStatus r;
           return stub.UpdateNode(c, {}, &r);
         }},
        {"DeregisterNode",
         [&](grpc::ClientContext* c) {
           v1::DeregisterNodeResponse r;
           return stub.DeregisterNode(c, {}, &r);
         }},
        {"EnrollNode",
         [&](grpc::ClientContext* c) {
           v1::EnrollNodeResponse r;
           return stub.EnrollNode(c, {}, &r);
         }},
    };
    std::map<std::string, grpc::Status> statuses;
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            "llmctl.v1.Controller");
    EXPECT_NE(service, nullptr);
    if (service == nullptr) return statuses;
    for (int i = 0; i < service->method_count(); ++i) {
      const std::string name = service->method(i)->name();
      auto call = calls.find(name);
      if (call == calls.end()) {
        ADD_FAILURE() << "no call for " << name << " in CallEveryMethod";
        continue;
      }
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      statuses[name] = call->second(&context);
    }
    return statuses;
  }

  static constexpr char kToken[] =
      "4f1c0c5e9b2d7a8e6f3b1d0c9a8e7f6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f";
  ManualClock clock_{store::Time(std::chrono::seconds(1'700'000'000))};
  std::string root_;
  std::string token_file_;
  ControllerConfig config_;
  std::unique_ptr<Daemon> daemon_;
};

// How many methods the Controller service has: a new one cannot be left out of the token check.
int ControllerMethodCount() {
  return v1::ListNodesRequest::descriptor()
      ->file()
      ->FindServiceByName("Controller")
      ->method_count();
}

TEST_F(ControllerTcpTest, EveryMethodRefusesACallWithoutTheRightToken) {
  Start();
  EXPECT_TRUE(daemon_->address().starts_with("127.0.0.1:")) << daemon_->address();
  for (const std::string& token : {std::string(), std::string("wrong"),
                                   std::string(kToken).substr(1), std::string(kToken) + "0"}) {
    const std::map<std::string, grpc::Status> statuses = CallEveryMethod(*StubWithToken(token));
    // Every method the service has: a new one cannot be left out of this check.
    EXPECT_EQ(static_cast<int>(statuses.size()), v1::ListNodesRequest::descriptor()
                                                     ->file()
                                                     ->FindServiceByName("Controller")
                                                     ->method_count());
    for (const auto& [method, status] : statuses) {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << method << " with token '" << token << "': " << status.error_message();
      EXPECT_EQ(status.error_message(),
                token.empty() ? "missing bearer token" : "invalid bearer token")
          << method;
    }
  }
  auto nodes = daemon_->store().ListNodes();
  ASSERT_TRUE(nodes.ok());
  EXPECT_TRUE(nodes->empty()) << "the refused RegisterNode registered nothing";

  // The right token passes every method (each then fails or not on its own request).
  const std::map<std::string, grpc::Status> statuses = CallEveryMethod(*StubWithToken(kToken));
  EXPECT_EQ(static_cast<int>(statuses.size()), ControllerMethodCount());
  for (const auto& [method, status] : statuses) {
    EXPECT_NE(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << method << ": " << status.error_message();
  }
  EXPECT_TRUE(statuses.at("ListNodes").ok());
  EXPECT_TRUE(statuses.at("RegisterNode").ok());
}

// A CLI of another llmctl version, or one older than the version header, would send requests whose
// fields this controller misreads or drops: every method refuses it, naming both versions.
TEST_F(ControllerTcpTest, EveryMethodRefusesACliOfAnotherVersion) {
  Start();
  const std::string version(kVersion);
  const std::map<std::optional<std::string>, std::string> refusals = {
      {"0.3.9", "this llmctl is 0.3.9 and the controller llmctl " + version +
                    "; they must be the same version: install llmctl " + version + " here"},
      {std::nullopt,
       "this llmctl does not say its version (it is older than the controller's, "
       "llmctl " +
           version + "); they must be the same version: install llmctl " + version + " here"}};
  for (const auto& [cli_version, refusal] : refusals) {
    const std::map<std::string, grpc::Status> statuses =
        CallEveryMethod(*StubWithToken(kToken, cli_version));
    EXPECT_EQ(static_cast<int>(statuses.size()), ControllerMethodCount());
    for (const auto& [method, status] : statuses) {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
          << method << ": " << status.error_message();
      EXPECT_EQ(status.error_message(), refusal) << method;
    }
  }
  auto nodes = daemon_->store().ListNodes();
  ASSERT_TRUE(nodes.ok());
  EXPECT_TRUE(nodes->empty()) << "the refused RegisterNode registered nothing";
}

TEST_F(ControllerTcpTest, ATcpListenerWithoutAUsableTokenFileDoesNotStart) {
  config_.token_file.clear();
  auto none = Daemon::Start(config_, clock_, {.run_dispatcher = false});
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(none.status().message().rfind("listen address '127.0.0.1:0' is TCP, which any local "
                                          "account can reach: set token_file",
                                          0),
            0u)
      << none.status().message();

  config_.token_file = token_file_;
  ASSERT_EQ(chmod(token_file_.c_str(), 0644), 0);
  auto readable = Daemon::Start(config_, clock_, {.run_dispatcher = false});
  EXPECT_EQ(readable.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(readable.status().message(),
            "token file " + token_file_ + " may be read by others; chmod 600 it");

  config_.token_file = root_ + "/missing.token";
  EXPECT_EQ(Daemon::Start(config_, clock_, {.run_dispatcher = false}).status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace llmctl::controller
