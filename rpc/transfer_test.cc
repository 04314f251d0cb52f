#include "rpc/transfer.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <limits>
#include <string>

#include "llmctl/v1/agent.grpc.pb.h"

namespace llmctl::rpc {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(TransferDeadlineTest, EmptyTransferGetsTheBase) {
  EXPECT_EQ(TransferDeadline(seconds(30), 0, kDefaultMinTransferBytesPerSecond), seconds(30));
}

TEST(TransferDeadlineTest, AddsTheTimeTheBytesTakeAtTheMinimumRate) {
  EXPECT_EQ(TransferDeadline(seconds(30), 10 << 20, 10 << 20), seconds(31));
  EXPECT_EQ(TransferDeadline(seconds(30), 5 << 20, 10 << 20), milliseconds(30'500));
  // Rounded up: one byte at 3 B/s is 334 ms, not 333.
  EXPECT_EQ(TransferDeadline(milliseconds(0), 1, 3), milliseconds(334));
}

TEST(TransferDeadlineTest, A13BModelDirectoryGetsFarMoreThanTheFixedCallDeadline) {
  const int64_t model_bytes = int64_t{26} * 1000 * 1000 * 1000;  // ~13B parameters in bf16
  const milliseconds deadline =
      TransferDeadline(seconds(30), model_bytes, kDefaultMinTransferBytesPerSecond);
  EXPECT_GT(deadline, seconds(30));
  // 26e9 B / 10 MiB/s = 2479.554 s, plus the base.
  EXPECT_EQ(deadline, milliseconds(30'000 + 2'479'554));
}

TEST(TransferDeadlineTest, NonsenseInputsDoNotProduceNonsenseDeadlines) {
  EXPECT_EQ(TransferDeadline(seconds(1), -5, 100), seconds(1));
  EXPECT_EQ(TransferDeadline(seconds(1), 100, 0), seconds(101));  // rate below 1 counts as 1 B/s
  EXPECT_EQ(TransferDeadline(seconds(1), std::numeric_limits<int64_t>::max(), 1),
            milliseconds::max());
  EXPECT_EQ(TransferDeadline(milliseconds::max(), 1, 1), milliseconds::max());
}

// Sends one artifact chunk, then nothing until the client goes away: a stalled download.
class StallingAgent final : public v1::Agent::Service {
  grpc::Status FetchArtifacts(grpc::ServerContext* context, const v1::FetchArtifactsRequest*,
                              grpc::ServerWriter<v1::ArtifactChunk>* writer) override {
    v1::ArtifactChunk chunk;
    chunk.set_path("adapter.safetensors");
    chunk.set_size(2);
    chunk.set_data("a");
    writer->Write(chunk);
    while (!context->IsCancelled()) std::this_thread::sleep_for(milliseconds(5));
    return grpc::Status::CANCELLED;
  }
};

class IdleCancellerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    socket_ = std::filesystem::temp_directory_path() /
              ("llmctl_transfer_" + std::to_string(::getpid()) + ".sock");
    std::filesystem::remove(socket_);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_.string(), grpc::InsecureServerCredentials());
    builder.RegisterService(&agent_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Agent::NewStub(
        grpc::CreateChannel("unix:" + socket_.string(), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    server_->Shutdown();
    std::filesystem::remove(socket_);
  }

  std::filesystem::path socket_;
  StallingAgent agent_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Agent::Stub> stub_;
};

TEST_F(IdleCancellerTest, CancelsAStalledStreamAndSaysWhy) {
  grpc::ClientContext context;
  Status finished;
  {
    IdleCanceller idle(context, milliseconds(200));
    auto reader = stub_->FetchArtifacts(&context, v1::FetchArtifactsRequest());
    v1::ArtifactChunk chunk;
    while (reader->Read(&chunk)) idle.Progress();
    finished = idle.Explain(reader->Finish(), "fetching artifacts");
  }
  EXPECT_EQ(finished.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(finished.message().find("fetching artifacts: nothing arrived for 200 ms"),
            std::string::npos)
      << finished.message();
}

TEST(IdleCancellerExplainTest, PassesOtherStatusesThrough) {
  grpc::ClientContext context;
  IdleCanceller idle(context, std::chrono::hours(1));
  EXPECT_TRUE(idle.Explain(grpc::Status::OK, "x").ok());
  // CANCELLED by someone else stays CANCELLED.
  EXPECT_EQ(idle.Explain(grpc::Status::CANCELLED, "x").code(), StatusCode::kCancelled);
  EXPECT_EQ(idle.Explain(grpc::Status(grpc::StatusCode::NOT_FOUND, "no run"), "x").message(),
            "no run");
}

}  // namespace
}  // namespace llmctl::rpc
