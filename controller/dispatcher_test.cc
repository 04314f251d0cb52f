// The dispatcher against an in-process fake agent that speaks agent.proto over mutual TLS with the
// credentials RegisterNode issued, on unix sockets; a real SQLite file; a manual clock for health
// checks, backoff and requeueing.
#include "controller/dispatcher.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sqlite3.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/digest/digest.h"
#include "controller/daemon.h"
#include "rpc/tls.h"

namespace llmctl::controller {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

std::string RunName(const v1::RunKey& key) {
  return std::to_string(key.experiment_id()) + "/" + key.trial() + "#" +
         std::to_string(key.attempt());
}

std::string StepLine(int step) {
  return R"({"type":"step","step":)" + std::to_string(step) +
         R"(,"loss":2.5,"tokens":64,"seconds":0.5,"allocated_bytes":1000,"peak_bytes":2000})";
}
const std::string kResultLine =
    R"({"type":"result","outcome":"ok","train_seconds":1.5,"tokens_per_second":128.0,"peak_bytes":2000,"final_loss":2.25})";

// What the fake agent knows; it outlives the fake's servers, as a real agent's disk does.
struct FakeAgentState {
  struct Run {
    v1::RunTrialRequest request;
    std::vector<std::string> lines;
    bool ended = false;
    std::string outcome;
  };
  std::mutex mutex;
  std::condition_variable changed;
  int cuda_devices = 0;  // GetNodeInfo lists these besides one CPU
  // What GetNodeInfo says of the NVIDIA driver and llm-train's LibTorch ("": nothing).
  std::string driver_version, driver_cuda_version, libtorch_cuda_version;
  std::map<std::string, Run> runs;  // by RunName
  std::vector<int64_t> stream_from_seqs;
  std::vector<int64_t> stream_from_sample_seqs;
  // The device samples every run has; each stream sends those from its from_sample_seq first.
  std::vector<v1::DeviceSample> samples;
  int node_info_calls = 0;
  std::set<std::string> blobs;
  std::vector<std::string> cancelled;
  // How long each UploadBlob had left before its deadline when it arrived, by sha256.
  std::map<std::string, std::chrono::system_clock::duration> upload_time_left;
  std::vector<v1::CancelRunRequest> cancel_requests;
  // What a cancelled run's worker writes before it ends.
  std::vector<std::string> cancel_lines;
  // What the next RunTrial's worker will write.
  std::vector<std::string> script = {StepLine(0), StepLine(1), kResultLine};
  bool script_ends = true;
  // The next stream breaks after sending this many events (0: never).
  int drop_after = 0;
  // PrepareHubModel: the requests seen, the answers to give in order (then OK), and whether a
  // call waits until `prepare_open` is set.
  std::vector<v1::PrepareHubModelRequest> prepared;
  std::vector<grpc::Status> prepare_results;
  bool prepare_open = true;
  // What FetchArtifacts with a path (a checkpoint's directory) sends: relative path → content;
  // empty: NOT_FOUND, as for a checkpoint that is not there. The paths asked for.
  std::map<std::string, std::string> checkpoint_files;
  std::vector<std::string> fetched_paths;

  void AddLinesAndEnd(const std::string& run, const std::vector<std::string>& lines,
                      const std::string& outcome) {
    {
      std::lock_guard lock(mutex);
      Run& r = runs.at(run);
      r.lines.insert(r.lines.end(), lines.begin(), lines.end());
      r.ended = true;
      r.outcome = outcome;
    }
    changed.notify_all();
  }
};

class FakeAgent final : public v1::Agent::Service {
 public:
  explicit FakeAgent(FakeAgentState& state) : state_(state) {}

  grpc::Status GetNodeInfo(grpc::ServerContext*, const v1::GetNodeInfoRequest*,
                           v1::NodeInfo* info) override {
    {
      std::lock_guard lock(state_.mutex);
      ++state_.node_info_calls;
    }
    info->set_node("n1");
    v1::Device* cpu = info->add_devices();
    cpu->set_type("cpu");
    cpu->set_name("fake cpu");
    std::lock_guard lock(state_.mutex);
    for (int index = 0; index < state_.cuda_devices; ++index) {
      v1::Device* gpu = info->add_devices();
      gpu->set_type("cuda");
      gpu->set_index(index);
      gpu->set_name("fake gpu");
    }
    info->set_nvidia_driver_version(state_.driver_version);
    info->set_driver_cuda_version(state_.driver_cuda_version);
    info->set_libtorch_version("2.15.0");
    info->set_libtorch_cuda_version(state_.libtorch_cuda_version);
    return grpc::Status::OK;
  }
  grpc::Status MissingBlobs(grpc::ServerContext*, const v1::MissingBlobsRequest* request,
                            v1::MissingBlobsResponse* response) override {
    std::lock_guard lock(state_.mutex);
    for (const std::string& sha : request->sha256()) {
      if (!state_.blobs.contains(sha)) response->add_sha256(sha);
    }
    return grpc::Status::OK;
  }
  grpc::Status UploadBlob(grpc::ServerContext* context, grpc::ServerReader<v1::BlobChunk>* reader,
                          v1::UploadBlobResponse* response) override {
    const auto time_left = context->deadline() - std::chrono::system_clock::now();
    v1::BlobChunk chunk;
    std::string sha;
    digest::Sha256 hasher;
    while (reader->Read(&chunk)) {
      if (sha.empty()) sha = chunk.sha256();
      hasher.Update(chunk.data());
    }
    if (hasher.HexDigest() != sha) return grpc::Status(grpc::StatusCode::DATA_LOSS, "digest");
    std::lock_guard lock(state_.mutex);
    state_.upload_time_left[sha] = time_left;
    state_.blobs.insert(sha);
    response->set_sha256(sha);
    return grpc::Status::OK;
  }
  grpc::Status PrepareHubModel(grpc::ServerContext* context,
                               const v1::PrepareHubModelRequest* request,
                               v1::PrepareHubModelResponse* response) override {
    std::unique_lock lock(state_.mutex);
    state_.prepared.push_back(*request);
    state_.changed.notify_all();
    while (!state_.prepare_open && !context->IsCancelled()) {
      state_.changed.wait_for(lock, milliseconds(20));
    }
    if (context->IsCancelled()) return grpc::Status::CANCELLED;
    grpc::Status result = grpc::Status::OK;
    if (!state_.prepare_results.empty()) {
      result = state_.prepare_results.front();
      state_.prepare_results.erase(state_.prepare_results.begin());
    }
    response->set_path("/cache/models/" + request->repo());
    return result;
  }
  grpc::Status RunTrial(grpc::ServerContext*, const v1::RunTrialRequest* request,
                        v1::RunState* state) override {
    std::lock_guard lock(state_.mutex);
    // A checkpoint sent as a tree needs no earlier run on this node.
    if (request->has_resume_from() && !request->resume_from().has_tree() &&
        !state_.runs.contains(RunName(request->resume_from().run()))) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this node has no such run");
    }
    auto [run, created] = state_.runs.try_emplace(RunName(request->key()));
    if (created) {
      run->second.request = *request;
      run->second.lines = state_.script;
      run->second.ended = state_.script_ends;
      run->second.outcome = "ok";
    }
    *state->mutable_key() = request->key();
    state->set_status(run->second.ended ? v1::RUN_STATUS_ENDED : v1::RUN_STATUS_RUNNING);
    return grpc::Status::OK;
  }
  grpc::Status ListRuns(grpc::ServerContext*, const v1::ListRunsRequest*,
                        v1::ListRunsResponse* response) override {
    std::lock_guard lock(state_.mutex);
    for (const auto& [name, run] : state_.runs) {
      v1::RunState* state = response->add_runs();
      *state->mutable_key() = run.request.key();
      state->set_status(run.ended ? v1::RUN_STATUS_ENDED : v1::RUN_STATUS_RUNNING);
    }
    return grpc::Status::OK;
  }
  grpc::Status StreamEvents(grpc::ServerContext* context, const v1::StreamEventsRequest* request,
                            grpc::ServerWriter<v1::StreamEventsResponse>* writer) override {
    std::unique_lock lock(state_.mutex);
    state_.stream_from_seqs.push_back(request->from_seq());
    state_.stream_from_sample_seqs.push_back(request->from_sample_seq());
    auto run = state_.runs.find(RunName(request->key()));
    if (run == state_.runs.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such run");
    v1::StreamEventsResponse samples;
    for (const v1::DeviceSample& sample : state_.samples) {
      if (sample.seq() >= request->from_sample_seq()) {
        *samples.mutable_samples()->add_samples() = sample;
      }
    }
    if (samples.has_samples() && !writer->Write(samples)) return grpc::Status::CANCELLED;
    const int drop_after = std::exchange(state_.drop_after, 0);
    size_t next = static_cast<size_t>(std::max<int64_t>(request->from_seq(), 1) - 1);
    int sent = 0;
    while (!context->IsCancelled()) {
      while (next < run->second.lines.size()) {
        v1::StreamEventsResponse response;
        response.mutable_event()->set_seq(static_cast<int64_t>(next + 1));
        const std::string line = run->second.lines[next];
        response.mutable_event()->set_json(line);
        response.mutable_event()->set_type(line.find("\"result\"") != std::string::npos ? "result"
                                                                                        : "step");
        lock.unlock();
        const bool written = writer->Write(response);
        lock.lock();
        if (!written) return grpc::Status::CANCELLED;
        ++next;
        if (drop_after > 0 && ++sent == drop_after) {
          return grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection dropped");
        }
      }
      if (run->second.ended) {
        v1::StreamEventsResponse response;
        response.mutable_ended()->set_outcome(run->second.outcome);
        lock.unlock();
        writer->Write(response);
        return grpc::Status::OK;
      }
      state_.changed.wait_for(lock, milliseconds(20));
    }
    return grpc::Status::CANCELLED;
  }
  grpc::Status CancelRun(grpc::ServerContext*, const v1::CancelRunRequest* request,
                         v1::RunState* state) override {
    {
      std::lock_guard lock(state_.mutex);
      state_.cancelled.push_back(RunName(request->key()));
      state_.cancel_requests.push_back(*request);
      auto run = state_.runs.find(RunName(request->key()));
      if (run == state_.runs.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no run");
      run->second.lines.insert(run->second.lines.end(), state_.cancel_lines.begin(),
                               state_.cancel_lines.end());
      run->second.ended = true;
      run->second.outcome = "cancelled";
    }
    state_.changed.notify_all();
    *state->mutable_key() = request->key();
    return grpc::Status::OK;
  }
  grpc::Status FetchArtifacts(grpc::ServerContext*, const v1::FetchArtifactsRequest* request,
                              grpc::ServerWriter<v1::ArtifactChunk>* writer) override {
    if (!request->path().empty()) {
      std::map<std::string, std::string> files;
      {
        std::lock_guard lock(state_.mutex);
        state_.fetched_paths.push_back(request->path());
        files = state_.checkpoint_files;
      }
      if (files.empty()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such directory");
      for (const auto& [path, content] : files) {
        // In two chunks, as a real agent sends a large file in several.
        const size_t half = content.size() / 2;
        v1::ArtifactChunk first;
        first.set_path(path);
        first.set_size(static_cast<int64_t>(content.size()));
        first.set_data(content.substr(0, half));
        writer->Write(first);
        v1::ArtifactChunk last;
        last.set_data(content.substr(half));
        last.set_sha256(digest::Sha256Hex(content));
        last.set_last(true);
        writer->Write(last);
      }
      return grpc::Status::OK;
    }
    v1::ArtifactChunk chunk;
    chunk.set_path("adapter/" + RunName(request->key()));
    chunk.set_data("weights");
    chunk.set_last(true);
    writer->Write(chunk);
    return grpc::Status::OK;
  }

 private:
  FakeAgentState& state_;
};

constexpr std::string_view kExperiment = R"(name: one
model: llmctl-demo
tokenizer: tok.json
data: {path: data/train.jsonl, max_seq_length: 64}
train: {micro_batch_size: 2, max_steps: 2}
)";

class DispatcherTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = testing::TempDir() + "/dispatcher_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
    config_.data_dir = root_ + "/data";
    config_.listen = "unix:" + root_ + "/controller.sock";
    config_.requeue_after = seconds(60);
    config_.health_interval = seconds(5);
    config_.agent_call_deadline = seconds(10);
    StartController();
    RegisterNode();
    StartAgent();
  }
  // Registers node n1 at the fake agent's address; its credentials go to credentials_.
  void RegisterNode() {
    grpc::ClientContext context;
    v1::RegisterNodeRequest request;
    request.set_name("n1");
    request.set_address(agent_address_);
    ASSERT_TRUE(controller_->RegisterNode(&context, request, &credentials_).ok());
  }
  void TearDown() override {
    daemon_.reset();
    StopAgent();
    fs::remove_all(root_);
  }

  void StartController() {
    auto daemon = Daemon::Start(
        config_, clock_,
        {.run_dispatcher = false, .backoff_initial = seconds(1), .backoff_max = seconds(4)});
    ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
    daemon_ = std::move(*daemon);
    controller_ = v1::Controller::NewStub(
        grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials()));
  }

  void StartAgent() {
    agent_service_ = std::make_unique<FakeAgent>(agent_state_);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(
        agent_address_,
        rpc::ServerCredentials({credentials_.ca_certificate_pem(), credentials_.certificate_pem(),
                                credentials_.private_key_pem()},
                               credentials_.token()));
    builder.RegisterService(agent_service_.get());
    agent_ = builder.BuildAndStart();
    ASSERT_NE(agent_, nullptr);
  }
  void StopAgent() {
    if (agent_ == nullptr) return;
    agent_->Shutdown(std::chrono::system_clock::now());
    agent_->Wait();
    agent_.reset();
  }

  int64_t SubmitOne(std::string_view model = "llmctl-demo") {
    std::string text(kExperiment);
    text.replace(text.find("llmctl-demo"), std::string_view("llmctl-demo").size(), model);
    v1::SubmitRequest request;
    request.set_filename("one.yaml");
    request.set_yaml_text(text);
    v1::SubmitResponse response;
    grpc::ClientContext context;
    EXPECT_TRUE(controller_->Submit(&context, request, &response).ok());
    return response.experiment_id();
  }

  // Submits one trial and places it; its worker writes one step and runs on. Returns once that
  // step is stored.
  int64_t SubmitOneThatKeepsRunning() {
    agent_state_.script = {StepLine(0)};
    agent_state_.script_ends = false;
    const int64_t experiment = SubmitOne();
    Tick();
    const int64_t trial_id = OnlyTrial(experiment).id;
    EXPECT_TRUE(Eventually([&] { return StoredEvents(trial_id, 1) == 1; }));
    return experiment;
  }

  store::TrialRecord OnlyTrial(int64_t experiment) {
    auto trials = daemon_->store().ListTrials(experiment);
    EXPECT_TRUE(trials.ok() && trials->size() == 1);
    return trials->front();
  }

  // Waits for the stream readers (threads) to get somewhere; bounded so a bug fails instead of
  // hanging. Nothing here measures time.
  template <typename Predicate>
  bool Eventually(Predicate predicate) {
    for (int i = 0; i < 2000; ++i) {
      if (predicate()) return true;
      std::this_thread::sleep_for(milliseconds(5));
    }
    return predicate();
  }

  int64_t StoredEvents(int64_t trial, int64_t attempt) {
    sqlite3* db = nullptr;
    sqlite3_open_v2((config_.data_dir + "/llmctl.db").c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
    sqlite3_stmt* statement = nullptr;
    sqlite3_prepare_v2(db, "SELECT COUNT(*) FROM events WHERE trial_id = ? AND attempt = ?", -1,
                       &statement, nullptr);
    sqlite3_bind_int64(statement, 1, trial);
    sqlite3_bind_int64(statement, 2, attempt);
    int64_t count = -1;
    if (sqlite3_step(statement) == SQLITE_ROW) count = sqlite3_column_int64(statement, 0);
    sqlite3_finalize(statement);
    sqlite3_close(db);
    return count;
  }

  void Tick() { daemon_->dispatcher().Tick(); }

  // The copy of a stopped trial's checkpoint was asked for and is over (done or failed).
  bool CheckpointCopied() {
    {
      std::lock_guard lock(agent_state_.mutex);
      if (agent_state_.fetched_paths.empty()) return false;
    }
    return daemon_->dispatcher().CheckpointCopiesInFlight() == 0;
  }

  size_t PrepareCalls() {
    std::lock_guard lock(agent_state_.mutex);
    return agent_state_.prepared.size();
  }
  int InFlightPrepares() { return daemon_->dispatcher().HubPreparationsInFlight(); }
  size_t RunsStarted() {
    std::lock_guard lock(agent_state_.mutex);
    return agent_state_.runs.size();
  }
  v1::ExperimentStatus StatusOf(int64_t experiment) {
    grpc::ClientContext context;
    v1::GetExperimentRequest request;
    request.set_experiment_id(experiment);
    v1::ExperimentStatus status;
    EXPECT_TRUE(controller_->GetExperiment(&context, request, &status).ok());
    return status;
  }
  grpc::Status SetLease(std::string_view node, store::Time ends) {
    grpc::ClientContext context;
    v1::UpdateNodeRequest request;
    request.set_name(std::string(node));
    request.mutable_lease()->set_name("lab-lease");
    request.mutable_lease()->set_site("KVM@TACC");
    request.mutable_lease()->set_flavor("g1.h100.pci.1");
    request.mutable_lease()->set_ends_unix(
        std::chrono::duration_cast<seconds>(ends.time_since_epoch()).count());
    v1::NodeStatus status;
    return controller_->UpdateNode(&context, request, &status);
  }

  ManualClock clock_{store::Time(seconds(1'700'000'000))};
  std::string root_;
  ControllerConfig config_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<v1::Controller::Stub> controller_;
  v1::NodeCredentials credentials_;
  std::string agent_address_ =
      "unix:" + testing::TempDir() + "/dispatcher_test_agent_" + std::to_string(getpid()) + ".sock";
  FakeAgentState agent_state_;
  std::unique_ptr<FakeAgent> agent_service_;
  std::unique_ptr<grpc::Server> agent_;
};

// Uploads `content` to the controller as the experiment's data file and submits kExperiment with
// it; returns the experiment id (0 on failure) and the file's tree.
std::pair<int64_t, v1::InputTree> SubmitWithDataFile(v1::Controller::Stub& controller,
                                                     const std::string& content) {
  const std::string sha = digest::Sha256Hex(content);
  grpc::ClientContext context;
  v1::UploadBlobResponse response;
  auto writer = controller.UploadBlob(&context, &response);
  v1::BlobChunk chunk;
  chunk.set_sha256(sha);
  chunk.set_size(static_cast<int64_t>(content.size()));
  chunk.set_data(content);
  writer->Write(chunk);
  writer->WritesDone();
  if (!writer->Finish().ok()) return {0, {}};
  v1::InputTree tree;
  tree.set_is_file(true);
  v1::TreeFile* file = tree.add_files();
  file->set_path("train.jsonl");
  file->set_sha256(sha);
  file->set_size(static_cast<int64_t>(content.size()));
  tree.set_digest(digest::Sha256Hex(sha + " " + std::to_string(content.size()) + " train.jsonl\n"));
  v1::SubmitRequest request;
  request.set_filename("one.yaml");
  request.set_yaml_text(std::string(kExperiment));
  (*request.mutable_inputs())["data/train.jsonl"] = tree;
  v1::SubmitResponse submitted;
  grpc::ClientContext submit_context;
  if (!controller.Submit(&submit_context, request, &submitted).ok()) return {0, {}};
  return {submitted.experiment_id(), tree};
}

TEST_F(DispatcherTest, RunsATrialWithItsInputsAndStoresEveryEvent) {
  // The data file goes to the controller first, then to the agent with the trial.
  const std::string content = "{\"text\": \"hello\"}\n";
  const std::string sha = digest::Sha256Hex(content);
  const auto [experiment_id, tree] = SubmitWithDataFile(*controller_, content);
  ASSERT_NE(experiment_id, 0);
  v1::SubmitResponse submitted;
  submitted.set_experiment_id(experiment_id);

  Tick();
  const store::TrialRecord trial = OnlyTrial(submitted.experiment_id());
  {
    std::lock_guard lock(agent_state_.mutex);
    ASSERT_EQ(agent_state_.runs.size(), 1u);
    const v1::RunTrialRequest& run = agent_state_.runs.begin()->second.request;
    EXPECT_EQ(run.key().attempt(), 1);
    EXPECT_EQ(run.key().trial(), "one");
    ASSERT_TRUE(run.inputs().contains("data.path"));
    EXPECT_EQ(run.inputs().at("data.path").digest(), tree.digest());
    EXPECT_TRUE(run.inputs().at("data.path").is_file());
    EXPECT_EQ(std::vector<int32_t>(run.device_indices().begin(), run.device_indices().end()),
              std::vector<int32_t>{0});
    EXPECT_TRUE(agent_state_.blobs.contains(sha));
  }
  ASSERT_TRUE(Eventually(
      [&] { return OnlyTrial(submitted.experiment_id()).state == store::TrialState::kOk; }));
  EXPECT_EQ(StoredEvents(trial.id, 1), 3);

  grpc::ClientContext report_context;
  v1::GetExperimentRequest which;
  which.set_experiment_id(submitted.experiment_id());
  v1::ReportResponse report;
  ASSERT_TRUE(controller_->Report(&report_context, which, &report).ok());
  ASSERT_EQ(report.trials_size(), 1);
  EXPECT_EQ(report.trials(0).outcome(), "ok");
  EXPECT_EQ(report.trials(0).node(), "n1");
  EXPECT_DOUBLE_EQ(report.trials(0).final_loss(), 2.25);
  EXPECT_DOUBLE_EQ(report.trials(0).tokens_per_second(), 128.0);

  grpc::ClientContext nodes_context;
  v1::ListNodesResponse nodes;
  ASSERT_TRUE(controller_->ListNodes(&nodes_context, {}, &nodes).ok());
  ASSERT_EQ(nodes.nodes_size(), 1);
  EXPECT_EQ(nodes.nodes(0).state(), "connected");
  ASSERT_EQ(nodes.nodes(0).devices_size(), 1);
  EXPECT_EQ(nodes.nodes(0).devices(0).type(), "cpu");

  grpc::ClientContext fetch_context;
  v1::FetchTrialArtifactsRequest fetch;
  fetch.set_experiment_id(submitted.experiment_id());
  fetch.set_trial("one");
  auto reader = controller_->FetchArtifacts(&fetch_context, fetch);
  v1::ArtifactChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  EXPECT_EQ(chunk.path(), "adapter/" + std::to_string(submitted.experiment_id()) + "/one#1");
  EXPECT_TRUE(reader->Finish().ok());
}

TEST_F(DispatcherTest, AnUploadToTheAgentGetsTimeForItsSizeAtTheMinimumRate) {
  // At 1 byte/s a 593-byte blob may take almost 10 minutes on top of the 10 s call deadline: far
  // beyond the fixed deadline that made large model directories impossible to upload.
  daemon_.reset();
  config_.min_transfer_bytes_per_second = 1;
  StartController();
  const std::string content = "{\"text\": \"" + std::string(580, 'x') + "\"}\n";
  ASSERT_EQ(content.size(), 593u);
  ASSERT_NE(SubmitWithDataFile(*controller_, content).first, 0);
  Tick();
  std::lock_guard lock(agent_state_.mutex);
  ASSERT_TRUE(agent_state_.upload_time_left.contains(digest::Sha256Hex(content)));
  // 10 s + 593 s; the margin only absorbs the time between the call's start and its arrival.
  EXPECT_GT(agent_state_.upload_time_left.at(digest::Sha256Hex(content)), seconds(500));
}

TEST_F(DispatcherTest, ADroppedStreamResumesFromTheLastStoredSeqAfterTheBackoff) {
  agent_state_.script = {StepLine(0), StepLine(1), StepLine(2), StepLine(3), kResultLine};
  agent_state_.drop_after = 2;
  const int64_t experiment = SubmitOne();
  Tick();
  const store::TrialRecord trial = OnlyTrial(experiment);
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));
  EXPECT_EQ(StoredEvents(trial.id, 1), 2);

  Tick();  // within the backoff: no new stream
  EXPECT_EQ(agent_state_.stream_from_seqs, std::vector<int64_t>{1});
  clock_.Advance(seconds(1));
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(agent_state_.stream_from_seqs, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(StoredEvents(trial.id, 1), 5);
  EXPECT_EQ(*daemon_->store().LastSeq(trial.id, 1), 5);
}

// Device sample `seq` of a GPU, a second apart.
v1::DeviceSample GpuSample(int64_t seq, const std::string& device = "cuda:0") {
  v1::DeviceSample sample;
  sample.set_seq(seq);
  sample.set_unix_ms(1'700'000'000'000 + 1000 * seq);
  sample.set_device(device);
  sample.set_utilization_percent(40 + seq);
  sample.set_memory_used_bytes(seq << 30);
  sample.set_memory_total_bytes(int64_t{80} << 30);
  sample.set_temperature_celsius(60);
  return sample;
}

TEST_F(DispatcherTest, DeviceSamplesAreStoredOnceAndAStreamResumesAfterTheLastStored) {
  agent_state_.samples = {GpuSample(1), GpuSample(2), GpuSample(3)};
  agent_state_.script = {StepLine(0), StepLine(1), StepLine(2), kResultLine};
  agent_state_.drop_after = 2;
  const int64_t experiment = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));
  EXPECT_EQ(agent_state_.stream_from_sample_seqs, std::vector<int64_t>{1});
  EXPECT_EQ(*daemon_->store().LastDeviceSampleSeq(OnlyTrial(experiment).id, 1), 3);
  clock_.Advance(seconds(1));
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  // The second stream asks for what the store lacks: nothing is stored twice.
  EXPECT_EQ(agent_state_.stream_from_sample_seqs, (std::vector<int64_t>{1, 4}));
  StatusOr<std::vector<store::DeviceSample>> stored =
      daemon_->store().DeviceSamples(experiment, "one");
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  ASSERT_EQ(stored->size(), 3u);
  for (int64_t seq = 1; seq <= 3; ++seq) {
    const store::DeviceSample& sample = (*stored)[seq - 1];
    EXPECT_EQ(sample.attempt, 1);
    EXPECT_EQ(sample.device, "cuda:0");
    EXPECT_EQ(sample.time, store::Time(milliseconds(1'700'000'000'000 + 1000 * seq)));
    EXPECT_EQ(sample.utilization_percent, 40.0 + seq);
    EXPECT_EQ(sample.memory_used_bytes, seq << 30);
    EXPECT_EQ(sample.memory_total_bytes, int64_t{80} << 30);
    EXPECT_FALSE(sample.power_watts.has_value());
    EXPECT_EQ(sample.temperature_celsius, 60.0);
  }
}

TEST_F(DispatcherTest, ARunningTrialsStatusCarriesEachDevicesLatestSample) {
  agent_state_.samples = {GpuSample(1, "cuda:0"), GpuSample(2, "cuda:1"), GpuSample(3, "cuda:0"),
                          GpuSample(4, "cuda:1")};
  const int64_t experiment = SubmitOneThatKeepsRunning();
  ASSERT_TRUE(Eventually([&] { return StatusOf(experiment).trials(0).devices_size() == 2; }));
  const v1::TrialStatus trial = StatusOf(experiment).trials(0);
  EXPECT_EQ(trial.devices(0).device(), "cuda:0");
  EXPECT_EQ(trial.devices(0).utilization_percent(), 43);
  EXPECT_EQ(trial.devices(0).memory_used_bytes(), int64_t{3} << 30);
  EXPECT_EQ(trial.devices(1).device(), "cuda:1");
  EXPECT_EQ(trial.devices(1).memory_used_bytes(), int64_t{4} << 30);
  EXPECT_FALSE(trial.devices(1).has_power_watts());
  EXPECT_EQ(trial.devices(1).temperature_celsius(), 60);
  // Once it has ended, no bars: the samples stay in the store for the report.
  agent_state_.AddLinesAndEnd(std::to_string(experiment) + "/one#1", {kResultLine}, "ok");
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(StatusOf(experiment).trials(0).devices_size(), 0);
  EXPECT_EQ(daemon_->store().DeviceSamples(experiment, "one")->size(), 4u);
}

TEST_F(DispatcherTest, EventsSentTwiceAreStoredOnce) {
  agent_state_.script = {StepLine(0), StepLine(1)};
  agent_state_.script_ends = false;
  const int64_t experiment = SubmitOne();
  Tick();
  const store::TrialRecord trial = OnlyTrial(experiment);
  ASSERT_TRUE(Eventually([&] { return StoredEvents(trial.id, 1) == 2; }));
  // A second delivery of the same lines (as after a reconnect that overlaps) changes nothing.
  const std::vector<store::Event> again = {{1, "step", StepLine(0)}, {2, "step", StepLine(1)}};
  EXPECT_EQ(*daemon_->store().AppendEvents(trial.id, 1, again), 0);
  agent_state_.AddLinesAndEnd(std::to_string(experiment) + "/one#1", {kResultLine}, "ok");
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(StoredEvents(trial.id, 1), 3);
}

TEST_F(DispatcherTest, ARestartedControllerResumesStreamingWhereTheStoreEnds) {
  agent_state_.script = {StepLine(0), StepLine(1), StepLine(2)};
  agent_state_.script_ends = false;
  const int64_t experiment = SubmitOne();
  Tick();
  const store::TrialRecord trial = OnlyTrial(experiment);
  ASSERT_TRUE(Eventually([&] { return StoredEvents(trial.id, 1) == 3; }));

  daemon_.reset();
  StartController();
  agent_state_.AddLinesAndEnd(std::to_string(experiment) + "/one#1", {StepLine(3), kResultLine},
                              "ok");
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(agent_state_.stream_from_seqs.back(), 4);
  EXPECT_EQ(StoredEvents(trial.id, 1), 5);
  std::lock_guard lock(agent_state_.mutex);
  EXPECT_EQ(agent_state_.runs.size(), 1u) << "the finished work is not run again";
}

TEST_F(DispatcherTest, ARestartedControllerKnowsWhichDevicesTheRunningAttemptsHold) {
  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.cuda_devices = 4;
    agent_state_.script_ends = false;
  }
  auto submit = [&](const std::string& name, const std::string& trials) {
    v1::SubmitRequest request;
    request.set_filename(name + ".yaml");
    request.set_yaml_text(std::string(kExperiment) + "device: cuda\ntrials:\n" + trials);
    v1::SubmitResponse submitted;
    grpc::ClientContext context;
    const grpc::Status accepted = controller_->Submit(&context, request, &submitted);
    EXPECT_TRUE(accepted.ok()) << accepted.error_message();
    return submitted.experiment_id();
  };
  auto devices_of = [&](const std::string& run) {
    std::lock_guard lock(agent_state_.mutex);
    const auto& indices = agent_state_.runs.at(run).request.device_indices();
    return std::vector<int32_t>(indices.begin(), indices.end());
  };
  // a → {0}, b → {1}, c → {2, 3}; then b ends: {2, 3} and {0} stay busy.
  const int64_t first = submit("first",
                               "  - {name: a}\n  - {name: b}\n"
                               "  - {name: c, set: {devices: 2, train.global_batch_size: 4}}\n");
  Tick();
  const std::string prefix = std::to_string(first) + "/";
  ASSERT_EQ(RunsStarted(), 3u);
  ASSERT_EQ(devices_of(prefix + "c#1"), (std::vector<int32_t>{2, 3}));
  ASSERT_EQ(devices_of(prefix + "a#1"), (std::vector<int32_t>{0}));
  agent_state_.AddLinesAndEnd(prefix + "b#1", {kResultLine}, "ok");
  ASSERT_TRUE(Eventually([&] {
    auto trials = daemon_->store().ListTrials(first);
    return trials.ok() && (*trials)[1].state == store::TrialState::kOk;
  }));

  daemon_.reset();  // a new store and dispatcher on the same database file
  StartController();
  const int64_t second = submit("second", "  - {name: d}\n");
  Tick();
  ASSERT_EQ(RunsStarted(), 4u);
  EXPECT_EQ(devices_of(std::to_string(second) + "/d#1"), (std::vector<int32_t>{1}));
}

TEST_F(DispatcherTest, ATrialWhoseAgentStaysSilentIsRequeuedAndItsOldAttemptFencedOff) {
  const int64_t experiment = SubmitOneThatKeepsRunning();
  const store::TrialRecord trial = OnlyTrial(experiment);

  StopAgent();
  clock_.Advance(seconds(30));
  Tick();  // unreachable, but not for long enough
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kRunning);
  clock_.Advance(seconds(31));
  Tick();
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
  EXPECT_EQ(OnlyTrial(experiment).current_attempt, 1);

  // The agent returns, still running attempt 1: the trial goes out again as attempt 2.
  agent_state_.script = {StepLine(0), kResultLine};
  agent_state_.script_ends = true;
  StartAgent();
  clock_.Advance(seconds(5));
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(OnlyTrial(experiment).current_attempt, 2);
  EXPECT_EQ(StoredEvents(trial.id, 2), 2);

  // Whatever attempt 1 still produces is refused.
  const std::vector<store::Event> late = {{2, "step", StepLine(1)}};
  EXPECT_EQ(daemon_->store().AppendEvents(trial.id, 1, late).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(daemon_->store()
                .FinishAttempt(trial.id, 1, store::TrialState::kOk, 0, "", clock_.Now())
                .code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(StoredEvents(trial.id, 1), 1);
}

TEST_F(DispatcherTest, AnAgentThatComesBackWithoutTheRunHasItRequeuedAtOnce) {
  agent_state_.script = {StepLine(0)};
  agent_state_.script_ends = false;
  const int64_t experiment = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 1; }));

  StopAgent();
  clock_.Advance(seconds(5));
  Tick();  // unreachable
  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.runs.clear();  // the node was rebuilt
    agent_state_.script_ends = true;
  }
  StartAgent();
  clock_.Advance(seconds(5));
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(OnlyTrial(experiment).current_attempt, 2);
}

TEST_F(DispatcherTest, ARemovedNodesTrialIsRequeuedAtOnceAndTheNodeIsNoLongerDialled) {
  const int64_t experiment = SubmitOneThatKeepsRunning();
  const store::TrialRecord trial = OnlyTrial(experiment);
  ASSERT_EQ(daemon_->dispatcher().ActiveStreams(), 1);

  // `llmctl node down n1`, the agent still up and the clock standing still.
  grpc::ClientContext context;
  v1::DeregisterNodeRequest request;
  request.set_name("n1");
  v1::DeregisterNodeResponse removed;
  ASSERT_TRUE(controller_->DeregisterNode(&context, request, &removed).ok());
  ASSERT_EQ(removed.requeued_size(), 1);
  // Requeued now, not requeue_after (60 s) later; its stream reader already gone.
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
  EXPECT_EQ(OnlyTrial(experiment).current_attempt, 1);
  EXPECT_EQ(daemon_->dispatcher().ActiveStreams(), 0);

  auto node_info_calls = [&] {
    std::lock_guard lock(agent_state_.mutex);
    return agent_state_.node_info_calls;
  };
  const int calls = node_info_calls();
  for (int round = 0; round < 3; ++round) {
    clock_.Advance(config_.health_interval);
    Tick();
  }
  EXPECT_EQ(node_info_calls(), calls) << "a removed node is dialled no more";
  EXPECT_EQ(RunsStarted(), 1u) << "no trial goes to a removed node";
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);

  // `node up` again under the same name: fresh credentials, and the trial runs as attempt 2.
  StopAgent();
  const std::string old_token = credentials_.token();
  RegisterNode();
  ASSERT_NE(credentials_.token(), old_token);
  agent_state_.script = {StepLine(0), kResultLine};
  agent_state_.script_ends = true;
  StartAgent();
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(OnlyTrial(experiment).current_attempt, 2);
  EXPECT_EQ(StoredEvents(trial.id, 2), 2);
  EXPECT_EQ(StoredEvents(trial.id, 1), 1);
}

TEST_F(DispatcherTest, CancelStopsARunningTrialOnItsAgent) {
  agent_state_.script = {StepLine(0)};
  agent_state_.script_ends = false;
  const int64_t experiment = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 1; }));

  grpc::ClientContext context;
  v1::CancelRequest request;
  request.set_experiment_id(experiment);
  v1::CancelResponse response;
  ASSERT_TRUE(controller_->Cancel(&context, request, &response).ok());
  EXPECT_EQ(response.cancelled_size(), 1);
  ASSERT_TRUE(
      Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kCancelled; }));
  std::lock_guard lock(agent_state_.mutex);
  EXPECT_EQ(agent_state_.cancelled,
            std::vector<std::string>{std::to_string(experiment) + "/one#1"});
  // A user's cancel asks for no checkpoint and keeps the agent's own grace.
  ASSERT_EQ(agent_state_.cancel_requests.size(), 1u);
  EXPECT_FALSE(agent_state_.cancel_requests[0].checkpoint());
  EXPECT_EQ(agent_state_.cancel_requests[0].checkpoint_grace_ms(), 0);
}

TEST_F(DispatcherTest, ATrialNoConnectedNodeCanRunWaitsWithANoticeSayingWhy) {
  v1::SubmitRequest request;
  request.set_filename("gpu.yaml");
  request.set_yaml_text(std::string(kExperiment) + "device: cuda\n");
  v1::SubmitResponse submitted;
  grpc::ClientContext submit_context;
  const grpc::Status accepted = controller_->Submit(&submit_context, request, &submitted);
  ASSERT_TRUE(accepted.ok()) << accepted.error_message();
  Tick();
  EXPECT_EQ(OnlyTrial(submitted.experiment_id()).state, store::TrialState::kQueued);
  EXPECT_EQ(RunsStarted(), 0u);

  grpc::ClientContext context;
  v1::GetExperimentRequest get;
  get.set_experiment_id(submitted.experiment_id());
  v1::ExperimentStatus status;
  ASSERT_TRUE(controller_->GetExperiment(&context, get, &status).ok());
  ASSERT_EQ(status.trials_size(), 1);
  EXPECT_NE(status.trials(0).notice().find("no connected node has 1 cuda device(s)"),
            std::string::npos)
      << status.trials(0).notice();

  // A CPU trial is placed as usual and carries no notice.
  const int64_t cpu = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(cpu).state == store::TrialState::kOk; }));
  EXPECT_EQ(daemon_->dispatcher().QueuedNotice(OnlyTrial(cpu).id), "");

  // An experiment for one flavor runs only on a node whose lease is of that flavor.
  request.set_filename("targeted.yaml");
  request.set_yaml_text(std::string(kExperiment) +
                        "target: {site: KVM@TACC, flavor: g1.h100.pci.1}\n");
  grpc::ClientContext targeted_context;
  ASSERT_TRUE(controller_->Submit(&targeted_context, request, &submitted).ok());
  const int64_t targeted = submitted.experiment_id();
  Tick();
  EXPECT_EQ(OnlyTrial(targeted).state, store::TrialState::kQueued);
  EXPECT_NE(daemon_->dispatcher()
                .QueuedNotice(OnlyTrial(targeted).id)
                .find("no connected node with flavor g1.h100.pci.1, site KVM@TACC has 1 cpu"),
            std::string::npos)
      << daemon_->dispatcher().QueuedNotice(OnlyTrial(targeted).id);
  ASSERT_TRUE(daemon_->store()
                  .SetNodeLease("n1", {.name = "lab",
                                       .site = "KVM@TACC",
                                       .flavor = "g1.h100.pci.1",
                                       .ends = clock_.Now() + std::chrono::hours(10)})
                  .ok());
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(targeted).state == store::TrialState::kOk; }));
}

v1::NodeStatus NodeStatusOf(v1::Controller::Stub& controller, const std::string& node) {
  grpc::ClientContext context;
  v1::ListNodesResponse nodes;
  EXPECT_TRUE(controller.ListNodes(&context, {}, &nodes).ok());
  for (const v1::NodeStatus& status : nodes.nodes()) {
    if (status.name() == node) return status;
  }
  ADD_FAILURE() << "no node " << node;
  return {};
}

TEST_F(DispatcherTest, ANodeWhoseDriverIsTooOldForLibTorchsCudaIsUnusableAndSaysWhy) {
  {
    // CC-Ubuntu24.04-CUDA's driver 560 (CUDA 12.6) and the pinned cu132 wheel.
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.cuda_devices = 1;
    agent_state_.driver_version = "560.35.03";
    agent_state_.driver_cuda_version = "12.6";
    agent_state_.libtorch_cuda_version = "13.2";
  }
  const int64_t cpu = SubmitOne();
  v1::SubmitRequest request;
  request.set_filename("gpu.yaml");
  request.set_yaml_text(std::string(kExperiment) + "device: cuda\n");
  v1::SubmitResponse submitted;
  grpc::ClientContext submit_context;
  ASSERT_TRUE(controller_->Submit(&submit_context, request, &submitted).ok());
  const int64_t gpu = submitted.experiment_id();
  Tick();

  const std::string reason =
      "node n1: NVIDIA driver 560.35.03 supports CUDA up to 12.6, but llm-train's LibTorch 2.15.0 "
      "was built for CUDA 13.2: use an image whose NVIDIA driver supports CUDA 13 (driver >= "
      "580.65.06), or an llm-train built with a LibTorch for CUDA 12.x";
  const v1::NodeStatus unusable = NodeStatusOf(*controller_, "n1");
  EXPECT_EQ(unusable.state(), "unusable");
  EXPECT_EQ(unusable.unusable(), reason);
  EXPECT_EQ(RunsStarted(), 0u) << "no trial is placed on the node, not even a CPU one";
  EXPECT_EQ(OnlyTrial(cpu).state, store::TrialState::kQueued);
  EXPECT_EQ(OnlyTrial(gpu).state, store::TrialState::kQueued);
  // The waiting trials say why too.
  const std::string notice = daemon_->dispatcher().QueuedNotice(OnlyTrial(gpu).id);
  EXPECT_NE(notice.find("no connected node has 1 cuda device(s)"), std::string::npos) << notice;
  EXPECT_TRUE(notice.ends_with("; " + reason)) << notice;

  // The node's image gets a newer driver: the next health check finds it usable.
  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.driver_version = "580.95.05";
    agent_state_.driver_cuda_version = "13.0";
  }
  clock_.Advance(config_.health_interval);
  Tick();
  const v1::NodeStatus usable = NodeStatusOf(*controller_, "n1");
  EXPECT_EQ(usable.state(), "connected");
  EXPECT_EQ(usable.unusable(), "");
  ASSERT_TRUE(Eventually([&] {
    Tick();
    return OnlyTrial(cpu).state == store::TrialState::kOk &&
           OnlyTrial(gpu).state == store::TrialState::kOk;
  }));
}

TEST_F(DispatcherTest, AnAgentWithACertificateFromAnotherCaIsNotTrusted) {
  StopAgent();
  auto other_ca = rpc::CertificateAuthority::LoadOrCreate(root_ + "/other-ca");
  ASSERT_TRUE(other_ca.ok());
  auto impostor = (*other_ca)->Issue(rpc::AgentCertificateName("n1"), 1);
  ASSERT_TRUE(impostor.ok());
  credentials_.set_ca_certificate_pem((*other_ca)->ca_certificate_pem());
  credentials_.set_certificate_pem(impostor->certificate_pem);
  credentials_.set_private_key_pem(impostor->private_key_pem);
  StartAgent();

  const int64_t experiment = SubmitOne();
  Tick();
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
  auto nodes = daemon_->store().ListNodes();
  ASSERT_TRUE(nodes.ok() && nodes->size() == 1);
  EXPECT_EQ(nodes->front().state, "unreachable");
  std::lock_guard lock(agent_state_.mutex);
  EXPECT_TRUE(agent_state_.runs.empty());
}

TEST_F(DispatcherTest, NoTokenAppearsInTheLogsOrTheDatabase) {
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  // A fresh registration, a run with a dropped stream and a cancel: the paths that log.
  StopAgent();
  grpc::ClientContext context;
  v1::RegisterNodeRequest request;
  request.set_name("n1");
  request.set_address(agent_address_);
  ASSERT_TRUE(controller_->RegisterNode(&context, request, &credentials_).ok());
  StartAgent();
  agent_state_.script = {StepLine(0), StepLine(1)};
  agent_state_.script_ends = false;
  agent_state_.drop_after = 1;
  const int64_t experiment = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));
  grpc::ClientContext cancel_context;
  v1::CancelRequest cancel;
  cancel.set_experiment_id(experiment);
  v1::CancelResponse cancelled;
  ASSERT_TRUE(controller_->Cancel(&cancel_context, cancel, &cancelled).ok());
  clock_.Advance(seconds(1));
  Tick();
  ASSERT_TRUE(
      Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kCancelled; }));
  spdlog::default_logger()->sinks().pop_back();

  const std::string token = credentials_.token();
  ASSERT_EQ(token.size(), 64u);
  EXPECT_NE(log.str().find("registered"), std::string::npos) << "the sink saw the log";
  EXPECT_EQ(log.str().find(token), std::string::npos);
  for (const fs::directory_entry& entry : fs::directory_iterator(config_.data_dir)) {
    if (!entry.path().filename().string().starts_with("llmctl.db")) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(bytes.find(token), std::string::npos) << entry.path();
  }
}

TEST_F(DispatcherTest, AHubModelIsPreparedOnceOnTheNodeBeforeItsTrialRuns) {
  agent_state_.prepare_open = false;
  const int64_t experiment = SubmitOne("hf:TinyLlama/TinyLlama-1.1B@abc123");
  Tick();
  ASSERT_TRUE(Eventually([&] { return PrepareCalls() == 1; }));
  // The download goes on in the background: the round is over and the trial waits, queued.
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
  Tick();
  EXPECT_EQ(PrepareCalls(), 1u) << "one download per node and model";
  EXPECT_EQ(RunsStarted(), 0u);
  {
    std::lock_guard lock(agent_state_.mutex);
    EXPECT_EQ(agent_state_.prepared[0].repo(), "TinyLlama/TinyLlama-1.1B");
    EXPECT_EQ(agent_state_.prepared[0].revision(), "abc123");
    agent_state_.prepare_open = true;
  }
  agent_state_.changed.notify_all();
  // The finished download wakes the dispatcher; these rounds stand in for the woken thread.
  ASSERT_TRUE(Eventually([&] {
    Tick();
    return RunsStarted() == 1;
  }));
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));

  // A second experiment with the same model finds it there.
  const int64_t again = SubmitOne("hf:TinyLlama/TinyLlama-1.1B@abc123");
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(again).state == store::TrialState::kOk; }));
  EXPECT_EQ(PrepareCalls(), 1u);
}

TEST_F(DispatcherTest, AHubDownloadThatMayRecoverIsRetriedAfterTheBackoff) {
  agent_state_.prepare_results = {grpc::Status(grpc::StatusCode::UNAVAILABLE, "hub 503"),
                                  grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "slow")};
  const int64_t experiment = SubmitOne("hf:org/tiny");
  Tick();
  ASSERT_TRUE(Eventually([&] { return PrepareCalls() == 1 && InFlightPrepares() == 0; }));
  Tick();  // within the backoff (1 s)
  EXPECT_EQ(InFlightPrepares(), 0);
  EXPECT_EQ(PrepareCalls(), 1u);
  clock_.Advance(seconds(1));
  Tick();
  ASSERT_TRUE(Eventually([&] { return PrepareCalls() == 2 && InFlightPrepares() == 0; }));
  clock_.Advance(seconds(1));
  Tick();  // the backoff doubled
  EXPECT_EQ(InFlightPrepares(), 0);
  EXPECT_EQ(PrepareCalls(), 2u);
  clock_.Advance(seconds(1));
  ASSERT_TRUE(Eventually([&] {
    Tick();
    return RunsStarted() == 1;
  }));
  EXPECT_EQ(PrepareCalls(), 3u);
  {
    std::lock_guard lock(agent_state_.mutex);
    EXPECT_EQ(agent_state_.prepared[2].revision(), "main");
  }
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
}

TEST_F(DispatcherTest, AHubModelThatCannotBePreparedFailsItsTrialWithTheAgentsMessage) {
  agent_state_.prepare_results = {
      grpc::Status(grpc::StatusCode::NOT_FOUND, "hf:org/missing@main: the hub has no such repo")};
  const int64_t experiment = SubmitOne("hf:org/missing");
  Tick();
  ASSERT_TRUE(Eventually([&] {
    Tick();
    return OnlyTrial(experiment).state == store::TrialState::kFailed;
  }));
  EXPECT_EQ(RunsStarted(), 0u);
  const v1::ExperimentStatus status = StatusOf(experiment);
  ASSERT_EQ(status.trials_size(), 1);
  EXPECT_NE(status.trials(0).error().find("preparing hf:org/missing@main on node n1"),
            std::string::npos)
      << status.trials(0).error();
  EXPECT_NE(status.trials(0).error().find("the hub has no such repo"), std::string::npos);
  EXPECT_EQ(PrepareCalls(), 1u);
}

TEST_F(DispatcherTest, BeforeItsLeaseEndsANodeWarnsThenStopsItsTrialsAndTakesNoNewOnes) {
  agent_state_.script = {StepLine(0), StepLine(1), StepLine(2)};
  agent_state_.script_ends = false;
  const std::string checkpoint = "/agent/runs/1/one/1/output/checkpoints/step-3";
  agent_state_.cancel_lines = {
      R"({"type":"result","outcome":"cancelled","steps":3,"error":"cancelled at step 3",)"
      R"("checkpoint":{"step":2,"path":")" +
      checkpoint + R"("}})"};
  const int64_t experiment = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 1; }));
  const store::Time ends = clock_.Now() + std::chrono::minutes(45);
  ASSERT_TRUE(SetLease("n1", ends).ok());
  EXPECT_EQ(SetLease("nobody", ends).error_code(), grpc::StatusCode::NOT_FOUND);

  Tick();  // 45 min left: nothing to say yet
  EXPECT_EQ(StatusOf(experiment).trials(0).notice(), "");

  clock_.Advance(std::chrono::minutes(20));  // 25 min left: the warning
  Tick();
  const std::string notice = StatusOf(experiment).trials(0).notice();
  EXPECT_NE(notice.find("node n1's lease lab-lease ends at"), std::string::npos) << notice;
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kRunning);
  const int64_t later = SubmitOne();
  Tick();
  EXPECT_EQ(OnlyTrial(later).state, store::TrialState::kQueued) << "no new trial on that node";

  clock_.Advance(std::chrono::minutes(16));  // 9 min left: checkpointed and stopped
  Tick();
  ASSERT_TRUE(
      Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kCancelled; }));
  const v1::ExperimentStatus status = StatusOf(experiment);
  const std::string error = status.trials(0).error();
  EXPECT_NE(error.find("lease lab-lease ends at"), std::string::npos) << error;
  EXPECT_NE(error.find("stopped before it does; checkpoint after step 3 in " + checkpoint +
                       " on the node (llmctl resume " + std::to_string(experiment) + " 'one'"),
            std::string::npos)
      << error;
  {
    std::lock_guard lock(agent_state_.mutex);
    EXPECT_EQ(agent_state_.cancelled,
              std::vector<std::string>{std::to_string(experiment) + "/one#1"});
    // The worker gets what is left of the lease (9 min) less the 2 min reserve to write it.
    ASSERT_EQ(agent_state_.cancel_requests.size(), 1u);
    EXPECT_TRUE(agent_state_.cancel_requests[0].checkpoint());
    EXPECT_EQ(agent_state_.cancel_requests[0].checkpoint_grace_ms(),
              std::chrono::duration_cast<milliseconds>(std::chrono::minutes(7)).count());
    agent_state_.cancel_lines.clear();
  }
  EXPECT_EQ(OnlyTrial(later).state, store::TrialState::kQueued);

  // The lease was extended: the node takes trials again.
  ASSERT_TRUE(SetLease("n1", clock_.Now() + std::chrono::hours(3)).ok());
  agent_state_.script = {StepLine(0), kResultLine};
  agent_state_.script_ends = true;
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(later).state == store::TrialState::kOk; }));
}

TEST_F(DispatcherTest, ALeaseStopWhoseCheckpointDidNotFitSaysWhy) {
  agent_state_.script = {StepLine(0)};
  agent_state_.script_ends = false;
  agent_state_.cancel_lines = {
      R"({"type":"result","outcome":"cancelled","steps":1,"error":"cancelled at step 1; )"
      R"(checkpoint skipped: needs 12.00 GiB, 3.50 GiB free in /agent/out"})"};
  const int64_t experiment = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 1; }));
  ASSERT_TRUE(SetLease("n1", clock_.Now() + std::chrono::minutes(5)).ok());
  Tick();
  ASSERT_TRUE(
      Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kCancelled; }));
  const std::string error = StatusOf(experiment).trials(0).error();
  EXPECT_NE(error.find("stopped before it does; no checkpoint (cancelled at step 1; checkpoint "
                       "skipped: needs 12.00 GiB, 3.50 GiB free in /agent/out)"),
            std::string::npos)
      << error;
  std::lock_guard lock(agent_state_.mutex);
  ASSERT_EQ(agent_state_.cancel_requests.size(), 1u);
  EXPECT_TRUE(agent_state_.cancel_requests[0].checkpoint());
  EXPECT_EQ(agent_state_.cancel_requests[0].checkpoint_grace_ms(),
            std::chrono::duration_cast<milliseconds>(std::chrono::minutes(3)).count());
}

TEST_F(DispatcherTest, ACancelWithACheckpointThenResumeRunsTheRestOnTheSameNode) {
  agent_state_.script = {StepLine(0), StepLine(1), StepLine(2)};
  agent_state_.script_ends = false;
  const std::string checkpoint = "/agent/runs/1/one/1/output/checkpoints/step-3";
  agent_state_.cancel_lines = {
      R"({"type":"result","outcome":"cancelled","train_seconds":1.5,"tokens_per_second":128.0,)"
      R"("peak_bytes":2000,"error":"cancelled at step 3","checkpoint":{"step":2,"path":")" +
      checkpoint + R"("}})"};
  const int64_t experiment = SubmitOne();
  const int64_t trial = OnlyTrial(experiment).id;
  Tick();
  ASSERT_TRUE(Eventually([&] { return StoredEvents(trial, 1) == 3; }));

  // Resuming a running trial says why not, and changes nothing.
  grpc::ClientContext early_context;
  v1::ResumeRequest resume_request;
  resume_request.set_experiment_id(experiment);
  resume_request.set_trial("one");
  v1::ResumeResponse resumed;
  const grpc::Status early = controller_->Resume(&early_context, resume_request, &resumed);
  EXPECT_EQ(early.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(early.error_message().find("is running"), std::string::npos) << early.error_message();

  grpc::ClientContext cancel_context;
  v1::CancelRequest cancel;
  cancel.set_experiment_id(experiment);
  cancel.set_trial("one");
  cancel.set_checkpoint(true);
  v1::CancelResponse cancelled;
  ASSERT_TRUE(controller_->Cancel(&cancel_context, cancel, &cancelled).ok());
  ASSERT_TRUE(
      Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kCancelled; }));
  {
    std::lock_guard lock(agent_state_.mutex);
    ASSERT_EQ(agent_state_.cancel_requests.size(), 1u);
    EXPECT_TRUE(agent_state_.cancel_requests[0].checkpoint());
    EXPECT_EQ(agent_state_.cancel_requests[0].checkpoint_grace_ms(),
              std::chrono::duration_cast<milliseconds>(std::chrono::minutes(10)).count());
  }
  const std::string error = StatusOf(experiment).trials(0).error();
  EXPECT_NE(error.find("cancelled with a checkpoint (llmctl cancel --checkpoint); checkpoint "
                       "after step 3 in " +
                       checkpoint + " on the node (llmctl resume " + std::to_string(experiment) +
                       " 'one' continues from it there"),
            std::string::npos)
      << error;

  // The rest of the run: steps 3 and 4, from the checkpoint, on the node that has it.
  agent_state_.script = {StepLine(3), StepLine(4), kResultLine};
  agent_state_.script_ends = true;
  grpc::ClientContext resume_context;
  ASSERT_TRUE(controller_->Resume(&resume_context, resume_request, &resumed).ok());
  EXPECT_EQ(resumed.resumes_attempt(), 1);
  EXPECT_EQ(resumed.first_step(), 3);
  EXPECT_EQ(resumed.node(), "n1");
  EXPECT_EQ(resumed.checkpoint(), checkpoint);
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  {
    std::lock_guard lock(agent_state_.mutex);
    const v1::RunTrialRequest& request =
        agent_state_.runs.at(std::to_string(experiment) + "/one#2").request;
    ASSERT_TRUE(request.has_resume_from());
    EXPECT_EQ(RunName(request.resume_from().run()), std::to_string(experiment) + "/one#1");
    EXPECT_EQ(request.resume_from().checkpoint(), checkpoint);
  }

  grpc::ClientContext report_context;
  v1::GetExperimentRequest report_request;
  report_request.set_experiment_id(experiment);
  v1::ReportResponse report;
  ASSERT_TRUE(controller_->Report(&report_context, report_request, &report).ok());
  const v1::TrialReport& row = report.trials(0);
  EXPECT_EQ(row.outcome(), "ok");
  EXPECT_EQ(row.attempt(), 2);
  EXPECT_EQ(std::vector<int32_t>(row.run_attempts().begin(), row.run_attempts().end()),
            (std::vector<int32_t>{1, 2}));
  std::vector<std::string> steps;
  for (const v1::TrialStep& step : row.steps()) {
    steps.push_back(std::to_string(step.attempt()) + ":" + std::to_string(step.step()));
  }
  EXPECT_EQ(steps, (std::vector<std::string>{"1:0", "1:1", "1:2", "2:3", "2:4"}));
  EXPECT_EQ(row.train_seconds(), 3.0);  // both attempts' 1.5 s
  EXPECT_EQ(row.tokens_per_second(), 128.0);
}

TEST_F(DispatcherTest, AResumedTrialWaitsForItsNodeAndFailsWhenItsCheckpointIsGone) {
  agent_state_.script = {StepLine(0)};
  agent_state_.script_ends = false;
  agent_state_.cancel_lines = {
      R"({"type":"result","outcome":"cancelled","checkpoint":{"step":0,"path":"/ckpt/step-1"}})"};
  const int64_t experiment = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 1; }));
  ASSERT_TRUE(daemon_->dispatcher().Cancel(experiment, "one", /*checkpoint=*/true).ok());
  ASSERT_TRUE(
      Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kCancelled; }));

  // The node is away: the trial waits for it, and says so; no other node may take it.
  StopAgent();
  clock_.Advance(seconds(6));
  Tick();
  ASSERT_TRUE(daemon_->dispatcher().Resume(experiment, "one").ok());
  Tick();
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
  EXPECT_NE(StatusOf(experiment)
                .trials(0)
                .notice()
                .find("it resumes from a checkpoint on node n1, which is not connected"),
            std::string::npos)
      << StatusOf(experiment).trials(0).notice();

  // It comes back without that run (its disk was wiped): the trial fails saying so.
  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.runs.clear();
  }
  StartAgent();
  clock_.Advance(seconds(6));
  Tick();
  ASSERT_TRUE(
      Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kFailed; }));
  const std::string error = StatusOf(experiment).trials(0).error();
  EXPECT_NE(error.find("the agent refused it: this node has no such run"), std::string::npos)
      << error;
}

// A second node's fake agent, registered with the controller under `name`.
struct OtherAgent {
  FakeAgentState state;
  std::unique_ptr<FakeAgent> service;
  std::unique_ptr<grpc::Server> server;
  ~OtherAgent() {
    if (server != nullptr) server->Shutdown(std::chrono::system_clock::now());
  }
};

std::unique_ptr<OtherAgent> StartOtherAgent(v1::Controller::Stub& controller,
                                            const std::string& name, const std::string& address) {
  auto agent = std::make_unique<OtherAgent>();
  grpc::ClientContext context;
  v1::RegisterNodeRequest request;
  request.set_name(name);
  request.set_address(address);
  v1::NodeCredentials credentials;
  EXPECT_TRUE(controller.RegisterNode(&context, request, &credentials).ok());
  agent->service = std::make_unique<FakeAgent>(agent->state);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, rpc::ServerCredentials({credentials.ca_certificate_pem(),
                                                            credentials.certificate_pem(),
                                                            credentials.private_key_pem()},
                                                           credentials.token()));
  builder.RegisterService(agent->service.get());
  agent->server = builder.BuildAndStart();
  EXPECT_NE(agent->server, nullptr);
  return agent;
}

// A lease stop's checkpoint, as the worker's result names it and the fake agent serves it.
constexpr std::string_view kCheckpoint = "/agent/runs/1/one/1/output/checkpoints/step-3";
const std::map<std::string, std::string> kCheckpointFiles = {
    {"model.safetensors", "model weights"},
    {"optimizer.safetensors", "moments"},
    {"rng.safetensors", ""},
    {"trainer_state.json", R"({"next_step": 3})"}};

TEST_F(DispatcherTest, ALeaseStopsCheckpointIsCopiedAndItsTrialResumesOnAnotherNode) {
  agent_state_.script = {StepLine(0), StepLine(1), StepLine(2)};
  agent_state_.script_ends = false;
  agent_state_.checkpoint_files = kCheckpointFiles;
  agent_state_.cancel_lines = {
      R"({"type":"result","outcome":"cancelled","train_seconds":1.5,"tokens_per_second":128.0,)"
      R"("peak_bytes":2000,"error":"cancelled at step 3","checkpoint":{"step":2,"path":")" +
      std::string(kCheckpoint) + R"("}})"};
  const int64_t experiment = SubmitOne();
  const int64_t trial = OnlyTrial(experiment).id;
  Tick();
  ASSERT_TRUE(Eventually([&] { return StoredEvents(trial, 1) == 3; }));

  // 9 minutes before the lease ends: stopped with a checkpoint, which the controller copies.
  ASSERT_TRUE(SetLease("n1", clock_.Now() + std::chrono::minutes(9)).ok());
  Tick();
  ASSERT_TRUE(
      Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kCancelled; }));
  ASSERT_TRUE(Eventually([&] { return CheckpointCopied(); }));
  std::vector<digest::TreeFile> files;
  for (const auto& [path, content] : kCheckpointFiles) {
    files.push_back({path, digest::Sha256Hex(content), static_cast<int64_t>(content.size())});
  }
  const std::string tree = digest::TreeDigest(files);
  {
    std::lock_guard lock(agent_state_.mutex);
    EXPECT_EQ(agent_state_.fetched_paths, std::vector<std::string>{std::string(kCheckpoint)});
  }
  for (const digest::TreeFile& file : files) {
    EXPECT_TRUE(fs::is_regular_file(config_.data_dir + "/blobs/" + file.sha256)) << file.path;
  }

  // The node goes with its lease (`llmctl node down`); another node continues the trial.
  std::unique_ptr<OtherAgent> n2 = StartOtherAgent(
      *controller_, "n2",
      "unix:" + testing::TempDir() + "/dispatcher_test_n2_" + std::to_string(getpid()) + ".sock");
  ASSERT_TRUE(daemon_->dispatcher().RemoveNode("n1").ok());
  StopAgent();
  StatusOr<store::TrialResume> resumed = daemon_->dispatcher().Resume(experiment, "one");
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(resumed->node, "n1");
  EXPECT_EQ(resumed->tree, tree);
  n2->state.script = {StepLine(3), StepLine(4), kResultLine};
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  {
    std::lock_guard lock(n2->state.mutex);
    const v1::RunTrialRequest& request =
        n2->state.runs.at(std::to_string(experiment) + "/one#2").request;
    ASSERT_TRUE(request.has_resume_from());
    EXPECT_EQ(request.resume_from().tree().digest(), tree);
    EXPECT_FALSE(request.resume_from().tree().is_file());
    EXPECT_EQ(request.resume_from().tree().files_size(), 4);
    // Every file of the checkpoint was sent to the node before RunTrial.
    for (const digest::TreeFile& file : files) {
      EXPECT_TRUE(n2->state.blobs.contains(file.sha256)) << file.path;
    }
  }
  StatusOr<std::vector<store::TrialStep>> steps = daemon_->store().RunSteps(experiment);
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  std::vector<std::string> run;
  for (const store::TrialStep& step : *steps) {
    run.push_back(std::to_string(step.attempt) + ":" + std::to_string(step.step));
  }
  EXPECT_EQ(run, (std::vector<std::string>{"1:0", "1:1", "1:2", "2:3", "2:4"}));
}

TEST_F(DispatcherTest, ACheckpointThatCannotBeCopiedIsResumedOnlyOnItsNode) {
  agent_state_.script = {StepLine(0)};
  agent_state_.script_ends = false;
  agent_state_.cancel_lines = {
      R"({"type":"result","outcome":"cancelled","checkpoint":{"step":0,"path":"/ckpt/step-1"}})"};
  const int64_t experiment = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 1; }));
  std::unique_ptr<OtherAgent> n2 = StartOtherAgent(
      *controller_, "n2",
      "unix:" + testing::TempDir() + "/dispatcher_test_n2_" + std::to_string(getpid()) + ".sock");
  ASSERT_TRUE(daemon_->dispatcher().Cancel(experiment, "one", /*checkpoint=*/true).ok());
  ASSERT_TRUE(
      Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kCancelled; }));
  // The agent does not have the directory (NOT_FOUND): no copy.
  ASSERT_TRUE(Eventually([&] { return CheckpointCopied(); }));
  {
    std::lock_guard lock(agent_state_.mutex);
    EXPECT_EQ(agent_state_.fetched_paths, std::vector<std::string>{"/ckpt/step-1"});
  }
  StatusOr<store::TrialResume> resumed = daemon_->dispatcher().Resume(experiment, "one");
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(resumed->tree, "");

  // Its node is away: n2 is connected and free, but does not get the trial.
  StopAgent();
  clock_.Advance(seconds(6));
  Tick();
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
  EXPECT_NE(StatusOf(experiment)
                .trials(0)
                .notice()
                .find("it resumes from a checkpoint on node n1, which is not connected"),
            std::string::npos)
      << StatusOf(experiment).trials(0).notice();
  {
    std::lock_guard lock(n2->state.mutex);
    EXPECT_TRUE(n2->state.runs.empty());
  }
  // Back again, n1 continues it from its own disk.
  agent_state_.script = {StepLine(1), kResultLine};
  agent_state_.script_ends = true;
  StartAgent();
  clock_.Advance(seconds(6));
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  std::lock_guard lock(agent_state_.mutex);
  const v1::RunTrialRequest& request =
      agent_state_.runs.at(std::to_string(experiment) + "/one#2").request;
  EXPECT_FALSE(request.resume_from().has_tree());
  EXPECT_EQ(request.resume_from().checkpoint(), "/ckpt/step-1");
}

}  // namespace
}  // namespace llmctl::controller
