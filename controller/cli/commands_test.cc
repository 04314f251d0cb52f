// llmctl's commands against an in-process fake Controller on a unix socket.
#include "controller/cli/commands.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/digest/digest.h"
#include "common/estimate/rate_probe.h"
#include "controller/cli/client.h"
#include "controller/cli/input_tree.h"
#include "controller/cli/inputs.h"
#include "controller/cli/offline_cli_test.h"
#include "llmctl/v1/controller.grpc.pb.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

// Records what the CLI sends and answers from canned responses.
class FakeController final : public v1::Controller::Service {
 public:
  grpc::Status MissingBlobs(grpc::ServerContext*, const v1::MissingBlobsRequest* request,
                            v1::MissingBlobsResponse* response) override {
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
    std::lock_guard lock(mutex_);
    *response = nodes_;
    authorization_.clear();
    for (const auto& [key, value] : context->client_metadata()) {
      if (key == "authorization") authorization_.assign(value.data(), value.size());
    }
    return grpc::Status::OK;
  }
  grpc::Status TimedRuns(grpc::ServerContext*, const v1::TimedRunsRequest*,
                         v1::TimedRunsResponse* response) override {
    std::lock_guard lock(mutex_);
    // What a controller from before the call answers.
    if (timed_runs_unimplemented_) return {grpc::StatusCode::UNIMPLEMENTED, ""};
    *response = timed_runs_;
    return grpc::Status::OK;
  }
  grpc::Status Submit(grpc::ServerContext*, const v1::SubmitRequest* request,
                      v1::SubmitResponse* response) override {
    std::lock_guard lock(mutex_);
    ++calls_;
    submitted_ = *request;
    response->set_experiment_id(42);
    response->set_name("lab");
    response->add_trials(std::string("a"));
    return grpc::Status::OK;
  }

  grpc::Status Watch(grpc::ServerContext*, const v1::GetExperimentRequest* request,
                     grpc::ServerWriter<v1::ExperimentStatus>* writer) override {
    {
      std::lock_guard lock(mutex_);
      ++calls_;
    }
    for (const v1::ExperimentStatus& status : watch_) writer->Write(status);
    return grpc::Status::OK;
  }

  grpc::Status Report(grpc::ServerContext*, const v1::GetExperimentRequest* request,
                      v1::ReportResponse* response) override {
    std::lock_guard lock(mutex_);
    ++calls_;
    if (request->experiment_id() != report_.experiment_id() && request->experiment_id() != 0) {
      return {grpc::StatusCode::NOT_FOUND,
              "no experiment " + std::to_string(request->experiment_id())};
    }
    *response = report_;
    return grpc::Status::OK;
  }

  grpc::Status FetchArtifacts(grpc::ServerContext*, const v1::FetchTrialArtifactsRequest*,
                              grpc::ServerWriter<v1::ArtifactChunk>* writer) override {
    for (const v1::ArtifactChunk& chunk : artifacts_) writer->Write(chunk);
    return grpc::Status::OK;
  }

  grpc::Status Cancel(grpc::ServerContext*, const v1::CancelRequest* request,
                      v1::CancelResponse* response) override {
    std::lock_guard lock(mutex_);
    ++calls_;
    response->add_cancelled(request->trial().empty() ? "all" : request->trial());
    cancel_checkpoint_ = request->checkpoint();
    return grpc::Status::OK;
  }

  // "running": cannot be resumed; "nope": no such trial; others resume from attempt 1's step 3.
  grpc::Status Resume(grpc::ServerContext*, const v1::ResumeRequest* request,
                      v1::ResumeResponse* response) override {
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
  v1::TimedRunsResponse timed_runs_;
  bool timed_runs_unimplemented_ = false;
  std::string authorization_;  // of the last ListNodes call
  std::vector<v1::ExperimentStatus> watch_;
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
    fs::remove_all(dir_);
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

  void Write(const fs::path& relative, const std::string& text) {
    fs::create_directories((dir_ / relative).parent_path());
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

  fs::path dir_;
  std::string target_;
  std::map<std::string, std::string> env_;  // besides LLMCTL_CONTROLLER
  FakeController fake_;
  std::unique_ptr<grpc::Server> server_;
  std::ostringstream out_, err_;
};

TEST_F(CommandsTest, SubmitUploadsOnlyMissingBlobsInChunksAndSendsTheTrees) {
  const std::string data = Records(2 * kBlobChunkBytes + 5);  // three chunks
  WriteGoodInputs(data);
  Write("lab/tok/special_tokens_map.json", "{}");
  Write("lab/tok/notes.txt", "{}");  // same bytes: one blob
  fake_.present_.insert(digest::Sha256Hex("{}"));
  fake_.present_.insert(digest::Sha256Hex(Tokenizer()));
  const std::string file = WriteExperiment();

  ASSERT_EQ(Run({"submit", file}), kExitOk) << err_.str();
  EXPECT_EQ(out_.str(), "42\n");

  std::lock_guard lock(fake_.mutex_);
  EXPECT_EQ(fake_.asked_.size(), 3u);  // each distinct blob once
  ASSERT_EQ(fake_.uploaded_.size(), 1u);
  EXPECT_EQ(fake_.uploaded_.begin()->first, digest::Sha256Hex(data));
  EXPECT_EQ(fake_.uploaded_.begin()->second, data);
  EXPECT_EQ(fake_.upload_chunk_sizes_.begin()->second,
            (std::vector<size_t>{kBlobChunkBytes, kBlobChunkBytes, 5}));

  ASSERT_TRUE(fake_.submitted_.has_value());
  const v1::SubmitRequest& request = *fake_.submitted_;
  EXPECT_EQ(request.filename(), file);
  EXPECT_EQ(request.yaml_text().rfind("model: llmctl-demo\n", 0), 0u);
  // Keyed by the path as written; the preset and the path on the node are not.
  ASSERT_EQ(request.inputs_size(), 2);
  const v1::InputTree& data_tree = request.inputs().at("data/train.jsonl");
  EXPECT_TRUE(data_tree.is_file());
  EXPECT_EQ(data_tree.files(0).path(), "train.jsonl");
  EXPECT_EQ(data_tree.files(0).size(), static_cast<int64_t>(data.size()));
  const v1::InputTree& tokenizer_tree = request.inputs().at("tok");
  EXPECT_FALSE(tokenizer_tree.is_file());
  EXPECT_EQ(tokenizer_tree.files_size(), 3);
  EXPECT_EQ(tokenizer_tree.digest(), InputTreeDigest(tokenizer_tree));
}

// --trial: the request names the trials to start; one the file lacks is invalid input, and
// nothing is sent.
TEST_F(CommandsTest, SubmitTrialSendsOnlyTheNamedTrialsAndRefusesAnUnknownOne) {
  WriteGoodInputs(Records(4096));
  Write("lab/tok/special_tokens_map.json", "{}");
  const std::string file = WriteExperiment();
  EXPECT_EQ(Run({"submit", file, "--trial", "nope"}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("no trial named 'nope' (its trials: a, b)"), std::string::npos)
      << err_.str();
  {
    std::lock_guard lock(fake_.mutex_);
    EXPECT_FALSE(fake_.submitted_.has_value());
  }
  ASSERT_EQ(Run({"submit", file, "--trial", "a"}), kExitOk) << err_.str();
  std::lock_guard lock(fake_.mutex_);
  ASSERT_TRUE(fake_.submitted_.has_value());
  EXPECT_EQ(std::vector<std::string>(fake_.submitted_->only_trials().begin(),
                                     fake_.submitted_->only_trials().end()),
            std::vector<std::string>{"a"});
}

TEST_F(CommandsTest, AnUploadGetsTimeForItsSizeAtTheMinimumRate) {
  // 2 MiB at 1 KiB/s: 2048 s on top of the 60 s call deadline.
  const std::string data = Records(2 * kBlobChunkBytes);
  WriteGoodInputs(data);
  Write("lab/tok/special_tokens_map.json", "{}");
  env_["LLMCTL_MIN_TRANSFER_RATE"] = "1KiB";
  ASSERT_EQ(Run({"submit", WriteExperiment()}), kExitOk) << err_.str();

  std::lock_guard lock(fake_.mutex_);
  ASSERT_TRUE(fake_.upload_time_left_.contains(digest::Sha256Hex(data)));
  // The margin only absorbs the time between the call's start and its arrival.
  EXPECT_GT(fake_.upload_time_left_.at(digest::Sha256Hex(data)), std::chrono::seconds(2000));
  // A small blob gets about the call deadline.
  EXPECT_LT(fake_.upload_time_left_.at(digest::Sha256Hex("{}")),
            kCallDeadline + std::chrono::seconds(1));
}

TEST_F(CommandsTest, ABadMinimumTransferRateIsInvalidInputAndSendsNothing) {
  WriteGoodInputs(Records(4096));
  env_["LLMCTL_MIN_TRANSFER_RATE"] = "0";
  EXPECT_EQ(Run({"submit", WriteExperiment()}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("LLMCTL_MIN_TRANSFER_RATE: expected a rate per second above 0"),
            std::string::npos)
      << err_.str();
  std::lock_guard lock(fake_.mutex_);
  EXPECT_EQ(fake_.calls_, 0);
}

TEST_F(CommandsTest, InvalidFileExitsTwoAndSendsNothing) {
  Write("bad.yaml", "model: llmctl-demo\ntrain: {micro_batch_sise: 4}\n");
  EXPECT_EQ(Run({"submit", (dir_ / "bad.yaml").string()}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("bad.yaml:2:9: unknown key 'train.micro_batch_sise' (did you mean "
                            "'train.micro_batch_size'?)"),
            std::string::npos)
      << err_.str();
  EXPECT_EQ(out_.str(), "");

  EXPECT_EQ(Run({"submit", (dir_ / "missing.yaml").string()}), kExitInvalidInput);
  EXPECT_EQ(Run({"submit"}), kExitInvalidInput);
  EXPECT_EQ(Run({"report", "--format", "pdf"}), kExitInvalidInput);
  EXPECT_EQ(Run({"cancel", "-3"}), kExitInvalidInput);
  std::lock_guard lock(fake_.mutex_);
  EXPECT_EQ(fake_.calls_, 0);
}

TEST_F(CommandsTest, HelpExitsZero) {
  EXPECT_EQ(Run({"--help"}), kExitOk);
  EXPECT_NE(out_.str().find("Exit codes:"), std::string::npos);
  EXPECT_EQ(Run({"report", "--help"}), kExitOk);
  EXPECT_NE(out_.str().find("--format"), std::string::npos);
}

v1::ReportResponse OneTrialReport(const std::string& outcome, const std::string& expected) {
  v1::ReportResponse report;
  report.set_experiment_id(42);
  report.set_name("lab");
  v1::TrialReport* trial = report.add_trials();
  trial->set_name("a");
  trial->set_outcome(outcome);
  trial->set_expected(expected);
  trial->set_train_seconds(2.5);
  trial->set_tokens_per_second(1000);
  trial->set_peak_bytes(100 << 20);
  trial->set_final_loss(2.0);
  v1::MemorySnapshot* snap = trial->mutable_at_peak();
  snap->set_phase("phase1_after_fwd");
  snap->set_params_bytes(10 << 20);
  snap->set_allocated_bytes(90 << 20);
  trial->add_per_phase()->CopyFrom(*snap);
  return report;
}

TEST_F(CommandsTest, ReportJsonShape) {
  fake_.report_ = OneTrialReport("ok", "ok");
  ASSERT_EQ(Run({"report", "42", "--format", "json"}), kExitOk) << err_.str();
  const nlohmann::json json = nlohmann::json::parse(out_.str());
  ASSERT_EQ(json["trials"].size(), 1u);
  const nlohmann::json& trial = json["trials"][0];
  EXPECT_EQ(trial["name"], "a");
  EXPECT_EQ(trial["outcome"], "ok");
  EXPECT_EQ(trial["expected"], "ok");
  EXPECT_EQ(trial["train_seconds"], 2.5);
  EXPECT_EQ(trial["tokens_per_second"], 1000.0);
  EXPECT_EQ(trial["peak_bytes"], 100 << 20);
  EXPECT_EQ(trial["final_loss"], 2.0);
  EXPECT_EQ(trial["at_peak"]["params_bytes"], 10 << 20);
  EXPECT_EQ(trial["at_peak"]["allocated_bytes"], 90 << 20);
  EXPECT_EQ(trial["per_phase"].size(), 1u);

  EXPECT_EQ(Run({"report", "9"}), kExitInvalidInput);  // NOT_FOUND from the controller
  EXPECT_NE(err_.str().find("no experiment 9"), std::string::npos);
}

TEST_F(CommandsTest, ReportOutputWritesTheFile) {
  fake_.report_ = OneTrialReport("ok", "ok");
  const fs::path output = dir_ / "report.html";
  ASSERT_EQ(Run({"report", "--format", "html", "--output", output.string()}), kExitOk);
  EXPECT_EQ(out_.str(), "");
  std::ifstream in(output);
  std::stringstream html;
  html << in.rdbuf();
  EXPECT_EQ(html.str().rfind("<!DOCTYPE html>", 0), 0u);
}

TEST_F(CommandsTest, SubmitWaitFollowsThenExitsOneWhenAnOutcomeDiffers) {
  WriteGoodInputs(Records(4096));
  v1::ExperimentStatus running;
  running.set_id(42);
  running.set_state("running");
  v1::TrialStatus* trial = running.add_trials();
  trial->set_name("a");
  trial->set_state("running");
  trial->set_step(1);
  trial->set_total_steps(2);
  v1::ExperimentStatus ended = running;
  ended.set_state("ended");
  ended.mutable_trials(0)->set_state("oom");
  fake_.watch_ = {running, ended};
  fake_.report_ = OneTrialReport("oom", "ok");

  EXPECT_EQ(Run({"submit", WriteExperiment(), "--wait"}), kExitFailed) << err_.str();
  const std::string out = out_.str();
  EXPECT_EQ(out.rfind("42\n", 0), 0u);
  EXPECT_NE(out.find("a      running    ["), std::string::npos) << out;
  EXPECT_NE(out.find("a      oom        ["), std::string::npos) << out;
  EXPECT_NE(out.find("oom (expected ok)"), std::string::npos) << out;

  fake_.report_ = OneTrialReport("ok", "ok");
  EXPECT_EQ(Run({"submit", WriteExperiment(), "--wait"}), kExitOk) << err_.str();
}

TEST_F(CommandsTest, UnreachableControllerExitsThree) {
  EXPECT_EQ(Run({"report", "1"}, "unix:" + (dir_ / "nobody.sock").string()), kExitUnreachable);
  EXPECT_NE(err_.str().find("is the controller at unix:"), std::string::npos) << err_.str();
}

TEST_F(CommandsTest, ATcpControllerIsCalledWithTheTokenFromTheTokenFileAndNeverWithout) {
  FakeController tcp_fake;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&tcp_fake);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string target = "127.0.0.1:" + std::to_string(port);

  EXPECT_EQ(Run({"nodes"}, target), kExitFailed);
  EXPECT_NE(err_.str().find("the controller at " + target +
                            " (from LLMCTL_CONTROLLER) is on TCP and takes calls only with its "
                            "API token: set LLMCTL_CONTROLLER_TOKEN_FILE"),
            std::string::npos)
      << err_.str();

  const fs::path token = dir_ / "api.token";
  Write("api.token", "s3cret-token\n");
  fs::permissions(token, fs::perms::owner_read | fs::perms::owner_write);
  env_["LLMCTL_CONTROLLER_TOKEN_FILE"] = token.string();
  EXPECT_EQ(Run({"nodes"}, target), kExitOk) << err_.str();
  {
    std::lock_guard lock(tcp_fake.mutex_);
    EXPECT_EQ(tcp_fake.authorization_, "Bearer s3cret-token");
  }

  fs::permissions(token, fs::perms::group_read | fs::perms::others_read, fs::perm_options::add);
  EXPECT_EQ(Run({"nodes"}, target), kExitFailed);
  EXPECT_NE(err_.str().find("token file " + token.string() + " may be read by others"),
            std::string::npos)
      << err_.str();
  server->Shutdown();
}

TEST_F(CommandsTest, BadControllerAddressIsInvalidInput) {
  EXPECT_EQ(Run({"nodes"}, "localhost"), kExitInvalidInput);
  EXPECT_NE(err_.str().find("LLMCTL_CONTROLLER: controller address 'localhost'"),
            std::string::npos);
}

TEST_F(CommandsTest, CancelNamesWhatWasCancelled) {
  ASSERT_EQ(Run({"cancel", "42", "--trial", "b"}), kExitOk);
  EXPECT_EQ(out_.str(), "cancelled b\n");
}

TEST_F(CommandsTest, CancelWithACheckpointAsksForOneAndSaysHowToGoOn) {
  ASSERT_EQ(Run({"cancel", "42", "--trial", "b", "--checkpoint"}), kExitOk);
  EXPECT_TRUE(fake_.cancel_checkpoint_);
  EXPECT_NE(out_.str().find("cancelled b\n"), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find("`llmctl resume 42 TRIAL` continues"), std::string::npos) << out_.str();
}

TEST_F(CommandsTest, ResumeSaysWhereTheTrialContinuesOrWhyItCannot) {
  ASSERT_EQ(Run({"resume", "42", "b"}), kExitOk);
  EXPECT_EQ(out_.str(),
            "resuming b of experiment 42 at step 4 from attempt 1's checkpoint /ckpt/step-3 on "
            "node n1\n");
  out_.str("");
  ASSERT_EQ(Run({"resume", "42", "copied"}), kExitOk);
  EXPECT_EQ(out_.str(),
            "resuming copied of experiment 42 at step 4 from attempt 1's checkpoint /ckpt/step-3 "
            "on node n1 (the controller has a copy: any node that can run it may continue it)\n");
  EXPECT_EQ(Run({"resume", "42", "running"}), kExitInvalidInput);
  EXPECT_EQ(err_.str(),
            "llmctl: cannot resume: trial 'running' is running; only a trial that has ended can "
            "be resumed\n");
  EXPECT_EQ(Run({"resume", "42", "nope"}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("has no trial 'nope'"), std::string::npos) << err_.str();
  EXPECT_EQ(Run({"resume", "42"}), kExitInvalidInput);
  EXPECT_EQ(Run({"resume", "0", "b"}), kExitInvalidInput);
}

// `llmctl lease ...` is controller/openstack's command with the words after "lease" and our
// environment: here none of the OS_* variables, so it refuses before any network call.
TEST_F(CommandsTest, LeaseHandsItsWordsAndEnvironmentToTheLeaseCommands) {
  EXPECT_EQ(Run({"lease", "list"}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("OS_AUTH_URL is not set"), std::string::npos) << err_.str();
}

TEST_F(CommandsTest, NodeHandsItsWordsAndEnvironmentToTheNodeCommands) {
  EXPECT_EQ(Run({"node", "list"}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("OS_AUTH_URL is not set"), std::string::npos) << err_.str();
  EXPECT_EQ(Run({"node", "up"}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("--lease is required"), std::string::npos) << err_.str();
}

TEST(ProvisionLeaseNameTest, IsADnsLabelFromTheExperimentAndFlavor) {
  EXPECT_EQ(ProvisionLeaseName("Single GPU", "g1.h100.pci.1"), "llmctl-single-gpu-g1-h100-pci-1");
  const std::string long_name = ProvisionLeaseName(std::string(80, 'x'), "g1.h100.pci.1");
  EXPECT_EQ(long_name.size(), 63u);
  EXPECT_EQ(ProvisionLeaseName(std::string(55, 'x') + "._", "f"),
            "llmctl-" + std::string(55, 'x'));  // no trailing '-'
}

TEST_F(CommandsTest, ATargetWithNoMatchingNodeSaysWhatToRunAndSubmitsNothing) {
  Write("gpu.yaml",
        "name: single\n"
        "target: {site: KVM@TACC, flavor: g1.h100.pci.1}\n"
        "model: llmctl-demo\n"
        "init: random\n"
        "tokenizer: node:/data/tokenizer.json\n"
        "data: {path: node:/data/synthetic.jsonl}\n");
  {
    std::lock_guard lock(fake_.mutex_);
    v1::NodeStatus* other = fake_.nodes_.add_nodes();  // a lease of another flavor
    other->set_name("a100");
    other->mutable_lease()->set_flavor("g1.a100.pci.1");
    other->mutable_lease()->set_site("KVM@TACC");
    other->mutable_lease()->set_ends_unix(4'000'000'000);
  }
  EXPECT_EQ(Run({"submit", (dir_ / "gpu.yaml").string()}), kExitFailed);
  EXPECT_NE(err_.str().find("no node of the controller's is on a lease of g1.h100.pci.1 at "
                            "KVM@TACC. `llmctl submit --provision`"),
            std::string::npos)
      << err_.str();
  EXPECT_NE(
      err_.str().find(
          "llmctl lease create --flavor g1.h100.pci.1 --name "
          "llmctl-single-g1-h100-pci-1 --duration 2h50m --wait --site KVM@TACC && llmctl node "
          "--site KVM@TACC up --lease llmctl-single-g1-h100-pci-1"),
      std::string::npos)
      << err_.str();
  {
    std::lock_guard lock(fake_.mutex_);
    EXPECT_FALSE(fake_.submitted_.has_value());
    v1::NodeStatus* node = fake_.nodes_.add_nodes();
    node->set_name("llmctl-single-g1-h100-pci-1");
    node->mutable_lease()->set_flavor("g1.h100.pci.1");
    node->mutable_lease()->set_site("KVM@TACC");
    node->mutable_lease()->set_ends_unix(4'000'000'000);
  }
  ASSERT_EQ(Run({"submit", (dir_ / "gpu.yaml").string()}), kExitOk) << err_.str();
  EXPECT_NE(err_.str().find("node llmctl-single-g1-h100-pci-1"), std::string::npos);
  std::lock_guard lock(fake_.mutex_);
  EXPECT_TRUE(fake_.submitted_.has_value());
}

// A bare-metal target names a node type (experiments/single-a100.yaml): a node whose lease
// reserved that type serves it, and without one the lease to make reserves hosts by node type.
TEST_F(CommandsTest, ABareMetalTargetNamesANodeType) {
  Write("a100.yaml",
        "name: single-a100\n"
        "target: {site: CHI@UC, node_type: compute_gigaio}\n"
        "model: llmctl-demo\n"
        "init: random\n"
        "tokenizer: node:/data/tokenizer.json\n"
        "data: {path: node:/data/synthetic.jsonl}\n");
  EXPECT_EQ(Run({"submit", (dir_ / "a100.yaml").string()}), kExitFailed);
  EXPECT_NE(err_.str().find(
                "llmctl lease create --node-type compute_gigaio --name "
                "llmctl-single-a100-compute-gigaio --duration 2h50m --wait --site CHI@UC && llmctl "
                "node --site CHI@UC up --lease llmctl-single-a100-compute-gigaio"),
            std::string::npos)
      << err_.str();
  {
    std::lock_guard lock(fake_.mutex_);
    v1::NodeStatus* node = fake_.nodes_.add_nodes();
    node->set_name("a100-node");
    node->mutable_lease()->set_flavor("compute_gigaio");
    node->mutable_lease()->set_site("CHI@UC");
    node->mutable_lease()->set_ends_unix(4'000'000'000);
  }
  ASSERT_EQ(Run({"submit", (dir_ / "a100.yaml").string()}), kExitOk) << err_.str();
  EXPECT_NE(err_.str().find("target compute_gigaio: node a100-node"), std::string::npos);

  Write("both.yaml",
        "name: both\n"
        "target: {site: CHI@UC, node_type: compute_gigaio, flavor: g1.h100.pci.1}\n"
        "model: llmctl-demo\n"
        "init: random\n"
        "tokenizer: node:/data/tokenizer.json\n"
        "data: {path: node:/data/synthetic.jsonl}\n");
  EXPECT_NE(Run({"submit", (dir_ / "both.yaml").string()}), kExitOk);
  EXPECT_NE(err_.str().find("a flavor (KVM sites) or a node_type (bare-metal sites)"),
            std::string::npos)
      << err_.str();
}

TEST_F(CommandsTest, NodesShowsWhyANodeIsUnusable) {
  const std::string reason =
      "node n1: NVIDIA driver 560.35.03 supports CUDA up to 12.6, but llm-train's LibTorch 2.15.0 "
      "was built for CUDA 13.2: use an image whose NVIDIA driver supports CUDA 13 (driver >= "
      "580.65.06), or an llm-train built with a LibTorch for CUDA 12.x";
  {
    std::lock_guard lock(fake_.mutex_);
    v1::NodeStatus* node = fake_.nodes_.add_nodes();
    node->set_name("n1");
    node->set_state("unusable");
    node->set_unusable(reason);
    v1::NodeStatus* fine = fake_.nodes_.add_nodes();
    fine->set_name("n2");
    fine->set_state("connected");
  }
  ASSERT_EQ(Run({"nodes"}), kExitOk) << err_.str();
  EXPECT_NE(out_.str().find("n1    unusable"), std::string::npos) << out_.str();
  EXPECT_TRUE(out_.str().ends_with("\n! " + reason + "\n")) << out_.str();
}

// A CPU probe of `threads` threads by `name`, taken 2026-11-29T01:00:00Z with LibTorch 2.15.0; its
// rates are the caller's.
estimate::RateProbe CpuProbe(const std::string& name, int threads) {
  estimate::RateProbe probe;
  probe.measured_at = "2026-11-29T01:00:00Z";
  probe.device = "cpu";
  probe.device_name = name;
  probe.threads = threads;
  probe.versions.libtorch = "2.15.0";
  return probe;
}

TEST_F(CommandsTest, NodesShowsEachNodesMeasuredRatesBesideTheDataSheet) {
  estimate::RateProbe probe = CpuProbe("Test CPU", 2);
  probe.matmul = {{"fp32", 512, 5e10}};
  probe.memory_bytes_per_s = 1.25e10;
  probe.launch_seconds = 4e-6;
  probe.adamw_8bit_values_per_s = 9e7;
  probe.nf4_dequant_values_per_s = 6e8;
  probe.dropout_values_per_s = 2.5e8;
  // bf16 attention one query past a block, between its 64 tokens' time and 96's.
  probe.sdpa = {{"bf16", 1e10, 64, 64}, {"bf16", 2e10, 128, 64}};
  probe.sdpa_partial_block = {{"bf16", 1e10, 65, 64}};
  // bf16 at new lengths 10 ms slower than at repeated ones: what a new length costs.
  probe.reference_steps = {{"fp32", 0.5, false}, {"bf16", 0.26, true}, {"bf16", 0.25, false}};
  {
    std::lock_guard lock(fake_.mutex_);
    v1::NodeStatus* measured = fake_.nodes_.add_nodes();
    measured->set_name("n1");
    measured->set_state("connected");
    measured->set_rate_probe_json(probe.ToJson().dump());
    fake_.nodes_.add_nodes()->set_name("n2");  // none measured yet: no line
  }
  ASSERT_EQ(Run({"nodes"}), kExitOk) << err_.str();
  const estimate::DeviceSpeed sheet = estimate::CpuSpeed();
  // The factors are rate_probe.h's arithmetic (estimate_rate_probe_test checks it); here, that
  // the line shows them.
  const estimate::DeviceSpeed probed = estimate::ProbedSpeed(sheet, probe, "");
  ASSERT_GT(probed.probed_fp32_factor, 0);
  ASSERT_GT(probed.probed_bf16_factor, 0);
  ASSERT_EQ(probed.fp32_new_length_seconds, 0);  // no fp32 step at new lengths
  ASSERT_GT(probed.bf16_new_length_seconds, 0);
  ASSERT_GT(probed.bf16_attention_block_share, 0);
  char expected[768];
  std::snprintf(expected, sizeof expected,
                "\nn1 rates: cpu Test CPU (2 threads, LibTorch 2.15.0), 2026-11-29T01:00:00Z: fp32 "
                "50 GFLOP/s (sheet %.3g), bf16 not measured (sheet %.3g), memory 12.5 GB/s (sheet "
                "%.3g), launch 4 us (sheet %.3g), 8-bit AdamW 90 M values/s (sheet %.3g), NF4 "
                "dequant 600 M values/s (sheet %.3g), dropout 250 M values/s (sheet %.3g), "
                "attention's partial query block at 0.00 (fp32), %.2f (bf16) of a whole one; its "
                "reference steps' factors fp32 %.3f, bf16 "
                "%.3f, a new length 0.00 ms (fp32), %.2f ms (bf16) a weight shape\n",
                sheet.fp32_flops / 1e9, sheet.bf16_flops / 1e9, sheet.memory_bytes_per_s / 1e9,
                sheet.launch_seconds / 1e-6, sheet.adamw_8bit_values_per_s / 1e6,
                sheet.nf4_dequant_values_per_s / 1e6, sheet.dropout_values_per_s / 1e6,
                probed.bf16_attention_block_share, probed.probed_fp32_factor,
                probed.probed_bf16_factor, probed.bf16_new_length_seconds * 1e3);
  EXPECT_TRUE(out_.str().ends_with(expected)) << out_.str();
  EXPECT_EQ(out_.str().find("n2 rates"), std::string::npos) << out_.str();
}

// With a configured controller, estimate times each trial at the rates of the controller's node
// that could run it (ListNodes) and calibrates with the controller's measured runs (TimedRuns):
// neither this machine's probe nor its embedded store, where none of those trials runs.
TEST_F(CommandsTest, EstimateTimesTrialsAtTheConfiguredControllersNodesAndRuns) {
  estimate::RateProbe probe = CpuProbe("Remote CPU", 16);
  probe.matmul = {{"fp32", 512, 4e11}, {"bf16", 512, 8e11}};
  probe.memory_bytes_per_s = 1e11;
  probe.launch_seconds = 2e-6;
  estimate::StepWork work;
  work.matmul_class = estimate::MatmulClass::kFp32;
  work.tokens = 1024;
  work.micro_batches = 1;
  work.matmul_flops = 1e12;
  work.memory_bytes = 1e9;
  work.launches = 1000;
  {
    std::lock_guard lock(fake_.mutex_);
    v1::NodeStatus* node = fake_.nodes_.add_nodes();
    node->set_name("remote-cpu");
    node->set_state("connected");
    node->set_rate_probe_json(probe.ToJson().dump());
    v1::TimedRun* run = fake_.timed_runs_.add_runs();
    run->set_prediction_json(
        nlohmann::json{{"peak_bytes", 1}, {"time_device", "cpu"}, {"work", work.ToJson()}}.dump());
    run->set_seconds_per_token(0.002);
    run->set_steps(5);
    // Another process's bytes: a time that is not one is no run.
    v1::TimedRun* broken = fake_.timed_runs_.add_runs();
    broken->set_prediction_json(run->prediction_json());
    broken->set_seconds_per_token(-1);
    broken->set_steps(5);
  }
  env_["LLMCTL_HOME"] = (dir_ / "home").string();
  ASSERT_EQ(
      Run({"estimate", "experiments/cpu-lab.yaml", "--trial", "bf16-true", "--format", "json"}),
      kExitOk)
      << err_.str();
  const nlohmann::json time = nlohmann::json::parse(out_.str())["trials"][0]["time"];
  EXPECT_TRUE(time["rates"].get<std::string>().starts_with(
      "node remote-cpu's probe (stored by the controller): cpu Remote CPU (16 threads"))
      << time["rates"];
  EXPECT_EQ(time["calibration"].get<std::string>(),
            "1 measured llama run on cpu (0 bf16, 1 fp32) in the controller at " + target_ +
                " (from LLMCTL_CONTROLLER)")
      << time["calibration"];
  EXPECT_EQ(err_.str(), "");
  EXPECT_FALSE(fs::exists(dir_ / "home")) << "nothing measured or read on this machine";

  // A controller from before TimedRuns: its nodes' rates, the built-in calibration, and a note
  // that says why.
  {
    std::lock_guard lock(fake_.mutex_);
    fake_.timed_runs_unimplemented_ = true;
  }
  ASSERT_EQ(
      Run({"estimate", "experiments/cpu-lab.yaml", "--trial", "bf16-true", "--format", "json"}),
      kExitOk)
      << err_.str();
  const nlohmann::json older = nlohmann::json::parse(out_.str())["trials"][0]["time"];
  EXPECT_TRUE(older["rates"].get<std::string>().starts_with("node remote-cpu's probe"));
  EXPECT_EQ(older["calibration"].get<std::string>().find("in the controller at"),
            std::string::npos);
  EXPECT_EQ(err_.str(), "note: the controller at " + target_ +
                            " (from LLMCTL_CONTROLLER) does not send its measured runs (it "
                            "predates TimedRuns; upgrade llmctld): the time is at the built-in "
                            "calibration\n");

  // A controller that does not answer: notes, and the data sheets' rates.
  const std::string nowhere = "unix:" + (dir_ / "nowhere.sock").string();
  ASSERT_EQ(
      Run({"estimate", "experiments/cpu-lab.yaml", "--trial", "bf16-true", "--format", "json"},
          nowhere),
      kExitOk)
      << err_.str();
  const nlohmann::json sheet = nlohmann::json::parse(out_.str())["trials"][0]["time"];
  EXPECT_FALSE(sheet.contains("rates")) << sheet;
  EXPECT_NE(err_.str().find("note: measured runs not read from the controller at " + nowhere +
                            " (from LLMCTL_CONTROLLER): "),
            std::string::npos)
      << err_.str();
  EXPECT_NE(err_.str().find("note: the nodes' rates not read from the controller at " + nowhere),
            std::string::npos)
      << err_.str();
}

std::vector<v1::ArtifactChunk> ArtifactChunks(const std::string& path, const std::string& bytes,
                                              const std::string& sha256) {
  v1::ArtifactChunk first, last;
  first.set_path(path);
  first.set_size(static_cast<int64_t>(bytes.size()));
  first.set_data(bytes.substr(0, 3));
  last.set_data(bytes.substr(3));
  last.set_sha256(sha256);
  last.set_last(true);
  return {first, last};
}

TEST_F(CommandsTest, FetchWritesVerifiedFilesAndRefusesBadOnes) {
  const std::string adapter = "adapter bytes";
  fake_.artifacts_ = ArtifactChunks("output/adapter/adapter_model.safetensors", adapter,
                                    digest::Sha256Hex(adapter));
  const std::vector<v1::ArtifactChunk> log =
      ArtifactChunks("events.jsonl", "{}\n{}\n", digest::Sha256Hex("{}\n{}\n"));
  fake_.artifacts_.insert(fake_.artifacts_.end(), log.begin(), log.end());
  const fs::path to = dir_ / "out";
  ASSERT_EQ(Run({"fetch", "42", "a", "--to", to.string()}), kExitOk) << err_.str();
  std::ifstream in(to / "output" / "adapter" / "adapter_model.safetensors");
  std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, adapter);
  EXPECT_TRUE(fs::exists(to / "events.jsonl"));

  fake_.artifacts_ = ArtifactChunks("bad.bin", adapter, digest::Sha256Hex("something else"));
  EXPECT_EQ(Run({"fetch", "42", "a", "--to", to.string()}), kExitFailed);
  EXPECT_NE(err_.str().find("bad.bin: 13 bytes with sha256"), std::string::npos);
  EXPECT_FALSE(fs::exists(to / "bad.bin"));
  EXPECT_FALSE(fs::exists(to / "bad.bin.part"));  // nothing half-written is left behind

  fake_.artifacts_ = ArtifactChunks("../escape.bin", adapter, digest::Sha256Hex(adapter));
  EXPECT_EQ(Run({"fetch", "42", "a", "--to", to.string()}), kExitFailed);
  EXPECT_FALSE(fs::exists(dir_ / "escape.bin"));
}

std::string Contents(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Every name the controller sends lies under output/ or is a top-level file of the run, and no
// link planted in the destination redirects a write: neither a directory on the way nor the
// ".part" file is followed.
TEST_F(CommandsTest, FetchWritesOnlyBelowItsDestinationWhateverIsPlantedThere) {
  const std::string adapter = "adapter bytes";
  const fs::path to = dir_ / "out";
  const fs::path victim = dir_ / "victim";
  fs::create_directories(to);
  fs::create_directories(victim);
  Write("victim/file", "untouched");

  fake_.artifacts_ = ArtifactChunks("input/data.jsonl", adapter, digest::Sha256Hex(adapter));
  EXPECT_EQ(Run({"fetch", "42", "a", "--to", to.string()}), kExitFailed);
  EXPECT_NE(err_.str().find("the controller sent artifact 'input/data.jsonl', which is not a "
                            "trial's artifact: a path outside the run's output/ directory"),
            std::string::npos)
      << err_.str();
  EXPECT_FALSE(fs::exists(to / "input"));

  // A planted .part link is replaced, not written through.
  fs::create_symlink(victim / "file", to / "events.jsonl.part");
  fake_.artifacts_ = ArtifactChunks("events.jsonl", adapter, digest::Sha256Hex(adapter));
  ASSERT_EQ(Run({"fetch", "42", "a", "--to", to.string()}), kExitOk) << err_.str();
  EXPECT_EQ(Contents(victim / "file"), "untouched");
  EXPECT_EQ(Contents(to / "events.jsonl"), adapter);
  EXPECT_FALSE(fs::is_symlink(to / "events.jsonl"));

  // A planted directory link on the way is refused.
  fs::create_directory_symlink(victim, to / "output");
  fake_.artifacts_ = ArtifactChunks("output/file", adapter, digest::Sha256Hex(adapter));
  EXPECT_EQ(Run({"fetch", "42", "a", "--to", to.string()}), kExitFailed);
  EXPECT_NE(err_.str().find((to / "output").string() +
                            ": a symbolic link; llmctl fetch writes "
                            "only into real directories below " +
                            to.string()),
            std::string::npos)
      << err_.str();
  EXPECT_EQ(Contents(victim / "file"), "untouched");
  EXPECT_FALSE(fs::exists(victim / "file.part"));
}

}  // namespace
}  // namespace llmctl::cli
