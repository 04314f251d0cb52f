// PrepareHubModel and hub models in RunTrial, through the agent's gRPC API (mutual TLS on a unix
// socket), against tests/fake_hub/fake_hub.py on 127.0.0.1 serving
// tests/fixtures/models/tiny-llama3 (config.json, tokenizer.json, a safetensors index and four LFS
// shards).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "agent/server.h"
#include "agent/stop_runs_test_support.h"
#include "common/files.h"
#include "common/http/http_client.h"
#include "common/model_config.h"
#include "llmctl/v1/agent.grpc.pb.h"
#include "rpc/tls.h"
#include "tests/support/server_process.h"
#include "tests/support/shell_command.h"

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;
namespace pb = llmctl::v1;

constexpr char kToken[] = "node1-token-0123456789";
constexpr char kHfToken[] = "hf_fake_secret_4f2a";
constexpr char kRepo[] = "llmctl/tiny-llama3";
constexpr char kFirstShard[] = "model-00001-of-00004.safetensors";
constexpr char kIndexFileName[] = "model.safetensors.index.json";

fs::path FixtureModel() { return testing::SourceDir() / "tests/fixtures/models/tiny-llama3"; }

std::string ReadAll(const fs::path& path) {
  auto text = ReadFileToString(path.string());
  return text.ok() ? *text : "";
}

class HubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("llmctl_hub_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
            std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const std::string model = FixtureModel().string();
    auto hub = testing::ServerProcess::StartPython(
        "tests/fake_hub/fake_hub.py",
        {"--repo",         std::string(kRepo) + "=" + model,
         "--repo",         "llmctl/bad-shard=" + model,
         "--wrong-sha256", "llmctl/bad-shard/model-00002-of-00004.safetensors",
         "--repo",         "llmctl/private=" + model,
         "--private",      "llmctl/private",
         "--token",        kHfToken,
         "--repo",         "llmctl/no-size=" + model,
         "--listed-size",  "llmctl/no-size/config.json=none",
         "--repo",         "llmctl/zero-size=" + model,
         "--listed-size",  "llmctl/zero-size/config.json=0",
         "--repo",         "llmctl/huge-size=" + model,
         "--listed-size",  "llmctl/huge-size/config.json=18446744073709551615"});
    ASSERT_TRUE(hub.ok()) << hub.status().ToString();
    hub_ = std::move(*hub);

    auto ca = rpc::CertificateAuthority::LoadOrCreate((dir_ / "ca").string());
    ASSERT_TRUE(ca.ok()) << ca.status().ToString();
    auto agent = (*ca)->Issue(rpc::AgentCertificateName("node1"), 1);
    auto controller = (*ca)->Issue(rpc::kControllerCertificateName, 1);
    ASSERT_TRUE(agent.ok() && controller.ok());
    agent_identity_ = {(*ca)->ca_certificate_pem(), agent->certificate_pem, agent->private_key_pem};
    controller_identity_ = {(*ca)->ca_certificate_pem(), controller->certificate_pem,
                            controller->private_key_pem};
  }

  void TearDown() override {
    server_.reset();
    test_support::StopRuns(dir_ / "data");  // a run a failed test left outlives the agent
    fs::remove_all(dir_);
  }

  // The agent as llm-agent's main makes it: hub options from HF_ENDPOINT and HF_TOKEN.
  void StartAgent(const std::string& hf_token = "",
                  int64_t cache_keep_free_bytes = kCacheKeepFreeBytes) {
    ::setenv("HF_ENDPOINT", (hub_->url() + "/").c_str(), 1);
    if (hf_token.empty()) {
      ::unsetenv("HF_TOKEN");
    } else {
      ::setenv("HF_TOKEN", hf_token.c_str(), 1);
    }
    AgentOptions options;
    options.listen = "unix:" + (dir_ / "agent.sock").string();
    options.data_dir = (dir_ / "data").string();
    options.node = "node1";
    options.identity = agent_identity_;
    options.token = kToken;
    options.llm_train = "/bin/true";
    options.supervisor_program = (testing::BuildDir() / "agent/llm-agent").string();
    options.hub = HubOptionsFromEnvironment();
    options.hub.http.sleep = [](std::chrono::milliseconds) {};  // retries without waiting
    options.hub.stall_timeout = stall_timeout_;
    options.cache_keep_free_bytes = cache_keep_free_bytes;
    auto server = AgentServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
  }

  std::unique_ptr<pb::Agent::Stub> Stub() {
    return pb::Agent::NewStub(rpc::Dial(server_->address(), rpc::AgentCertificateName("node1"),
                                        rpc::ChannelCredentials(controller_identity_, kToken)));
  }

  grpc::Status Prepare(const std::string& repo, const std::string& revision,
                       pb::PrepareHubModelResponse* response,
                       const std::vector<std::string>& files = {},
                       std::chrono::milliseconds deadline = std::chrono::seconds(120)) {
    pb::PrepareHubModelRequest request;
    request.set_repo(repo);
    request.set_revision(revision);
    for (const std::string& file : files) request.add_files(file);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + deadline);
    return Stub()->PrepareHubModel(&context, request, response);
  }

  grpc::Status RunTrial(const std::string& model, pb::RunState* state) {
    pb::RunTrialRequest request;
    request.mutable_key()->set_experiment_id(1);
    request.mutable_key()->set_trial("hub");
    request.mutable_key()->set_attempt(1);
    request.set_config_json(nlohmann::json{
        {"model", model}, {"init", "pretrained"}, {"data", {{"path", "unused.jsonl"}}}}
                                .dump());
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    return Stub()->RunTrial(&context, request, state);
  }

  // Follows the run's event stream until the agent says the run ended (its supervisor has written
  // the worker's exit and is gone).
  bool AwaitEnd(const pb::RunKey& key) {
    pb::StreamEventsRequest request;
    *request.mutable_key() = key;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    auto stub = Stub();
    auto reader = stub->StreamEvents(&context, request);
    bool ended = false;
    pb::StreamEventsResponse item;
    while (reader->Read(&item)) ended = ended || item.has_ended();
    return reader->Finish().ok() && ended;
  }

  nlohmann::json HubStats() {
    http::HttpClient client;
    http::Request request;
    request.url = hub_->url() + "/_stats";
    auto response = client.Send(request);
    EXPECT_TRUE(response.ok() && response->status == 200);
    return response.ok() ? nlohmann::json::parse(response->body) : nlohmann::json::object();
  }

  void HubControl(const std::string& path_and_query) {
    http::HttpClient client;
    http::Request request;
    request.method = "POST";
    request.url = hub_->url() + path_and_query;
    auto response = client.Send(request);
    ASSERT_TRUE(response.ok() && response->status == 204) << path_and_query;
  }

  // Sends bytes of kFirstShard's first transfer, then nothing; waits until some have arrived.
  void StallFirstShard() { HubControl(std::string("/_stall?file=") + kFirstShard + "&after=1000"); }
  int64_t BytesSent(const std::string& file) {
    const nlohmann::json stats = HubStats();
    return stats["bytes"].contains(file) ? stats["bytes"][file].get<int64_t>() : 0;
  }

  fs::path dir_;
  std::chrono::seconds stall_timeout_ = std::chrono::minutes(1);
  std::unique_ptr<testing::ServerProcess> hub_;
  rpc::TlsIdentity agent_identity_;
  rpc::TlsIdentity controller_identity_;
  std::unique_ptr<AgentServer> server_;
};

int64_t CdnRequests(const nlohmann::json& stats, const std::string& file) {
  int64_t count = 0;
  for (const auto& [path, n] : stats["requests"].items()) {
    if (path.starts_with("/cdn/") && path.ends_with("/" + file)) count += n.get<int64_t>();
  }
  return count;
}

TEST_F(HubTest, DownloadsTheDefaultFilesIntoAModelDirectoryThatLoads) {
  StartAgent();
  pb::PrepareHubModelResponse response;
  const grpc::Status status = Prepare(kRepo, "main", &response);
  ASSERT_TRUE(status.ok()) << status.error_message();

  const fs::path model_dir = response.path();
  EXPECT_EQ(model_dir.parent_path(), dir_ / "data/cache/hub/llmctl/tiny-llama3");
  const std::string commit = model_dir.filename().string();
  EXPECT_EQ(commit.size(), 40u);
  std::vector<std::string> files;
  int64_t bytes = 0;
  for (const auto& entry : fs::directory_iterator(model_dir)) {
    files.push_back(entry.path().filename().string());
    bytes += static_cast<int64_t>(entry.file_size());
    EXPECT_EQ(ReadAll(entry.path()), ReadAll(FixtureModel() / entry.path().filename()))
        << entry.path();
  }
  std::sort(files.begin(), files.end());
  // expected.safetensors is in the repository but is neither config, tokenizer nor indexed weights.
  EXPECT_EQ(files, (std::vector<std::string>{"config.json", "model-00001-of-00004.safetensors",
                                             "model-00002-of-00004.safetensors",
                                             "model-00003-of-00004.safetensors",
                                             "model-00004-of-00004.safetensors",
                                             "model.safetensors.index.json", "tokenizer.json"}));
  EXPECT_EQ(response.bytes(), bytes);
  StatusOr<ModelConfig> loaded = ResolveModel(model_dir.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(*loaded, *ResolveModel(FixtureModel().string()));
  // Nothing left behind in the cache's scratch space.
  EXPECT_TRUE(fs::is_empty(dir_ / "data/cache/tmp"));

  // Prepared models are reused: again by branch and by commit, with no file fetched twice.
  const nlohmann::json before = HubStats();
  pb::PrepareHubModelResponse again;
  ASSERT_TRUE(Prepare(kRepo, "main", &again).ok());
  EXPECT_EQ(again.path(), response.path());
  ASSERT_TRUE(Prepare(kRepo, commit, &again).ok());
  EXPECT_EQ(again.path(), response.path());
  EXPECT_EQ(HubStats()["bytes"], before["bytes"]);

  // A trial naming the model by hub reference runs from the prepared directory.
  pb::RunState state;
  const grpc::Status started = RunTrial(std::string("hf:") + kRepo, &state);
  ASSERT_TRUE(started.ok()) << started.error_message();
  const std::string trial_yaml = ReadAll(dir_ / "data/runs/1/hub/1/trial.yaml");
  EXPECT_NE(trial_yaml.find("model: " + model_dir.string()), std::string::npos) << trial_yaml;
  // The run's supervisor outlives this call; it must be done writing its files before TearDown
  // removes the directory under it.
  EXPECT_TRUE(AwaitEnd(state.key()));
}

TEST_F(HubTest, FilesThatDoNotFitAreRefusedBeforeTheirFirstByte) {
  // No filesystem has 2^62 bytes available: whatever the weights' size, they do not fit.
  StartAgent("", int64_t{1} << 62);
  pb::PrepareHubModelResponse response;
  const grpc::Status status = Prepare(kRepo, "main", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  // The first file it would fetch (config.json) is refused already.
  EXPECT_NE(status.error_message().find("Hugging Face model llmctl/tiny-llama3@"),
            std::string::npos)
      << status.error_message();
  EXPECT_NE(status.error_message().find("do not fit in " + (dir_ / "data/cache/tmp").string()),
            std::string::npos)
      << status.error_message();
  EXPECT_EQ(CdnRequests(HubStats(), kFirstShard), 0) << "no shard was asked for";
  EXPECT_FALSE(fs::exists(dir_ / "data/cache/hub/llmctl/tiny-llama3"));

  // The same node with room downloads it.
  server_.reset();
  StartAgent();
  EXPECT_TRUE(Prepare(kRepo, "main", &response).ok());
}

TEST_F(HubTest, WeightsThatDoNotFitTogetherAreRefusedBeforeTheFirstShard) {
  // The small files are there already; the four shards are summed and refused before any is asked
  // for.
  StartAgent();
  pb::PrepareHubModelResponse response;
  ASSERT_TRUE(
      Prepare(kRepo, "main", &response, {"config.json", "tokenizer.json", kIndexFileName}).ok());
  server_.reset();
  StartAgent("", int64_t{1} << 62);
  const grpc::Status status = Prepare(kRepo, "main", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_NE(status.error_message().find("downloading Hugging Face model llmctl/tiny-llama3@"),
            std::string::npos)
      << status.error_message();
  // 524,416 + 190,200 + 524,408 + 140,760 bytes.
  EXPECT_NE(status.error_message().find(": 1.32 MiB do not fit in "), std::string::npos)
      << status.error_message();
  EXPECT_EQ(CdnRequests(HubStats(), kFirstShard), 0) << "no shard was asked for";
}

TEST_F(HubTest, ExplicitFilesAreAddedToThePreparedDirectory) {
  StartAgent();
  pb::PrepareHubModelResponse response;
  ASSERT_TRUE(Prepare(kRepo, "main", &response, {"config.json"}).ok());
  EXPECT_TRUE(fs::exists(fs::path(response.path()) / "config.json"));
  EXPECT_FALSE(fs::exists(fs::path(response.path()) / "expected.safetensors"));
  const grpc::Status status = Prepare(kRepo, "main", &response, {"expected.safetensors"});
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(fs::exists(fs::path(response.path()) / "config.json"));
  EXPECT_EQ(ReadAll(fs::path(response.path()) / "expected.safetensors"),
            ReadAll(FixtureModel() / "expected.safetensors"));
  EXPECT_EQ(Prepare(kRepo, "main", &response, {"missing.bin"}).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(HubTest, ADroppedConnectionIsResumedWhereItStopped) {
  StartAgent();
  HubControl(std::string("/_drop?file=") + kFirstShard + "&after=200000");
  pb::PrepareHubModelResponse response;
  const grpc::Status status = Prepare(kRepo, "main", &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(ReadAll(fs::path(response.path()) / kFirstShard),
            ReadAll(FixtureModel() / kFirstShard));
  const nlohmann::json stats = HubStats();
  // Two transfers, and together exactly the file: the second began where the first broke off.
  EXPECT_EQ(CdnRequests(stats, kFirstShard), 2);
  EXPECT_EQ(stats["bytes"][kFirstShard].get<int64_t>(),
            static_cast<int64_t>(fs::file_size(FixtureModel() / kFirstShard)));
}

TEST_F(HubTest, AStalledTransferIsResumedAfterTheStallLimit) {
  // The CDN sends 1,000 bytes and then keeps the connection open for an hour, saying nothing.
  stall_timeout_ = std::chrono::seconds(1);
  StartAgent();
  StallFirstShard();
  pb::PrepareHubModelResponse response;
  const grpc::Status status = Prepare(kRepo, "main", &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(ReadAll(fs::path(response.path()) / kFirstShard),
            ReadAll(FixtureModel() / kFirstShard));
  EXPECT_EQ(CdnRequests(HubStats(), kFirstShard), 2);
}

TEST_F(HubTest, AControllerThatGivesUpEndsTheDownload) {
  // The stall limit is a minute: only the call's cancellation can end its stalled transfer
  // within the 20 s this test waits for the agent to close the connection.
  StartAgent();
  StallFirstShard();
  pb::PrepareHubModelResponse response;
  const grpc::Status abandoned = Prepare(kRepo, "main", &response, {}, std::chrono::seconds(3));
  ASSERT_EQ(abandoned.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << abandoned.error_message();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (HubStats()["abandoned"] == 0 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(HubStats()["abandoned"], 1) << "the agent went on with a download nobody waits for";
  // The next call resumes the partial file.
  const grpc::Status again = Prepare(kRepo, "main", &response, {}, std::chrono::seconds(30));
  ASSERT_TRUE(again.ok()) << again.error_message();
  EXPECT_EQ(ReadAll(fs::path(response.path()) / kFirstShard),
            ReadAll(FixtureModel() / kFirstShard));
  EXPECT_EQ(CdnRequests(HubStats(), kFirstShard), 2);
  HubControl("/_release");
}

TEST_F(HubTest, ACallerThatGivesUpAloneLeavesTheSharedDownloadToTheOthers) {
  stall_timeout_ = std::chrono::seconds(3);
  StartAgent();
  StallFirstShard();
  // The first call drives the download; the second joins it once the stall has begun.
  pb::PrepareHubModelResponse first_response;
  grpc::Status first;
  std::thread first_caller(
      [&] { first = Prepare(kRepo, "main", &first_response, {}, std::chrono::seconds(2)); });
  while (BytesSent(kFirstShard) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  pb::PrepareHubModelResponse response;
  const grpc::Status second = Prepare(kRepo, "main", &response, {}, std::chrono::seconds(60));
  first_caller.join();
  EXPECT_EQ(first.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << first.error_message();
  ASSERT_TRUE(second.ok()) << second.error_message();
  // One download: the stalled transfer and its resumption after the stall limit.
  EXPECT_EQ(CdnRequests(HubStats(), kFirstShard), 2);
  EXPECT_EQ(HubStats()["requests"]["/api/models/llmctl/tiny-llama3/revision/main"], 1);
  HubControl("/_release");
}

TEST_F(HubTest, AWrongSha256IsRefusedAndNothingIsMaterialised) {
  StartAgent();
  pb::PrepareHubModelResponse response;
  const grpc::Status status = Prepare("llmctl/bad-shard", "main", &response);
  ASSERT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS) << status.error_message();
  EXPECT_NE(status.error_message().find("model-00002-of-00004.safetensors has sha256 "),
            std::string::npos)
      << status.error_message();
  EXPECT_NE(status.error_message().find("the download was discarded"), std::string::npos);
  std::error_code error;
  EXPECT_FALSE(fs::exists(dir_ / "data/cache/hub/llmctl/bad-shard", error));
  EXPECT_TRUE(fs::is_empty(dir_ / "data/cache/tmp"));  // the bad bytes are not kept to resume

  pb::RunState state;
  const grpc::Status started = RunTrial("hf:llmctl/bad-shard", &state);
  EXPECT_EQ(started.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(started.error_message(),
            "model hf:llmctl/bad-shard@main not prepared on this node (PrepareHubModel "
            "downloads it)");
}

// A listed size caps the download: a file listed without one (or past INT64_MAX) is refused
// before any byte, and one listed as empty is not downloaded at all (the HTTP client takes a cap
// of 0 bytes as none, so the hub could have sent an endless body).
TEST_F(HubTest, AFileIsDownloadedOnlyUpToItsListedSize) {
  StartAgent();
  pb::PrepareHubModelResponse response;
  grpc::Status status = Prepare("llmctl/no-size", "main", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_NE(status.error_message().find("the hub's answer is not a model listing: config.json "
                                        "has no size (a non-negative integer)"),
            std::string::npos)
      << status.error_message();
  status = Prepare("llmctl/huge-size", "main", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_NE(status.error_message().find("config.json has no size"), std::string::npos)
      << status.error_message();

  status = Prepare("llmctl/zero-size", "main", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_NE(status.error_message().find("config.json has git blob id "), std::string::npos)
      << status.error_message();
  const nlohmann::json stats = HubStats();
  for (const auto& [path, count] : stats["requests"].items()) {
    EXPECT_FALSE(path.find("zero-size/resolve/") != std::string::npos &&
                 path.ends_with("/config.json"))
        << "requested " << path;
  }
  std::error_code error;
  EXPECT_FALSE(fs::exists(dir_ / "data/cache/hub/llmctl/zero-size", error));
}

TEST_F(HubTest, UnknownRepositoriesRevisionsAndBadRequestsAreClear) {
  StartAgent();
  pb::PrepareHubModelResponse response;
  grpc::Status status = Prepare("llmctl/no-such-model", "main", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(),
            "Hugging Face model llmctl/no-such-model not found at " + hub_->url() +
                " (a private or gated repository needs HF_TOKEN in the agent's environment)");
  status = Prepare(kRepo, "v9", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(),
            "revision 'v9' not found in Hugging Face model llmctl/tiny-llama3");
  status = Prepare("no-org", "main", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("'no-org' is not a Hugging Face repository id"),
            std::string::npos);
  status = Prepare(kRepo, "main", &response, {"../etc/passwd"});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // A private repository without a token is indistinguishable from a missing one.
  EXPECT_EQ(Prepare("llmctl/private", "main", &response).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(HubTest, TheTokenIsSentWhenSetAndNeverShown) {
  StartAgent(kHfToken);
  pb::PrepareHubModelResponse response;
  grpc::Status status = Prepare("llmctl/private", "main", &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const nlohmann::json stats = HubStats();
  ASSERT_FALSE(stats["authorization"].empty());
  for (const auto& header : stats["authorization"]) {
    EXPECT_EQ(header, std::string("Bearer ") + kHfToken);
  }
  status = Prepare("llmctl/no-such-model", "main", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message().find(kHfToken), std::string::npos);
}

TEST_F(HubTest, ConcurrentCallsShareOneDownload) {
  StartAgent();
  HubControl("/_delay?ms=300");  // the listing is slow, so the calls overlap
  constexpr int kCalls = 4;
  std::vector<pb::PrepareHubModelResponse> responses(kCalls);
  std::vector<grpc::Status> statuses(kCalls);
  std::vector<std::thread> callers;
  for (int i = 0; i < kCalls; ++i) {
    callers.emplace_back([&, i] { statuses[i] = Prepare(kRepo, "main", &responses[i]); });
  }
  for (std::thread& caller : callers) caller.join();
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(statuses[i].ok()) << statuses[i].error_message();
    EXPECT_EQ(responses[i].path(), responses[0].path());
  }
  const nlohmann::json stats = HubStats();
  EXPECT_EQ(stats["requests"]["/api/models/llmctl/tiny-llama3/revision/main"], 1);
  for (const char* shard :
       {"model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
        "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors"}) {
    EXPECT_EQ(CdnRequests(stats, shard), 1) << shard;
  }
}

}  // namespace
}  // namespace llmctl::agent
