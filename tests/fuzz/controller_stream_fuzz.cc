// Fuzz target for llmctld's streaming gRPC handlers (controller/controller_service.h): UploadBlob
// (a stream of BlobChunk) and Watch (a request, a stream of ExperimentStatus back), each input one
// real call on llmctld's own unix socket, so that gRPC's ServerReader and ServerWriter run as for
// the CLI. The input is read as tests/fuzz/stream_input.h says: the first byte chooses the RPC
// (even UploadBlob, odd Watch), the messages after it are the chunks, or Watch's request (the
// first). One llmctld without its dispatcher, as controller_rpc_fuzz.cc starts it (a node and an
// experiment, whose trials are cancelled so that a Watch of it ends), in a fresh data directory,
// serves every input. Beyond "no crash, no hang": each call ends before its deadline with OK or a
// refusal whose code names the caller's mistake and that has a message (rpc_checks.h); nothing is
// written into the working directory; a blob accepted as new lies in DATA/blobs under its digest,
// with the announced size and bytes that hash to that digest.
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
  }
  ~Fixture() {
    stub_.reset();
    daemon_.reset();
  }

  v1::Controller::Stub& stub() { return *stub_; }
  fs::path BlobPath(const std::string& sha256) const {
    return root_.path() / "data" / "blobs" / sha256;
  }

 private:
  llmctl::rpc_fuzz::TargetRoot root_{"controller_stream_fuzz"};
  llmctl::controller::ManualClock clock_{llmctl::store::Time(std::chrono::seconds(1'700'000'000))};
  std::unique_ptr<llmctl::controller::Daemon> daemon_;
  std::unique_ptr<v1::Controller::Stub> stub_;
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
  grpc::ClientContext context;
  SetCallDeadline(context);
  auto reader = fixture.stub().Watch(&context, requests.front());
  v1::ExperimentStatus status;
  while (reader->Read(&status)) {
  }
  CheckStreamAnswer(reader->Finish());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > (1 << 20)) return 0;
  static Fixture fixture;
  if (data[0] % 2 == 0) {
    UploadBlob(fixture, data + 1, size - 1);
  } else {
    Watch(fixture, data + 1, size - 1);
  }
  llmctl::rpc_fuzz::CheckWorkingDirectoryEmpty();
  return 0;
}
