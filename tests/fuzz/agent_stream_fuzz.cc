// Fuzz target for llm-agent's streaming gRPC handlers (agent/server.cc, agent/enrollment.cc):
// UploadBlob (a stream of BlobChunk), StreamEvents (a request, a stream of events back),
// RenewCertificate (the controller's CertificateGrant after the agent's CSR) and AgentEnrollment's
// Enroll (EnrollmentGrant after the agent's offer). Each input is one real call as the controller
// makes it: over mutual TLS with the controller's certificate and the node's token, on the
// agent's unix socket (the enrollment server's loopback port for Enroll), so that gRPC's readers
// and writers and the handlers' caller checks run. The input is read as tests/fuzz/stream_input.h
// says: the first byte chooses the RPC (modulo 4, in the order above), the messages after it are
// the chunks, StreamEvents' request (the first) or the grants.
//
// One agent serves every input, as agent_rpc_fuzz.cc starts it (llm-train answering only the
// version probe, the supervisor /bin/true) but serving its identity from files, which a renewal
// replaces, with one run (experiment 1, trial a, attempt 1) started and ended at start, so that
// StreamEvents of it sends its lines and its end. The enrollment server (node n1) keeps the
// credentials it is granted under its own folder. Beyond "no crash, no hang": each call ends before
// its deadline with OK or a refusal whose code names the caller's mistake and that has a message
// (rpc_checks.h); nothing is written into the working directory; a blob accepted as new lies in
// the cache under its digest with the announced size and bytes of that digest; a refused renewal
// leaves the agent's certificate as it was and no new key behind; a refused enrollment writes no
// node token.
//
// Replayed over tests/fuzz/corpus/agent_stream/ by the `agent_stream_fuzz_replay` test. A
// libFuzzer build links the agent library as controller_rpc_fuzz.cc says for the controller's.
#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "agent/certificate_renewal.h"
#include "agent/enrollment.h"
#include "agent/fake_device_sampler.h"
#include "agent/server.h"
#include "common/digest/digest.h"
#include "common/files.h"
#include "common/version.h"
#include "llmctl/v1/agent.grpc.pb.h"
#include "rpc/certificates.h"
#include "rpc/tls.h"
#include "tests/fuzz/agent_fixture.h"
#include "tests/fuzz/rpc_checks.h"
#include "tests/fuzz/stream_input.h"

namespace {

namespace fs = std::filesystem;
namespace v1 = llmctl::v1;
using llmctl::rpc_fuzz::Check;
using llmctl::rpc_fuzz::CheckStreamAnswer;
using llmctl::rpc_fuzz::SetCallDeadline;
using llmctl::rpc_fuzz::StreamMessages;

using llmctl::rpc_fuzz::kAgentToken;

std::string ReadOrEmpty(const fs::path& path) {
  auto text = llmctl::ReadFileToString(path.string(), 1 << 20);
  return text.ok() ? *text : std::string();
}

// The agent and the enrollment server of every input, channels to them, and their directory,
// removed at exit.
class Fixture {
 public:
  Fixture() {
    auto ca = llmctl::rpc::CertificateAuthority::LoadOrCreate((root_.path() / "ca").string());
    Check(ca.ok(), "a CA");
    auto agent = (*ca)->Issue(llmctl::rpc::AgentCertificateName("node1"), 1);
    auto controller = (*ca)->Issue(llmctl::rpc::kControllerCertificateName, 1);
    Check(agent.ok() && controller.ok(), "the agent's and the controller's certificates");
    const llmctl::rpc::TlsIdentity controller_identity{
        (*ca)->ca_certificate_pem(), controller->certificate_pem, controller->private_key_pem};
    fs::create_directories(root_.path() / "identity");
    identity_files_ = {(root_.path() / "identity" / "ca.crt").string(),
                       (root_.path() / "identity" / "agent.crt").string(),
                       (root_.path() / "identity" / "agent.key").string()};
    Check(llmctl::rpc::WriteSecretFile(identity_files_.ca_file, (*ca)->ca_certificate_pem(), 0600)
                  .ok() &&
              llmctl::rpc::WriteSecretFile(identity_files_.certificate_file, agent->certificate_pem,
                                           0600)
                  .ok() &&
              llmctl::rpc::WriteSecretFile(identity_files_.private_key_file, agent->private_key_pem,
                                           0600)
                  .ok(),
          "the agent's identity files");
    StartAgent();
    agent_ = v1::Agent::NewStub(
        llmctl::rpc::Dial(server_->address(), llmctl::rpc::AgentCertificateName("node1"),
                          llmctl::rpc::ChannelCredentials(controller_identity, kAgentToken)));
    EndOneRun();
    StartEnrollment((*ca)->ca_certificate_pem(), controller_identity);
  }
  ~Fixture() {
    agent_.reset();
    enrollment_.reset();
    enrollment_server_.reset();
    server_.reset();
  }

  v1::Agent::Stub& agent() { return *agent_; }
  v1::AgentEnrollment::Stub& enrollment() { return *enrollment_; }
  const llmctl::rpc::IdentityFiles& identity_files() const { return identity_files_; }
  fs::path BlobPath(const std::string& sha256) const {
    return root_.path() / "data" / "cache" / "blobs" / sha256;
  }
  fs::path EnrolledTokenFile() const { return root_.path() / "enrolled" / "token"; }

 private:
  // First: the directory goes after the daemons that write in it.
  llmctl::rpc_fuzz::TargetRoot root_{"agent_stream_fuzz"};

  void StartAgent() {
    llmctl::agent::AgentOptions options = llmctl::rpc_fuzz::AgentOptionsIn(root_.path(), &sampler_);
    options.identity_files = identity_files_;
    auto server = llmctl::agent::AgentServer::Start(options);
    Check(server.ok(), "the agent starts");
    server_ = std::move(*server);
  }

  // Run 1/a/1, whose supervisor (/bin/true) ends it at once; its stream is read to the end.
  void EndOneRun() {
    v1::RunTrialRequest run;
    run.mutable_key()->set_experiment_id(1);
    run.mutable_key()->set_trial("a");
    run.mutable_key()->set_attempt(1);
    run.set_config_json(R"({"output_dir": "out", "seed": 0})");
    v1::RunState state;
    grpc::ClientContext run_context;
    SetCallDeadline(run_context);
    Check(agent_->RunTrial(&run_context, run, &state).ok(), "run 1/a/1 starts");
    v1::StreamEventsRequest follow;
    *follow.mutable_key() = run.key();
    grpc::ClientContext follow_context;
    follow_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = agent_->StreamEvents(&follow_context, follow);
    v1::StreamEventsResponse item;
    bool ended = false;
    while (reader->Read(&item)) ended = ended || item.has_ended();
    Check(reader->Finish().ok() && ended, "run 1/a/1 ends");
  }

  void StartEnrollment(const std::string& ca_pem,
                       const llmctl::rpc::TlsIdentity& controller_identity) {
    auto server = llmctl::agent::EnrollmentServer::Start(
        {.listen = "127.0.0.1:0",
         .node = "n1",
         .ca_pem = ca_pem,
         .enrollment_token = "enrollment-token-0123",
         .certificate_file = (root_.path() / "enrolled" / "agent.crt").string(),
         .private_key_file = (root_.path() / "enrolled" / "agent.key").string(),
         .token_file = EnrolledTokenFile().string()});
    Check(server.ok(), "the enrollment server starts");
    enrollment_server_ = std::move(*server);
    grpc::ChannelArguments arguments;
    arguments.SetSslTargetNameOverride(llmctl::rpc::EnrollmentCertificateName("n1"));
    enrollment_ = v1::AgentEnrollment::NewStub(grpc::CreateCustomChannel(
        enrollment_server_->address(),
        llmctl::rpc::EnrollmentChannelCredentials(controller_identity), arguments));
  }

  llmctl::rpc::IdentityFiles identity_files_;
  llmctl::agent::FakeDeviceSampler sampler_{{}};
  std::unique_ptr<llmctl::agent::AgentServer> server_;
  std::unique_ptr<llmctl::agent::EnrollmentServer> enrollment_server_;
  std::unique_ptr<v1::Agent::Stub> agent_;
  std::unique_ptr<v1::AgentEnrollment::Stub> enrollment_;
};

void UploadBlob(Fixture& fixture, const uint8_t* data, size_t size) {
  const std::vector<v1::BlobChunk> chunks = StreamMessages<v1::BlobChunk>(data, size);
  v1::UploadBlobResponse response;
  const grpc::Status status = llmctl::rpc_fuzz::UploadChunks(fixture.agent(), chunks, response);
  if (!status.ok() || response.already_present()) return;
  Check(!chunks.empty(), "an upload without a chunk is refused");
  const v1::BlobChunk& first = chunks.front();
  auto bytes = llmctl::ReadFileToString(fixture.BlobPath(first.sha256()).string(), 2 << 20);
  Check(bytes.ok(), "an accepted blob is cached under its digest");
  Check(static_cast<int64_t>(bytes->size()) == first.size(), "an accepted blob has its size");
  Check(llmctl::digest::Sha256Hex(*bytes) == first.sha256(), "an accepted blob has its digest");
}

void StreamEvents(Fixture& fixture, const uint8_t* data, size_t size) {
  const std::vector<v1::StreamEventsRequest> requests =
      StreamMessages<v1::StreamEventsRequest>(data, size);
  if (requests.empty()) return;
  grpc::ClientContext context;
  SetCallDeadline(context);
  auto reader = fixture.agent().StreamEvents(&context, requests.front());
  v1::StreamEventsResponse item;
  while (reader->Read(&item)) {
  }
  const grpc::Status status = reader->Finish();
  CheckStreamAnswer(status);
}

void RenewCertificate(Fixture& fixture, const uint8_t* data, size_t size) {
  const std::vector<v1::CertificateGrant> grants = StreamMessages<v1::CertificateGrant>(data, size);
  const llmctl::rpc::IdentityFiles& files = fixture.identity_files();
  const std::string certificate = ReadOrEmpty(files.certificate_file);
  grpc::ClientContext context;
  SetCallDeadline(context);
  auto stream = fixture.agent().RenewCertificate(&context);
  v1::CertificateRenewal renewal;
  stream->Read(&renewal);
  for (const v1::CertificateGrant& grant : grants) {
    if (!stream->Write(grant)) break;
  }
  stream->WritesDone();
  while (stream->Read(&renewal)) {
  }
  const grpc::Status status = stream->Finish();
  CheckStreamAnswer(status);
  if (status.ok()) return;
  Check(ReadOrEmpty(files.certificate_file) == certificate,
        "a refused renewal leaves the certificate");
  Check(!fs::exists(llmctl::agent::NextKeyFile(files)), "a refused renewal leaves no new key");
}

void Enroll(Fixture& fixture, const uint8_t* data, size_t size) {
  const std::vector<v1::EnrollmentGrant> grants = StreamMessages<v1::EnrollmentGrant>(data, size);
  const bool enrolled = fs::exists(fixture.EnrolledTokenFile());
  grpc::ClientContext context;
  SetCallDeadline(context);
  auto stream = fixture.enrollment().Enroll(&context);
  v1::EnrollmentOffer offer;
  stream->Read(&offer);
  for (const v1::EnrollmentGrant& grant : grants) {
    if (!stream->Write(grant)) break;
  }
  stream->WritesDone();
  while (stream->Read(&offer)) {
  }
  const grpc::Status status = stream->Finish();
  CheckStreamAnswer(status);
  if (!status.ok()) {
    Check(fs::exists(fixture.EnrolledTokenFile()) == enrolled,
          "a refused enrollment writes no node token");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > (1 << 20)) return 0;
  static Fixture fixture;
  const uint8_t* body = data + 1;
  const size_t body_size = size - 1;
  switch (data[0] % 4) {
    case 0:
      UploadBlob(fixture, body, body_size);
      break;
    case 1:
      StreamEvents(fixture, body, body_size);
      break;
    case 2:
      RenewCertificate(fixture, body, body_size);
      break;
    case 3:
      Enroll(fixture, body, body_size);
      break;
  }
  llmctl::rpc_fuzz::CheckWorkingDirectoryEmpty();
  return 0;
}
