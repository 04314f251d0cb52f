// What the tests of the controller's API over a unix socket (controller_service_test.cc,
// controller_service_nodes_test.cc) share: a two-trial experiment and the fixture, one llmctld
// without its dispatcher in a fresh data directory per test.
#ifndef LLMCTL_CONTROLLER_CONTROLLER_SERVICE_TEST_SUPPORT_H_
#define LLMCTL_CONTROLLER_CONTROLLER_SERVICE_TEST_SUPPORT_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "controller/clock.h"
#include "controller/config.h"
#include "controller/daemon.h"
#include "controller/test_experiment.h"
#include "llmctl/v1/controller.grpc.pb.h"

namespace llmctl::controller::test_support {

namespace fs = std::filesystem;

inline std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class ControllerServiceTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = testing::TempDir() + "/controller_service_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
    ControllerConfig config;
    config.data_dir = root_ + "/data";
    config.listen = "unix:" + root_ + "/run/controller.sock";
    auto daemon = Daemon::Start(config, clock_, {.run_dispatcher = false});
    ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
    daemon_ = std::move(*daemon);
    stub_ = v1::Controller::NewStub(
        grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    daemon_.reset();
    fs::remove_all(root_);
  }

  grpc::Status Submit(std::string_view filename, std::string_view text,
                      v1::SubmitResponse* response,
                      const std::map<std::string, v1::InputTree>& inputs = {}) {
    v1::SubmitRequest request;
    request.set_filename(std::string(filename));
    request.set_yaml_text(std::string(text));
    for (const auto& [path, tree] : inputs) (*request.mutable_inputs())[path] = tree;
    grpc::ClientContext context;
    return stub_->Submit(&context, request, response);
  }

  grpc::Status Report(int64_t experiment_id, v1::ReportResponse* response) {
    v1::GetExperimentRequest request;
    request.set_experiment_id(experiment_id);
    grpc::ClientContext context;
    return stub_->Report(&context, request, response);
  }

  grpc::Status Upload(const std::string& sha256, int64_t size,
                      const std::vector<std::string>& parts, v1::UploadBlobResponse* response) {
    grpc::ClientContext context;
    auto writer = stub_->UploadBlob(&context, response);
    for (size_t i = 0; i < parts.size(); ++i) {
      v1::BlobChunk chunk;
      if (i == 0) {
        chunk.set_sha256(sha256);
        chunk.set_size(size);
      }
      chunk.set_data(parts[i]);
      writer->Write(chunk);
    }
    writer->WritesDone();
    return writer->Finish();
  }

  int ExperimentCount() {
    grpc::ClientContext context;
    v1::ListExperimentsResponse response;
    EXPECT_TRUE(stub_->ListExperiments(&context, {}, &response).ok());
    return response.experiments_size();
  }

  ManualClock clock_{store::Time(std::chrono::seconds(1'700'000'000))};
  std::string root_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<v1::Controller::Stub> stub_;
};

}  // namespace llmctl::controller::test_support

#endif  // LLMCTL_CONTROLLER_CONTROLLER_SERVICE_TEST_SUPPORT_H_
