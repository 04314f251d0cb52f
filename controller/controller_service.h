// The controller's gRPC API for the CLI (proto/llmctl/v1/controller.proto): protobuf in, plain
// values to the store, blob store and dispatcher. No exception leaves a handler: each ends with a
// status (INTERNAL for an unexpected exception). The handlers, by what they serve:
// controller_service.cc (the guard, blobs, Submit), controller_service_experiments.cc (list,
// status, watch, cancel, resume, fetch), controller_service_report.cc (Report, TimedRuns) and
// controller_service_nodes.cc (the nodes).
#ifndef LLMCTL_CONTROLLER_CONTROLLER_SERVICE_H_
#define LLMCTL_CONTROLLER_CONTROLLER_SERVICE_H_

#include <functional>
#include <string>
#include <string_view>

#include "common/name_locks.h"
#include "controller/blob_store.h"
#include "controller/change_notifier.h"
#include "controller/clock.h"
#include "controller/dispatcher.h"
#include "controller/enrollment.h"
#include "controller/secrets.h"
#include "controller/store/store.h"
#include "llmctl/v1/controller.grpc.pb.h"
#include "rpc/tls.h"

namespace llmctl::controller {

class ControllerService final : public v1::Controller::Service {
 public:
  // The references must outlive the service. A non-empty `api_token` must come with every call
  // ("authorization: Bearer <token>", rpc::CheckBearerToken), else UNAUTHENTICATED, and so must
  // this llmctl's version (rpc::CheckClientVersion), else FAILED_PRECONDITION: the checks are the
  // first thing each handler does (Guard), as gRPC has no hook that refuses a call on a channel
  // without TLS. Empty: no check (the unix socket, whose mode is its credential, and whose CLI
  // started llmctld from its own directory, docs/architecture.md "Versions"). Every answer
  // announces this llmctl's version (rpc::AnnounceVersion).
  ControllerService(store::Store& store, const BlobStore& blobs, SecretsFile& secrets,
                    const rpc::CertificateAuthority& ca, Dispatcher& dispatcher,
                    const ChangeNotifier& changes, const Clock& clock, std::string api_token = "",
                    rpc::TlsIdentity controller_identity = {});

  grpc::Status MissingBlobs(grpc::ServerContext* context, const v1::MissingBlobsRequest* request,
                            v1::MissingBlobsResponse* response) override;
  grpc::Status UploadBlob(grpc::ServerContext* context, grpc::ServerReader<v1::BlobChunk>* reader,
                          v1::UploadBlobResponse* response) override;
  grpc::Status Submit(grpc::ServerContext* context, const v1::SubmitRequest* request,
                      v1::SubmitResponse* response) override;
  grpc::Status ListExperiments(grpc::ServerContext* context,
                               const v1::ListExperimentsRequest* request,
                               v1::ListExperimentsResponse* response) override;
  grpc::Status GetExperiment(grpc::ServerContext* context, const v1::GetExperimentRequest* request,
                             v1::ExperimentStatus* response) override;
  grpc::Status Watch(grpc::ServerContext* context, const v1::GetExperimentRequest* request,
                     grpc::ServerWriter<v1::ExperimentStatus>* writer) override;
  grpc::Status Cancel(grpc::ServerContext* context, const v1::CancelRequest* request,
                      v1::CancelResponse* response) override;
  grpc::Status Resume(grpc::ServerContext* context, const v1::ResumeRequest* request,
                      v1::ResumeResponse* response) override;
  grpc::Status Report(grpc::ServerContext* context, const v1::GetExperimentRequest* request,
                      v1::ReportResponse* response) override;
  grpc::Status TimedRuns(grpc::ServerContext* context, const v1::TimedRunsRequest* request,
                         v1::TimedRunsResponse* response) override;
  grpc::Status FetchArtifacts(grpc::ServerContext* context,
                              const v1::FetchTrialArtifactsRequest* request,
                              grpc::ServerWriter<v1::ArtifactChunk>* writer) override;
  grpc::Status ListNodes(grpc::ServerContext* context, const v1::ListNodesRequest* request,
                         v1::ListNodesResponse* response) override;
  grpc::Status MeasureNodeRates(grpc::ServerContext* context,
                                const v1::MeasureNodeRatesRequest* request,
                                v1::MeasureNodeRatesResponse* response) override;
  grpc::Status RegisterNode(grpc::ServerContext* context, const v1::RegisterNodeRequest* request,
                            v1::NodeCredentials* response) override;
  grpc::Status EnrollNode(grpc::ServerContext* context, const v1::EnrollNodeRequest* request,
                          v1::EnrollNodeResponse* response) override;
  grpc::Status UpdateNode(grpc::ServerContext* context, const v1::UpdateNodeRequest* request,
                          v1::NodeStatus* response) override;
  grpc::Status DeregisterNode(grpc::ServerContext* context,
                              const v1::DeregisterNodeRequest* request,
                              v1::DeregisterNodeResponse* response) override;

 private:
  // Announces this llmctl's version, checks the caller's token and version (when the service has a
  // token), then runs a handler body, turning an escaping exception into INTERNAL.
  grpc::Status Guard(grpc::ServerContext* context, std::string_view method,
                     const std::function<Status()>& body) const;
  StatusOr<int64_t> ResolveExperimentId(int64_t requested);
  StatusOr<v1::ExperimentStatus> BuildStatus(int64_t experiment_id);
  // RegisterNode's two kinds of issue, under `node`'s registration lock.
  Status IssueCredentials(const std::string& node, v1::NodeCredentials& response);
  Status IssueEnrollment(const std::string& node, v1::NodeCredentials& response);
  // The grant for an agent that presented `token` as node `node`'s enrollment token, kept as the
  // enrollment's sent grant (SecretsFile::RecordSentGrant) before it goes: its token becomes the
  // node token once the agent has it.
  StatusOr<v1::EnrollmentGrant> DecideEnrollment(const std::string& node, const std::string& token);
  StatusOr<v1::NodeStatus> BuildNodeStatus(const store::NodeRecord& node,
                                           const std::vector<store::RunningAttempt>& running);

  store::Store& store_;
  const BlobStore& blobs_;
  SecretsFile& secrets_;
  const rpc::CertificateAuthority& ca_;
  Dispatcher& dispatcher_;
  const ChangeNotifier& changes_;
  const Clock& clock_;
  const std::string api_token_;
  // The controller's client certificate, for EnrollNode's call to the node (empty: it refuses).
  const rpc::TlsIdentity controller_identity_;
  // One per node name: RegisterNode's check and change of the name's token, and EnrollNode's check
  // and spending of its enrollment token, and DeregisterNode's removal of the token and the node,
  // happen under it (so `node down` waits for an enrollment in flight). Per name, since an
  // enrollment holds it while it dials the node (up to 20 s, a booting node's address may swallow
  // the connection).
  NameLocks registration_locks_;
};

// "letters, digits and '-'", 1 to 63 of them: a DNS label, as the agent's certificate name needs.
Status ValidateNodeName(std::string_view name);

}  // namespace llmctl::controller

#endif  // LLMCTL_CONTROLLER_CONTROLLER_SERVICE_H_
