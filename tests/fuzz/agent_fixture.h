// What the llm-agent fuzz targets (agent_rpc_fuzz.cc, agent_stream_fuzz.cc) start their agent with.
#ifndef LLMCTL_TESTS_FUZZ_AGENT_FIXTURE_H_
#define LLMCTL_TESTS_FUZZ_AGENT_FIXTURE_H_

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "agent/device_sampler.h"
#include "agent/server.h"
#include "common/version.h"

namespace llmctl::rpc_fuzz {

// The node's token, which the agent compares its callers' with.
inline constexpr char kAgentToken[] = "node1-token-0123456789";

// node1's options in `root`: its socket root/agent.sock, its data in root/data, an llm-train
// (root/llm-train) that answers only the version probe, the supervisor /bin/true (no trial
// runs), a hub that nothing listens on, tried once, and `sampler`. The identity is the caller's.
inline agent::AgentOptions AgentOptionsIn(const std::filesystem::path& root,
                                          agent::DeviceSampler* sampler) {
  const std::string trainer = (root / "llm-train").string();
  std::ofstream(trainer) << "#!/bin/sh\n"
                         << "[ \"$1\" = --version ] && echo '{\"llmctl\": \"" << kVersion
                         << "\", \"libtorch\": \"2.15.0\", \"cuda_devices\": 0}'\n"
                         << "exit 0\n";
  std::filesystem::permissions(trainer, std::filesystem::perms::owner_all);
  agent::AgentOptions options;
  options.listen = "unix:" + (root / "agent.sock").string();
  options.data_dir = (root / "data").string();
  options.node = "node1";
  options.token = kAgentToken;
  options.llm_train = trainer;
  options.supervisor_program = "/bin/true";
  options.cancel_grace = std::chrono::milliseconds(100);
  options.poll_interval = std::chrono::milliseconds(10);
  options.hub.endpoint = "http://127.0.0.1:9";
  options.hub.http.retry.max_attempts = 1;
  options.sampler = sampler;
  return options;
}

}  // namespace llmctl::rpc_fuzz

#endif  // LLMCTL_TESTS_FUZZ_AGENT_FIXTURE_H_
