// Fuzz target for llmctld's gRPC handlers (controller/controller_service.h): the first input byte
// chooses the RPC, the rest is its request message (ParseFromArray; bytes that do not parse are
// skipped, as gRPC refuses them before any handler runs), handed to the handler in this process,
// as the CLI's call would reach it. One llmctld without its dispatcher (as the service's tests
// start it) in a fresh data directory, with a node and an experiment registered at start, serves
// every input; its state carries over from input to input. Beyond "no crash, no exception, no
// hang": a refusal has a code for the caller's mistake and a message (rpc_checks.h), nothing lands
// in the working directory, and an accepted Submit's filename, which the controller logs and
// `llmctl list` prints, is printable text. After EnrollNode, which writes the secrets file and the
// store, nothing lies in the target's directory outside the data directory, no temporary of an
// atomic write is left there, and the store opens.
//
// EnrollNode dials the node's address with its own 20 s deadline: it is called only for a name
// whose node, if registered, has no address or a unix socket path where nothing is (the dial fails
// at once), never another process's socket or a TCP address. Not called: the streaming RPCs, whose
// reader and writer need a call (controller_stream_fuzz.cc's). Each RPC's fields and what the
// handler does with them: tests/fuzz/README.md, "The gRPC handlers".
//
// Replayed over tests/fuzz/corpus/controller_rpc/ by the `controller_rpc_fuzz_replay` test. A
// libFuzzer build links the controller library: configure a build directory with CC=clang
// CXX=clang++ and CXXFLAGS="-fsanitize=fuzzer-no-link,address,undefined", build llmctl_controller,
// then link this file with -fsanitize=fuzzer against it (as controller_rpc_fuzz_replay is linked,
// replay_main.cc left out: its link line is the last of `ninja -C DIR -t commands
// controller_rpc_fuzz_replay`).
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "common/text.h"
#include "controller/clock.h"
#include "controller/daemon.h"
#include "controller/store/store.h"
#include "controller/submission.h"
#include "controller/test_experiment.h"
#include "llmctl/v1/controller.grpc.pb.h"
#include "tests/fuzz/controller_fixture.h"
#include "tests/fuzz/rpc_checks.h"

namespace {

namespace fs = std::filesystem;
namespace v1 = llmctl::v1;
using llmctl::rpc_fuzz::Check;
using llmctl::rpc_fuzz::CheckAnswer;
// Two trials of the built-in model.
using llmctl::controller::test_support::kExperiment;

// The controller of every input, and its directory, removed at exit.
class Fixture {
 public:
  Fixture() {
    daemon_ = llmctl::rpc_fuzz::StartController(root_.path(), clock_);
    v1::RegisterNodeRequest node;
    node.set_name("node1");
    node.set_address("unix:" + (root_.path() / "node1.sock").string());
    v1::NodeCredentials credentials;
    grpc::ServerContext register_context;
    Check(service().RegisterNode(&register_context, &node, &credentials).ok(), "node1 registers");
    v1::SubmitRequest submit;
    submit.set_filename("tiny.yaml");
    submit.set_yaml_text(std::string(kExperiment));
    v1::SubmitResponse submitted;
    grpc::ServerContext submit_context;
    Check(service().Submit(&submit_context, &submit, &submitted).ok(), "tiny.yaml submits");
  }
  ~Fixture() { daemon_.reset(); }

  llmctl::controller::ControllerService& service() { return daemon_->service(); }
  llmctl::store::Store& store() { return daemon_->store(); }
  const fs::path& root() const { return root_.path(); }

 private:
  llmctl::rpc_fuzz::TargetRoot root_{"controller_rpc_fuzz"};
  llmctl::controller::ManualClock clock_{llmctl::store::Time(std::chrono::seconds(1'700'000'000))};
  std::unique_ptr<llmctl::controller::Daemon> daemon_;
};

// Parses `bytes` as a `Request`, calls `handler` with it and checks the answer, then, when it was
// OK, `accepted` with the request. Bytes that are not a `Request` never reach a handler.
template <typename Request, typename Response, typename Handler>
void Call(const uint8_t* data, size_t size, Handler handler,
          void (*accepted)(const Request&) = nullptr) {
  Request request;
  // Not valid UTF-8 in a string field: protobuf refuses the message, and need not say so.
  const google::protobuf::LogSilencer quiet;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  Response response;
  grpc::ServerContext context;
  const grpc::Status status = handler(&context, &request, &response);
  CheckAnswer(status);
  if (status.ok() && accepted != nullptr) accepted(request);
}

// A submitted file's name is stored, logged and printed by `llmctl list`: printable text.
void CheckSubmitted(const v1::SubmitRequest& request) {
  Check(llmctl::PrintableTextProblem(request.filename(), llmctl::controller::kMaxFilenameBytes)
            .empty(),
        "an accepted filename is printable");
}

// Whether EnrollNode of `name` dials nothing but a unix socket path where nothing is (see above).
bool EnrollmentDialsNobody(Fixture& fixture, const std::string& name) {
  auto nodes = fixture.store().ListNodes();
  Check(nodes.ok(), "the store lists its nodes");
  for (const llmctl::store::NodeRecord& node : *nodes) {
    if (node.name != name || node.address.empty()) continue;
    constexpr std::string_view kUnix = "unix:";
    return node.address.starts_with(kUnix) && !fs::exists(node.address.substr(kUnix.size()));
  }
  return true;
}

// What an enrollment writes lies in the data directory, whole, and the store still opens.
void CheckDataDirectory(const Fixture& fixture) {
  for (const fs::directory_entry& entry : fs::directory_iterator(fixture.root())) {
    const std::string name = entry.path().filename().string();
    Check(name == "cwd" || name == "data" || name == "run",
          "nothing is written outside the data directory");
  }
  for (const fs::directory_entry& entry :
       fs::recursive_directory_iterator(fixture.root() / "data")) {
    // WriteFileAtomically's temporaries: <name>.tmp.<pid>.<n>.
    Check(entry.path().filename().string().find(".tmp.") == std::string::npos,
          "no write is left half-done");
  }
  Check(llmctl::store::Store::OpenReadOnly((fixture.root() / "data" / "llmctl.db").string()).ok(),
        "the store opens");
}

void EnrollNode(Fixture& fixture, const uint8_t* data, size_t size) {
  v1::EnrollNodeRequest request;
  {
    const google::protobuf::LogSilencer quiet;
    if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  }
  if (!EnrollmentDialsNobody(fixture, request.name())) return;
  v1::EnrollNodeResponse response;
  grpc::ServerContext context;
  CheckAnswer(fixture.service().EnrollNode(&context, &request, &response));
  CheckDataDirectory(fixture);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > (1 << 20)) return 0;
  static Fixture fixture;
  llmctl::controller::ControllerService& service = fixture.service();
  const uint8_t* body = data + 1;
  const size_t body_size = size - 1;
  using S = llmctl::controller::ControllerService;
  const auto bind = [&service](auto method) {
    return [&service, method](auto* context, auto* request, auto* response) {
      return (service.*method)(context, request, response);
    };
  };
  switch (data[0] % 14) {
    case 0:
      Call<v1::MissingBlobsRequest, v1::MissingBlobsResponse>(body, body_size,
                                                              bind(&S::MissingBlobs));
      break;
    case 1:
      Call<v1::SubmitRequest, v1::SubmitResponse>(body, body_size, bind(&S::Submit),
                                                  CheckSubmitted);
      break;
    case 2:
      Call<v1::ListExperimentsRequest, v1::ListExperimentsResponse>(body, body_size,
                                                                    bind(&S::ListExperiments));
      break;
    case 3:
      Call<v1::GetExperimentRequest, v1::ExperimentStatus>(body, body_size,
                                                           bind(&S::GetExperiment));
      break;
    case 4:
      Call<v1::CancelRequest, v1::CancelResponse>(body, body_size, bind(&S::Cancel));
      break;
    case 5:
      Call<v1::ResumeRequest, v1::ResumeResponse>(body, body_size, bind(&S::Resume));
      break;
    case 6:
      Call<v1::GetExperimentRequest, v1::ReportResponse>(body, body_size, bind(&S::Report));
      break;
    case 7:
      Call<v1::TimedRunsRequest, v1::TimedRunsResponse>(body, body_size, bind(&S::TimedRuns));
      break;
    case 8:
      Call<v1::ListNodesRequest, v1::ListNodesResponse>(body, body_size, bind(&S::ListNodes));
      break;
    case 9:
      Call<v1::RegisterNodeRequest, v1::NodeCredentials>(body, body_size, bind(&S::RegisterNode));
      break;
    case 10:
      Call<v1::UpdateNodeRequest, v1::NodeStatus>(body, body_size, bind(&S::UpdateNode));
      break;
    case 11:
      Call<v1::DeregisterNodeRequest, v1::DeregisterNodeResponse>(body, body_size,
                                                                  bind(&S::DeregisterNode));
      break;
    case 12:
      EnrollNode(fixture, body, body_size);
      break;
    case 13:
      Call<v1::MeasureNodeRatesRequest, v1::MeasureNodeRatesResponse>(body, body_size,
                                                                      bind(&S::MeasureNodeRates));
      break;
  }
  llmctl::rpc_fuzz::CheckWorkingDirectoryEmpty();
  return 0;
}
