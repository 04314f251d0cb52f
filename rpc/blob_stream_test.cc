#include "rpc/blob_stream.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "common/digest/digest.h"
#include "llmctl/v1/agent.grpc.pb.h"
#include "rpc/grpc_status.h"

namespace llmctl::rpc {
namespace {

namespace fs = std::filesystem;
namespace pb = llmctl::v1;

// Receives uploads into `dir`/<sha256> the way the agent and the controller do, with the blob
// named `present`, `present_bytes` long, taken as held already.
class Receiver final : public pb::Agent::Service {
 public:
  Receiver(fs::path dir, std::string present, int64_t present_bytes)
      : dir_(std::move(dir)), present_(std::move(present)), present_bytes_(present_bytes) {}

  grpc::Status UploadBlob(grpc::ServerContext*, grpc::ServerReader<pb::BlobChunk>* reader,
                          pb::UploadBlobResponse* response) override {
    return ToGrpcStatus([&]() -> Status {
      ASSIGN_OR_RETURN(pb::BlobChunk first, ReadFirstBlobChunk(*reader));
      response->set_sha256(first.sha256());
      if (first.sha256() == present_) {
        response->set_already_present(true);
        return DrainHeldBlob(*reader, first, present_bytes_);
      }
      const fs::path temp = dir_ / ("tmp-" + std::to_string(++uploads_));
      const int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd < 0) return InternalError("cannot create " + temp.string());
      digest::VerifiedFileWriter file("upload of " + first.sha256(), fd, temp.string(),
                                      (dir_ / first.sha256()).string(), first.size());
      return ReceiveBlob(*reader, std::move(first), file);
    }());
  }

 private:
  const fs::path dir_;
  const std::string present_;
  const int64_t present_bytes_;
  std::atomic<int> uploads_{0};
};

class BlobStreamTest : public ::testing::Test {
 protected:
  // The held blob's size: more chunks than flow control lets a sender write ahead of an idle
  // receiver.
  static constexpr int64_t kHeldBytes = 4 << 20;

  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("blob_stream_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "received");
    receiver_ =
        std::make_unique<Receiver>(dir_ / "received", digest::Sha256Hex("held"), kHeldBytes);
    grpc::ServerBuilder builder;
    builder.RegisterService(receiver_.get());
    server_ = builder.BuildAndStart();
    stub_ = pb::Agent::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }

  void TearDown() override {
    server_->Shutdown();
    fs::remove_all(dir_);
  }

  fs::path WriteSource(const std::string& name, const std::string& bytes) {
    const fs::path path = dir_ / name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  // Sends the file at `path` announced as `sha256` and `size`.
  Status Send(const fs::path& path, const std::string& sha256, int64_t size, size_t chunk_bytes,
              int64_t* bytes_sent, pb::UploadBlobResponse* response) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    EXPECT_GE(fd, 0) << path;
    grpc::ClientContext context;
    auto writer = stub_->UploadBlob(&context, response);
    const Status sent = SendBlob(*writer, context, {.sha256 = sha256, .size = size, .fd = fd},
                                 chunk_bytes, bytes_sent);
    close(fd);
    return sent;
  }

  std::string Received(const std::string& sha256) {
    std::ifstream in(dir_ / "received" / sha256, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

  // Files under received/: the published blobs and any temporary file left behind.
  int ReceivedFiles() {
    return static_cast<int>(
        std::distance(fs::directory_iterator(dir_ / "received"), fs::directory_iterator()));
  }

  fs::path dir_;
  std::unique_ptr<Receiver> receiver_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<pb::Agent::Stub> stub_;
};

TEST_F(BlobStreamTest, ABlobOfManyChunksArrivesWhole) {
  std::string bytes;
  for (int i = 0; i < 1000; ++i) bytes += static_cast<char>(i * 7);
  const std::string sha256 = digest::Sha256Hex(bytes);
  int64_t sent = 0;
  pb::UploadBlobResponse response;
  // 1000 bytes in chunks of 7: the last chunk is short.
  const Status status = Send(WriteSource("source", bytes), sha256,
                             static_cast<int64_t>(bytes.size()), 7, &sent, &response);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(sent, 1000);
  EXPECT_EQ(response.sha256(), sha256);
  EXPECT_FALSE(response.already_present());
  EXPECT_EQ(Received(sha256), bytes);
  EXPECT_EQ(ReceivedFiles(), 1);
}

TEST_F(BlobStreamTest, AnEmptyBlobIsSentAsOneChunkThatNamesIt) {
  const std::string sha256 = digest::Sha256Hex("");
  int64_t sent = 0;
  pb::UploadBlobResponse response;
  const Status status = Send(WriteSource("empty", ""), sha256, 0, 64, &sent, &response);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(sent, 0);
  EXPECT_EQ(response.sha256(), sha256);
  EXPECT_TRUE(fs::exists(dir_ / "received" / sha256));
  EXPECT_EQ(ReceivedFiles(), 1);
}

TEST_F(BlobStreamTest, BytesOtherThanAnnouncedArePublishedNowhere) {
  const std::string announced = "the announced bytes";
  int64_t sent = 0;
  pb::UploadBlobResponse response;
  const Status status =
      Send(WriteSource("changed", "the changed  bytes!"), digest::Sha256Hex(announced),
           static_cast<int64_t>(announced.size()), 4, &sent, &response);
  EXPECT_EQ(status.code(), StatusCode::kDataLoss) << status.message();
  EXPECT_EQ(ReceivedFiles(), 0);
}

TEST_F(BlobStreamTest, MoreBytesThanAnnouncedAreRefused) {
  const std::string bytes(100, 'x');
  pb::UploadBlobResponse response;
  const Status status = Send(WriteSource("long", bytes + "more"), digest::Sha256Hex(bytes), 100, 16,
                             nullptr, &response);
  EXPECT_EQ(status.code(), StatusCode::kDataLoss) << status.message();
  EXPECT_EQ(ReceivedFiles(), 0);
}

TEST_F(BlobStreamTest, AReceiverThatHoldsTheBlobReadsItsAnnouncedSizeAndNoMore) {
  const std::string bytes(kHeldBytes, 'h');
  int64_t sent = 0;
  pb::UploadBlobResponse response;
  const Status status = Send(WriteSource("held", bytes), digest::Sha256Hex("held"),
                             static_cast<int64_t>(bytes.size()), 1024, &sent, &response);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_TRUE(response.already_present());
  EXPECT_EQ(sent, static_cast<int64_t>(bytes.size()));
  EXPECT_EQ(ReceivedFiles(), 0);

  // A sender that goes on past the size it announced is refused, not read for as long as it
  // writes.
  const Status endless = Send(WriteSource("endless", bytes + bytes), digest::Sha256Hex("held"),
                              kHeldBytes, 1024, nullptr, &response);
  EXPECT_EQ(endless.code(), StatusCode::kInvalidArgument) << endless.message();
  EXPECT_NE(endless.message().find("more than the 4194304 bytes it announced"), std::string::npos)
      << endless.message();

  // Nor is one that announces a size other than the held blob's: a digest names one content, and
  // the sender's word would otherwise bound how long it is read.
  const Status inflated = Send(WriteSource("inflated", bytes + bytes), digest::Sha256Hex("held"),
                               2 * kHeldBytes, 1024, nullptr, &response);
  EXPECT_EQ(inflated.code(), StatusCode::kInvalidArgument) << inflated.message();
  EXPECT_NE(inflated.message().find("announced 8388608 bytes, where the blob of that digest held "
                                    "here has 4194304"),
            std::string::npos)
      << inflated.message();
}

TEST_F(BlobStreamTest, AnUnreadableSourceCancelsTheCallAndSaysWhy) {
  // A directory opens for reading, and read(2) fails on it (EISDIR).
  fs::create_directories(dir_ / "a-directory");
  int64_t sent = 0;
  pb::UploadBlobResponse response;
  const Status status = Send(dir_ / "a-directory", digest::Sha256Hex("x"), 1, 64, &sent, &response);
  EXPECT_EQ(status.code(), StatusCode::kDataLoss);
  EXPECT_NE(status.message().find("read failed during the upload: Is a directory"),
            std::string::npos)
      << status.message();
  EXPECT_EQ(sent, 0);
  EXPECT_EQ(ReceivedFiles(), 0);
}

TEST_F(BlobStreamTest, AChunkNamingAnotherBlobIsRefused) {
  const std::string bytes = "two halves";
  grpc::ClientContext context;
  pb::UploadBlobResponse response;
  auto writer = stub_->UploadBlob(&context, &response);
  pb::BlobChunk chunk;
  chunk.set_sha256(digest::Sha256Hex(bytes));
  chunk.set_size(static_cast<int64_t>(bytes.size()));
  chunk.set_data(bytes.substr(0, 4));
  ASSERT_TRUE(writer->Write(chunk));
  chunk.set_sha256(digest::Sha256Hex("another"));
  chunk.clear_size();
  chunk.set_data(bytes.substr(4));
  writer->Write(chunk);
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("a later chunk names another blob"), std::string::npos)
      << status.error_message();
  EXPECT_EQ(ReceivedFiles(), 0);
}

TEST_F(BlobStreamTest, AStreamWithoutChunksIsRefused) {
  grpc::ClientContext context;
  pb::UploadBlobResponse response;
  auto writer = stub_->UploadBlob(&context, &response);
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("the stream carried no chunk"), std::string::npos)
      << status.error_message();
}

}  // namespace
}  // namespace llmctl::rpc
