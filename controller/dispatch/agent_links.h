// The dispatcher's links to the agents: one per node in the store, each health-checked with
// GetNodeInfo every health_interval (sooner, with a doubling backoff, after a failure; the round
// waits at most failing_check_wait for the check of a node whose last one failed), recording
// the node as connected, unreachable or unusable (its agent is another llmctl version,
// CheckAgentVersion, or its NVIDIA driver is too old for its llm-train's LibTorch,
// CheckDriverRunsLibTorch). It also says which running attempts are lost through their
// agent: those an agent that (re)connected does not know (ListRuns), and those whose agent has been
// silent for requeue_after (the scheduler's DecideLostAttempts); the dispatcher declares them lost.
// The other parts reach an agent through the stub of its link.
#ifndef LLMCTL_CONTROLLER_DISPATCH_AGENT_LINKS_H_
#define LLMCTL_CONTROLLER_DISPATCH_AGENT_LINKS_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/event_line.h"
#include "common/status.h"
#include "controller/dispatch/dispatcher_core.h"
#include "controller/secrets.h"
#include "controller/store/records.h"
#include "llmctl/v1/agent.grpc.pb.h"
#include "rpc/certificates.h"

namespace llmctl::controller {

// A channel to a node's agent and the credentials it was opened with.
struct AgentChannel {
  std::shared_ptr<grpc::Channel> channel;
  // The name the agent's certificate must carry on this channel: the node's registration when it
  // was dialled ("" when the connector checks none). A certificate is renewed over the channel only
  // under this name, and only while it is still the node's current one.
  std::string certificate_name;
};

// Opens the channel to a node's agent.
using AgentConnector = std::function<StatusOr<AgentChannel>(const store::NodeRecord& node)>;

// The largest message the controller takes from an agent: above a StreamEvents message carrying an
// event line of the cap (common/event_line.h; its type is part of the line, so at most twice the
// cap) with its framing, and above gRPC's default of 4 MiB that the other messages were sized for.
inline constexpr int64_t kMaxAgentMessageBytes = int64_t{8} << 20;
static_assert(kMaxAgentMessageBytes >= 2 * event_line::kMaxBytes + (int64_t{64} << 10));

// Mutual TLS with the controller's identity, checking the agent's certificate name
// (agent-<node>.llmctl), with the node's token from `secrets` on every call.
AgentConnector TlsAgentConnector(rpc::TlsIdentity identity, const SecretsFile& secrets);

namespace dispatch {

// The node's devices as the store keeps them (NodeRecord::devices_json).
std::string DevicesJson(const std::vector<v1::Device>& devices);

// How many nodes' health checks CheckNodes starts per batch; it starts the next batch once the
// batch's checks have answered or, for nodes whose last check failed, failing_check_wait has
// passed. Those failing checks go on to their call's deadline, so more than this many may be
// running at once. Why 32: each check is a thread and a GetNodeInfo call (a TLS handshake when
// the link is new or redialled), so a batch bounds the burst a controller with hundreds of nodes
// makes at once, while answering agents reply within a round trip, so a batch of 32 costs about
// one round trip and a few hundred nodes a few. A chosen bound, not a measured one.
inline constexpr size_t kHealthChecksPerBatch = 32;

// Why a call for a user to `node`'s agent (MeasureRates, FetchArtifacts) cannot be made: it has no
// link, its agent not having answered the controller. FailedPrecondition, not Unavailable: the
// controller answered, and the CLI reads Unavailable as the controller's own absence.
Status NodeNotConnected(const std::string& node);
// Such a call's failure as the controller's answer: the agent's words on one line, cut, with the
// node named; out of reach (Unavailable, DeadlineExceeded) as FailedPrecondition, as above.
Status AgentCallFailed(const std::string& node, const Status& called);

// What a connected node's agent last said of its rates (NodeInfo's rate_probe_pending and
// rate_probe_underway); empty and false when they are current or the node is not connected.
struct RatesNote {
  std::string pending;
  bool underway = false;
};

class AgentLinks {
 public:
  struct Link {
    std::string name;
    std::string address;
    // Shared with the stream readers and calls in flight, which may outlive a redial. Replaced by
    // its health check, under the core's mutex; null until dialled and after a failed health
    // check.
    std::shared_ptr<v1::Agent::Stub> stub;
    // The certificate name `stub`'s channel checks (AgentChannel::certificate_name); set with it.
    std::string certificate_name;
    // Guarded by the core's mutex (reached only through links_, which clang checks):
    bool connected = false;
    // Whether it has ever connected: until it has, its node is known only by name (the embedded
    // agent right after the daemons start, or a node down since the controller started).
    bool has_connected = false;
    bool needs_reconcile = true;  // ListRuns after each (re)connect
    bool removed = false;         // Disconnect: never dialled again; the next round erases it
    // When its agent last answered, on the wall clock: stored and shown (NodeRecord::last_seen).
    store::Time last_seen;
    // When its agent last answered, or when the link was made if it has not yet: its silence is
    // counted from here. A link is made at the controller's first round for each node.
    MonotonicTime heard_at;
    MonotonicTime next_health_at;
    // After a failed check the next comes sooner than health_interval: backoff_initial, doubling
    // up to health_interval, so that an agent that is just starting (the embedded one is started
    // right after it is registered) is seen within a second. 0 after a successful check.
    std::chrono::milliseconds health_backoff{0};
    std::vector<v1::Device> devices;
    // Why no channel to the node could be made at the last try (the connector's error: no token
    // while its enrollment is pending); "" once one is. Logged when it starts or changes, not at
    // every health check; its end shows as "connected" (new credentials make a new link).
    std::string cannot_connect;
    // Why the connected node takes no trial (CheckDriverRunsLibTorch's message); "" when it may.
    std::string unusable;
    // Its agent measures its rates now (NodeInfo.rate_probe_pending): it starts no trial until
    // that ends, so none is placed there.
    bool measuring = false;
    // Its agent's note on its rates at the last health check or MeasureRates answer
    // (NodeInfo.rate_probe_pending): "" when the rates it reports are current.
    std::string rate_probe_pending;
    // Its agent measures or waits to measure them (NodeInfo.rate_probe_underway; true after a
    // MeasureRates answer).
    bool rate_probe_underway = false;
    // MeasureRates answers noted: a health check whose GetNodeInfo was sent before the last one
    // says nothing newer of the rates, and would show a probe just asked for as not underway.
    int rates_asks = 0;
    // The node's rates (NodeInfo's rate_probe_json) as last stored or refused: the agent reports
    // them with every health check, and only a change is parsed and stored again.
    std::string rate_probe_json;
    // A health check under way: the round starts no other, and a link erased or replaced
    // meanwhile is kept (retired_) until it ends.
    bool checking = false;
    grpc::ClientContext* check_context = nullptr;  // its GetNodeInfo in flight, for Stop
    // The check's thread; started and joined by the round thread only (and by Stop after it).
    std::thread check;
  };

  AgentLinks(DispatcherCore& core, AgentConnector connect)
      : core_(core), connect_(std::move(connect)) {}

  // The round's first step: drops the links of nodes no longer listed, makes one for each listed
  // node with an address, and checks the health of those that are due, side by side; it waits
  // for each check to end, but at most failing_check_wait for a node whose last check failed.
  // Only the round thread (one round at a time) calls it, so a Link* stays valid for the rest of
  // the round.
  void CheckNodes(const std::vector<store::NodeRecord>& nodes, store::Time now,
                  MonotonicTime monotonic_now);
  // ListRuns on each link that (re)connected since it last did: the attempts the store has as
  // running there that the agent does not know (its node was rebuilt, or its state lost). Waiting
  // longer cannot bring them back.
  std::vector<AttemptKey> ForgottenRuns(const std::vector<store::RunningAttempt>& running);
  // The running attempts whose agent has been silent for requeue_after (the scheduler's policy).
  std::vector<AttemptKey> SilentRuns(const std::vector<store::RunningAttempt>& running,
                                     MonotonicTime now);

  // The node's stub; null when it has no link or is not dialled.
  std::shared_ptr<v1::Agent::Stub> Stub(const std::string& node);
  // Dispatcher::NodeUnusable.
  std::string Unusable(const std::string& node);
  // Dispatcher::NodeRatesPending.
  RatesNote RatesPending(const std::string& node);
  // Dispatcher::MeasureNodeRates.
  StatusOr<std::string> MeasureRates(const std::string& node);
  // RemoveNode, and a node registered again with new credentials: the node's link is never
  // dialled again and the next round erases it, or (for a node still listed) builds a new one that
  // dials with the credentials then current.
  void Disconnect(const std::string& node);
  // Cancels the health checks under way and waits for their threads (Dispatcher::Stop, after the
  // round thread has ended); a cancelled check records nothing.
  void Stop();

  Link* FindLocked(const std::string& node) LLMCTL_REQUIRES(core_.mutex);
  const std::map<std::string, std::unique_ptr<Link>>& AllLocked() const
      LLMCTL_REQUIRES(core_.mutex) {
    return links_;
  }
  // When the links want the next round (their next health checks).
  void CollectWakeTimesLocked(std::vector<MonotonicTime>& times) const LLMCTL_REQUIRES(core_.mutex);

 private:
  // What one health check learnt: the certificate's check, then the agent's answer.
  struct HealthAnswer {
    Status unexpired;
    Status health;
    v1::NodeInfo info;
    int rates_asks = 0;  // the link's rates_asks when GetNodeInfo was sent
  };

  Link* EnsureLink(const store::NodeRecord& node, MonotonicTime now);
  // Joins the threads of checks that have ended, and frees the retired links whose check has.
  void ReclaimChecks();
  // Starts `link`'s check on its thread (joining its previous, ended one first).
  void StartCheck(Link& link, store::Time now, MonotonicTime monotonic_now);
  // GetNodeInfo on the link (renewing its certificate when due), then the link and the store's
  // node updated with the answer.
  void CheckHealth(Link& link, store::Time now, MonotonicTime monotonic_now);
  // A stub and the certificate name its channel checks.
  struct Dialled {
    std::shared_ptr<v1::Agent::Stub> stub;
    std::string certificate_name;
  };
  // The link's stub, or a fresh one dialled (null when that fails).
  Dialled StubFor(Link& link);
  // The certificate's check and the agent's answer, without the core's mutex (it may wait the
  // call's deadline).
  HealthAnswer AskHealth(Link& link, const Dialled& dialled, store::Time now,
                         MonotonicTime monotonic_now);
  // The link after `answer`: its backoff and next check, whether it is connected, its node's
  // description.
  void UpdateLink(Link& link, const Dialled& dialled, const HealthAnswer& answer, store::Time now,
                  MonotonicTime monotonic_now) LLMCTL_REQUIRES(core_.mutex);
  // The node's state as the link now has it, recorded in the store.
  void StoreLinkState(const Link& link, const HealthAnswer& answer) LLMCTL_REQUIRES(core_.mutex);
  // A connected node's NodeInfo: its devices, whether llm-train can run there, whether it measures
  // its rates, and the rates it measured (stored when they changed). `rates_asked_since`: a
  // MeasureRates answer came after the NodeInfo was asked for, whose note on the rates is the
  // newer.
  void ApplyNodeInfo(Link& link, const v1::NodeInfo& info, store::Time now, bool rates_asked_since)
      LLMCTL_REQUIRES(core_.mutex);
  void Reconcile(Link& link, const std::vector<store::RunningAttempt>& running,
                 std::vector<AttemptKey>& forgotten);

  DispatcherCore& core_;
  const AgentConnector connect_;
  // By node. Erased only by CheckNodes (on the round thread, which every user of a Link* is on)
  // once the node is no longer listed.
  std::map<std::string, std::unique_ptr<Link>> links_ LLMCTL_GUARDED_BY(core_.mutex);
  // Links erased from links_ or replaced there, freed by ReclaimChecks once no check of theirs
  // runs.
  std::vector<std::unique_ptr<Link>> retired_ LLMCTL_GUARDED_BY(core_.mutex);
  // Since when each running attempt may count as silent (SilentRuns), and SilentRuns' last `now`.
  std::map<AttemptKey, MonotonicTime> running_since_ LLMCTL_GUARDED_BY(core_.mutex);
  std::optional<MonotonicTime> previous_round_ LLMCTL_GUARDED_BY(core_.mutex);
  // Notified when a check ends.
  CondVar checked_;
};

}  // namespace dispatch
}  // namespace llmctl::controller

#endif  // LLMCTL_CONTROLLER_DISPATCH_AGENT_LINKS_H_
