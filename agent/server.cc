#include "agent/server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stop_token>
#include <thread>

#include "agent/artifact_files.h"
#include "agent/certificate_renewal.h"
#include "agent/event_reader.h"
#include "agent/node_info.h"
#include "agent/node_rates.h"
#include "agent/process.h"
#include "agent/stream_events.h"
#include "common/digest/digest.h"
#include "common/file_lock.h"
#include "common/files.h"
#include "common/foreign_json.h"
#include "common/model_config.h"
#include "common/version.h"
#include "llmctl/v1/agent.grpc.pb.h"
#include "rpc/blob_stream.h"
#include "rpc/connection.h"
#include "rpc/grpc_status.h"

namespace llmctl::agent {
namespace {

namespace pb = llmctl::v1;

constexpr size_t kArtifactChunkBytes = 1 << 20;

RunKey FromProto(const pb::RunKey& key) {
  return RunKey{key.experiment_id(), key.trial(), key.attempt()};
}

void ToProto(const RunKey& key, pb::RunKey* out) {
  out->set_experiment_id(key.experiment_id);
  out->set_trial(key.trial);
  out->set_attempt(key.attempt);
}

void ToProto(const RunEnd& end, pb::RunEnded* out) {
  out->set_outcome(end.outcome);
  out->set_exit_code(end.exit_code);
  out->set_error(end.error);
}

void ToProto(const RunState& state, pb::RunState* out) {
  ToProto(state.key, out->mutable_key());
  out->set_status(state.ended ? pb::RUN_STATUS_ENDED : pb::RUN_STATUS_RUNNING);
  out->set_last_seq(state.last_seq);
  if (state.ended) ToProto(state.end, out->mutable_ended());
  out->set_master_port(state.master_port);
}

// When the caller of `context` stops waiting, on the steady clock: its deadline less a margin for
// the answer's way back, or the epoch for a call without one (RunRequest::answer_by).
std::chrono::steady_clock::time_point AnswerBy(const grpc::ServerContext& context) {
  constexpr std::chrono::seconds kAnswerMargin{2};
  const auto left = context.deadline() - std::chrono::system_clock::now();
  // A call without a deadline has one at the end of time.
  if (left > std::chrono::hours(24 * 365)) return {};
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(left - kAnswerMargin);
}

digest::InputTree FromProto(const pb::InputTree& tree) {
  digest::InputTree plain;
  plain.digest = tree.digest();
  plain.is_file = tree.is_file();
  for (const pb::TreeFile& file : tree.files()) {
    plain.files.push_back(digest::TreeFile{file.path(), file.sha256(), file.size()});
  }
  return plain;
}

}  // namespace

class AgentService final : public pb::Agent::Service {
 public:
  AgentService(const AgentOptions& options, InputCache* cache, HubCache* hub, RunManager* runs)
      : node_(options.node),
        llm_train_(options.llm_train),
        poll_interval_(options.poll_interval),
        cache_(cache),
        hub_(hub),
        runs_(runs),
        rates_({.data_dir = options.data_dir,
                .llm_train = options.llm_train,
                .measure = options.measure_rates,
                .adoptable_probe = options.adoptable_rate_probe},
               [runs] { return !runs->Running().empty(); }),
        renewer_(options.identity_files.certificate_file.empty()
                     ? nullptr
                     : std::make_unique<CertificateRenewer>(options.identity_files)) {}

  ~AgentService() {
    if (probe_thread_.joinable()) probe_thread_.join();
  }

  // Probes the node on a thread of its own, so that the controller's first health check, which
  // comes right after the agent starts, finds the facts ready instead of waiting for llm-train to
  // load LibTorch; then its rates, kept or measured once no trial runs.
  void StartProbe() {
    probe_thread_ = std::thread([this] {
      if (const StatusOr<NodeFacts>& facts = Probe(); facts.ok()) rates_.Start(*facts);
    });
  }

  // Ends the streams that follow running runs (within one poll interval) and the node's probes in
  // progress, llm-train --version and the rate probe (their process groups killed), which would
  // otherwise hold up the agent's exit.
  void Stop() {
    stop_.request_stop();
    rates_.Stop();
  }

  grpc::Status RenewCertificate(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<pb::CertificateRenewal, pb::CertificateGrant>* stream) override {
    if (renewer_ == nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "certificate renewal: this agent serves no certificate files");
    }
    return renewer_->Renew(*context, *stream);
  }

  grpc::Status GetNodeInfo(grpc::ServerContext*, const pb::GetNodeInfoRequest*,
                           pb::NodeInfo* response) override {
    // The controller calls this as its health check; the facts do not change while the agent runs,
    // and probing them loads NVML and runs llm-train (which loads LibTorch), so probe once.
    const StatusOr<NodeFacts>& probed = Probe();
    if (!probed.ok()) return rpc::ToGrpcStatus(probed.status());
    const NodeFacts& facts = *probed;
    response->set_node(rpc::AgentCertificateName(node_));
    for (const DeviceInfo& device : facts.devices) {
      pb::Device* out = response->add_devices();
      out->set_type(device.type);
      out->set_index(device.index);
      out->set_name(device.name);
      out->set_memory_bytes(device.memory_bytes);
    }
    response->set_host_memory_bytes(facts.host_memory_bytes);
    response->set_llmctl_version(std::string(kVersion));
    response->set_trainer_version(facts.trainer_version);
    response->set_cpu_count(facts.cpu_count);
    response->set_nvidia_driver_version(facts.nvidia_driver_version);
    response->set_driver_cuda_version(facts.driver_cuda_version);
    response->set_libtorch_version(facts.libtorch_version);
    response->set_libtorch_cuda_version(facts.libtorch_cuda_version);
    rates_.TakeChangedLocalProbe();
    NodeRates::Report rates = rates_.Current();
    response->set_rate_probe_json(std::move(rates.probe_json));
    response->set_rate_probe_pending(std::move(rates.pending));
    response->set_rate_probe_underway(rates.underway);
    response->set_unusable(CheckTrainerVersion(llm_train_, facts).message());
    return grpc::Status::OK;
  }

  grpc::Status MeasureRates(grpc::ServerContext*, const pb::MeasureRatesRequest*,
                            pb::MeasureRatesResponse* response) override {
    StatusOr<std::string> pending = rates_.MeasureAgain();
    if (!pending.ok()) return rpc::ToGrpcStatus(pending.status());
    response->set_pending(*std::move(pending));
    return grpc::Status::OK;
  }

  grpc::Status MissingBlobs(grpc::ServerContext*, const pb::MissingBlobsRequest* request,
                            pb::MissingBlobsResponse* response) override {
    auto missing = cache_->MissingBlobs({request->sha256().begin(), request->sha256().end()});
    if (!missing.ok()) return rpc::ToGrpcStatus(missing.status());
    for (const std::string& sha256 : *missing) response->add_sha256(sha256);
    return grpc::Status::OK;
  }

  grpc::Status UploadBlob(grpc::ServerContext*, grpc::ServerReader<pb::BlobChunk>* reader,
                          pb::UploadBlobResponse* response) override {
    auto first = rpc::ReadFirstBlobChunk(*reader);
    if (!first.ok()) return rpc::ToGrpcStatus(first.status());
    const std::string sha256 = first->sha256();
    response->set_sha256(sha256);
    if (const std::optional<int64_t> held =
            digest::IsSha256Hex(sha256) ? cache_->HeldBlobBytes(sha256) : std::nullopt) {
      response->set_already_present(true);
      return rpc::ToGrpcStatus(rpc::DrainHeldBlob(*reader, *first, *held));
    }
    auto upload = cache_->BeginUpload(sha256, first->size());
    if (!upload.ok()) return rpc::ToGrpcStatus(upload.status());
    return rpc::ToGrpcStatus(rpc::ReceiveBlob(*reader, *std::move(first), **upload));
  }

  grpc::Status PrepareHubModel(grpc::ServerContext* context,
                               const pb::PrepareHubModelRequest* request,
                               pb::PrepareHubModelResponse* response) override {
    auto ref = MakeHubModelRef(request->repo(), request->revision());
    if (!ref.ok()) return rpc::ToGrpcStatus(ref.status().WithContext("PrepareHubModel"));
    // A controller that gave up (its deadline, a node forgotten, its stop) ends the download here
    // too, instead of leaving it to run for hours on a thread of this server's.
    const std::function<bool()> cancelled = [context] { return context->IsCancelled(); };
    auto prepared =
        hub_->Prepare(*ref, {request->files().begin(), request->files().end()}, cancelled);
    if (!prepared.ok()) return rpc::ToGrpcStatus(prepared.status());
    response->set_path(prepared->path);
    response->set_bytes(prepared->bytes);
    return grpc::Status::OK;
  }

  grpc::Status RunTrial(grpc::ServerContext* context, const pb::RunTrialRequest* request,
                        pb::RunState* response) override {
    // The controller places none on a node whose info says it is unusable; this holds for one that
    // does not read that yet.
    const StatusOr<NodeFacts>& probed = Probe();
    if (!probed.ok()) return rpc::ToGrpcStatus(probed.status());
    if (const Status trainer = CheckTrainerVersion(llm_train_, *probed); !trainer.ok()) {
      return rpc::ToGrpcStatus(trainer.WithContext("RunTrial"));
    }
    RunRequest plain;
    plain.key = FromProto(request->key());
    plain.config_json = request->config_json();
    for (const auto& [key, tree] : request->inputs()) plain.inputs[key] = FromProto(tree);
    // A hub model runs from the directory PrepareHubModel made (an uploaded tree for `model` wins).
    const nlohmann::json config = ParseForeignJson(request->config_json());
    if (const auto model = config.is_object() ? config.find("model") : config.end();
        model != config.end() && model->is_string() && IsHubModelRef(model->get<std::string>()) &&
        plain.inputs.count("model") == 0) {
      auto ref = ParseHubModelRef(model->get<std::string>());
      if (!ref.ok()) return rpc::ToGrpcStatus(ref.status().WithContext("config_json"));
      auto dir = hub_->Find(*ref);
      if (!dir.ok()) return rpc::ToGrpcStatus(dir.status());
      plain.local_paths["model"] = *dir;
    }
    plain.device_indices.assign(request->device_indices().begin(), request->device_indices().end());
    // nodes <= 1 (or no group): a trial on this node alone.
    if (const pb::NodeGroup& group = request->node_group(); group.nodes() > 1) {
      plain.node_group =
          NodeGroup{group.node_rank(), group.nodes(), group.master_addr(), group.master_port()};
    }
    if (request->has_resume_from() && request->resume_from().has_tree()) {
      plain.resume_tree = FromProto(request->resume_from().tree());
    } else if (request->has_resume_from()) {
      if (request->resume_from().checkpoint().empty()) {
        return rpc::ToGrpcStatus(InvalidArgumentError("resume_from: no checkpoint named"));
      }
      plain.resume_run = FromProto(request->resume_from().run());
      plain.resume_checkpoint = request->resume_from().checkpoint();
    }
    plain.answer_by = AnswerBy(*context);
    // Not while the node's rates are measured: each would distort the other's time. Nor once the
    // controller has stopped waiting: it would not know the run, and place the trial again.
    const NodeRates::StartingTrial starting(rates_, plain.answer_by);
    if (!starting.free()) {
      return rpc::ToGrpcStatus(UnavailableError(
          "RunTrial: the node is measuring its rates (llm-train --probe, about 12 s on a CPU and "
          "under 30 s on a GPU); it takes trials again once that ends"));
    }
    if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "RunTrial");
    auto state = runs_->Start(plain);
    if (!state.ok()) return rpc::ToGrpcStatus(state.status());
    ToProto(*state, response);
    return grpc::Status::OK;
  }

  grpc::Status ListRuns(grpc::ServerContext*, const pb::ListRunsRequest*,
                        pb::ListRunsResponse* response) override {
    for (const RunState& state : runs_->List()) ToProto(state, response->add_runs());
    return grpc::Status::OK;
  }

  grpc::Status StreamEvents(grpc::ServerContext* context, const pb::StreamEventsRequest* request,
                            grpc::ServerWriter<pb::StreamEventsResponse>* writer) override {
    const RunKey key = FromProto(request->key());
    if (request->from_seq() < 0 || request->from_sample_seq() < 0) {
      return rpc::ToGrpcStatus(
          InvalidArgumentError("StreamEvents: from_seq and from_sample_seq must be >= 0, got " +
                               std::to_string(request->from_seq()) + " and " +
                               std::to_string(request->from_sample_seq())));
    }
    auto dir = runs_->RunDir(key);
    if (!dir.ok()) return rpc::ToGrpcStatus(dir.status());
    auto ranks = runs_->Ranks(key);
    if (!ranks.ok()) return rpc::ToGrpcStatus(ranks.status());
    // One reader per event file of this node's ranks (global ranks first..; a multi-node run's
    // node rank K > 0 has no rank 0), each with its own line numbers; index i is rank first + i.
    const int first_rank = ranks->first;
    std::vector<std::unique_ptr<EventReader>> readers;
    std::vector<int64_t> from_seqs;
    for (int rank = first_rank; rank < first_rank + ranks->count; ++rank) {
      readers.push_back(std::make_unique<EventReader>(*dir + "/" + RankEventsFile(rank)));
      from_seqs.push_back(1);
    }
    if (first_rank == 0) from_seqs[0] = std::max<int64_t>(1, request->from_seq());
    for (const auto& [rank, seq] : request->from_rank_seq()) {
      if (rank < 1 || seq < 0) {
        return rpc::ToGrpcStatus(InvalidArgumentError(
            "StreamEvents: from_rank_seq names ranks from 1 with seqs >= 0, got rank " +
            std::to_string(rank) + " at " + std::to_string(seq)));
      }
      // Another node's ranks are that node's agent's to send.
      if (rank >= first_rank && rank < first_rank + ranks->count) {
        from_seqs[rank - first_rank] = std::max<int64_t>(1, seq);
      }
    }
    const int64_t from_sample_seq = std::max<int64_t>(1, request->from_sample_seq());
    EventReader samples_reader(*dir + "/" + kSamplesFile);
    // Nothing to wait for before the first read; after a read that found no new line, up to one
    // poll interval, cut short when the run ends so that its end goes out at once.
    std::chrono::milliseconds wait(0);
    while (true) {
      if (context->IsCancelled()) return grpc::Status::CANCELLED;
      // Ended is read before the files: a run that had ended then has all its lines in them (the
      // launcher reaps every rank before it exits).
      auto ended = runs_->Ended(key, wait);
      if (!ended.ok()) return rpc::ToGrpcStatus(ended.status());
      bool any_lines = false;
      bool all_read = true;  // every file read to its end: the run's end may go out
      const grpc::Status sent =
          SendEventLines(key, first_rank, readers, from_seqs, request->batch_events(), any_lines,
                         all_read, writer);
      if (!sent.ok()) return sent;
      auto sample_lines = samples_reader.ReadNewLines();
      if (!sample_lines.ok()) return rpc::ToGrpcStatus(sample_lines.status());
      all_read = all_read && samples_reader.at_end();
      if (!SendSamples(*sample_lines, samples_reader.lines_read(), from_sample_seq, writer)) {
        return grpc::Status::CANCELLED;
      }
      if (ended->has_value() && all_read) {
        pb::StreamEventsResponse item;
        ToProto(**ended, item.mutable_ended());
        writer->Write(item);
        return grpc::Status::OK;
      }
      if (stop_.stop_requested()) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the agent is shutting down");
      }
      // More to read at once (lines came, or a reader stopped at its budget): no wait.
      wait = !any_lines && sample_lines->empty() && all_read ? poll_interval_
                                                             : std::chrono::milliseconds(0);
    }
  }

  grpc::Status CancelRun(grpc::ServerContext*, const pb::CancelRunRequest* request,
                         pb::RunState* response) override {
    if (!request->checkpoint() && request->checkpoint_grace_ms() != 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "CancelRun: checkpoint_grace_ms is only for a cancel with checkpoint");
    }
    auto state =
        request->checkpoint()
            ? runs_->CancelWithCheckpoint(FromProto(request->key()),
                                          std::chrono::milliseconds(request->checkpoint_grace_ms()))
            : runs_->Cancel(FromProto(request->key()));
    if (!state.ok()) return rpc::ToGrpcStatus(state.status());
    ToProto(*state, response);
    return grpc::Status::OK;
  }

  grpc::Status FetchArtifacts(grpc::ServerContext* context,
                              const pb::FetchArtifactsRequest* request,
                              grpc::ServerWriter<pb::ArtifactChunk>* writer) override {
    auto run_dir = runs_->RunDir(FromProto(request->key()));
    if (!run_dir.ok()) return rpc::ToGrpcStatus(run_dir.status());
    auto ranks = runs_->Ranks(FromProto(request->key()));
    if (!ranks.ok()) return rpc::ToGrpcStatus(ranks.status());
    std::string root = *run_dir;
    std::vector<std::string> paths;
    if (request->path().empty()) {
      paths = ArtifactPaths(root, *ranks);
    } else {
      auto below = OutputSubdirectory(root, request->path());
      if (!below.ok()) return rpc::ToGrpcStatus(below.status().WithContext("FetchArtifacts"));
      root = *below;
      paths = FilesBelow(root);
    }
    std::string buffer(kArtifactChunkBytes, '\0');
    for (const std::string& path : paths) {
      int64_t size = 0;
      const UniqueFd in = OpenArtifact(root, path, size);
      if (!in.valid()) continue;  // removed meanwhile, or no longer the run's own file
      // The size when the file was opened: a log still growing is sent up to there.
      int64_t left = size;
      digest::Sha256 hasher;
      bool first = true;
      do {
        if (context->IsCancelled()) return grpc::Status::CANCELLED;
        const int64_t wanted = std::min<int64_t>(left, kArtifactChunkBytes);
        const int64_t got = ReadFull(in.get(), buffer.data(), wanted);
        // A file cut short meanwhile ends here; the receiver sees the size and sha256 disagree.
        left = got < wanted ? 0 : left - got;
        const std::string_view data(buffer.data(), static_cast<size_t>(got));
        hasher.Update(data);
        pb::ArtifactChunk chunk;
        if (first) {
          chunk.set_path(path);
          chunk.set_size(size);
        }
        chunk.set_data(std::string(data));
        if (left == 0) {
          chunk.set_last(true);
          chunk.set_sha256(hasher.HexDigest());
        }
        if (!writer->Write(chunk)) return grpc::Status::CANCELLED;
        first = false;
      } while (left > 0);
    }
    return grpc::Status::OK;
  }

 private:
  const std::string node_;
  const std::string llm_train_;
  // The facts do not change while the agent runs, and probing them loads NVML and runs llm-train
  // (which loads LibTorch): probed once. Cancelled when the agent stopped first.
  const StatusOr<NodeFacts>& Probe() {
    std::call_once(probe_once_,
                   [this] { facts_.emplace(ProbeNode(llm_train_, stop_.get_token())); });
    return *facts_;
  }

  std::once_flag probe_once_;
  std::optional<StatusOr<NodeFacts>> facts_;  // set once, by Probe
  std::thread probe_thread_;
  const std::chrono::milliseconds poll_interval_;
  InputCache* const cache_;
  HubCache* const hub_;
  RunManager* const runs_;
  NodeRates rates_;
  const std::unique_ptr<CertificateRenewer> renewer_;  // null: fixed credentials
  std::stop_source stop_;                              // requested by Stop()
};

namespace {

// The options the agent cannot start without.
Status CheckRequiredOptions(const AgentOptions& options) {
  if (options.listen.empty() || options.data_dir.empty() || options.node.empty() ||
      options.token.empty() || options.llm_train.empty() || options.supervisor_program.empty()) {
    return InvalidArgumentError(
        "the agent needs --listen, --data-dir, --node, a token, --llm-train and its own path");
  }
  return Status::Ok();
}

// A socket left at `listen` (unix:PATH) by an earlier agent would make the bind fail: removed.
// Anything else there stays, and is refused.
Status RemoveStaleSocket(const std::string& listen) {
  struct stat info;
  const std::string path = listen.substr(5);
  if (::lstat(path.c_str(), &info) == 0) {
    if (!S_ISSOCK(info.st_mode)) {
      return InvalidArgumentError("--listen " + listen + ": " + path +
                                  " exists and is not a socket");
    }
    ::unlink(path.c_str());
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<AgentServer>> AgentServer::Start(AgentOptions options) {
  RETURN_IF_ERROR(CheckRequiredOptions(options));
  // The runs, the input cache and the node's rates are this user's alone, whatever the umask.
  RETURN_IF_ERROR(EnsureOwnDirectory(options.data_dir, 0700, OthersMay::kAnything));
  std::unique_ptr<AgentServer> server(new AgentServer());
  // Before its socket and its runs: a second agent here would take the first's socket and recover
  // and supervise the same runs.
  ASSIGN_OR_RETURN(server->data_lock_,
                   LockDataDirectory(options.data_dir, "llm-agent.lock", "llm-agent",
                                     "stop it, or give this one another --data-dir"));
  RETURN_IF_ERROR(server->OpenStores(options));
  RETURN_IF_ERROR(server->StartService(options));
  RETURN_IF_ERROR(server->Listen(options));
  return server;
}

Status AgentServer::OpenStores(const AgentOptions& options) {
  ASSIGN_OR_RETURN(cache_,
                   InputCache::Open(options.data_dir + "/cache", options.cache_keep_free_bytes));
  hub_ = std::make_unique<HubCache>(options.hub, cache_.get());
  RunManagerOptions run_options;
  run_options.data_dir = options.data_dir;
  run_options.llm_train = options.llm_train;
  run_options.supervisor_program = options.supervisor_program;
  run_options.cancel_grace = options.cancel_grace;
  run_options.poll_interval = options.poll_interval;
  ASSIGN_OR_RETURN(runs_, RunManager::Open(run_options, cache_.get()));
  return Status::Ok();
}

Status AgentServer::StartService(const AgentOptions& options) {
  if (options.sample_interval.count() <= 0) {
    return InvalidArgumentError("the sample interval must be positive");
  }
  DeviceSampler* sampler = options.sampler;
  if (sampler == nullptr) {
    node_sampler_ = MakeNodeSampler();
    sampler = node_sampler_.get();
  }
  recorder_ = std::make_unique<SampleRecorder>(runs_.get(), sampler, options.sample_interval);
  service_ = std::make_unique<AgentService>(options, cache_.get(), hub_.get(), runs_.get());
  service_->StartProbe();
  return Status::Ok();
}

Status AgentServer::Listen(const AgentOptions& options) {
  const bool is_unix = options.listen.starts_with("unix:");
  if (is_unix) RETURN_IF_ERROR(RemoveStaleSocket(options.listen));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(
      rpc::GrpcAddress(options.listen),
      options.identity_files.certificate_file.empty()
          ? rpc::ServerCredentials(options.identity, options.token)
          : rpc::WatchedServerCredentials(options.identity_files, options.token,
                                          options.identity_refresh),
      is_unix ? nullptr : &port);
  builder.RegisterService(service_.get());
  rpc::ServerLimits limits;
  limits.max_receive_bytes = 8 << 20;
  rpc::ApplyServerLimits(builder, limits);
  server_ = rpc::BuildAndStartServer(builder, options.listen);
  if (server_ == nullptr || (!is_unix && port == 0)) {
    return UnavailableError("cannot listen on " + options.listen);
  }
  if (is_unix) {
    address_ = options.listen;
  } else {
    const std::string host = options.listen.substr(0, options.listen.rfind(':'));
    address_ = host + ":" + std::to_string(port);
  }
  return Status::Ok();
}

void AgentServer::Wait() {
  if (server_) server_->Wait();
}

v1::Agent::Service& AgentServer::service() { return *service_; }

void AgentServer::Shutdown() {
  if (service_) service_->Stop();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

AgentServer::~AgentServer() {
  Shutdown();
  if (server_) server_->Wait();
}

}  // namespace llmctl::agent
