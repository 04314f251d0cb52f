// llm-agent's gRPC server: the Agent service (proto/llmctl/v1/agent.proto) over mutual TLS with the
// node's token, on a unix socket or a TCP port.
#ifndef LLMCTL_AGENT_SERVER_H_
#define LLMCTL_AGENT_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "agent/device_sampler.h"
#include "agent/hub.h"
#include "agent/input_cache.h"
#include "agent/runs.h"
#include "agent/sample_recorder.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "llmctl/v1/agent.grpc.pb.h"
#include "rpc/tls.h"

namespace llmctl::agent {

struct AgentOptions {
  std::string listen;    // "unix:/path" or "host:port" (port 0: any free port)
  std::string data_dir;  // runs/ and cache/ live here
  std::string node;      // the certificate names agent-<node>.llmctl
  rpc::TlsIdentity identity;
  // Set: the agent serves the identity in these files instead, reads them again every
  // identity_refresh, and takes RenewCertificate, which replaces them
  // (agent/certificate_renewal.h).
  rpc::IdentityFiles identity_files;
  std::chrono::seconds identity_refresh{60};
  std::string token;
  std::string llm_train;           // the trainer binary
  std::string supervisor_program;  // this binary (re-executed as the supervisor)
  std::chrono::milliseconds cancel_grace{10000};
  std::chrono::milliseconds poll_interval{100};  // run checks and event-file following
  HubOptions hub;  // where PrepareHubModel downloads from (HF_ENDPOINT, HF_TOKEN)
  // What uploads and hub downloads into cache/ leave free of its filesystem (InputCache::Open).
  int64_t cache_keep_free_bytes = kCacheKeepFreeBytes;
  // How often the devices of running trials are sampled (agent/sample_recorder.h), and by what:
  // not owned; null: the node's own (/proc for CPU trials, NVML for GPU trials).
  std::chrono::milliseconds sample_interval{1000};
  DeviceSampler* sampler = nullptr;
  // Whether the node's own rates are measured (agent/node_rates.h): llm-agent measures unless
  // LLMCTL_RATE_PROBE=off; off for the agents tests start in-process.
  bool measure_rates = false;
  // A probe of this machine to take instead of measuring (NodeRatesOptions::adoptable_probe).
  std::string adoptable_rate_probe;
};

class AgentService;

class AgentServer {
 public:
  // Opens the cache and the runs (re-adopting running workers) and starts serving.
  // InvalidArgument for bad options; Unavailable when the address cannot be bound.
  static StatusOr<std::unique_ptr<AgentServer>> Start(AgentOptions options);
  // Shuts down: open streams end, workers keep running.
  ~AgentServer();
  AgentServer(const AgentServer&) = delete;
  AgentServer& operator=(const AgentServer&) = delete;

  // Where it listens: the unix address as given, or "host:port" with the port chosen.
  const std::string& address() const { return address_; }
  // Blocks until Shutdown() (from another thread or a signal handler's thread).
  void Wait();
  void Shutdown();
  // The Agent service's handlers, for calls in this process without a channel
  // (tests/fuzz/agent_rpc_fuzz.cc).
  v1::Agent::Service& service();

 private:
  AgentServer() = default;
  // Start's steps, in its order: the input cache, the hub's models and the runs (re-adopting
  // running workers); the samples and the gRPC service; the listening server.
  Status OpenStores(const AgentOptions& options);
  Status StartService(const AgentOptions& options);
  Status Listen(const AgentOptions& options);
  // DATA/llm-agent.lock (LockDataDirectory), held for the agent's lifetime: first, so it is
  // released last.
  UniqueFd data_lock_;
  std::unique_ptr<InputCache> cache_;
  std::unique_ptr<HubCache> hub_;
  std::unique_ptr<RunManager> runs_;
  std::unique_ptr<DeviceSampler> node_sampler_;  // null when AgentOptions named one
  std::unique_ptr<SampleRecorder> recorder_;
  std::unique_ptr<AgentService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_SERVER_H_
