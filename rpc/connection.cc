#include "rpc/connection.h"

#include <grpc/grpc.h>
#include <sys/stat.h>

#include "common/text.h"

namespace llmctl::rpc {
namespace {

int Milliseconds(std::chrono::milliseconds duration) { return static_cast<int>(duration.count()); }

}  // namespace

std::string GrpcAddress(const std::string& address) {
  constexpr std::string_view kUnix = "unix:";
  if (!address.starts_with(kUnix)) return address;
  return std::string(kUnix).append(
      PercentEncode(std::string_view(address).substr(kUnix.size()), /*keep_slash=*/true));
}

void SetClientKeepalive(grpc::ChannelArguments& arguments, const KeepaliveOptions& keepalive) {
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, Milliseconds(keepalive.time));
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Milliseconds(keepalive.timeout));
  // Pings only while a call is open: the server counts pings on an idle connection as strikes.
  arguments.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  // gRPC stops pinging after 2 pings without data by default, which on a quiet stream (a watch
  // with nothing new) would end the keepalive after its second ping.
  arguments.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

void ApplyServerLimits(grpc::ServerBuilder& builder, const ServerLimits& limits) {
  grpc::ResourceQuota quota("llmctl-server");
  quota.SetMaxThreads(limits.max_threads);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, limits.max_streams_per_connection);
  builder.SetMaxReceiveMessageSize(limits.max_receive_bytes);
  // The clients' pings, at their rate with room for timer slack, are no abuse.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             Milliseconds(limits.keepalive.time / 2));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
  // The server's own pings, to free a call whose client vanished.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, Milliseconds(limits.keepalive.time));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Milliseconds(limits.keepalive.timeout));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

std::unique_ptr<grpc::Server> BuildAndStartServer(grpc::ServerBuilder& builder,
                                                  const std::string& address) {
  if (!address.starts_with("unix:")) return builder.BuildAndStart();
  // A unix socket is made by its bind (in BuildAndStart) with 0777 less the umask: under umask 000
  // any local user could connect. Bound under umask 077 it is the owner's alone from its first
  // instant, where a chmod after the bind left a moment in which others could connect, and in which
  // llmctl's start took the daemon for ready while it could still fail to make it private. The
  // umask is the process's: a file another thread makes meanwhile is the owner's alone too, as
  // everything under the daemons' private directories is.
  const mode_t umask_before = ::umask(077);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ::umask(umask_before);
  return server;
}

}  // namespace llmctl::rpc
