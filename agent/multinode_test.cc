// One node's share of a multi-node trial (RunTrialRequest.node_group): two agents in one test,
// each with its own data directory, on unix sockets; a shell script standing in for llm-train, and
// the real llm-train's ranks meeting over loopback when it has been built.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "agent/agent_test_support.h"
#include "agent/server.h"
#include "common/experiment.h"
#include "common/version.h"
#include "llmctl/v1/agent.grpc.pb.h"
#include "rpc/tls.h"
#include "tests/support/one_thread_per_process.h"

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;
namespace pb = llmctl::v1;
using namespace test_support;  // NOLINT(build/namespaces): the tests' shared vocabulary

// The port the stand-in's node rank 0 "binds" for the rendezvous.
constexpr int kFakePort = 29555;

// Stands in for llm-train's launcher and its ranks, as the agent starts it for a node group:
// --nproc N --nnodes M --node-rank K --master-addr A --master-port P --ranks-file F. Its arguments
// go to `argv` in the run directory, one a line, and GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME
// ("unset" when unset) to `ifname`. It writes F (with master_port kFakePort when P is
// 0), then start and two steps in each of its global ranks' event files (K x N + l, with "rank").
// The trial's seed says what comes next: 0 finishes ok; 1 exits 1 before F is written; 300 waits
// for a file named `go` in the run directory, then two more steps and ok; 301 waits for `port-go`
// before it writes F, then finishes ok; 500+C: its last rank fails first with exit code C (its
// result says out of memory), as F then records.
constexpr char kFakeTrainerRuns[] = R"sh(config="$2"
events="$4"
run="${events%/*}"
printf '%s\n' "$@" > "$run/argv"
printf '%s\n' "${GLOO_SOCKET_IFNAME-unset}" "${NCCL_SOCKET_IFNAME-unset}" > "$run/ifname"
seed=$(sed -n 's/^seed: *//p' "$config")
nproc=1; nnodes=1; node_rank=0; port=0; ranks_file=; prev=
for arg in "$@"; do
  case "$prev" in
    --nproc) nproc=$arg ;; --nnodes) nnodes=$arg ;; --node-rank) node_rank=$arg ;;
    --master-port) port=$arg ;; --ranks-file) ranks_file=$arg ;;
  esac
  prev=$arg
done
first=$((node_rank * nproc))
last=$((first + nproc - 1))
[ "$port" -eq 0 ] && port=29555
file() { if [ "$1" -eq 0 ]; then echo "$events"; else echo "${events%.jsonl}.rank$1.jsonl"; fi; }
emit() {
  r=$first
  while [ "$r" -le "$last" ]; do
    printf '%s\n' "$1" | sed "s/^{/{\"rank\":$r,/" >> "$(file "$r")"
    r=$((r + 1))
  done
}
record() {
  [ -n "$ranks_file" ] || return 0
  printf '{"world_size":%d,"master_port":%d,"nnodes":%d,"node_rank":%d,"nproc_per_node":%d,"pids":[]%s}\n' \
    $((nnodes * nproc)) "$port" "$nnodes" "$node_rank" "$nproc" "$1" > "$ranks_file.tmp"
  mv "$ranks_file.tmp" "$ranks_file"
}
[ "$seed" -eq 1 ] && exit 1
if [ "$seed" -eq 301 ]; then while [ ! -e "$run/port-go" ]; do sleep 0.02; done; fi
record ""
emit '{"type":"start","total_steps":4}'
emit '{"type":"step","step":1}'
emit '{"type":"step","step":2}'
if [ "$seed" -ge 500 ]; then
  printf '%s\n' '{"type":"result","outcome":"oom","error":"out of memory at step 2"}' >> "$(file "$last")"
  record ",\"first_failure\":{\"rank\":$last,\"exit_code\":$((seed - 500))}"
  echo "llm-train: rank $last of $((nnodes * nproc)) failed; the other ranks were stopped" >&2
  exit $((seed - 500))
fi
if [ "$seed" -eq 300 ]; then
  while [ ! -e "$run/go" ]; do sleep 0.02; done
  emit '{"type":"step","step":3}'
  emit '{"type":"step","step":4}'
fi
emit '{"type":"result","outcome":"ok","error":""}'
)sh";

class MultiNodeTest : public ::testing::Test {
 protected:
  static constexpr int kNodes = 2;

  void SetUp() override {
    dir_ = FreshTestDir("llmctl_multinode");
    auto ca = rpc::CertificateAuthority::LoadOrCreate((dir_ / "ca").string());
    ASSERT_TRUE(ca.ok()) << ca.status().ToString();
    auto controller = (*ca)->Issue(rpc::kControllerCertificateName, 1);
    ASSERT_TRUE(controller.ok());
    controller_identity_ = {(*ca)->ca_certificate_pem(), controller->certificate_pem,
                            controller->private_key_pem};
    for (int node = 0; node < kNodes; ++node) {
      auto agent = (*ca)->Issue(rpc::AgentCertificateName(NodeName(node)), 1);
      ASSERT_TRUE(agent.ok());
      agent_identities_[node] = {(*ca)->ca_certificate_pem(), agent->certificate_pem,
                                 agent->private_key_pem};
    }
    fake_trainer_ = (dir_ / "fake-llm-train").string();
    // Its --version (the agent's probe) says this llmctl's version, so the node takes trials.
    WriteFile(fake_trainer_,
              std::string("#!/bin/sh\nif [ \"$1\" = --version ]; then\n  echo '{\"llmctl\": \"")
                  .append(kVersion)
                  .append("\", \"libtorch\": \"2.15.0\", \"libtorch_cuda\": \"\", "
                          "\"cuda_devices\": 0}'; exit 0\nfi\n")
                  .append(kFakeTrainerRuns),
              fs::perms::owner_all);
    supervisor_ = BuildDir() + "/agent/llm-agent";
    ASSERT_TRUE(fs::exists(supervisor_)) << supervisor_ << " is built with agent_multinode_test";
  }

  void TearDown() override {
    for (auto& server : servers_) server.reset();
    // As AgentTest's: the runs' supervisors and workers (the real llm-train's ranks too) outlive
    // their agents by design, and a test that failed midway left them running.
    for (int node = 0; node < kNodes; ++node) StopRuns(DataDir(node));
    fs::remove_all(dir_);
  }

  static std::string NodeName(int node) { return "node" + std::to_string(node); }
  std::string Address(int node) const {
    return "unix:" + (dir_ / (NodeName(node) + ".sock")).string();
  }
  fs::path DataDir(int node) const { return dir_ / NodeName(node); }

  // Starts (or, after a stop, restarts) node `node`'s agent in this process; its runs' workers
  // outlive a stop, and a restart re-adopts them.
  void StartAgent(int node, const std::string& llm_train = "") {
    AgentOptions options;
    options.listen = Address(node);
    options.data_dir = DataDir(node).string();
    options.node = NodeName(node);
    options.identity = agent_identities_[node];
    options.token = kToken;
    options.llm_train = llm_train.empty() ? fake_trainer_ : llm_train;
    options.supervisor_program = supervisor_;
    options.cancel_grace = std::chrono::milliseconds(300);
    options.poll_interval = std::chrono::milliseconds(20);
    auto server = AgentServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    servers_[node] = std::move(*server);
  }

  std::unique_ptr<pb::Agent::Stub> Stub(int node) {
    return pb::Agent::NewStub(rpc::Dial(Address(node), rpc::AgentCertificateName(NodeName(node)),
                                        rpc::ChannelCredentials(controller_identity_, kToken)));
  }

  fs::path RunDir(int node, const pb::RunKey& key) const {
    return DataDir(node) / "runs" / std::to_string(key.experiment_id()) / key.trial() /
           std::to_string(key.attempt());
  }

  // A RunTrial request for node rank `node_rank` of `nodes` with the stand-in's `seed` as a ddp
  // trial of `devices` devices on each node.
  static pb::RunTrialRequest FakeRequest(const pb::RunKey& key, int seed, int devices, int nodes,
                                         int node_rank, const std::string& master_addr = "",
                                         int master_port = 0) {
    pb::RunTrialRequest request;
    *request.mutable_key() = key;
    request.set_config_json(nlohmann::json{{"seed", seed},
                                           {"strategy", "ddp"},
                                           {"devices", devices},
                                           {"nodes", nodes},
                                           {"data", {{"path", "unused.jsonl"}}}}
                                .dump());
    for (int i = 0; i < devices; ++i) request.add_device_indices(i);
    pb::NodeGroup* group = request.mutable_node_group();
    group->set_node_rank(node_rank);
    group->set_nodes(nodes);
    group->set_master_addr(master_addr);
    group->set_master_port(master_port);
    return request;
  }

  grpc::Status RunTrial(int node, const pb::RunTrialRequest& request, pb::RunState* state) {
    grpc::ClientContext context;
    Deadline(&context);
    return Stub(node)->RunTrial(&context, request, state);
  }

  pb::RunState MustRunTrial(int node, const pb::RunTrialRequest& request) {
    pb::RunState state;
    const grpc::Status status = RunTrial(node, request, &state);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return state;
  }

  Streamed Stream(int node, const pb::RunKey& key, int64_t from_seq = 0,
                  size_t max_events = SIZE_MAX, const std::map<int, int64_t>& from_rank_seq = {}) {
    return StreamRun(*Stub(node), key, from_seq, max_events, from_rank_seq);
  }

  pb::RunState Cancel(int node, const pb::RunKey& key) {
    pb::CancelRunRequest request;
    *request.mutable_key() = key;
    grpc::ClientContext context;
    Deadline(&context);
    pb::RunState state;
    const grpc::Status status = Stub(node)->CancelRun(&context, request, &state);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return state;
  }

  std::vector<std::string> Argv(int node, const pb::RunKey& key) const {
    return Lines(ReadAll(RunDir(node, key) / "argv"));
  }

  // The flag's value in `argv`; "" when absent.
  static std::string Flag(const std::vector<std::string>& argv, const std::string& flag) {
    const auto it = std::find(argv.begin(), argv.end(), flag);
    return it == argv.end() || it + 1 == argv.end() ? "" : *(it + 1);
  }

  fs::path dir_;
  rpc::TlsIdentity controller_identity_;
  std::array<rpc::TlsIdentity, kNodes> agent_identities_;
  std::string fake_trainer_;
  std::string supervisor_;
  std::array<std::unique_ptr<AgentServer>, kNodes> servers_;
};

TEST_F(MultiNodeTest, ABadNodeGroupIsInvalidArgumentNamingTheField) {
  StartAgent(0);
  const pb::RunKey key = Key(1, "bad", 1);
  pb::RunTrialRequest three_nodes = FakeRequest(key, 0, 1, /*nodes=*/2, 0);
  three_nodes.mutable_node_group()->set_nodes(3);
  const std::vector<std::pair<pb::RunTrialRequest, std::string>> cases = {
      {three_nodes, "node_group.nodes: 3 is not the trial's nodes (2)"},
      {FakeRequest(key, 0, 1, 2, /*node_rank=*/2, "127.0.0.1", 1), "node_group.node_rank: 2"},
      {FakeRequest(key, 0, 1, 2, -1, "127.0.0.1", 1), "node_group.node_rank: -1"},
      {FakeRequest(key, 0, 1, 2, 0, "", /*master_port=*/29500), "node_group.master_port"},
      {FakeRequest(key, 0, 1, 2, 1, "", 29500), "node_group.master_addr"},
      {FakeRequest(key, 0, 1, 2, 1, "127.0.0.1", 0), "node_group.master_port"},
      {FakeRequest(key, 0, 1, 2, 1, "127.0.0.1", 65536), "node_group.master_port"},
  };
  for (const auto& [request, expected] : cases) {
    pb::RunState state;
    const grpc::Status status = RunTrial(0, request, &state);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << expected;
    EXPECT_NE(status.error_message().find(expected), std::string::npos) << status.error_message();
  }
  EXPECT_FALSE(fs::exists(RunDir(0, key))) << "a refused run leaves no directory";

  // nodes 1 (or no group): a trial on this node alone, as before node groups, whatever else the
  // group says.
  pb::RunTrialRequest alone = FakeRequest(key, 0, 1, /*nodes=*/1, /*node_rank=*/5, "", 7);
  alone.mutable_node_group()->set_nodes(1);
  const pb::RunState state = MustRunTrial(0, alone);
  EXPECT_EQ(state.master_port(), 0);
  ASSERT_TRUE(Stream(0, key).ended.has_value());
  EXPECT_EQ(Flag(Argv(0, key), "--nnodes"), "");
  EXPECT_EQ(Flag(Argv(0, key), "--nproc"), "");
}

// Two nodes of two ranks each: node 0's launcher binds the port (RunState.master_port), node 1's
// gets it; each node's agent streams its own ranks by their global numbers, lists their files as
// artifacts, and only node 0 counts rank 0's lines.
TEST_F(MultiNodeTest, EachNodeRunsAndStreamsItsOwnGlobalRanks) {
  StartAgent(0);
  StartAgent(1);
  const pb::RunKey key = Key(2, "ddp", 1);
  const pb::RunState first = MustRunTrial(0, FakeRequest(key, 0, 2, 2, 0));
  EXPECT_EQ(first.master_port(), kFakePort);
  const pb::RunState second =
      MustRunTrial(1, FakeRequest(key, 0, 2, 2, 1, "127.0.0.1", first.master_port()));
  EXPECT_EQ(second.master_port(), 0) << "only node rank 0 reports a port";

  const Streamed streamed0 = Stream(0, key);
  ASSERT_TRUE(streamed0.ended.has_value());
  EXPECT_EQ(streamed0.ended->outcome(), "ok") << streamed0.ended->error();
  ASSERT_EQ(streamed0.events.size(), 8u);
  ExpectSameAsFile(OfRank(streamed0.events, 0), RunDir(0, key) / "events.jsonl");
  ExpectSameAsFile(OfRank(streamed0.events, 1), RunDir(0, key) / "events.rank1.jsonl");
  const Streamed streamed1 = Stream(1, key);
  ASSERT_TRUE(streamed1.ended.has_value());
  EXPECT_EQ(streamed1.ended->outcome(), "ok") << streamed1.ended->error();
  ASSERT_EQ(streamed1.events.size(), 8u);
  EXPECT_FALSE(fs::exists(RunDir(1, key) / "events.jsonl"));
  for (int rank : {2, 3}) {
    const std::vector<pb::TrialEvent> events = OfRank(streamed1.events, rank);
    ExpectSameAsFile(events, RunDir(1, key) / RankEventsFile(rank));
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(nlohmann::json::parse(events.front().json()).value("rank", -1), rank);
  }

  // Written by the stand-ins, which have ended.
  const std::vector<std::string> argv0 = Argv(0, key);
  EXPECT_EQ(Flag(argv0, "--nproc"), "2");
  EXPECT_EQ(Flag(argv0, "--nnodes"), "2");
  EXPECT_EQ(Flag(argv0, "--node-rank"), "0");
  EXPECT_EQ(Flag(argv0, "--master-addr"), "127.0.0.1");
  EXPECT_EQ(Flag(argv0, "--master-port"), "0");
  EXPECT_EQ(Flag(argv0, "--ranks-file"), (RunDir(0, key) / "ranks.json").string());
  const std::vector<std::string> argv1 = Argv(1, key);
  EXPECT_EQ(Flag(argv1, "--node-rank"), "1");
  EXPECT_EQ(Flag(argv1, "--master-addr"), "127.0.0.1");
  EXPECT_EQ(Flag(argv1, "--master-port"), std::to_string(kFakePort));
  EXPECT_EQ(Flag(argv1, "--events"), (RunDir(1, key) / "events.jsonl").string());
  // Node 1 reaches node rank 0 at 127.0.0.1: its ranks talk over loopback. Node 0 was given no
  // address here (the controller gives it its own), so the backends choose.
  EXPECT_EQ(ReadAll(RunDir(1, key) / "ifname"), "lo\nlo\n");
  EXPECT_EQ(ReadAll(RunDir(0, key) / "ifname"), "unset\nunset\n");

  // Node 1 resumes its ranks by their global numbers: from_seq (rank 0's) and other nodes' ranks
  // do not apply to it.
  const Streamed rest = Stream(1, key, /*from_seq=*/3, SIZE_MAX, {{3, 2}, {1, 4}});
  ASSERT_TRUE(rest.ended.has_value());
  ExpectSameAsFile(OfRank(rest.events, 2), RunDir(1, key) / "events.rank2.jsonl");
  ExpectSameAsFile(OfRank(rest.events, 3), RunDir(1, key) / "events.rank3.jsonl", 2);
  EXPECT_EQ(rest.events.size(), 7u);

  // A repeated RunTrial is the same run with the same port; ListRuns reports them too.
  EXPECT_EQ(MustRunTrial(0, FakeRequest(key, 0, 2, 2, 0)).master_port(), kFakePort);
  for (int node = 0; node < kNodes; ++node) {
    grpc::ClientContext context;
    Deadline(&context);
    pb::ListRunsResponse runs;
    ASSERT_TRUE(Stub(node)->ListRuns(&context, {}, &runs).ok());
    ASSERT_EQ(runs.runs_size(), 1);
    EXPECT_EQ(runs.runs(0).master_port(), node == 0 ? kFakePort : 0);
    EXPECT_EQ(runs.runs(0).last_seq(), node == 0 ? 4 : 0) << "rank 0's lines";
  }

  pb::FetchArtifactsRequest fetch;
  *fetch.mutable_key() = key;
  grpc::ClientContext context;
  Deadline(&context);
  auto stub = Stub(1);
  auto reader = stub->FetchArtifacts(&context, fetch);
  std::vector<std::string> paths;
  pb::ArtifactChunk chunk;
  while (reader->Read(&chunk)) {
    if (!chunk.path().empty()) paths.push_back(chunk.path());
  }
  ASSERT_TRUE(reader->Finish().ok());
  for (const char* path : {"events.rank2.jsonl", "events.rank3.jsonl", "ranks.json"}) {
    EXPECT_NE(std::find(paths.begin(), paths.end(), path), paths.end()) << path;
  }
  EXPECT_EQ(std::find(paths.begin(), paths.end(), "events.jsonl"), paths.end());
}

// Node rank 0's RunTrial answers once its launcher has recorded the port, not before; a run that
// ends without one answers with port 0.
TEST_F(MultiNodeTest, NodeRankZeroAnswersOnceItsRendezvousPortIsKnown) {
  StartAgent(0);
  const pb::RunKey key = Key(3, "port", 1);
  std::future<pb::RunState> started = std::async(
      std::launch::async, [&] { return MustRunTrial(0, FakeRequest(key, 301, 1, 2, 0)); });
  // The stand-in is running and waits for port-go before it writes the port.
  while (!fs::exists(RunDir(0, key) / "argv")) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(started.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "RunTrial answered before the port was known";
  WriteFile(RunDir(0, key) / "port-go", "", fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(started.get().master_port(), kFakePort);
  ASSERT_TRUE(Stream(0, key).ended.has_value());

  const pb::RunKey failed = Key(3, "no-port", 1);
  const pb::RunState state = MustRunTrial(0, FakeRequest(failed, 1, 1, 2, 0));
  EXPECT_EQ(state.status(), pb::RUN_STATUS_ENDED);
  EXPECT_EQ(state.ended().outcome(), "failed");
  EXPECT_EQ(state.master_port(), 0);
}

// The run's place in its node group is the run directory's: after an agent restart node 1 still
// streams its global ranks from where the client left off, none lost or repeated, and the first
// failed rank is named by its global number of the global world.
TEST_F(MultiNodeTest, ARestartedAgentKeepsItsRunsNodeGroup) {
  StartAgent(1);
  const pb::RunKey key = Key(4, "survivor", 1);
  MustRunTrial(1, FakeRequest(key, 300, 2, 2, 1, "127.0.0.1", kFakePort));
  const pb::RunKey oom = Key(4, "oom", 1);
  MustRunTrial(1, FakeRequest(oom, 503, 2, 2, 1, "127.0.0.1", kFakePort));
  const Streamed oom_streamed = Stream(1, oom);
  ASSERT_TRUE(oom_streamed.ended.has_value());
  EXPECT_EQ(oom_streamed.ended->outcome(), "oom");
  EXPECT_EQ(oom_streamed.ended->exit_code(), 3);
  EXPECT_EQ(oom_streamed.ended->error(), "rank 3 of 4: out of memory at step 2");
  // Some of the 6 events written before `go`, of either rank.
  const Streamed before = Stream(1, key, 0, 4);
  ASSERT_EQ(before.events.size(), 4u);

  servers_[1].reset();
  fs::remove(RunDir(1, oom) / "ended.json");  // decided again from the run's files
  StartAgent(1);
  WriteFile(RunDir(1, key) / "go", "", fs::perms::owner_read | fs::perms::owner_write);
  std::map<int, int64_t> next = {{2, 1}, {3, 1}};
  for (const pb::TrialEvent& event : before.events) next[event.rank()] = event.seq() + 1;
  const Streamed after = Stream(1, key, 0, SIZE_MAX, next);
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  ASSERT_TRUE(after.ended.has_value());
  EXPECT_EQ(after.ended->outcome(), "ok") << after.ended->error();
  std::vector<pb::TrialEvent> all = before.events;
  all.insert(all.end(), after.events.begin(), after.events.end());
  ExpectSameAsFile(OfRank(all, 2), RunDir(1, key) / "events.rank2.jsonl");
  ExpectSameAsFile(OfRank(all, 3), RunDir(1, key) / "events.rank3.jsonl");
  EXPECT_EQ(all.size(), 12u);

  const Streamed again = Stream(1, oom);
  ASSERT_TRUE(again.ended.has_value());
  EXPECT_EQ(again.ended->error(), "rank 3 of 4: out of memory at step 2");
}

// The demo trial by the real trainer as ddp over two nodes of one CPU rank each, the nodes' agents
// and ranks meeting over loopback.
class RealTrainerMultiNodeTest : public MultiNodeTest {
 protected:
  void SetUp() override {
    MultiNodeTest::SetUp();
    llm_train_ = BuildDir() + "/trainer/llm-train";
    if (!fs::exists(llm_train_)) GTEST_SKIP() << llm_train_ << " is not built";
    auto experiment =
        LoadExperimentFile((llmctl::testing::SourceDir() / "experiments/demo.yaml").string());
    ASSERT_TRUE(experiment.ok()) << experiment.status().ToString();
    config_ = experiment->trials.front().config;
    for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{
             {"strategy", "ddp"}, {"devices", "1"}, {"nodes", "2"}}) {
      ASSERT_TRUE(config_.SetFromText(name, value).ok()) << name;
    }
    StartAgent(0, llm_train_);
    StartAgent(1, llm_train_);
  }

  // Uploads the inputs to `node` and starts its share of the trial, or (nodes 1 in `config`) the
  // whole trial on it.
  pb::RunState Start(int node, const pb::RunKey& key, const TrialConfig& config,
                     int master_port = 0) {
    pb::RunTrialRequest request;
    *request.mutable_key() = key;
    request.set_config_json(config.ToJson().dump());
    for (int i = 0; i < config.GetInt("devices"); ++i) request.add_device_indices(i);
    if (config.GetInt("nodes") > 1) {
      pb::NodeGroup* group = request.mutable_node_group();
      group->set_node_rank(node);
      group->set_nodes(static_cast<int32_t>(config.GetInt("nodes")));
      if (node > 0) {
        group->set_master_addr("127.0.0.1");
        group->set_master_port(master_port);
      }
    }
    UploadInputs(*Stub(node), config, &request);
    return MustRunTrial(node, request);
  }

  // Starts both nodes' shares of `key`: node 0 first, node 1 with node 0's port.
  void StartBoth(const pb::RunKey& key) {
    const pb::RunState first = Start(0, key, config_);
    ASSERT_GT(first.master_port(), 0) << ReadAll(RunDir(0, key) / "stderr.log");
    Start(1, key, config_, first.master_port());
  }

  // Streams until rank `rank`'s first step: the job is under way.
  void StreamUntilAStep(int node, const pb::RunKey& key, int rank) {
    pb::StreamEventsRequest request;
    *request.mutable_key() = key;
    grpc::ClientContext context;
    Deadline(&context);
    auto stub = Stub(node);
    auto reader = stub->StreamEvents(&context, request);
    pb::StreamEventsResponse item;
    while (reader->Read(&item)) {
      ASSERT_FALSE(item.has_ended()) << item.ended().error();
      if (item.has_event() && item.event().rank() == rank && item.event().type() == "step") break;
    }
    context.TryCancel();
    reader->Finish();
  }

  std::string llm_train_;
  TrialConfig config_;
};

// Both nodes end ok, each streaming its own rank; the ranks report the same losses (the reported
// loss is summed over every rank), and the same as one node's two ranks of the same trial. Node 1's
// agent restarts mid-run and its stream goes on from where it was, nothing lost or repeated.
TEST_F(RealTrainerMultiNodeTest, TwoNodesOfOneRankTrainLikeOneNodeOfTwo) {
  // Losses compared bit for bit: a rank's threads must not follow its node's share of the CPUs (one
  // rank a node gets both, two on one node one each) nor MKL's choice.
  const llmctl::testing::OneThreadPerProcess one_thread;
  ASSERT_TRUE(config_.SetFromText("train.max_steps", "3").ok());
  const pb::RunKey key = Key(9, "two-nodes", 1);
  ASSERT_NO_FATAL_FAILURE(StartBoth(key));
  const Streamed before = Stream(1, key, 0, 1);
  ASSERT_EQ(before.events.size(), 1u);
  servers_[1].reset();
  ASSERT_NO_FATAL_FAILURE(StartAgent(1, llm_train_));
  const Streamed after = Stream(1, key, 0, SIZE_MAX, {{1, before.events.back().seq() + 1}});
  ASSERT_TRUE(after.ended.has_value());
  EXPECT_EQ(after.ended->outcome(), "ok") << after.ended->error() << "\n"
                                          << ReadAll(RunDir(1, key) / "stderr.log");
  std::vector<pb::TrialEvent> node1 = before.events;
  node1.insert(node1.end(), after.events.begin(), after.events.end());
  EXPECT_EQ(OfRank(node1, 1).size(), node1.size()) << "node 1 has rank 1 only";
  ExpectSameAsFile(node1, RunDir(1, key) / "events.rank1.jsonl");
  EXPECT_EQ(node1.front().type(), "start");
  EXPECT_EQ(nlohmann::json::parse(node1.front().json()).value("rank", -1), 1);
  EXPECT_EQ(node1.back().type(), "result");

  const Streamed node0 = Stream(0, key);
  ASSERT_TRUE(node0.ended.has_value());
  EXPECT_EQ(node0.ended->outcome(), "ok") << node0.ended->error() << "\n"
                                          << ReadAll(RunDir(0, key) / "stderr.log");
  EXPECT_EQ(OfRank(node0.events, 0).size(), node0.events.size()) << "node 0 has rank 0 only";
  ExpectSameAsFile(node0.events, RunDir(0, key) / "events.jsonl");
  const nlohmann::json ranks = nlohmann::json::parse(ReadAll(RunDir(0, key) / "ranks.json"));
  EXPECT_EQ(ranks.value("world_size", 0), 2);

  const std::map<int64_t, double> losses = Losses(node0.events, 0);
  EXPECT_EQ(losses.size(), 3u);
  EXPECT_EQ(Losses(node1, 1), losses);

  TrialConfig one_node = config_;
  ASSERT_TRUE(one_node.SetFromText("nodes", "1").ok());
  ASSERT_TRUE(one_node.SetFromText("devices", "2").ok());
  const pb::RunKey single = Key(9, "one-node", 1);
  Start(0, single, one_node);
  const Streamed both = Stream(0, single);
  ASSERT_TRUE(both.ended.has_value());
  EXPECT_EQ(both.ended->outcome(), "ok") << both.ended->error();
  for (int rank : {0, 1}) EXPECT_EQ(Losses(both.events, rank), losses) << "rank " << rank;
}

// A cancel of node 1's share ends node 0's too (its rank loses its peer), with no process of
// either node left: the controller decides the attempt's outcome across the nodes.
TEST_F(RealTrainerMultiNodeTest, CancellingOneNodesShareEndsTheOthersWithNoProcessLeft) {
  ASSERT_TRUE(config_.SetFromText("train.max_steps", "100000").ok());
  const pb::RunKey key = Key(9, "cancelled", 1);
  ASSERT_NO_FATAL_FAILURE(StartBoth(key));
  ASSERT_NO_FATAL_FAILURE(StreamUntilAStep(0, key, 0));
  ASSERT_NO_FATAL_FAILURE(StreamUntilAStep(1, key, 1));
  std::vector<pid_t> pids = JobPids(RunDir(0, key));
  const std::vector<pid_t> node1_pids = JobPids(RunDir(1, key));
  pids.insert(pids.end(), node1_pids.begin(), node1_pids.end());
  ASSERT_EQ(pids.size(), 4u);

  const pb::RunState cancelled = Cancel(1, key);
  ASSERT_EQ(cancelled.status(), pb::RUN_STATUS_ENDED);
  EXPECT_EQ(cancelled.ended().outcome(), "cancelled") << cancelled.ended().error();
  const Streamed node0 = Stream(0, key);
  ASSERT_TRUE(node0.ended.has_value()) << "node 0's share did not end";
  EXPECT_TRUE(node0.ended->outcome() == "failed" || node0.ended->outcome() == "cancelled")
      << node0.ended->outcome() << ": " << node0.ended->error();
  ExpectGone(pids);
}

}  // namespace
}  // namespace llmctl::agent
