#include "rpc/connection.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "llmctl/v1/agent.grpc.pb.h"

namespace llmctl::rpc {
namespace {

using std::chrono::milliseconds;
namespace pb = llmctl::v1;

// StreamEvents sends one event and then holds the stream open, saying nothing, until its call is
// cancelled or the test releases it: a quiet stream, as a watch with nothing new is.
class QuietAgent final : public pb::Agent::Service {
 public:
  grpc::Status GetNodeInfo(grpc::ServerContext*, const pb::GetNodeInfoRequest*,
                           pb::NodeInfo* response) override {
    response->set_node("node1");
    return grpc::Status::OK;
  }

  grpc::Status StreamEvents(grpc::ServerContext* context, const pb::StreamEventsRequest*,
                            grpc::ServerWriter<pb::StreamEventsResponse>* writer) override {
    ++open_;
    pb::StreamEventsResponse first;
    first.mutable_event()->set_seq(1);
    writer->Write(first);
    while (!released_ && !context->IsCancelled()) std::this_thread::sleep_for(milliseconds(20));
    if (context->IsCancelled()) ++ended_by_cancellation_;
    --open_;
    return grpc::Status::OK;
  }

  std::atomic<int> open_{0};
  std::atomic<int> ended_by_cancellation_{0};
  std::atomic<bool> released_{false};
};

// A TCP relay between the client and the server that can go silent: frozen, it keeps both
// connections open and passes nothing, as a peer cut off by the network does.
class FreezableRelay {
 public:
  explicit FreezableRelay(int upstream_port) : upstream_port_(upstream_port) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    EXPECT_EQ(::listen(listener_, 8), 0);
    socklen_t length = sizeof address;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }

  ~FreezableRelay() {
    stopping_ = true;
    ::shutdown(listener_, SHUT_RDWR);
    acceptor_.join();
    for (std::thread& pump : pumps_) pump.join();
    ::close(listener_);
    for (int fd : sockets_) ::close(fd);
  }

  int port() const { return port_; }
  void Freeze() { frozen_ = true; }

 private:
  void Accept() {
    while (!stopping_) {
      const int client = ::accept(listener_, nullptr, nullptr);
      if (client < 0) return;
      const int server = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      address.sin_port = htons(static_cast<uint16_t>(upstream_port_));
      if (::connect(server, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
        ::close(client);
        ::close(server);
        continue;
      }
      sockets_.push_back(client);
      sockets_.push_back(server);
      pumps_.emplace_back([this, client, server] { Pump(client, server); });
      pumps_.emplace_back([this, client, server] { Pump(server, client); });
    }
  }

  void Pump(int from, int to) {
    char buffer[1 << 14];
    while (!stopping_) {
      pollfd ready{from, POLLIN, 0};
      if (::poll(&ready, 1, 20) <= 0 || frozen_) continue;
      const ssize_t n = ::read(from, buffer, sizeof buffer);
      if (n <= 0 || ::write(to, buffer, static_cast<size_t>(n)) != n) return;
    }
  }

  const int upstream_port_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> frozen_{false};
  std::thread acceptor_;
  std::vector<std::thread> pumps_;  // touched only by the acceptor, joined after it
  std::vector<int> sockets_;
};

class ConnectionTest : public ::testing::Test {
 protected:
  void StartServer(const ServerLimits& limits) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    ApplyServerLimits(builder, limits);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }

  void TearDown() override {
    service_.released_ = true;
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + milliseconds(500));
  }

  std::unique_ptr<pb::Agent::Stub> Stub(int port, const KeepaliveOptions& keepalive) {
    grpc::ChannelArguments arguments;
    SetClientKeepalive(arguments, keepalive);
    return pb::Agent::NewStub(grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), arguments));
  }

  // Waits up to `limit` for `done`; the limit only bounds a failing test.
  template <typename Predicate>
  static bool Await(Predicate done, std::chrono::seconds limit = std::chrono::seconds(30)) {
    const auto give_up = std::chrono::steady_clock::now() + limit;
    while (!done()) {
      if (std::chrono::steady_clock::now() > give_up) return false;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return true;
  }

  QuietAgent service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

constexpr KeepaliveOptions kQuickKeepalive{milliseconds(200), milliseconds(500)};

ServerLimits QuickLimits() {
  ServerLimits limits;
  limits.keepalive = kQuickKeepalive;
  return limits;
}

TEST_F(ConnectionTest, AQuietStreamOutlivesManyKeepalivePings) {
  // Without the server's side of the rule, gRPC's server would take the second of these pings as
  // abuse and close the connection.
  StartServer(QuickLimits());
  auto stub = Stub(port_, kQuickKeepalive);
  grpc::ClientContext context;
  auto reader = stub->StreamEvents(&context, {});
  pb::StreamEventsResponse item;
  ASSERT_TRUE(reader->Read(&item));
  std::this_thread::sleep_for(std::chrono::seconds(3));  // 15 keepalive periods
  service_.released_ = true;
  EXPECT_FALSE(reader->Read(&item));
  const grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_code() << " " << status.error_message();
  EXPECT_EQ(service_.ended_by_cancellation_, 0);
}

TEST_F(ConnectionTest, AStreamWhosePeerWentSilentEndsOnBothSides) {
  StartServer(QuickLimits());
  FreezableRelay relay(port_);
  auto stub = Stub(relay.port(), kQuickKeepalive);
  grpc::ClientContext context;  // no deadline: only the keepalive can end this call
  auto reader = stub->StreamEvents(&context, {});
  pb::StreamEventsResponse item;
  ASSERT_TRUE(reader->Read(&item));
  relay.Freeze();
  std::atomic<bool> client_done{false};
  grpc::Status status;
  std::thread client([&] {
    while (reader->Read(&item)) {
    }
    status = reader->Finish();
    client_done = true;
  });
  const bool client_ended = Await([&] { return client_done.load(); });
  if (!client_ended) context.TryCancel();
  client.join();
  EXPECT_TRUE(client_ended) << "the client's stream went on waiting for a silent server";
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  // The server's pings go unanswered too: it cancels the call and frees its thread.
  EXPECT_TRUE(Await([&] { return service_.ended_by_cancellation_ == 1; }))
      << "the server's handler went on for a client that went silent";
}

TEST_F(ConnectionTest, PastItsThreadsAServerRefusesCallsInsteadOfGrowing) {
  ServerLimits limits;
  limits.max_threads = 4;
  StartServer(limits);
  auto stub = Stub(port_, {});
  constexpr int kStreams = 12;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<pb::StreamEventsResponse>>> readers;
  int refused = 0;
  int open = 0;
  for (int i = 0; i < kStreams; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    readers.push_back(stub->StreamEvents(contexts.back().get(), {}));
    pb::StreamEventsResponse item;
    if (readers.back()->Read(&item)) {
      ++open;
    } else {
      const grpc::Status status = readers.back()->Finish();
      EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << status.error_message();
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_LT(open, 4);
  EXPECT_LE(service_.open_, 4);
  // Once the streams end, the server takes calls again.
  service_.released_ = true;
  for (int i = 0; i < kStreams; ++i) contexts[i]->TryCancel();
  readers.clear();
  ASSERT_TRUE(Await([&] { return service_.open_ == 0; }));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  pb::NodeInfo info;
  const grpc::Status status = stub->GetNodeInfo(&context, {}, &info);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

// gRPC reads a server's and a channel's unix: address as a URI: a socket in a directory named as
// users name theirs ("lab #1", "?", "%41", "é", a space) is made and reached only through
// GrpcAddress, where the server made it in ".../q=A é" and the channel's "#1" began a fragment.
TEST_F(ConnectionTest, AServerAndAChannelMeetAtAUnixSocketWhosePathHoldsURISyntax) {
  std::string directory = (std::filesystem::temp_directory_path() / "llmctl-rpc-XXXXXX").string();
  ASSERT_NE(::mkdtemp(directory.data()), nullptr);
  const std::filesystem::path named =
      std::filesystem::path(directory) / "My Drive #1 ?q=%41 \u00e9";
  std::filesystem::create_directory(named);
  const std::string address = "unix:" + (named / "agent.sock").string();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(GrpcAddress(address), grpc::InsecureServerCredentials());
  builder.RegisterService(&service_);
  server_ = builder.BuildAndStart();
  ASSERT_NE(server_, nullptr);
  EXPECT_TRUE(std::filesystem::exists(named / "agent.sock"));

  auto stub = pb::Agent::NewStub(
      grpc::CreateChannel(GrpcAddress(address), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  pb::NodeInfo info;
  const grpc::Status status = stub->GetNodeInfo(&context, {}, &info);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(info.node(), "node1");
  EXPECT_EQ(GrpcAddress("127.0.0.1:7443"), "127.0.0.1:7443");
  std::filesystem::remove_all(directory);
}

// Under umask 000 a socket bound as it comes would be 0777, any local user's to connect to;
// BuildAndStartServer makes it the owner's alone from its bind, and gives the umask back.
TEST_F(ConnectionTest, AServersUnixSocketIsItsOwnersAloneUnderAnOpenUmask) {
  std::string directory = (std::filesystem::temp_directory_path() / "llmctl-rpc-XXXXXX").string();
  ASSERT_NE(::mkdtemp(directory.data()), nullptr);
  const std::string path = directory + "/agent.sock";
  grpc::ServerBuilder builder;
  builder.AddListeningPort(GrpcAddress("unix:" + path), grpc::InsecureServerCredentials());
  builder.RegisterService(&service_);
  const mode_t umask_before = ::umask(0);
  server_ = BuildAndStartServer(builder, "unix:" + path);
  EXPECT_EQ(::umask(umask_before), 0u);
  ASSERT_NE(server_, nullptr);
  struct stat info {};
  ASSERT_EQ(::lstat(path.c_str(), &info), 0);
  EXPECT_TRUE(S_ISSOCK(info.st_mode));
  EXPECT_EQ(info.st_mode & 0777, 0700u);
  std::filesystem::remove_all(directory);
}

}  // namespace
}  // namespace llmctl::rpc
