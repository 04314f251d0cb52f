// Following what runs on the agents: one StreamEvents reader (a thread) per running attempt whose
// agent is connected, from the store's LastSeq + 1 (and its device samples from
// LastDeviceSampleSeq + 1). What arrives is stored idempotently on (trial, attempt, seq); `ended`
// finishes the attempt (through checkpoint_copy.h when it was stopped with a checkpoint); a broken
// stream is reopened after a backoff that doubles up to backoff_max (and starts over once a stream
// stored something), from the last stored seq. Only the store's own fence (store::IsFence: the
// attempt is stale, lost or ended) settles a stream for good; one whose store failed to write (a
// file that cannot be written, a full disk) is reopened and stores what it could not. Readers of
// attempts that are no longer running stop.
//
// What the agent answers never settles a stream, whatever its code: a FAILED_PRECONDITION is the
// agent's state, not the store's fence (this release's agent sends none for StreamEvents, and the
// controller's channels to the agents carry no rpc::VersionInterceptor, but an agent of another
// release or a faulty one may), and it is read again after its backoff like a broken one.
// An agent that does not know the run (NOT_FOUND) has its runs listed at the next round
// (AgentLinks::ForgottenRuns), which declares the attempt lost if the run is gone. An agent that
// answers its health checks but refuses the stream (any code but the transport's UNAVAILABLE,
// DEADLINE_EXCEEDED and CANCELLED, which are the link's silence to judge) for requeue_after, every
// reading in a row, cannot be followed, as if it were silent: RefusedRuns names the attempt, which
// the dispatcher declares lost (an agent of another llmctl version that turns the stream away, a
// run whose files the agent cannot read).
//
// A multi-node attempt has a reader per node, each resuming every rank after its last stored line
// (a node's agent sends its own ranks); a node's end is recorded with FinishAttemptNode, which ends
// the attempt once every node's has. A node whose run ends otherwise than ok has its peers'
// runs stopped at once: their ranks would otherwise wait in a collective until its timeout.
// Device samples come from every node, each from its own last stored reading (a node numbers its
// own).
#ifndef LLMCTL_CONTROLLER_DISPATCH_EVENT_STREAMS_H_
#define LLMCTL_CONTROLLER_DISPATCH_EVENT_STREAMS_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/status.h"
#include "controller/dispatch/agent_links.h"
#include "controller/dispatch/checkpoint_copy.h"
#include "controller/dispatch/dispatcher_core.h"
#include "controller/store/records.h"
#include "llmctl/v1/agent.grpc.pb.h"

namespace llmctl::controller::dispatch {

// How far past the controller's clock a device sample may be dated. One dated later would stay its
// attempt's newest reading (what `llmctl watch` shows) until then, and every true reading before
// it would be merged into buckets as old; a node's clock that far ahead is named in the warning.
inline constexpr std::chrono::minutes kMaxSampleClockLead{10};

// How the agent's outcome word maps to a trial state; `invalid` (the trainer refused its config)
// and anything unknown end the trial as failed.
store::TrialState OutcomeState(const std::string& outcome);

// The event to store for what an agent sent: its line, or the line's refused_line replacement
// (common/event_line.h) when the line breaks the rule, since the agent is not trusted either; the
// type is the line's own, whatever the agent said. `refusal` says why it was replaced ("" when it
// was not).
store::Event StoredEvent(const v1::TrialEvent& event, std::string& refusal);

class EventStreams {
 public:
  EventStreams(DispatcherCore& core, AgentLinks& links, CheckpointCopies& checkpoints)
      : core_(core), links_(links), checkpoints_(checkpoints) {}

  // One round: starts (or restarts, once their backoff is over) the readers of the `running`
  // attempts, and stops those of attempts no longer running.
  void Follow(const std::vector<store::RunningAttempt>& running, MonotonicTime now);
  // Stops the attempt's readers (one per node) and waits for them.
  void Stop(const AttemptKey& key);
  // Every reader (Dispatcher::Stop).
  void StopAll();
  // How many readers are running now.
  int Active();
  // When broken streams are due to be reopened.
  void CollectWakeTimesLocked(std::vector<MonotonicTime>& times) const LLMCTL_REQUIRES(core_.mutex);
  // The `running` attempts one of whose streams its agent has refused for requeue_after (the
  // scheduler's DecideLostAttempts, as for a silent agent), each once, with a warning naming the
  // refusal; the dispatcher declares them lost.
  std::vector<AttemptKey> RefusedRuns(const std::vector<store::RunningAttempt>& running,
                                      MonotonicTime now);

 private:
  // (trial id, attempt, node rank)
  using StreamKey = std::tuple<int64_t, int64_t, int64_t>;
  struct Stream {
    store::RunningAttempt attempt;
    int64_t node_rank = 0;
    std::string node;  // node rank `node_rank`'s
    std::string trial_name;
    // Its node's ranks are node_rank x ranks_per_node and the next ranks_per_node - 1: the only
    // ranks whose lines its agent may send.
    int64_t ranks_per_node = 1;
    std::thread thread;
    std::shared_ptr<v1::Agent::Stub> stub;  // the reader's own reference
    // Guarded by the core's mutex (reached only through streams_, which clang checks):
    grpc::ClientContext* context = nullptr;  // while the reader is in a call
    bool stop = false;
    bool done = true;      // no reader running
    bool settled = false;  // ended and finished, or fenced off: never reopened
    MonotonicTime retry_at;
    std::chrono::milliseconds backoff{0};
    // When its agent began to refuse it (IsRefusal), every reading since; unset once a reading
    // stored something or ended otherwise. The last refusal, for the warning.
    std::optional<MonotonicTime> refused_since;
    Status refusal;
    // The worker's `result` event once it came; used only by the reader thread (one at a time).
    std::string result_json;
  };

  // Reads the run's events, samples and end into the store until the stream ends; then settles
  // the stream or sets when it is reopened.
  void Read(Stream& stream, v1::Agent::Stub& stub);
  // StreamEvents from after the lines and samples the store holds.
  StatusOr<v1::StreamEventsRequest> ResumeRequest(const Stream& stream);
  // The stream's items into the store until it ends. What the controller refused (the store's
  // error, or its own refusal of a message) stops it, cancelling `context`, and is returned.
  // `answer`: the agent's, when the stream closed before the run's end and nothing was refused
  // (its call's error, or Unavailable for a stream it closed OK), else OK. `ended`: the end came;
  // `stored`: an item was stored (or, for samples the store refused for a bad reading, dropped).
  Status Receive(Stream& stream, v1::Agent::Stub& stub, grpc::ClientContext& context,
                 const v1::StreamEventsRequest& request, Status& answer, bool& ended, bool& stored);
  // Event lines read at once (each as its refusal when the store would refuse it), in one
  // transaction; an error stops the stream. A line of a rank that is not the node's own is
  // dropped: stored, it would take the place of the real rank's line with the same seq. A message
  // of more lines than common/event_stream.h allows is DataLoss.
  Status StoreEvents(Stream& stream,
                     const google::protobuf::RepeatedPtrField<v1::TrialEvent>& lines);
  // A batch of device samples, less those dated past kMaxSampleClockLead. One the store refuses
  // for a bad reading (InvalidArgument) is dropped; any other refusal (fenced off, or a storage
  // failure to retry) and a message past common/event_stream.h's bound stop the stream.
  Status StoreSamples(Stream& stream, const v1::DeviceSamples& samples);
  // Records how a node's run ended; for a single-node attempt, the attempt's end.
  Status Finish(Stream& stream, const v1::RunEnded& end);
  void StopStream(const StreamKey& key);

  DispatcherCore& core_;
  AgentLinks& links_;
  CheckpointCopies& checkpoints_;
  std::map<StreamKey, std::unique_ptr<Stream>> streams_ LLMCTL_GUARDED_BY(core_.mutex);
};

}  // namespace llmctl::controller::dispatch

#endif  // LLMCTL_CONTROLLER_DISPATCH_EVENT_STREAMS_H_
