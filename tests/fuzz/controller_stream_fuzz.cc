// Fuzz target for llmctld's streaming gRPC handlers (controller/controller_service.h): UploadBlob
// (a stream of BlobChunk), Watch (a request, a stream of ExperimentStatus back) and FetchArtifacts
// (a request, a stream of ArtifactChunk back), each input one real call on llmctld's own unix
// socket, so that gRPC's ServerReader and ServerWriter run as for the CLI. The input is read as
// tests/fuzz/stream_input.h says: the first byte chooses the RPC (modulo 3: UploadBlob, Watch,
// FetchArtifacts), the messages after it are the chunks, or the request (the first). One llmctld
// without its dispatcher, as controller_rpc_fuzz.cc starts it, in a fresh data directory, serves
// every input: a node, experiment 1, whose trials are cancelled so that a Watch of it ends, and
// experiment 2 (the latest), whose trial a runs on the node (put in the store: no dispatcher runs)
// and whose trial b waits. Beyond "no crash, no hang": each call ends before its deadline with OK
// or a refusal whose code names the caller's mistake and that has a message (rpc_checks.h);
// nothing is written into the working directory; a blob accepted as new lies in DATA/blobs under
// its digest, with the announced size and bytes that hash to that digest. A Watch of the running
// experiment never ends by itself: it is called with a short deadline, is never told the
// experiment ended, ends with DEADLINE_EXCEEDED or CANCELLED, and the server answers the next call.
// FetchArtifacts of a trial that ran reaches the dispatcher, which has no link to the node here
// (UNAVAILABLE): a chunk, would one come, names a path inside the run's output or its own files.
//
// Replayed over tests/fuzz/corpus/controller_stream/ by the `controller_stream_fuzz_replay` test.
// A libFuzzer build links the controller library as controller_rpc_fuzz.cc says.
#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "common/digest/digest.h"
#include "common/files.h"
#include "controller/clock.h"
#include "controller/daemon.h"
#include "controller/store/store.h"
#include "controller/test_experiment.h"
#include "llmctl/v1/controller.grpc.pb.h"
#include "tests/fuzz/controller_fixture.h"
#include "tests/fuzz/rpc_checks.h"
#include "tests/fuzz/stream_input.h"

namespace {

namespace fs = std::filesystem;
namespace v1 = llmctl::v1;
using llmctl::rpc_fuzz::Check;
using llmctl::rpc_fuzz::CheckStreamAnswer;
using llmctl::rpc_fuzz::SetCallDeadline;
using llmctl::rpc_fuzz::StreamMessages;

// How a Watch of the running experiment, which never ends by itself, is ended.
enum class WatchEnd {
  // At a short deadline (20 ms): once per process, as every such call waits for it (a replay of
  // 60,000 inputs took 60 s with every running watch ended so, 13.6 s without them).
  kDeadline,
  // By the caller cancelling once it has the first status (the handler has sent it and waits for
  // changes), which comes before the call's usual deadline (SetCallDeadline).
  kCancel,
};

// A Watch of the running experiment (`request`) ended as `end` says: the watcher is never told
// the experiment ended, the call ends as its caller ended it, and the handler, which sees its call
// cancelled, leaves the server answering the next call.
void WatchRunning(v1::Controller::Stub& stub, const v1::GetExperimentRequest& request,
                  WatchEnd end) {
  grpc::ClientContext context;
  if (end == WatchEnd::kDeadline) {
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(20));
  } else {
    SetCallDeadline(context);
  }
  auto reader = stub.Watch(&context, request);
  v1::ExperimentStatus status;
  while (reader->Read(&status)) {
    Check(status.state() == "running", "a watcher is told the experiment runs");
    if (end == WatchEnd::kCancel) context.TryCancel();
  }
  const grpc::StatusCode code = reader->Finish().error_code();
  if (end == WatchEnd::kDeadline) {
    Check(code == grpc::StatusCode::DEADLINE_EXCEEDED || code == grpc::StatusCode::CANCELLED,
          "a watch of a running experiment ends at its deadline");
  } else {
    Check(code == grpc::StatusCode::CANCELLED,
          "a watch of a running experiment sends its status and ends when cancelled");
  }
  grpc::ClientContext next_context;
  SetCallDeadline(next_context);
  Check(stub.GetExperiment(&next_context, request, &status).ok(),
        "the server answers the call after a watch that ended unfinished");
}

// The controller of every input, a channel to it, and its directory, removed at exit.
class Fixture {
 public:
  Fixture() {
    daemon_ = llmctl::rpc_fuzz::StartController(root_.path(), clock_);
    stub_ = v1::Controller::NewStub(
        grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials()));
    v1::RegisterNodeRequest node;
    node.set_name("node1");
    node.set_address("unix:" + (root_.path() / "node1.sock").string());
    v1::NodeCredentials credentials;
    grpc::ClientContext register_context;
    Check(stub_->RegisterNode(&register_context, node, &credentials).ok(), "node1 registers");
    v1::SubmitRequest submit;
    submit.set_filename("tiny.yaml");
    submit.set_yaml_text(std::string(llmctl::controller::test_support::kExperiment));
    v1::SubmitResponse submitted;
    grpc::ClientContext submit_context;
    Check(stub_->Submit(&submit_context, submit, &submitted).ok(), "tiny.yaml submits");
    // Ended, so that a Watch of it sends its status and returns rather than waiting for changes.
    v1::CancelRequest cancel;
    cancel.set_experiment_id(submitted.experiment_id());
    v1::CancelResponse cancelled;
    grpc::ClientContext cancel_context;
    Check(stub_->Cancel(&cancel_context, cancel, &cancelled).ok(), "its trials cancel");
    grpc::ClientContext running_context;
    Check(stub_->Submit(&running_context, submit, &submitted).ok(), "tiny.yaml submits again");
    running_id_ = submitted.experiment_id();
    llmctl::store::Store& store = daemon_->store();
    auto trials = store.ListTrials(running_id_);
    Check(trials.ok() && !trials->empty(), "its trials are stored");
    Check(store.StartAttempt(trials->front().id, "node1", clock_.Now()).ok(), "its trial a runs");
    v1::GetExperimentRequest watch;
    watch.set_experiment_id(running_id_);
    WatchRunning(*stub_, watch, WatchEnd::kDeadline);
  }
  ~Fixture() {
    stub_.reset();
    daemon_.reset();
  }

  v1::Controller::Stub& stub() { return *stub_; }
  // Whether a Watch of `experiment_id` watches the running experiment (0: the latest).
  bool WatchesRunning(int64_t experiment_id) const {
    return experiment_id == 0 || experiment_id == running_id_;
  }
  fs::path BlobPath(const std::string& sha256) const {
    return root_.path() / "data" / "blobs" / sha256;
  }

 private:
  llmctl::rpc_fuzz::TargetRoot root_{"controller_stream_fuzz"};
  llmctl::controller::ManualClock clock_{llmctl::store::Time(std::chrono::seconds(1'700'000'000))};
  std::unique_ptr<llmctl::controller::Daemon> daemon_;
  std::unique_ptr<v1::Controller::Stub> stub_;
  int64_t running_id_ = 0;
};

// A blob the controller took as new is stored whole: its announced size, bytes of its digest.
void CheckStoredBlob(const Fixture& fixture, const v1::BlobChunk& first) {
  auto bytes = llmctl::ReadFileToString(fixture.BlobPath(first.sha256()).string(), 2 << 20);
  Check(bytes.ok(), "an accepted blob is stored under its digest");
  Check(static_cast<int64_t>(bytes->size()) == first.size(), "an accepted blob has its size");
  Check(llmctl::digest::Sha256Hex(*bytes) == first.sha256(), "an accepted blob has its digest");
}

void UploadBlob(Fixture& fixture, const uint8_t* data, size_t size) {
  const std::vector<v1::BlobChunk> chunks = StreamMessages<v1::BlobChunk>(data, size);
  v1::UploadBlobResponse response;
  const grpc::Status status = llmctl::rpc_fuzz::UploadChunks(fixture.stub(), chunks, response);
  if (status.ok() && !response.already_present()) {
    Check(!chunks.empty(), "an upload without a chunk is refused");
    CheckStoredBlob(fixture, chunks.front());
  }
}

void Watch(Fixture& fixture, const uint8_t* data, size_t size) {
  const std::vector<v1::GetExperimentRequest> requests =
      StreamMessages<v1::GetExperimentRequest>(data, size);
  if (requests.empty()) return;
  if (fixture.WatchesRunning(requests.front().experiment_id())) {
    WatchRunning(fixture.stub(), requests.front(), WatchEnd::kCancel);
    return;
  }
  grpc::ClientContext context;
  SetCallDeadline(context);
  auto reader = fixture.stub().Watch(&context, requests.front());
  v1::ExperimentStatus status;
  while (reader->Read(&status)) {
  }
  CheckStreamAnswer(reader->Finish());
}

void FetchArtifacts(Fixture& fixture, const uint8_t* data, size_t size) {
  const std::vector<v1::FetchTrialArtifactsRequest> requests =
      StreamMessages<v1::FetchTrialArtifactsRequest>(data, size);
  if (requests.empty()) return;
  grpc::ClientContext context;
  SetCallDeadline(context);
  auto reader = fixture.stub().FetchArtifacts(&context, requests.front());
  v1::ArtifactChunk chunk;
  while (reader->Read(&chunk)) {
    // A chunk without a path continues the file before it.
    Check(chunk.path().empty() || llmctl::digest::RunArtifactPathProblem(chunk.path()).empty(),
          "an artifact lies in the run's output or is one of its own files");
  }
  CheckStreamAnswer(reader->Finish());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > (1 << 20)) return 0;
  static Fixture fixture;
  switch (data[0] % 3) {
    case 0:
      UploadBlob(fixture, data + 1, size - 1);
      break;
    case 1:
      Watch(fixture, data + 1, size - 1);
      break;
    case 2:
      FetchArtifacts(fixture, data + 1, size - 1);
      break;
  }
  llmctl::rpc_fuzz::CheckWorkingDirectoryEmpty();
  return 0;
}
