// Fuzz target for llm-agent's gRPC handlers (agent/server.h, the Agent service): the first input
// byte chooses the RPC, the rest is its request message (ParseFromArray; bytes that do not parse
// are skipped, as gRPC refuses them before any handler runs), handed to the handler in this
// process, as the controller's call would reach it. One agent (as its tests start it, in a fresh
// data directory) serves every input; its state carries over from input to input. Its llm-train
// answers the version probe and does nothing else, and its supervisor is /bin/true: a RunTrial
// that passes every check starts a run that ends at once, never a trainer. The hub is a local
// port nothing listens on, tried once. Beyond "no crash, no exception, no hang": a refusal has a
// code (not UNKNOWN) and a message (rpc_checks.h), nothing lands in the working directory, and a
// FetchArtifacts path the agent takes (OutputSubdirectory, what its handler runs on the path
// before any file is read) lies inside the run's output directory.
//
// Not called: the streaming RPCs, whose reader and writer need a call (UploadBlob, StreamEvents
// and RenewCertificate are agent_stream_fuzz.cc's), and the rest of FetchArtifacts. Each RPC's
// fields and what the handler does with them: tests/fuzz/README.md, "The gRPC handlers".
//
// Replayed over tests/fuzz/corpus/agent_rpc/ by the `agent_rpc_fuzz_replay` test. A libFuzzer
// build links the agent library as controller_rpc_fuzz.cc says for the controller's.
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "agent/artifact_files.h"
#include "agent/fake_device_sampler.h"
#include "agent/server.h"
#include "common/version.h"
#include "llmctl/v1/agent.grpc.pb.h"
#include "rpc/certificates.h"
#include "rpc/tls.h"
#include "tests/fuzz/agent_fixture.h"
#include "tests/fuzz/rpc_checks.h"

namespace {

namespace fs = std::filesystem;
namespace v1 = llmctl::v1;
using llmctl::rpc_fuzz::Check;
using llmctl::rpc_fuzz::CheckAnswer;

// The agent of every input, and its directory, removed at exit.
class Fixture {
 public:
  Fixture() {
    auto ca = llmctl::rpc::CertificateAuthority::LoadOrCreate((root_.path() / "ca").string());
    Check(ca.ok(), "a CA");
    auto certificate = (*ca)->Issue(llmctl::rpc::AgentCertificateName("node1"), 1);
    Check(certificate.ok(), "the agent's certificate");
    llmctl::agent::AgentOptions options = llmctl::rpc_fuzz::AgentOptionsIn(root_.path(), &sampler_);
    options.identity = {(*ca)->ca_certificate_pem(), certificate->certificate_pem,
                        certificate->private_key_pem};
    auto server = llmctl::agent::AgentServer::Start(options);
    Check(server.ok(), "the agent starts");
    server_ = std::move(*server);
  }
  ~Fixture() { server_.reset(); }

  v1::Agent::Service& service() { return server_->service(); }
  const fs::path& root() const { return root_.path(); }

 private:
  llmctl::rpc_fuzz::TargetRoot root_{"agent_rpc_fuzz"};
  llmctl::agent::FakeDeviceSampler sampler_{{}};
  std::unique_ptr<llmctl::agent::AgentServer> server_;
};

template <typename Request, typename Response, typename Handler>
void Call(const uint8_t* data, size_t size, Handler handler) {
  Request request;
  // Not valid UTF-8 in a string field: protobuf refuses the message, and need not say so.
  const google::protobuf::LogSilencer quiet;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  Response response;
  grpc::ServerContext context;
  CheckAnswer(handler(&context, &request, &response));
}

// What FetchArtifacts does with `path` before it reads a file: an accepted directory lies in the
// run's output directory.
void FetchArtifactsPath(const fs::path& root, const uint8_t* data, size_t size) {
  v1::FetchArtifactsRequest request;
  const google::protobuf::LogSilencer quiet;
  if (!request.ParseFromArray(data, static_cast<int>(size)) || request.path().empty()) return;
  const std::string run_dir = (root / "data" / "runs" / "1" / "a" / "1").string();
  const auto below = llmctl::agent::OutputSubdirectory(run_dir, request.path());
  if (!below.ok()) {
    Check(!below.status().message().empty(), "a refused path is named");
    return;
  }
  const std::string output = run_dir + "/output";
  Check(*below == output || below->starts_with(output + "/"), "the path lies in output/");
  Check(below->find("/../") == std::string::npos && !below->ends_with("/.."),
        "the path has no '..'");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > (1 << 20)) return 0;
  static Fixture fixture;
  v1::Agent::Service& service = fixture.service();
  const uint8_t* body = data + 1;
  const size_t body_size = size - 1;
  using S = v1::Agent::Service;
  const auto bind = [&service](auto method) {
    return [&service, method](auto* context, auto* request, auto* response) {
      return (service.*method)(context, request, response);
    };
  };
  switch (data[0] % 8) {
    case 0:
      Call<v1::GetNodeInfoRequest, v1::NodeInfo>(body, body_size, bind(&S::GetNodeInfo));
      break;
    case 1:
      Call<v1::MissingBlobsRequest, v1::MissingBlobsResponse>(body, body_size,
                                                              bind(&S::MissingBlobs));
      break;
    case 2:
      Call<v1::PrepareHubModelRequest, v1::PrepareHubModelResponse>(body, body_size,
                                                                    bind(&S::PrepareHubModel));
      break;
    case 3:
      Call<v1::RunTrialRequest, v1::RunState>(body, body_size, bind(&S::RunTrial));
      break;
    case 4:
      Call<v1::ListRunsRequest, v1::ListRunsResponse>(body, body_size, bind(&S::ListRuns));
      break;
    case 5:
      Call<v1::CancelRunRequest, v1::RunState>(body, body_size, bind(&S::CancelRun));
      break;
    case 6:
      FetchArtifactsPath(fixture.root(), body, body_size);
      break;
    case 7:
      Call<v1::MeasureRatesRequest, v1::MeasureRatesResponse>(body, body_size,
                                                              bind(&S::MeasureRates));
      break;
  }
  llmctl::rpc_fuzz::CheckWorkingDirectoryEmpty();
  return 0;
}
