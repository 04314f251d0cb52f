// What the dispatcher's tests share (controller/dispatch/*_test.cc, controller/dispatcher_test.cc):
// an in-process fake agent that speaks agent.proto over mutual TLS with the credentials
// RegisterNode issued, on unix sockets, and a fixture with the whole controller (Daemon: a real
// SQLite file, the controller's gRPC API) whose dispatcher rounds the tests run by hand on a
// manual clock, for health checks, backoff and requeueing.
#ifndef LLMCTL_CONTROLLER_DISPATCH_DISPATCH_TEST_SUPPORT_H_
#define LLMCTL_CONTROLLER_DISPATCH_DISPATCH_TEST_SUPPORT_H_

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/digest/digest.h"
#include "common/version.h"
#include "controller/daemon.h"
#include "controller/dispatcher.h"
#include "llmctl/v1/agent.grpc.pb.h"
#include "llmctl/v1/controller.grpc.pb.h"
#include "rpc/tls.h"

namespace llmctl::controller::dispatch_test {

using std::chrono::milliseconds;
using std::chrono::seconds;

inline std::string RunName(const v1::RunKey& key) {
  return std::to_string(key.experiment_id()) + "/" + key.trial() + "#" +
         std::to_string(key.attempt());
}

inline std::string StepLine(int step) {
  return R"({"type":"step","step":)" + std::to_string(step) +
         R"(,"loss":2.5,"tokens":64,"seconds":0.5,"allocated_bytes":1000,"peak_bytes":2000})";
}
inline const std::string kResultLine =
    R"({"type":"result","outcome":"ok","train_seconds":1.5,"tokens_per_second":128.0,"peak_bytes":2000,"final_loss":2.25})";

// Shared by fake agents whose calls of one kind should meet: each call waits, until its deadline,
// until `together` calls (of all the fakes sharing it) have been in flight at once.
struct CallGate {
  std::mutex mutex;
  std::condition_variable arrived;
  int together = 2;
  int in_flight = 0;
  int most_in_flight = 0;

  // One call's wait; false when its deadline came first.
  bool Meet(std::chrono::system_clock::time_point deadline) {
    std::unique_lock lock(mutex);
    most_in_flight = std::max(most_in_flight, ++in_flight);
    arrived.notify_all();
    const bool met = arrived.wait_until(lock, deadline, [&] { return most_in_flight >= together; });
    --in_flight;
    return met;
  }
};

// What the fake agent knows; it outlives the fake's servers, as a real agent's disk does.
struct FakeAgentState {
  struct Run {
    v1::RunTrialRequest request;
    std::vector<std::string> lines;
    std::vector<std::string> rank1_lines;  // a 2-rank run's rank 1 (events.rank1.jsonl)
    bool ended = false;
    std::string outcome;
  };
  std::mutex mutex;
  std::condition_variable changed;
  std::string node = "n1";                             // the name GetNodeInfo gives
  std::string llmctl_version = std::string(kVersion);  // the agent's, as GetNodeInfo gives it
  // GetNodeInfo's: why the agent takes no trial ("": it takes them).
  std::string unusable;
  int cuda_devices = 0;  // GetNodeInfo lists these besides one CPU
  // What GetNodeInfo says of the NVIDIA driver and llm-train's LibTorch ("": nothing).
  std::string driver_version, driver_cuda_version, libtorch_cuda_version;
  std::string rate_probe_json;       // NodeInfo's: the node's measured rates ("": none yet)
  std::string rate_probe_pending;    // NodeInfo's: why there are none ("measuring", ...)
  bool rate_probe_underway = false;  // NodeInfo's: whether they are measured or waited for
  // MeasureRates: how many calls came, and the answer to give (OK: the pending it then has, which
  // becomes rate_probe_pending, with rate_probe_underway).
  int measure_rates_calls = 0;
  grpc::Status measure_rates_result = grpc::Status::OK;
  std::string measure_rates_pending = "measuring";
  std::map<std::string, Run> runs;  // by RunName
  std::vector<int64_t> stream_from_seqs;
  std::vector<int64_t> stream_from_rank1_seqs;  // from_rank_seq[1]; 0 when absent
  std::vector<int64_t> stream_from_sample_seqs;
  // The device samples every run has; each stream sends those from its from_sample_seq first.
  std::vector<v1::DeviceSample> samples;
  int node_info_calls = 0;
  CallGate* node_info_gate = nullptr;  // GetNodeInfo's; set before the fake serves; not owned
  // Called by GetNodeInfo once its answer is read from this state, before it is sent.
  std::function<void()> node_info_answered;
  std::set<std::string> blobs;
  std::vector<std::string> cancelled;
  // How long each UploadBlob had left before its deadline when it arrived, by sha256.
  std::map<std::string, std::chrono::system_clock::duration> upload_time_left;
  // UploadBlob: how many began, the answers to give in order (then OK), whether a call waits
  // until `upload_open` is set, and how many calls their caller cancelled (2 s or more before
  // their deadline) while they waited.
  int uploads_started = 0;
  std::vector<grpc::Status> upload_results;
  bool upload_open = true;
  int uploads_cancelled = 0;
  std::vector<v1::CancelRunRequest> cancel_requests;
  // What a cancelled run's worker writes before it ends.
  std::vector<std::string> cancel_lines;
  // How many CancelRun calls to answer with the run still going (its worker slow to stop; it
  // ends at the next call after them).
  int cancels_before_end = 0;
  // CancelRun waits until this is set (its worker slow to stop: the real agent answers once the run
  // has ended, up to its cancel_grace and 5 s); how many calls wait now.
  bool cancel_open = true;
  int cancels_waiting = 0;
  // CancelRun's, before anything else; set before the first CancelRun; not owned.
  CallGate* cancel_gate = nullptr;
  // How long RunTrial takes to answer once it has started the run.
  std::chrono::milliseconds run_trial_delay{0};
  // RunTrial's answers, in order (then it starts the run): an error starts nothing.
  std::vector<grpc::Status> run_trial_results;
  // The rendezvous port node rank 0 of a multi-node run reports.
  int32_t master_port = 29500;
  // What the next RunTrial's worker will write.
  std::vector<std::string> script = {StepLine(0), StepLine(1), kResultLine};
  bool script_ends = true;
  // Rank 1's lines of a 2-rank run: each stream sends rank 1's line i after rank 0's line i (or,
  // once rank 0's are all sent, the rest), with rank 1.
  std::vector<std::string> rank1_script;
  // The next stream breaks after sending this many events (0: never).
  int drop_after = 0;
  // StreamEvents' answers, in order (then it streams): an error sends nothing.
  std::vector<grpc::Status> stream_results;
  // Streams send rank 0's lines as one batch (StreamEventsResponse.events), not one a message.
  bool one_batch = false;
  // PrepareHubModel: the requests seen, the answers to give in order (then OK), and whether a
  // call waits until `prepare_open` is set.
  std::vector<v1::PrepareHubModelRequest> prepared;
  std::vector<grpc::Status> prepare_results;
  bool prepare_open = true;
  // What FetchArtifacts with a path (a checkpoint's directory) sends: relative path → content;
  // empty: NOT_FOUND, as for a checkpoint that is not there. The paths asked for.
  std::map<std::string, std::string> checkpoint_files;
  std::vector<std::string> fetched_paths;
  // The name FetchArtifacts of a whole run gives its one file; "": output/adapter/<RunName>.
  std::string artifact_name;

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

  grpc::Status GetNodeInfo(grpc::ServerContext* context, const v1::GetNodeInfoRequest*,
                           v1::NodeInfo* info) override {
    if (CallGate* gate = state_.node_info_gate;
        gate != nullptr && !gate->Meet(context->deadline())) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no other call came");
    }
    std::unique_lock lock(state_.mutex);
    ++state_.node_info_calls;
    info->set_node(state_.node);
    info->set_llmctl_version(state_.llmctl_version);
    info->set_unusable(state_.unusable);
    v1::Device* cpu = info->add_devices();
    cpu->set_type("cpu");
    cpu->set_name("fake cpu");
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
    info->set_rate_probe_json(state_.rate_probe_json);
    info->set_rate_probe_pending(state_.rate_probe_pending);
    info->set_rate_probe_underway(state_.rate_probe_underway);
    if (state_.node_info_answered) {
      const std::function<void()> answered = state_.node_info_answered;
      lock.unlock();
      answered();
    }
    return grpc::Status::OK;
  }
  grpc::Status MeasureRates(grpc::ServerContext*, const v1::MeasureRatesRequest*,
                            v1::MeasureRatesResponse* response) override {
    std::lock_guard lock(state_.mutex);
    ++state_.measure_rates_calls;
    if (!state_.measure_rates_result.ok()) return state_.measure_rates_result;
    state_.rate_probe_pending = state_.measure_rates_pending;
    state_.rate_probe_underway = true;
    response->set_pending(state_.measure_rates_pending);
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
    {
      std::unique_lock lock(state_.mutex);
      ++state_.uploads_started;
      state_.changed.notify_all();
      while (!state_.upload_open && !context->IsCancelled()) {
        state_.changed.wait_for(lock, milliseconds(20));
      }
      if (context->IsCancelled()) {
        // A caller's cancellation, not its deadline (whose client side may come a little first).
        if (context->deadline() - std::chrono::system_clock::now() > seconds(2)) {
          ++state_.uploads_cancelled;
        }
        return grpc::Status::CANCELLED;
      }
      if (!state_.upload_results.empty()) {
        const grpc::Status result = state_.upload_results.front();
        state_.upload_results.erase(state_.upload_results.begin());
        if (!result.ok()) return result;
      }
    }
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
    std::unique_lock lock(state_.mutex);
    if (!state_.run_trial_results.empty()) {
      const grpc::Status result = state_.run_trial_results.front();
      state_.run_trial_results.erase(state_.run_trial_results.begin());
      if (!result.ok()) return result;
    }
    // A checkpoint sent as a tree needs no earlier run on this node.
    if (request->has_resume_from() && !request->resume_from().has_tree() &&
        !state_.runs.contains(RunName(request->resume_from().run()))) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this node has no such run");
    }
    auto [run, created] = state_.runs.try_emplace(RunName(request->key()));
    if (created) {
      run->second.request = *request;
      run->second.lines = state_.script;
      run->second.rank1_lines = state_.rank1_script;
      run->second.ended = state_.script_ends;
      run->second.outcome = "ok";
    }
    *state->mutable_key() = request->key();
    state->set_status(run->second.ended ? v1::RUN_STATUS_ENDED : v1::RUN_STATUS_RUNNING);
    if (request->node_group().nodes() > 1 && request->node_group().node_rank() == 0) {
      state->set_master_port(state_.master_port);
    }
    const std::chrono::milliseconds delay = state_.run_trial_delay;
    lock.unlock();
    std::this_thread::sleep_for(delay);
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
    const auto rank1_from = request->from_rank_seq().find(1);
    state_.stream_from_rank1_seqs.push_back(
        rank1_from == request->from_rank_seq().end() ? 0 : rank1_from->second);
    state_.stream_from_sample_seqs.push_back(request->from_sample_seq());
    if (!state_.stream_results.empty()) {
      const grpc::Status result = state_.stream_results.front();
      state_.stream_results.erase(state_.stream_results.begin());
      if (!result.ok()) return result;
    }
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
    size_t next1 = rank1_from == request->from_rank_seq().end()
                       ? 0
                       : static_cast<size_t>(std::max<int64_t>(rank1_from->second, 1) - 1);
    int sent = 0;
    if (state_.one_batch && next < run->second.lines.size()) {
      v1::StreamEventsResponse batch;
      for (; next < run->second.lines.size(); ++next) {
        v1::TrialEvent* event = batch.mutable_events()->add_events();
        event->set_seq(static_cast<int64_t>(next + 1));
        event->set_json(run->second.lines[next]);
      }
      lock.unlock();
      const bool written = writer->Write(batch);
      lock.lock();
      if (!written) return grpc::Status::CANCELLED;
    }
    while (!context->IsCancelled()) {
      while (next < run->second.lines.size() || next1 < run->second.rank1_lines.size()) {
        // Rank 0's next line, unless rank 1 is behind it (or rank 0 has none left).
        const bool rank1 = next1 < run->second.rank1_lines.size() &&
                           (next >= run->second.lines.size() || next1 < next);
        v1::StreamEventsResponse response;
        response.mutable_event()->set_seq(static_cast<int64_t>((rank1 ? next1 : next) + 1));
        response.mutable_event()->set_rank(rank1 ? 1 : 0);
        const std::string line = rank1 ? run->second.rank1_lines[next1] : run->second.lines[next];
        response.mutable_event()->set_json(line);
        response.mutable_event()->set_type(line.find("\"result\"") != std::string::npos ? "result"
                                                                                        : "step");
        lock.unlock();
        const bool written = writer->Write(response);
        lock.lock();
        if (!written) return grpc::Status::CANCELLED;
        ++(rank1 ? next1 : next);
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
  grpc::Status CancelRun(grpc::ServerContext* context, const v1::CancelRunRequest* request,
                         v1::RunState* state) override {
    // Until a second before its deadline: a call its caller gave up on must not meet the next.
    if (CallGate* gate = state_.cancel_gate;
        gate != nullptr && !gate->Meet(context->deadline() - std::chrono::seconds(1))) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no other call came");
    }
    {
      std::unique_lock lock(state_.mutex);
      state_.cancelled.push_back(RunName(request->key()));
      state_.cancel_requests.push_back(*request);
      ++state_.cancels_waiting;
      state_.changed.notify_all();
      while (!state_.cancel_open && !context->IsCancelled()) {
        state_.changed.wait_for(lock, milliseconds(20));
      }
      --state_.cancels_waiting;
      if (context->IsCancelled()) return grpc::Status::CANCELLED;
      auto run = state_.runs.find(RunName(request->key()));
      if (run == state_.runs.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no run");
      *state->mutable_key() = request->key();
      // As the real agent (RunManager::Cancel): a run that has ended is left as it ended.
      if (run->second.ended) {
        state->set_status(v1::RUN_STATUS_ENDED);
        return grpc::Status::OK;
      }
      if (state_.cancels_before_end > 0) {
        --state_.cancels_before_end;
        state->set_status(v1::RUN_STATUS_RUNNING);
        return grpc::Status::OK;
      }
      run->second.lines.insert(run->second.lines.end(), state_.cancel_lines.begin(),
                               state_.cancel_lines.end());
      run->second.ended = true;
      run->second.outcome = "cancelled";
      state->set_status(v1::RUN_STATUS_ENDED);
    }
    state_.changed.notify_all();
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
    {
      std::lock_guard lock(state_.mutex);
      chunk.set_path(state_.artifact_name.empty() ? "output/adapter/" + RunName(request->key())
                                                  : state_.artifact_name);
    }
    chunk.set_data("weights");
    chunk.set_last(true);
    writer->Write(chunk);
    return grpc::Status::OK;
  }

 private:
  FakeAgentState& state_;
};

inline constexpr std::string_view kExperiment = R"(name: one
model: llmctl-demo
tokenizer: tok.json
data: {path: data/train.jsonl, max_seq_length: 64}
train: {micro_batch_size: 2, max_steps: 2}
)";

// Uploads `content` to the controller as the experiment's data file and submits kExperiment with
// it; returns the experiment id (0 on failure) and the file's tree.
inline std::pair<int64_t, v1::InputTree> SubmitWithDataFile(v1::Controller::Stub& controller,
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
  void RegisterNode() { credentials_ = RegisterNodeAt("n1", agent_address_); }
  v1::NodeCredentials RegisterNodeAt(const std::string& name, const std::string& address) {
    grpc::ClientContext context;
    v1::RegisterNodeRequest request;
    request.set_name(name);
    request.set_address(address);
    v1::NodeCredentials credentials;
    const grpc::Status registered = controller_->RegisterNode(&context, request, &credentials);
    EXPECT_TRUE(registered.ok()) << registered.error_message();
    return credentials;
  }
  void TearDown() override {
    daemon_.reset();
    StopAgent();
    std::filesystem::remove_all(root_);
  }

  void StartController() {
    auto daemon = Daemon::Start(config_, clock_,
                                {.run_dispatcher = false,
                                 .backoff_initial = seconds(1),
                                 .backoff_max = seconds(4),
                                 .inline_upload_bytes = inline_upload_bytes_});
    ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
    daemon_ = std::move(*daemon);
    controller_ = v1::Controller::NewStub(
        grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials()));
  }

  void StartAgent() {
    agent_service_ = std::make_unique<FakeAgent>(agent_state_);
    agent_ = ServeAgent(*agent_service_, agent_address_, credentials_);
    ASSERT_NE(agent_, nullptr);
  }
  // Serves `service` at `address` as the node those credentials were issued to.
  static std::unique_ptr<grpc::Server> ServeAgent(v1::Agent::Service& service,
                                                  const std::string& address,
                                                  const v1::NodeCredentials& credentials) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, rpc::ServerCredentials({credentials.ca_certificate_pem(),
                                                              credentials.certificate_pem(),
                                                              credentials.private_key_pem()},
                                                             credentials.token()));
    builder.RegisterService(&service);
    return builder.BuildAndStart();
  }
  // Serves `service` at `address` without credentials, for a test that drives a part of the
  // dispatcher directly over an insecure channel.
  static std::unique_ptr<grpc::Server> ServeAgentInsecurely(v1::Agent::Service& service,
                                                            const std::string& address) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials());
    builder.RegisterService(&service);
    return builder.BuildAndStart();
  }
  void StopAgent() {
    if (agent_ == nullptr) return;
    agent_->Shutdown(std::chrono::system_clock::now());
    agent_->Wait();
    agent_.reset();
  }

  // Asks the controller to cancel every trial of `experiment`, as `llmctl cancel EXPERIMENT` does;
  // what it cancelled goes to `response` where one is given.
  grpc::Status CancelExperiment(int64_t experiment, v1::CancelResponse* response = nullptr) {
    grpc::ClientContext context;
    v1::CancelRequest request;
    request.set_experiment_id(experiment);
    v1::CancelResponse cancelled;
    return controller_->Cancel(&context, request, response != nullptr ? response : &cancelled);
  }

  // kExperiment with `model`, and `extra` (top-level YAML lines) appended.
  int64_t SubmitOne(std::string_view model = "llmctl-demo", std::string_view extra = "") {
    std::string text(kExperiment);
    text.replace(text.find("llmctl-demo"), std::string_view("llmctl-demo").size(), model);
    text += extra;
    v1::SubmitRequest request;
    request.set_filename("one.yaml");
    request.set_yaml_text(text);
    v1::SubmitResponse response;
    grpc::ClientContext context;
    const grpc::Status submitted = controller_->Submit(&context, request, &response);
    EXPECT_TRUE(submitted.ok()) << submitted.error_message();
    return response.experiment_id();
  }

  // Submits kExperiment as a ddp trial over two nodes; returns the experiment id.
  int64_t SubmitTwoNodeTrial() {
    std::string text(kExperiment);
    text.replace(text.find("max_steps: 2"), std::string_view("max_steps: 2").size(),
                 "global_batch_size: 4, max_steps: 2");
    v1::SubmitRequest request;
    request.set_filename("two-nodes.yaml");
    request.set_yaml_text(text + "strategy: ddp\nnodes: 2\n");
    v1::SubmitResponse submitted;
    grpc::ClientContext context;
    const grpc::Status accepted = controller_->Submit(&context, request, &submitted);
    EXPECT_TRUE(accepted.ok()) << accepted.error_message();
    return submitted.experiment_id();
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

  // Rank 0's rows counted in SQL: Store::LastSeq (the highest seq) would miss one lost below it.
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

  // Rounds 4 s apart for requeue_after (60 s) after the round that made the first refusal, each
  // waiting for the agent's refusal of the stream (stream_results) to end that round's stream: the
  // attempt is declared lost at the last one.
  void TickWhileTheStreamIsRefusedForRequeueAfter() {
    for (int refused_for = 4; refused_for <= 60; refused_for += 4) {
      clock_.Advance(std::chrono::seconds(4));
      Tick();
      ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));
    }
  }

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
  int InFlightDeliveries() { return daemon_->dispatcher().BlobDeliveriesInFlight(); }
  int UploadsStarted() {
    std::lock_guard lock(agent_state_.mutex);
    return agent_state_.uploads_started;
  }
  void OpenUploads() {
    {
      std::lock_guard lock(agent_state_.mutex);
      agent_state_.upload_open = true;
    }
    agent_state_.changed.notify_all();
  }
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
  int64_t inline_upload_bytes_ = int64_t{64} << 20;  // DaemonOptions'
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<v1::Controller::Stub> controller_;
  v1::NodeCredentials credentials_;
  std::string agent_address_ =
      "unix:" + testing::TempDir() + "/dispatcher_test_agent_" + std::to_string(getpid()) + ".sock";
  FakeAgentState agent_state_;
  std::unique_ptr<FakeAgent> agent_service_;
  std::unique_ptr<grpc::Server> agent_;
};

// Two nodes, n1 (the fixture's fake agent) and n2, each with one CPU.
class TwoNodeDispatcherTest : public DispatcherTest {
 protected:
  void SetUp() override {
    DispatcherTest::SetUp();
    second_state_.node = "n2";
    second_service_ = std::make_unique<FakeAgent>(second_state_);
    second_credentials_ = RegisterNodeAt("n2", second_address_);
    second_ = ServeAgent(*second_service_, second_address_, second_credentials_);
    ASSERT_NE(second_, nullptr);
  }
  void TearDown() override {
    daemon_.reset();
    second_->Shutdown(std::chrono::system_clock::now());
    second_->Wait();
    DispatcherTest::TearDown();
  }

  // For a test whose fake agents' calls wait for each other (FakeAgentState's cancel_gate and
  // node_info_gate). A member, not the test's local: destroyed after TearDown has shut the fake
  // agents down, so a call that arrives after the test's body (a multi-node attempt's peer stop
  // once node rank 0's run ended) never meets a gate that is gone, as one did (a hang in TearDown).
  CallGate gate_;
  std::string second_address_ = "unix:" + testing::TempDir() + "/dispatcher_test_agent2_" +
                                std::to_string(getpid()) + ".sock";
  v1::NodeCredentials second_credentials_;
  FakeAgentState second_state_;
  std::unique_ptr<FakeAgent> second_service_;
  std::unique_ptr<grpc::Server> second_;
};

}  // namespace llmctl::controller::dispatch_test

#endif  // LLMCTL_CONTROLLER_DISPATCH_DISPATCH_TEST_SUPPORT_H_
