#include "controller/dispatch/event_streams.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "common/event_line.h"
#include "common/event_stream.h"
#include "common/text.h"
#include "common/trial_config.h"
#include "common/trial_outcome.h"
#include "controller/device_samples_proto.h"
#include "controller/dispatch/cancellation.h"
#include "controller/dispatch/node_info_check.h"
#include "controller/scheduler/scheduler.h"
#include "controller/store/stored_config.h"
#include "rpc/grpc_status.h"

namespace llmctl::controller::dispatch {

store::TrialState OutcomeState(const std::string& outcome) {
  auto state = store::ParseTrialState(outcome);
  if (state.ok() && store::IsOutcome(*state)) return *state;
  return store::TrialState::kFailed;
}

store::Event StoredEvent(const v1::TrialEvent& event, std::string& refusal) {
  event_line::Accepted accepted = event_line::Accept(event.json());
  refusal = std::move(accepted.refusal);
  return store::Event{.seq = event.seq(),
                      .type = std::move(accepted.type),
                      .json = std::move(accepted.json),
                      .rank = event.rank()};
}

void EventStreams::Follow(const std::vector<store::RunningAttempt>& running, MonotonicTime now) {
  std::set<StreamKey> still_running;
  for (const store::RunningAttempt& attempt : running) {
    for (const store::AttemptNode& run : attempt.Runs()) {
      if (run.ended) continue;
      const int64_t node_rank = run.node_rank;
      const std::string& node = run.node;
      const StreamKey key{attempt.trial_id, attempt.attempt, node_rank};
      still_running.insert(key);
      std::shared_ptr<v1::Agent::Stub> stub;
      Stream* stream = nullptr;
      {
        MutexLock lock(core_.mutex);
        const AgentLinks::Link* link = links_.FindLocked(node);
        if (link == nullptr || !link->connected) continue;
        std::unique_ptr<Stream>& entry = streams_[key];
        if (entry == nullptr) entry = std::make_unique<Stream>();
        if (!entry->done || entry->settled || now < entry->retry_at) continue;
        if (link->stub == nullptr) continue;
        stream = entry.get();
        stub = link->stub;
        stream->done = false;
        stream->stop = false;
      }
      if (stream->thread.joinable()) stream->thread.join();
      if (stream->trial_name.empty()) {
        auto trial = core_.store.GetTrial(attempt.trial_id);
        StatusOr<TrialConfig> config =
            trial.ok() ? store::StoredConfig(*trial) : StatusOr<TrialConfig>(trial.status());
        if (!config.ok()) {
          spdlog::warn("{}: cannot follow its events: {}", AttemptName(attempt),
                       config.status().ToString());
          MutexLock lock(core_.mutex);
          stream->done = true;
          continue;
        }
        stream->trial_name = trial->name;
        stream->ranks_per_node = RanksPerNode(*config);
      }
      stream->attempt = attempt;
      stream->node_rank = node_rank;
      stream->node = node;
      stream->stub = std::move(stub);
      stream->thread = std::thread([this, stream] { Read(*stream, *stream->stub); });
    }
  }
  // Attempts (and nodes) that ended or were lost: their readers are no longer needed.
  std::vector<StreamKey> gone;
  {
    MutexLock lock(core_.mutex);
    for (const auto& [key, stream] : streams_) {
      if (!still_running.contains(key)) gone.push_back(key);
    }
  }
  for (const StreamKey& key : gone) StopStream(key);
}

Status EventStreams::Finish(Stream& stream, const v1::RunEnded& end) {
  store::Store& store = core_.store;
  const store::RunningAttempt& attempt = stream.attempt;
  std::string error = end.error();
  if (end.outcome() == trial_outcome::kInvalid && error.empty()) {
    error = "the trainer refused the config";
  }
  // Rank 0's checkpoint, on node rank 0.
  if (stream.node_rank == 0) {
    if (std::optional<std::string> stopped_error =
            checkpoints_.OnEnded(attempt, stream.trial_name, end.outcome(), stream.result_json)) {
      error = *std::move(stopped_error);
    }
  }
  if (attempt.nodes.empty()) {
    return store.FinishAttempt(attempt.trial_id, attempt.attempt, OutcomeState(end.outcome()),
                               end.exit_code(), error, core_.clock.Now());
  }
  ASSIGN_OR_RETURN(const std::optional<store::TrialState> ended,
                   store.FinishAttemptNode(attempt.trial_id, attempt.attempt, stream.node_rank,
                                           OutcomeState(end.outcome()), end.exit_code(), error,
                                           core_.clock.Now()));
  if (!ended && end.outcome() != "ok") {
    spdlog::warn("{} on node {} (node rank {}) ended {}: stopping its other nodes' runs",
                 AttemptName(attempt), stream.node, stream.node_rank, end.outcome());
    CancelRuns(core_, links_, attempt, stream.trial_name, std::nullopt, stream.node_rank);
  }
  return Status::Ok();
}

StatusOr<v1::StreamEventsRequest> EventStreams::ResumeRequest(const Stream& stream) {
  store::Store& store = core_.store;
  const store::RunningAttempt& attempt = stream.attempt;
  auto last_seq = store.LastSeq(attempt.trial_id, attempt.attempt);
  // A multi-rank attempt's other ranks, each resumed after its own last stored line.
  auto last_rank_seqs = store.LastRankSeqs(attempt.trial_id, attempt.attempt);
  // Each node numbers its own readings.
  auto last_sample_seq =
      store.LastDeviceSampleSeq(attempt.trial_id, attempt.attempt, stream.node_rank);
  if (!last_seq.ok()) return last_seq.status();
  if (!last_rank_seqs.ok()) return last_rank_seqs.status();
  if (!last_sample_seq.ok()) return last_sample_seq.status();
  v1::StreamEventsRequest request;
  request.mutable_key()->set_experiment_id(attempt.experiment_id);
  request.mutable_key()->set_trial(stream.trial_name);
  request.mutable_key()->set_attempt(static_cast<int32_t>(attempt.attempt));
  request.set_from_seq(*last_seq + 1);
  for (const auto& [rank, seq] : *last_rank_seqs) {
    (*request.mutable_from_rank_seq())[rank] = seq + 1;
  }
  request.set_from_sample_seq(*last_sample_seq + 1);
  request.set_batch_events(true);
  return request;
}

Status EventStreams::StoreEvents(Stream& stream,
                                 const google::protobuf::RepeatedPtrField<v1::TrialEvent>& lines) {
  const store::RunningAttempt& attempt = stream.attempt;
  if (lines.size() > event_stream::kEventsPerMessage) {
    return DataLossError("node " + stream.node + " sent " + std::to_string(lines.size()) +
                         " event lines in one message; an agent sends at most " +
                         std::to_string(event_stream::kEventsPerMessage));
  }
  std::vector<store::Event> events;
  events.reserve(static_cast<size_t>(lines.size()));
  const int64_t first_rank = stream.node_rank * stream.ranks_per_node;
  const v1::TrialEvent* first_foreign = nullptr;
  int64_t foreign_lines = 0;
  int64_t refused_lines = 0;  // one warning a message names the first
  for (const v1::TrialEvent& line : lines) {
    if (line.rank() < first_rank || line.rank() >= first_rank + stream.ranks_per_node) {
      if (foreign_lines++ == 0) first_foreign = &line;
      continue;
    }
    // A line the store would refuse is stored as its replacement: a refusal that failed the
    // stream would have it reopened at the same line, every backoff, forever.
    std::string refusal;
    store::Event& event = events.emplace_back(StoredEvent(line, refusal));
    if (!refusal.empty() && refused_lines++ == 0) {
      spdlog::warn("{} on node {}: rank {} event line {} refused ({}); stored as a {} event",
                   AttemptName(attempt), stream.node, event.rank, event.seq, refusal,
                   event_line::kRefusedType);
    }
    // Rank 0's result is the job's (a checkpoint stop's message reads it).
    if (event.type == "result" && event.rank == 0) stream.result_json = event.json;
  }
  if (refused_lines > 1) {
    spdlog::warn(
        "{} on node {}: {} more event lines of the same message refused and stored as {} "
        "events",
        AttemptName(attempt), stream.node, refused_lines - 1, event_line::kRefusedType);
  }
  if (first_foreign != nullptr) {
    spdlog::warn(
        "{} on node {}: dropped {} event line(s) of ranks it does not run (the first: "
        "line {} of rank {}); it runs ranks {} to {}",
        AttemptName(attempt), stream.node, foreign_lines, first_foreign->seq(),
        first_foreign->rank(), first_rank, first_rank + stream.ranks_per_node - 1);
  }
  // One transaction and one change for the lines read at once.
  ASSIGN_OR_RETURN(const int64_t appended,
                   core_.store.AppendEvents(attempt.trial_id, attempt.attempt, events));
  if (appended > 0) core_.changes.Notify();
  return Status::Ok();
}

namespace {

// Whether an agent samples `device` for a run that holds `indices` on its node: its host ("cpu")
// or one of its CUDA devices ("cuda:N", N the node's index); any CUDA index below kMaxNodeDevices
// when the indices are unknown (an attempt a controller started without recording them). Other
// names are made up: stored, each would add rows and a line to every status without bound.
bool IsSampledDevice(std::string_view device, const std::vector<int64_t>& indices) {
  if (device == event_stream::kHostDevice) return true;
  const std::optional<int64_t> index = event_stream::CudaDeviceIndex(device);
  if (!index.has_value()) return false;
  if (indices.empty()) return *index < kMaxNodeDevices;
  return std::find(indices.begin(), indices.end(), *index) != indices.end();
}

}  // namespace

Status EventStreams::StoreSamples(Stream& stream, const v1::DeviceSamples& samples) {
  const store::RunningAttempt& attempt = stream.attempt;
  if (samples.samples_size() > event_stream::kSamplesPerMessage) {
    return DataLossError("node " + stream.node + " sent " + std::to_string(samples.samples_size()) +
                         " device samples in one message; an agent sends at most " +
                         std::to_string(event_stream::kSamplesPerMessage));
  }
  std::vector<store::NewDeviceSample> rows = FromProto(samples);
  const std::vector<store::AttemptNode> runs = attempt.Runs();
  const std::vector<int64_t>& indices =
      stream.node_rank < static_cast<int64_t>(runs.size())
          ? runs[static_cast<size_t>(stream.node_rank)].device_indices
          : attempt.device_indices;
  std::optional<std::string> first_foreign;  // the first sample of no device of the run's
  std::erase_if(rows, [&](const store::NewDeviceSample& row) {
    if (IsSampledDevice(row.sample.device, indices)) return false;
    if (!first_foreign) first_foreign = row.sample.device;
    return true;
  });
  if (first_foreign) {
    spdlog::warn(
        "{} on node {}: dropped device samples of devices the run does not hold (the "
        "first: '{}')",
        AttemptName(attempt), stream.node, OnOneLine(*first_foreign, 64));
  }
  const store::Time now = core_.clock.Now();
  std::optional<store::Time> first_ahead;  // the first sample dropped, for the warning
  std::erase_if(rows, [&](const store::NewDeviceSample& row) {
    if (row.sample.time <= now + kMaxSampleClockLead) return false;
    if (!first_ahead) first_ahead = row.sample.time;
    return true;
  });
  if (first_ahead) {
    spdlog::warn(
        "{} on node {}: dropped device samples dated more than {} min after the "
        "controller's clock (the first: {} s ahead); is the node's clock right?",
        AttemptName(attempt), stream.node, kMaxSampleClockLead.count(),
        std::chrono::duration_cast<std::chrono::seconds>(*first_ahead - now).count());
  }
  auto stored =
      core_.store.AppendDeviceSamples(attempt.trial_id, attempt.attempt, rows, stream.node_rank);
  // A batch refused for what it holds (a bad figure) is lost, not the stream: samples only show
  // how it runs.
  if (!stored.ok() && stored.status().code() == StatusCode::kInvalidArgument) {
    spdlog::warn("{} on node {}: device samples dropped: {}", AttemptName(attempt), stream.node,
                 stored.status().ToString());
    return Status::Ok();
  }
  // Fenced off, as its events are; or a store that cannot take it now (a full disk, a file that
  // cannot be written, a busy database): the stream is read again after its backoff, from the
  // last stored sample, so the batch comes again.
  if (!stored.ok()) return stored.status();
  if (*stored > 0) core_.changes.Notify();
  return Status::Ok();
}

Status EventStreams::Receive(Stream& stream, v1::Agent::Stub& stub, grpc::ClientContext& context,
                             const v1::StreamEventsRequest& request, Status& answer, bool& ended,
                             bool& stored) {
  Status result;
  auto reader = stub.StreamEvents(&context, request);
  v1::StreamEventsResponse response;
  while (reader->Read(&response)) {
    if (response.has_event()) {
      // An agent from before batch_events sends one line an item: a batch of one.
      v1::TrialEvent line = std::move(*response.mutable_event());
      *response.mutable_events()->add_events() = std::move(line);
    }
    if (response.has_events() || response.has_samples()) {
      result = response.has_events() ? StoreEvents(stream, response.events().events())
                                     : StoreSamples(stream, response.samples());
      if (!result.ok()) {
        context.TryCancel();
        break;
      }
      stored = true;
    } else if (response.has_ended()) {
      result = Finish(stream, response.ended());
      ended = true;
      core_.changes.Notify();
      if (!result.ok()) break;
      stored = true;
    }
  }
  const grpc::Status finished = reader->Finish();
  if (result.ok() && !ended) {
    answer = finished.ok() ? UnavailableError("the event stream closed before the run ended")
                           : rpc::FromGrpcStatus(finished);
  }
  return result;
}

namespace {

// Whether the agent's answer to StreamEvents turns the stream away: anything but the transport's
// failures (a node down or cut off, whose silence AgentLinks::SilentRuns judges) and the
// controller's own cancel.
bool IsRefusal(const Status& answer) {
  switch (answer.code()) {
    case StatusCode::kOk:
    case StatusCode::kCancelled:
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
      return false;
    default:
      return true;
  }
}

}  // namespace

void EventStreams::Read(Stream& stream, v1::Agent::Stub& stub) {
  bool ended = false;
  bool stored = false;
  const StatusOr<v1::StreamEventsRequest> request = ResumeRequest(stream);
  grpc::ClientContext context;
  bool stopped;
  {
    MutexLock lock(core_.mutex);
    stopped = stream.stop;
    if (!stopped) stream.context = &context;
  }
  Status result;  // the controller's side: the store's, or its refusal of a message
  Status answer;  // the agent's
  if (!request.ok()) {
    result = request.status();
  } else if (!stopped) {
    result = Receive(stream, stub, context, *request, answer, ended, stored);
  }
  const Status& failure = result.ok() ? answer : result;
  if (!failure.ok() && failure.code() != StatusCode::kCancelled) {
    spdlog::warn("{} on node {}: event stream: {}{}", AttemptName(stream.attempt), stream.node,
                 result.ok() ? "the agent answered " : "", failure.ToString());
  }
  {
    MutexLock lock(core_.mutex);
    stream.context = nullptr;
    // Fenced off by the store (a stale, lost or ended attempt) or finished: nothing more to read.
    // The agent's FAILED_PRECONDITION is no fence, nor is a store that could not write (its file
    // read-only, removed or failing, its disk full): the stream is read again after its backoff,
    // from what the store holds.
    stream.settled = (ended && result.ok()) || store::IsFence(result);
    // A stream that stored something starts its backoff over; one whose every message was
    // refused (a full disk's store) keeps doubling it, instead of a reopening each second.
    if (stored) stream.backoff = std::chrono::milliseconds(0);
    if (!stream.settled) {
      stream.backoff =
          NextBackoff(stream.backoff, core_.options.backoff_initial, core_.options.backoff_max);
      stream.retry_at = core_.clock.Monotonic() + stream.backoff;
    }
    if (stored || !IsRefusal(answer)) {
      stream.refused_since.reset();
    } else {
      if (!stream.refused_since) stream.refused_since = core_.clock.Monotonic();
      stream.refusal = answer;
    }
    // An agent that does not know the run (rebuilt, or its state lost while its link stayed up):
    // the next round lists its runs, as after a reconnect, and declares the attempt lost if the
    // run is gone.
    if (answer.code() == StatusCode::kNotFound) {
      if (AgentLinks::Link* link = links_.FindLocked(stream.node); link != nullptr) {
        link->needs_reconcile = true;
      }
    }
    stream.done = true;
  }
  core_.changes.Notify();
  core_.Wake();
}

void EventStreams::Stop(const AttemptKey& key) {
  std::vector<StreamKey> keys;
  {
    MutexLock lock(core_.mutex);
    for (auto it = streams_.lower_bound({key.first, key.second, 0});
         it != streams_.end() && std::get<0>(it->first) == key.first &&
         std::get<1>(it->first) == key.second;
         ++it) {
      keys.push_back(it->first);
    }
  }
  for (const StreamKey& stream : keys) StopStream(stream);
}

void EventStreams::StopStream(const StreamKey& key) {
  std::unique_ptr<Stream> stream;
  {
    MutexLock lock(core_.mutex);
    auto it = streams_.find(key);
    if (it == streams_.end()) return;
    it->second->stop = true;
    if (it->second->context != nullptr) it->second->context->TryCancel();
    stream = std::move(it->second);
    streams_.erase(it);
  }
  if (stream->thread.joinable()) stream->thread.join();
}

void EventStreams::StopAll() {
  std::vector<StreamKey> keys;
  {
    MutexLock lock(core_.mutex);
    for (const auto& [key, stream] : streams_) keys.push_back(key);
  }
  for (const StreamKey& key : keys) StopStream(key);
}

int EventStreams::Active() {
  MutexLock lock(core_.mutex);
  return static_cast<int>(std::count_if(streams_.begin(), streams_.end(),
                                        [](const auto& entry) { return !entry.second->done; }));
}

void EventStreams::CollectWakeTimesLocked(std::vector<MonotonicTime>& times) const {
  for (const auto& [key, stream] : streams_) {
    if (stream->done && !stream->settled) times.push_back(stream->retry_at);
  }
}

std::vector<AttemptKey> EventStreams::RefusedRuns(const std::vector<store::RunningAttempt>& running,
                                                  MonotonicTime now) {
  std::set<AttemptKey> still_running;
  for (const store::RunningAttempt& attempt : running) {
    still_running.emplace(attempt.trial_id, attempt.attempt);
  }
  std::vector<scheduler::RunningAttempt> refused;
  std::map<AttemptKey, std::string> refusals;  // the warning's
  {
    MutexLock lock(core_.mutex);
    for (const auto& [key, stream] : streams_) {
      // A reader running now was let in.
      if (!stream->done || stream->settled || !stream->refused_since) continue;
      const store::RunningAttempt& attempt = stream->attempt;
      if (!still_running.contains({attempt.trial_id, attempt.attempt})) continue;
      refused.push_back({.trial_id = attempt.trial_id,
                         .attempt = attempt.attempt,
                         .agent = stream->node,
                         .agent_last_seen = *stream->refused_since});
      refusals.try_emplace({attempt.trial_id, attempt.attempt}, stream->refusal.ToString());
    }
  }
  const scheduler::LostAgentDecision decision =
      scheduler::DecideLostAttempts(refused, now, core_.options.requeue_after);
  std::vector<AttemptKey> lost;
  for (const scheduler::RunningAttempt& attempt : decision.requeue) {
    const AttemptKey key{attempt.trial_id, attempt.attempt};
    if (std::find(lost.begin(), lost.end(), key) != lost.end()) continue;  // another node's too
    spdlog::warn(
        "node {} has refused the event stream of {} for {} s ({}): the attempt cannot be "
        "followed; it is lost and requeued",
        attempt.agent, AttemptName(attempt.trial_id, attempt.attempt),
        std::chrono::duration_cast<std::chrono::seconds>(now - attempt.agent_last_seen).count(),
        refusals.at(key));
    lost.push_back(key);
  }
  return lost;
}

}  // namespace llmctl::controller::dispatch
