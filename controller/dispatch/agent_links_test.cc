// Links to the agents: requeueing after silence and fencing, silence and health checks reckoned on
// the monotonic clock (a step of the wall clock), an agent back without its run, a node
// whose driver is too old or whose agent is another llmctl version, a certificate from another CA,
// no token in logs or the database; DevicesJson.
#include "controller/dispatch/agent_links.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include "common/estimate/rate_probe.h"
#include "common/version.h"
#include "controller/dispatch/dispatch_test_support.h"

namespace llmctl::controller::dispatch_test {
namespace {

namespace fs = std::filesystem;

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

class AgentLinksTest : public DispatcherTest {
 protected:
  // Node n1, whose agent takes trials again, is connected after the next health check, and
  // `experiment`'s one waiting trial runs there to its end.
  void ExpectConnectedAtTheNextHealthCheckAndTheTrialRuns(int64_t experiment) {
    clock_.Advance(config_.health_interval);
    Tick();
    EXPECT_EQ(NodeStatusOf(*controller_, "n1").state(), "connected");
    ASSERT_TRUE(Eventually([&] {
      Tick();
      return OnlyTrial(experiment).state == store::TrialState::kOk;
    }));
  }
};

TEST_F(AgentLinksTest, ATrialWhoseAgentStaysSilentIsRequeuedAndItsOldAttemptFencedOff) {
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

  // The agent returns, still running attempt 1: that run is stopped before attempt 2 takes its
  // device (the node's one), and the trial goes out again as attempt 2.
  const std::string attempt1 = std::to_string(experiment) + "/one#1";
  agent_state_.script = {StepLine(0), kResultLine};
  agent_state_.script_ends = true;
  StartAgent();
  clock_.Advance(seconds(5));
  Tick();  // attempt 1's run is asked to stop, off the round thread
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().LostRunCancelsInFlight() == 0; }));
  Tick();  // it has ended: attempt 2 takes the device
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(OnlyTrial(experiment).current_attempt, 2);
  EXPECT_EQ(StoredEvents(trial.id, 2), 2);
  {
    std::lock_guard lock(agent_state_.mutex);
    EXPECT_EQ(agent_state_.cancelled, std::vector<std::string>{attempt1});
    EXPECT_TRUE(agent_state_.runs.at(attempt1).ended);
  }

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

// chrony stepping the controller's wall clock 2 min forward while a health check fails: the
// agent has been silent 5 s, not 2 min, so its trial is kept.
TEST_F(AgentLinksTest, AWallClockStepForwardDoesNotRequeueAHealthyNodesTrial) {
  const int64_t experiment = SubmitOneThatKeepsRunning();
  StopAgent();
  clock_.StepWallClock(std::chrono::minutes(2));
  clock_.Advance(seconds(5));
  Tick();  // one failed health check
  EXPECT_EQ(NodeStatusOf(*controller_, "n1").state(), "unreachable");
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kRunning);
  clock_.Advance(seconds(56));  // silent 61 s
  Tick();
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
}

// The wall clock stepped an hour back: health checks go on at their interval, and a silent agent's
// trial is requeued after requeue_after, not an hour later.
TEST_F(AgentLinksTest, AWallClockStepBackStopsNeitherHealthChecksNorRequeueing) {
  const int64_t experiment = SubmitOneThatKeepsRunning();
  clock_.StepWallClock(-std::chrono::hours(1));
  StopAgent();
  clock_.Advance(seconds(30));
  Tick();
  EXPECT_EQ(NodeStatusOf(*controller_, "n1").state(), "unreachable");
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kRunning);
  clock_.Advance(seconds(31));
  Tick();
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
}

TEST_F(AgentLinksTest, AnAgentThatComesBackWithoutTheRunHasItRequeuedAtOnce) {
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
  Tick();  // attempt 1 lost; its CancelRun (NOT_FOUND) is made off the round thread
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().LostRunCancelsInFlight() == 0; }));
  Tick();  // attempt 1 holds no device: attempt 2 takes it
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(OnlyTrial(experiment).current_attempt, 2);
}

TEST_F(AgentLinksTest, ANodeWhoseDriverIsTooOldForLibTorchsCudaIsUnusableAndSaysWhy) {
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
  EXPECT_NE(notice.find("no connected node has 1 cuda device"), std::string::npos) << notice;
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

// An agent of another llmctl version (a node deployed before the controller's upgrade) takes no
// trial, whose settings its llm-train may not know or read otherwise, and says how to redeploy;
// the first health check after the redeploy places the waiting trial.
TEST_F(AgentLinksTest, AnAgentOfAnotherLlmctlVersionIsUnusableAndSaysHowToRedeploy) {
  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.llmctl_version = "0.3.9";
  }
  const int64_t experiment = SubmitOne();
  Tick();
  const std::string version(kVersion);
  const std::string reason =
      "node n1: its agent is llmctl 0.3.9, this controller llmctl " + version +
      "; they must be the same version, so no trial is placed there: run llmctl " + version +
      "'s agent there (a leased node: llmctl node down n1, then llmctl node up --lease LEASE "
      "with " +
      version + "'s --agent-image or --agent-commit; the embedded one: llmctl daemon stop)";
  const v1::NodeStatus unusable = NodeStatusOf(*controller_, "n1");
  EXPECT_EQ(unusable.state(), "unusable");
  EXPECT_EQ(unusable.unusable(), reason);
  EXPECT_EQ(RunsStarted(), 0u);
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
  const std::string notice = daemon_->dispatcher().QueuedNotice(OnlyTrial(experiment).id);
  EXPECT_TRUE(notice.ends_with("; " + reason)) << notice;

  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.llmctl_version = version;
  }
  ExpectConnectedAtTheNextHealthCheckAndTheTrialRuns(experiment);
}

// An agent that says it takes no trial (its llm-train is another llmctl version) makes its node
// unusable with its line; once it takes them again, the waiting trial is placed.
TEST_F(AgentLinksTest, AnAgentThatSaysItTakesNoTrialMakesItsNodeUnusableWithItsReason) {
  const std::string agent_reason =
      "its llm-train (/opt/llm-train) is llmctl 0.3.9, its agent llmctl 0.4.0; they must be the "
      "same version, so no trial runs there";
  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.unusable = agent_reason;
  }
  const int64_t experiment = SubmitOne();
  Tick();
  const v1::NodeStatus unusable = NodeStatusOf(*controller_, "n1");
  EXPECT_EQ(unusable.state(), "unusable");
  EXPECT_EQ(unusable.unusable(), "node n1: " + agent_reason);
  EXPECT_EQ(RunsStarted(), 0u);
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);

  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.unusable.clear();
  }
  ExpectConnectedAtTheNextHealthCheckAndTheTrialRuns(experiment);
}

// A node whose agent measures its rates starts no trial meanwhile: none is placed there, and the
// waiting trial says why; the next health check after the probe places it.
TEST_F(AgentLinksTest, NoTrialIsPlacedOnANodeWhileItMeasuresItsRates) {
  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.rate_probe_pending = "measuring";
  }
  const int64_t experiment = SubmitOne();
  Tick();
  EXPECT_EQ(RunsStarted(), 0u);
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
  const std::string notice = daemon_->dispatcher().QueuedNotice(OnlyTrial(experiment).id);
  EXPECT_TRUE(
      notice.ends_with("; node n1 is measuring its rates (about 12 s on a CPU, under 30 s "
                       "on a GPU): it takes trials once that ends"))
      << notice;
  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.rate_probe_pending = "";
  }
  clock_.Advance(config_.health_interval);
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
}

// `llmctl nodes --measure NODE`: the controller asks the node's agent and passes on its answer,
// which ListNodes then shows; an unknown node, one not connected and the agent's refusal each
// come back as one clear error naming the node, and no trial is placed while it measures.
TEST_F(AgentLinksTest, ANodeIsAskedToMeasureItsRatesAgainThroughTheController) {
  const auto measure = [&](const std::string& node, v1::MeasureNodeRatesResponse* response) {
    grpc::ClientContext context;
    v1::MeasureNodeRatesRequest request;
    request.set_name(node);
    return controller_->MeasureNodeRates(&context, request, response);
  };
  v1::MeasureNodeRatesResponse response;
  grpc::Status status = measure("n9", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(), "no node named n9 is registered (llmctl nodes)");
  EXPECT_EQ(measure("bad name", &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  status = measure("n1", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << "not dialled yet";
  EXPECT_EQ(status.error_message(),
            "node n1 is not connected: its agent has not answered the controller");

  Tick();
  status = measure("n1", &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.pending(), "measuring");
  EXPECT_EQ(NodeStatusOf(*controller_, "n1").rate_probe_pending(), "measuring");
  EXPECT_TRUE(NodeStatusOf(*controller_, "n1").rate_probe_underway()) << "from the answer";
  const int64_t experiment = SubmitOne();
  Tick();
  EXPECT_EQ(RunsStarted(), 0u) << "no trial while it measures";
  {
    std::lock_guard lock(agent_state_.mutex);
    EXPECT_EQ(agent_state_.measure_rates_calls, 1);
    agent_state_.rate_probe_pending = "";
    agent_state_.rate_probe_underway = false;
    agent_state_.measure_rates_result =
        grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "no rates here\n\x1b[2J");
  }
  clock_.Advance(config_.health_interval);
  Tick();
  EXPECT_EQ(NodeStatusOf(*controller_, "n1").rate_probe_pending(), "");
  EXPECT_FALSE(NodeStatusOf(*controller_, "n1").rate_probe_underway()) << "from the health check";
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));

  status = measure("n1", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message().find("node n1: no rates here"), 0u) << status.error_message();
  EXPECT_EQ(status.error_message().find('\n'), std::string::npos) << "one line";
  EXPECT_EQ(status.error_message().find('\x1b'), std::string::npos) << "no escape";

  // An answer the controller does not take of an agent is refused.
  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.measure_rates_result = grpc::Status::OK;
    agent_state_.measure_rates_pending = std::string(5000, 'x');
  }
  status = measure("n1", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(status.error_message().find("node n1: its answer is refused: its pending "), 0u)
      << status.error_message();

  StopAgent();
  status = measure("n1", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_EQ(status.error_message().find("node n1: "), 0u) << status.error_message();
}

// A health check whose GetNodeInfo the agent answered before it was asked to measure, and which
// the controller takes after the agent's MeasureRates answer, says nothing newer of the rates:
// ListNodes shows the probe underway (`nodes --measure --wait` would otherwise stop at once, on
// the rates from before) until the next check reads the agent again.
TEST_F(AgentLinksTest, AHealthCheckAnsweredBeforeAMeasureRatesAnswerDoesNotHideTheProbe) {
  Tick();
  ASSERT_EQ(NodeStatusOf(*controller_, "n1").state(), "connected");
  std::promise<void> answered;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> first{true};
  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.node_info_answered = [&answered, released, &first] {
      if (!first.exchange(false)) return;
      answered.set_value();
      released.wait();
    };
  }
  clock_.Advance(config_.health_interval);
  std::thread check([&] { Tick(); });
  answered.get_future().wait();
  grpc::ClientContext context;
  v1::MeasureNodeRatesRequest request;
  request.set_name("n1");
  v1::MeasureNodeRatesResponse response;
  const grpc::Status asked = controller_->MeasureNodeRates(&context, request, &response);
  release.set_value();
  check.join();
  ASSERT_TRUE(asked.ok()) << asked.error_message();
  v1::NodeStatus node = NodeStatusOf(*controller_, "n1");
  EXPECT_TRUE(node.rate_probe_underway());
  EXPECT_EQ(node.rate_probe_pending(), "measuring");

  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.node_info_answered = nullptr;
    agent_state_.rate_probe_pending = "";
    agent_state_.rate_probe_underway = false;
  }
  clock_.Advance(config_.health_interval);
  Tick();
  node = NodeStatusOf(*controller_, "n1");
  EXPECT_FALSE(node.rate_probe_underway());
  EXPECT_EQ(node.rate_probe_pending(), "");
}

// A fixed probe as llm-train --probe writes it, with `memory` as its memory rate.
std::string ProbeJson(double memory) {
  estimate::RateProbe probe;
  probe.measured_at = "2026-11-29T01:00:00Z";
  probe.device = "cpu";
  probe.device_name = "fake cpu";
  probe.threads = 2;
  probe.versions.libtorch = "2.15.0";
  probe.matmul = {{"fp32", 512, 5e10}, {"bf16", 512, 1e9}};
  probe.memory_bytes_per_s = memory;
  return probe.ToJson().dump(2);
}

TEST_F(AgentLinksTest, ANodesMeasuredRatesAreStoredListedAndReplacedWhenTheyChange) {
  Tick();
  EXPECT_EQ(NodeStatusOf(*controller_, "n1").rate_probe_json(), "") << "none measured yet";
  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.rate_probe_json = ProbeJson(1e10);
  }
  clock_.Advance(config_.health_interval);
  Tick();
  const auto stored = [&] {
    const std::string json = NodeStatusOf(*controller_, "n1").rate_probe_json();
    return estimate::RateProbe::FromJson(nlohmann::json::parse(json, nullptr, false));
  };
  ASSERT_TRUE(stored().ok()) << stored().status().ToString();
  EXPECT_EQ(stored()->ToJson(), nlohmann::ordered_json::parse(ProbeJson(1e10)));
  EXPECT_EQ(daemon_->store().NodeRates()->size(), 1u);

  // Measured again (a new llm-train): the new probe replaces the old.
  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.rate_probe_json = ProbeJson(2e10);
  }
  clock_.Advance(config_.health_interval);
  Tick();
  EXPECT_EQ(stored()->memory_bytes_per_s, 2e10);
  EXPECT_EQ(daemon_->store().NodeRates()->size(), 1u);

  // A probe that does not parse is refused, with a logged line, and the stored one stays.
  auto log = std::make_shared<std::ostringstream>();
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(*log);
  spdlog::default_logger()->sinks().push_back(sink);
  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.rate_probe_json = R"({"version": 1, "matmul": "fast"})";
  }
  clock_.Advance(config_.health_interval);
  Tick();
  EXPECT_EQ(stored()->memory_bytes_per_s, 2e10);
  EXPECT_NE(log->str().find("node n1: its measured rates are refused: "), std::string::npos)
      << log->str();

  // So is a well-formed one whose reference step would overflow every estimate's time.
  nlohmann::json absurd = nlohmann::json::parse(ProbeJson(3e10));
  absurd["reference_steps"] = {{{"dtype", "fp32"}, {"seconds", 1.7e308}}};
  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.rate_probe_json = absurd.dump();
  }
  clock_.Advance(config_.health_interval);
  Tick();
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_EQ(stored()->memory_bytes_per_s, 2e10);
  EXPECT_NE(log->str().find(
                "'reference_steps[0].seconds' must be 0 (not measured) or from 1e-06 to 3600 s"),
            std::string::npos)
      << log->str();
}

TEST_F(AgentLinksTest, AnAgentWithACertificateFromAnotherCaIsNotTrusted) {
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

TEST_F(AgentLinksTest, ACertificateOfAnEarlierNodeOfTheSameNameIsNotTrusted) {
  // `node down`, then `node up` under the same name: the new node's token, served with the old
  // node's certificate (same CA, same node name), must not pass for the new node.
  const v1::NodeCredentials old_node = credentials_;
  StopAgent();
  grpc::ClientContext down_context;
  v1::DeregisterNodeRequest down;
  down.set_name("n1");
  v1::DeregisterNodeResponse removed;
  ASSERT_TRUE(controller_->DeregisterNode(&down_context, down, &removed).ok());
  Tick();
  RegisterNode();
  const v1::NodeCredentials new_node = credentials_;
  credentials_.set_certificate_pem(old_node.certificate_pem());
  credentials_.set_private_key_pem(old_node.private_key_pem());
  StartAgent();

  const int64_t experiment = SubmitOne();
  Tick();
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
  EXPECT_EQ(NodeStatusOf(*controller_, "n1").state(), "unreachable");
  {
    std::lock_guard lock(agent_state_.mutex);
    EXPECT_TRUE(agent_state_.runs.empty());
  }

  // The new node's own certificate passes.
  StopAgent();
  credentials_ = new_node;
  StartAgent();
  // Past the link's backoff, and gRPC's reconnect backoff after the refused handshake.
  for (int round = 0; round < 50 && RunsStarted() == 0; ++round) {
    clock_.Advance(seconds(10));
    Tick();
    std::this_thread::sleep_for(milliseconds(200));
  }
  EXPECT_EQ(RunsStarted(), 1u);
}

// Registers n1 again with its current token (for enrollment when `enroll`), leaving the agent
// serving the old credentials: the old key's holder.
v1::NodeCredentials RegisterAgain(v1::Controller::Stub& controller, const std::string& address,
                                  const std::string& current_token, bool enroll) {
  grpc::ClientContext context;
  v1::RegisterNodeRequest request;
  request.set_name("n1");
  request.set_address(address);
  request.set_current_token(current_token);
  request.set_enroll(enroll);
  v1::NodeCredentials credentials;
  const grpc::Status registered = controller.RegisterNode(&context, request, &credentials);
  EXPECT_TRUE(registered.ok()) << registered.error_message();
  return credentials;
}

TEST_F(AgentLinksTest, ANodeRegisteredAgainIsNoLongerReachedOverItsOldLink) {
  for (const bool enroll : {false, true}) {
    SCOPED_TRACE(enroll ? "registered again for enrollment" : "registered again");
    // Connected, with a trial running and its events streaming over the link.
    const int64_t running = SubmitOneThatKeepsRunning();
    ASSERT_EQ(daemon_->dispatcher().ActiveStreams(), 1);
    const v1::NodeCredentials fresh =
        RegisterAgain(*controller_, agent_address_, credentials_.token(), enroll);
    EXPECT_EQ(fresh.token().empty(), enroll);
    // The fake agent still serves the old certificate and accepts only the old token: any call
    // that reaches it from now on carries the old token.
    int calls_before = 0;
    {
      std::lock_guard lock(agent_state_.mutex);
      calls_before = agent_state_.node_info_calls;
    }
    const size_t runs_before = RunsStarted();
    EXPECT_EQ(daemon_->dispatcher().ActiveStreams(), 0);  // ended before RegisterNode answered
    const int64_t experiment = SubmitOne();
    for (int round = 0; round < 5; ++round) {
      clock_.Advance(seconds(10));
      Tick();
    }
    std::this_thread::sleep_for(milliseconds(200));  // any stream reader a round started
    EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
    EXPECT_EQ(RunsStarted(), runs_before);
    EXPECT_EQ(daemon_->dispatcher().ActiveStreams(), 0);
    EXPECT_EQ(NodeStatusOf(*controller_, "n1").state(), "unreachable");
    {
      std::lock_guard lock(agent_state_.mutex);
      EXPECT_EQ(agent_state_.node_info_calls, calls_before);
    }
    if (enroll) break;

    // The new credentials' agent is reached, and its link used, as before.
    StopAgent();
    credentials_ = fresh;
    StartAgent();
    for (int round = 0; round < 50 && NodeStatusOf(*controller_, "n1").state() != "connected";
         ++round) {
      clock_.Advance(seconds(10));
      Tick();
      std::this_thread::sleep_for(milliseconds(200));
    }
    ASSERT_EQ(NodeStatusOf(*controller_, "n1").state(), "connected");
    // Clean slate for the enrollment round: both experiments' trials cancelled.
    for (const int64_t id : {running, experiment}) ASSERT_TRUE(CancelExperiment(id).ok());
    clock_.Advance(seconds(1));
    Tick();
    ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));
  }
}

// A node waiting for its enrollment has no token, so no channel can be made at any health check:
// that is logged once, and its end once ("connected"), not at every check.
TEST_F(AgentLinksTest, ANodeThatCannotBeDialledIsLoggedOnceUntilItCanBe) {
  Tick();
  ASSERT_EQ(NodeStatusOf(*controller_, "n1").state(), "connected");
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  RegisterAgain(*controller_, agent_address_, credentials_.token(), /*enroll=*/true);
  constexpr int kRounds = 6;
  for (int round = 0; round < kRounds; ++round) {
    clock_.Advance(config_.health_interval);
    Tick();
  }
  const auto count = [&](const std::string& line) {
    const std::string text = log.str();
    int found = 0;
    for (size_t at = text.find(line); at != std::string::npos; at = text.find(line, at + 1)) {
      ++found;
    }
    return found;
  };
  EXPECT_EQ(count("node n1: cannot connect: NOT_FOUND: no token for node 'n1'"), 1) << log.str();

  // Credentials again (registered anew: no token to present): connected, and said so once.
  StopAgent();
  credentials_ = RegisterAgain(*controller_, agent_address_, "", /*enroll=*/false);
  StartAgent();
  for (int round = 0; round < 50 && NodeStatusOf(*controller_, "n1").state() != "connected";
       ++round) {
    clock_.Advance(config_.health_interval);
    Tick();
    std::this_thread::sleep_for(milliseconds(200));
  }
  clock_.Advance(config_.health_interval);
  Tick();
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_EQ(NodeStatusOf(*controller_, "n1").state(), "connected");
  EXPECT_EQ(count("cannot connect"), 1) << log.str();
  EXPECT_EQ(count("node n1: connected"), 1) << log.str();
}

TEST_F(AgentLinksTest, NoTokenAppearsInTheLogsOrTheDatabase) {
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  // A fresh registration, a run with a dropped stream and a cancel: the paths that log.
  StopAgent();
  grpc::ClientContext context;
  v1::RegisterNodeRequest request;
  request.set_name("n1");
  request.set_address(agent_address_);
  request.set_current_token(credentials_.token());
  ASSERT_TRUE(controller_->RegisterNode(&context, request, &credentials_).ok());
  StartAgent();
  agent_state_.script = {StepLine(0), StepLine(1)};
  agent_state_.script_ends = false;
  agent_state_.drop_after = 1;
  const int64_t experiment = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));
  ASSERT_TRUE(CancelExperiment(experiment).ok());
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

TEST(DevicesJsonTest, ListsEachDevicesTypeIndexNameAndMemory) {
  v1::Device gpu;
  gpu.set_type("cuda");
  gpu.set_index(1);
  gpu.set_name("H100");
  gpu.set_memory_bytes(80);
  EXPECT_EQ(dispatch::DevicesJson({}), "[]");
  EXPECT_EQ(dispatch::DevicesJson({gpu}),
            R"([{"index":1,"memory_bytes":80,"name":"H100","type":"cuda"}])");
}

}  // namespace
}  // namespace llmctl::controller::dispatch_test
