// The rules every llmctl gRPC connection follows, on both ends: keepalive, a server's limits, and
// a server's unix socket the owner's alone.
//
// Keepalive: a client pings every `time` while it has a call open and drops the connection when a
// ping goes unanswered for `timeout`, so a stream whose peer vanished without closing (a node cut
// off, a laptop asleep) ends with UNAVAILABLE instead of waiting for ever. gRPC's servers take a
// ping more often than every 5 minutes as abuse and close the connection after two, so the server
// side here permits the clients' rate; servers ping too, which frees the thread of a call whose
// client vanished. Both ends read one KeepaliveOptions.
//
// Limits: gRPC's synchronous server gives each call a thread and by default makes as many as calls
// arrive; past ServerLimits::max_threads a new call is answered RESOURCE_EXHAUSTED ("Server
// Threadpool Exhausted") or waits for a thread to come free, instead. Both were seen: the first in
// rpc/connection_test.cc, the second with 300 `llmctl watch` against llmctld (11-30).
#ifndef LLMCTL_RPC_CONNECTION_H_
#define LLMCTL_RPC_CONNECTION_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

namespace llmctl::rpc {

struct KeepaliveOptions {
  std::chrono::milliseconds time{std::chrono::seconds(30)};
  std::chrono::milliseconds timeout{std::chrono::seconds(10)};
};

// gRPC's default limit on one message a server receives, which llmctld's API keeps
// (ServerLimits{}): a SubmitRequest's trees must fit in it, and so the CLI refuses a submit whose
// request would not before it uploads or provisions anything (controller/cli/inputs.h). Not
// raised: each trial's trees go on to its node in one RunTrialRequest, and the agent takes 8 MiB.
inline constexpr int kDefaultMaxReceiveBytes = 4 << 20;

struct ServerLimits {
  // Threads for calls, gRPC's pollers included. Each open stream (events, watch, uploads) holds
  // one.
  int max_threads = 256;
  int max_streams_per_connection = 100;
  int max_receive_bytes = kDefaultMaxReceiveBytes;
  KeepaliveOptions keepalive;
};

// `address`, host:port or unix:/path, as gRPC reads it, for a server's listening port and a client
// channel's target alike: gRPC reads both as URIs, percent-decoding a unix: path ("%41" is "A"),
// and a channel's target ends its path at a '#' or '?', so a socket path's bytes are
// percent-encoded here (a controller listening in "/home/ana/lab #1" was dialled at
// "/home/ana/lab ").
std::string GrpcAddress(const std::string& address);

// A client channel's keepalive.
void SetClientKeepalive(grpc::ChannelArguments& arguments, const KeepaliveOptions& keepalive = {});

// A server's limits and its side of the keepalive rule. Call before BuildAndStart.
void ApplyServerLimits(grpc::ServerBuilder& builder, const ServerLimits& limits);

// `builder`'s server, started, listening on `address` (as given to GrpcAddress for its port); null
// when it cannot listen. A unix socket is the owner's alone (0700: connecting takes its write
// permission) from its first instant.
std::unique_ptr<grpc::Server> BuildAndStartServer(grpc::ServerBuilder& builder,
                                                  const std::string& address);

}  // namespace llmctl::rpc

#endif  // LLMCTL_RPC_CONNECTION_H_
