#include "controller/dispatch/artifacts.h"

#include "common/digest/digest.h"
#include "rpc/transfer.h"

namespace llmctl::controller::dispatch {

Status ArtifactFetcher::Fetch(const std::string& node, const v1::RunKey& key,
                              const std::function<bool(const v1::ArtifactChunk&)>& sink,
                              const std::string& path) const {
  const std::shared_ptr<v1::Agent::Stub> stub = links_.Stub(node);
  if (stub == nullptr) return NodeNotConnected(node);
  // The artifacts' total size is not known up front: no call deadline, an idle limit instead.
  grpc::ClientContext context;
  rpc::IdleCanceller idle(context, core_.options.call_deadline);
  v1::FetchArtifactsRequest request;
  *request.mutable_key() = key;
  request.set_path(path);
  auto reader = stub->FetchArtifacts(&context, request);
  v1::ArtifactChunk chunk;
  while (reader->Read(&chunk)) {
    // The agent is not trusted to keep to the run: every name it sends is a plain relative path,
    // and for a whole run one under output/ or a file of the run's directory.
    if (!chunk.path().empty()) {
      const std::string problem = path.empty() ? digest::RunArtifactPathProblem(chunk.path())
                                               : digest::RelativePathProblem(chunk.path());
      if (!problem.empty()) {
        context.TryCancel();
        reader->Finish();
        return DataLossError("node " + node + " sent artifact '" + chunk.path() + "': " + problem);
      }
    }
    if (!sink(chunk)) {
      context.TryCancel();
      reader->Finish();
      return CancelledError("the artifact download was abandoned");
    }
    // After the sink: time spent passing the chunk on is not the agent's silence.
    idle.Progress();
  }
  const Status finished = idle.Explain(reader->Finish(), "fetching its artifacts");
  return finished.ok() ? finished : AgentCallFailed(node, finished);
}

}  // namespace llmctl::controller::dispatch
