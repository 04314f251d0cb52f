// Test support for llmctl's commands against a controller: a fake Controller service on a unix
// socket that records what the CLI sends and answers from canned responses, and the fixture that
// runs `llmctl` in-process against it (commands_test.cc, node_commands_test.cc).
#ifndef LLMCTL_CONTROLLER_CLI_COMMANDS_TEST_SUPPORT_H_
#define LLMCTL_CONTROLLER_CLI_COMMANDS_TEST_SUPPORT_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/digest/digest.h"
#include "common/version.h"
#include "controller/cli/commands.h"
#include "controller/cli/offline_cli_test.h"
#include "llmctl/v1/controller.grpc.pb.h"
#include "rpc/version_check.h"

namespace llmctl::cli {

// Records what the CLI sends and answers from canned responses, announcing this llmctl's version
// as llmctld does (the CLI refuses an answer that names none).
class FakeController final : public v1::Controller::Service {
 public:
  grpc::Status MissingBlobs(grpc::ServerContext* context, const v1::MissingBlobsRequest* request,
                            v1::MissingBlobsResponse* response) override {
    rpc::AnnounceVersion(*context, kVersion);
    std::lock_guard lock(mutex_);
    ++calls_;
    for (const std::string& sha256 : request->sha256()) {
      asked_.push_back(sha256);
      if (!present_.contains(sha256)) response->add_sha256(sha256);
    }
    return grpc::Status::OK;
  }

  grpc::Status UploadBlob(grpc::ServerContext* context, grpc::ServerReader<v1::BlobChunk>* reader,
                          v1::UploadBlobResponse* response) override {
    rpc::AnnounceVersion(*context, kVersion);
    const auto time_left = context->deadline() - std::chrono::system_clock::now();
    v1::BlobChunk chunk;
    std::string sha256, bytes;
    int64_t size = -1;
    std::vector<size_t> chunk_sizes;
    while (reader->Read(&chunk)) {
      if (size < 0) {
        sha256 = chunk.sha256();
        size = chunk.size();
      } else if (!chunk.sha256().empty()) {
        return {grpc::StatusCode::INVALID_ARGUMENT, "sha256 after the first chunk"};
      }
      chunk_sizes.push_back(chunk.data().size());
      bytes += chunk.data();
    }
    if (digest::Sha256Hex(bytes) != sha256 || static_cast<int64_t>(bytes.size()) != size) {
      return {grpc::StatusCode::DATA_LOSS, "digest or size differ"};
    }
    std::lock_guard lock(mutex_);
    ++calls_;
    uploaded_[sha256] = bytes;
    upload_chunk_sizes_[sha256] = chunk_sizes;
    upload_time_left_[sha256] = time_left;
    response->set_sha256(sha256);
    return grpc::Status::OK;
  }

  grpc::Status ListNodes(grpc::ServerContext* context, const v1::ListNodesRequest*,
                         v1::ListNodesResponse* response) override {
    rpc::AnnounceVersion(*context, kVersion);
    std::lock_guard lock(mutex_);
    // Each call takes the next of later_nodes_, keeping the last for the calls after it.
    if (!later_nodes_.empty()) {
      nodes_ = later_nodes_.front();
      later_nodes_.pop_front();
    }
    *response = nodes_;
    ++list_nodes_calls_;
    authorization_.clear();
    for (const auto& [key, value] : context->client_metadata()) {
      if (key == "authorization") authorization_.assign(value.data(), value.size());
    }
    return grpc::Status::OK;
  }
  grpc::Status MeasureNodeRates(grpc::ServerContext* context,
                                const v1::MeasureNodeRatesRequest* request,
                                v1::MeasureNodeRatesResponse* response) override {
    rpc::AnnounceVersion(*context, kVersion);
    std::lock_guard lock(mutex_);
    measured_.push_back(request->name());
    if (!measure_result_.ok()) return measure_result_;
    response->set_pending("measuring");
    return grpc::Status::OK;
  }
  grpc::Status TimedRuns(grpc::ServerContext* context, const v1::TimedRunsRequest*,
                         v1::TimedRunsResponse* response) override {
    rpc::AnnounceVersion(*context, kVersion);
    std::lock_guard lock(mutex_);
    // What a controller from before the call answers.
    if (timed_runs_unimplemented_) return {grpc::StatusCode::UNIMPLEMENTED, ""};
    if (!timed_runs_error_.empty()) return {grpc::StatusCode::INTERNAL, timed_runs_error_};
    *response = timed_runs_;
    return grpc::Status::OK;
  }
  grpc::Status Submit(grpc::ServerContext* context, const v1::SubmitRequest* request,
                      v1::SubmitResponse* response) override {
    rpc::AnnounceVersion(*context, kVersion);
    std::lock_guard lock(mutex_);
    ++calls_;
    submitted_ = *request;
    response->set_experiment_id(42);
    response->set_name(submit_name_);
    response->add_trials(std::string("a"));
    return grpc::Status::OK;
  }

  grpc::Status Watch(grpc::ServerContext* context, const v1::GetExperimentRequest* request,
                     grpc::ServerWriter<v1::ExperimentStatus>* writer) override {
    rpc::AnnounceVersion(*context, kVersion);
    {
      std::lock_guard lock(mutex_);
      ++calls_;
    }
    for (const v1::ExperimentStatus& status : watch_) writer->Write(status);
    if (interrupt_watch_) ::raise(SIGINT);
    return watch_end_;
  }

  grpc::Status Report(grpc::ServerContext* context, const v1::GetExperimentRequest* request,
                      v1::ReportResponse* response) override {
    rpc::AnnounceVersion(*context, kVersion);
    std::lock_guard lock(mutex_);
    ++calls_;
    if (request->experiment_id() != report_.experiment_id() && request->experiment_id() != 0) {
      return {grpc::StatusCode::NOT_FOUND,
              "no experiment " + std::to_string(request->experiment_id())};
    }
    *response = report_;
    return grpc::Status::OK;
  }

  grpc::Status FetchArtifacts(grpc::ServerContext* context, const v1::FetchTrialArtifactsRequest*,
                              grpc::ServerWriter<v1::ArtifactChunk>* writer) override {
    rpc::AnnounceVersion(*context, kVersion);
    // Its own copy, taken before the first chunk goes out: a client that refuses a chunk returns
    // while this handler may still be writing the rest, and the test then sets the next call's
    // artifacts_ (a freed vector read here made the fetch tests crash about one run in thirty
    // under load).
    const std::vector<v1::ArtifactChunk> chunks = artifacts_;
    for (const v1::ArtifactChunk& chunk : chunks) writer->Write(chunk);
    return grpc::Status::OK;
  }

  grpc::Status Cancel(grpc::ServerContext* context, const v1::CancelRequest* request,
                      v1::CancelResponse* response) override {
    rpc::AnnounceVersion(*context, kVersion);
    std::lock_guard lock(mutex_);
    ++calls_;
    // A trial named "ended..." has ended: nothing cancelled.
    if (request->trial().rfind("ended", 0) != 0) {
      response->add_cancelled(request->trial().empty() ? "all" : request->trial());
    }
    cancel_checkpoint_ = request->checkpoint();
    return grpc::Status::OK;
  }

  // "running": cannot be resumed; "nope": no such trial; others resume from attempt 1's step 3.
  grpc::Status Resume(grpc::ServerContext* context, const v1::ResumeRequest* request,
                      v1::ResumeResponse* response) override {
    rpc::AnnounceVersion(*context, kVersion);
    if (request->trial() == "running") {
      return {grpc::StatusCode::FAILED_PRECONDITION,
              "trial 'running' is running; only a trial that has ended can be resumed"};
    }
    if (request->trial() == "nope") {
      return {grpc::StatusCode::NOT_FOUND, "experiment 42 has no trial 'nope'"};
    }
    response->set_experiment_id(request->experiment_id());
    response->set_trial(request->trial());
    response->set_resumes_attempt(1);
    response->set_first_step(3);
    response->set_node("n1");
    response->set_checkpoint("/ckpt/step-3");
    response->set_checkpoint_copied(request->trial() == "copied");
    return grpc::Status::OK;
  }

  std::mutex mutex_;
  int calls_ = 0;
  std::set<std::string> present_;
  std::vector<std::string> asked_;
  std::map<std::string, std::string> uploaded_;
  std::map<std::string, std::vector<size_t>> upload_chunk_sizes_;
  std::map<std::string, std::chrono::system_clock::duration> upload_time_left_;
  std::optional<v1::SubmitRequest> submitted_;
  v1::ListNodesResponse nodes_;
  std::deque<v1::ListNodesResponse> later_nodes_;  // ListNodes' next answers, in turn
  int list_nodes_calls_ = 0;
  std::vector<std::string> measured_;  // the nodes MeasureNodeRates was asked for
  grpc::Status measure_result_;        // MeasureNodeRates' answer (OK: "measuring")
  v1::TimedRunsResponse timed_runs_;
  bool timed_runs_unimplemented_ = false;
  std::string timed_runs_error_;     // TimedRuns fails with it when set
  std::string submit_name_ = "lab";  // the experiment's name Submit answers
  std::string authorization_;        // of the last ListNodes call
  std::vector<v1::ExperimentStatus> watch_;
  grpc::Status watch_end_;        // how Watch ends after writing watch_
  bool interrupt_watch_ = false;  // Watch raises SIGINT after writing watch_, as Ctrl-C would
  v1::ReportResponse report_;
  std::vector<v1::ArtifactChunk> artifacts_;
  bool cancel_checkpoint_ = false;
};

class CommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/llmctl-cli-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    target_ = "unix:" + (dir_ / "controller.sock").string();
    grpc::ServerBuilder builder;
    builder.AddListeningPort(target_, grpc::InsecureServerCredentials());
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    server_->Shutdown();
    std::filesystem::remove_all(dir_);
  }

  int Run(std::vector<std::string> args, std::string target = "") {
    out_.str("");
    err_.str("");
    args.insert(args.begin(), "llmctl");
    const std::string controller = target.empty() ? target_ : target;
    CliContext context = testing::TestCliContext(
        [controller, env = env_](std::string_view name) -> std::optional<std::string> {
          if (name == "LLMCTL_CONTROLLER") return controller;
          if (auto value = env.find(std::string(name)); value != env.end()) return value->second;
          return std::nullopt;
        },
        out_, err_, dir_);
    return RunLlmctl(args, context);
  }

  void Write(const std::filesystem::path& relative, const std::string& text) {
    std::filesystem::create_directories((dir_ / relative).parent_path());
    std::ofstream(dir_ / relative, std::ios::binary) << text;
  }

  // Inputs that pass submit's content check: alpaca records making exactly `bytes` bytes, and the
  // demo's tokenizer.json.
  static std::string Records(size_t bytes) {
    const std::string head = R"({"instruction": "i", "output": ")", tail = "\"}\n";
    std::string text;
    while (text.size() < bytes) {
      const size_t left = bytes - text.size() - head.size() - tail.size();
      // Lines of about 1000 bytes; the last one takes what is left (never less than 1 byte).
      const size_t fill = left > 2000 ? 1000 - head.size() - tail.size() : left;
      text += head + std::string(fill, 'o') + tail;
    }
    return text;
  }
  static std::string Tokenizer() {
    std::ifstream in("experiments/tokenizers/demo/tokenizer.json", std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }
  void WriteGoodInputs(const std::string& records) {
    Write("lab/data/train.jsonl", records);
    Write("lab/tok/tokenizer.json", Tokenizer());
  }

  std::string WriteExperiment() {
    Write("lab/lab.yaml",
          "model: llmctl-demo\n"
          "init: random\n"
          "tokenizer: tok\n"
          "data: {path: data/train.jsonl}\n"
          "trials:\n"
          "  - {name: a, expect: ok}\n"
          "  - {name: b, set: {data.path: \"node:/nonexistent/on/this/machine.jsonl\"}}\n");
    return (dir_ / "lab" / "lab.yaml").string();
  }

  std::filesystem::path dir_;
  std::string target_;
  std::map<std::string, std::string> env_;  // besides LLMCTL_CONTROLLER
  FakeController fake_;
  std::unique_ptr<grpc::Server> server_;
  std::ostringstream out_, err_;
};

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_COMMANDS_TEST_SUPPORT_H_
