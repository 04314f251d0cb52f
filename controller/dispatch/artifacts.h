// Downloading a run's artifacts (its output, or one directory of it) from its node's agent:
// FetchArtifacts streamed into a sink, with an idle limit instead of a deadline, as the total size
// is not known up front. `llmctl fetch` (through Dispatcher::FetchArtifacts) and the copy of a
// stopped trial's checkpoint (checkpoint_copy.h) both go through it.
#ifndef LLMCTL_CONTROLLER_DISPATCH_ARTIFACTS_H_
#define LLMCTL_CONTROLLER_DISPATCH_ARTIFACTS_H_

#include <functional>
#include <string>

#include "common/status.h"
#include "controller/dispatch/agent_links.h"
#include "controller/dispatch/dispatcher_core.h"
#include "llmctl/v1/agent.grpc.pb.h"

namespace llmctl::controller::dispatch {

class ArtifactFetcher {
 public:
  ArtifactFetcher(const DispatcherCore& core, AgentLinks& links) : core_(core), links_(links) {}

  // Dispatcher::FetchArtifacts: Unavailable when the node has no link; DeadlineExceeded when no
  // chunk arrives for call_deadline; Cancelled when `sink` says false; DataLoss, before `sink`
  // sees it, for a file name that is not a plain relative path, or, fetching the whole run
  // (`path` empty), one outside output/ and the run's own top-level files
  // (digest::RunArtifactPathProblem).
  Status Fetch(const std::string& node, const v1::RunKey& key,
               const std::function<bool(const v1::ArtifactChunk&)>& sink,
               const std::string& path) const;

 private:
  const DispatcherCore& core_;
  AgentLinks& links_;
};

}  // namespace llmctl::controller::dispatch

#endif  // LLMCTL_CONTROLLER_DISPATCH_ARTIFACTS_H_
