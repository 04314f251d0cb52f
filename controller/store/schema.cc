#include "controller/store/schema.h"

#include <array>
#include <cstddef>
#include <string_view>

#include "common/snapshot_event.h"

namespace llmctl::store {
namespace {

// The parts joined into one string at compile time: a migration made of definitions that another
// migration shares.
template <const std::string_view&... kParts>
struct Joined {
  static constexpr auto kChars = [] {
    std::array<char, (kParts.size() + ...)> chars{};
    size_t at = 0;
    for (std::string_view part : {kParts...}) {
      for (char c : part) chars[at++] = c;
    }
    return chars;
  }();
  static constexpr std::string_view kText{kChars.data(), kChars.size()};
};

// The snapshot phases as rows (phase_order, phase), in step order, from the names the trainer
// writes (common/snapshot_event.h): "SELECT 0 AS phase_order, 'phase0_before_fwd' AS phase UNION
// ALL SELECT 1, 'phase1_after_fwd' ...".
constexpr std::string_view kPhaseRow0 = "SELECT 0 AS phase_order, '";
constexpr std::string_view kPhaseRow1 = "' AS phase UNION ALL SELECT 1, '";
constexpr std::string_view kPhaseRow2 = "' UNION ALL SELECT 2, '";
constexpr std::string_view kPhaseRow3 = "' UNION ALL SELECT 3, '";
constexpr std::string_view kPhaseRow4 = "' UNION ALL SELECT 4, '";
constexpr std::string_view kPhaseRowsEnd = "'";
static_assert(snapshot_event::kPhases.size() == 5, "one row per phase below");
constexpr std::string_view kPhaseRows =
    Joined<kPhaseRow0, snapshot_event::kBeforeForward, kPhaseRow1, snapshot_event::kAfterForward,
           kPhaseRow2, snapshot_event::kAfterBackward, kPhaseRow3,
           snapshot_event::kAfterOptimizerStep, kPhaseRow4, snapshot_event::kAtOom,
           kPhaseRowsEnd>::kText;

// Times are Unix milliseconds (UTC). JSON columns hold compact JSON text.
constexpr std::string_view kInitialSchema = R"sql(
CREATE TABLE experiments (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL,
  filename TEXT NOT NULL,
  yaml_text TEXT NOT NULL,
  description TEXT NOT NULL,
  target_json TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  -- active while any trial is queued or running, done when every trial has an outcome
  state TEXT NOT NULL CHECK (state IN ('active', 'done'))
);

CREATE TABLE trials (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  experiment_id INTEGER NOT NULL REFERENCES experiments(id) ON DELETE CASCADE,
  ordinal INTEGER NOT NULL,  -- position in the experiment file, from 0
  name TEXT NOT NULL,
  description TEXT NOT NULL,
  config_json TEXT NOT NULL,  -- TrialConfig::ToJson
  expect TEXT CHECK (expect IS NULL OR expect IN ('ok', 'oom')),
  device_type TEXT NOT NULL CHECK (device_type IN ('cpu', 'cuda')),
  device_count INTEGER NOT NULL CHECK (device_count >= 1),
  state TEXT NOT NULL CHECK (state IN
      ('queued', 'running', 'ok', 'oom', 'diverged', 'failed', 'cancelled')),
  current_attempt INTEGER NOT NULL DEFAULT 0,  -- 0 before the first attempt
  -- set when the user cancels a running trial: if its attempt is then lost, the trial ends as
  -- cancelled instead of being queued again
  cancel_requested INTEGER NOT NULL DEFAULT 0,
  UNIQUE (experiment_id, name),
  UNIQUE (experiment_id, ordinal)
);
CREATE INDEX trials_by_state ON trials (state, experiment_id, ordinal);

CREATE TABLE attempts (
  trial_id INTEGER NOT NULL REFERENCES trials(id) ON DELETE CASCADE,
  attempt INTEGER NOT NULL CHECK (attempt >= 1),
  node TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('running', 'ended', 'lost')),
  started_at INTEGER NOT NULL,
  ended_at INTEGER,
  outcome TEXT CHECK (outcome IS NULL OR outcome IN
      ('ok', 'oom', 'diverged', 'failed', 'cancelled')),
  exit_code INTEGER,
  error TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (trial_id, attempt)
) WITHOUT ROWID;

-- The worker's event lines; seq is the 1-based line number in its event file.
CREATE TABLE events (
  trial_id INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  seq INTEGER NOT NULL CHECK (seq >= 1),
  type TEXT NOT NULL,
  json TEXT NOT NULL,
  PRIMARY KEY (trial_id, attempt, seq),
  FOREIGN KEY (trial_id, attempt) REFERENCES attempts(trial_id, attempt) ON DELETE CASCADE
) WITHOUT ROWID;
CREATE INDEX events_by_type ON events (trial_id, attempt, type, seq);

CREATE TABLE nodes (
  name TEXT PRIMARY KEY,
  address TEXT NOT NULL,
  devices_json TEXT NOT NULL,
  last_seen INTEGER NOT NULL,
  state TEXT NOT NULL
) WITHOUT ROWID;

-- The content digest of each input (dataset, model or tokenizer path) uploaded with an experiment.
CREATE TABLE inputs (
  experiment_id INTEGER NOT NULL REFERENCES experiments(id) ON DELETE CASCADE,
  path_as_written TEXT NOT NULL,
  digest TEXT NOT NULL,
  PRIMARY KEY (experiment_id, path_as_written)
) WITHOUT ROWID;

-- Only the name under which a secret is kept in the 0600 secrets file; never a secret itself.
CREATE TABLE secrets_ref (
  name TEXT PRIMARY KEY,
  reference TEXT NOT NULL
) WITHOUT ROWID;
)sql";

// The cloud lease a node runs on (all empty / NULL for nodes on no lease).
constexpr std::string_view kNodeLeases = R"sql(
ALTER TABLE nodes ADD COLUMN lease TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN lease_site TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN lease_flavor TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN lease_ends INTEGER;
)sql";

// When `llmctl node down` removed the node (NULL while it is registered). The row stays so that
// attempts keep naming a node the controller knew; a removed node is not listed or dialled.
constexpr std::string_view kNodeRemoval = R"sql(
ALTER TABLE nodes ADD COLUMN removed_at INTEGER;
)sql";

// The device indices the scheduler gave an attempt, as a JSON array ("[2,3]"), so that a restarted
// controller knows which devices of a multi-GPU node are busy. NULL for attempts started before
// this migration: their indices are unknown.
constexpr std::string_view kAttemptDevices = R"sql(
ALTER TABLE attempts ADD COLUMN device_indices_json TEXT;
)sql";

// The report's figures as SQL views, so that `sqlite3 llmctl.db 'select * from trial_results'`
// answers what `llmctl report` shows without unpacking event JSON by hand; and what `llmctl resume`
// needs beside them: where a continuation starts, and the controller's copy of a checkpoint. One
// migration: none of this had shipped when it was written. Store::Report reads the views, so they
// are the one statement of the report's rules.
//
// `llmctl resume`: a trial whose final attempt stopped with a checkpoint runs again from it. The
// trial keeps the checkpoint its next attempts start from (a continuation that is lost is replaced
// by another from the same checkpoint), each attempt the step it started at; the views read a
// trial's run, its final attempt and the attempts it resumed from.
//
// Which attempts make up the run: the final one and every attempt before it that ended. An attempt
// ends once and gives the trial its outcome, and only a resume queues the trial again after that,
// from the final attempt's checkpoint; so each ended attempt before the final one is one that the
// next attempt of the run continued (lost attempts never count). An attempt's steps count up to
// the step the next attempt of the run started at (its `until_step`): later ones were run again.
//
// The run's figures:
// - train_seconds summed over its attempts' latest `result` events, tokens_per_second their tokens
//   over that time; final_loss the final attempt's result's; load_peak_bytes from the final
//   attempt's latest `start` event;
// - "at peak" is the `snapshot` event of the run with the most allocated bytes, the earliest
//   (attempt, then seq) on a tie: for an out-of-memory trial, the moment the allocation failed;
// - peak_bytes is the highest of the results' and the at-peak snapshot's peak;
// - error is what the controller recorded when the final attempt ended, else its result's;
// - per phase, the phase's snapshot with the most allocated bytes, the earliest on a tie, in the
//   step anatomy's order (trainer/train/trainer.cc) with the out-of-memory snapshot last.
// A run of one attempt has exactly that attempt's figures; NULL where there is no such figure (a
// trial that never started, a run without a result). Each subquery is correlated to one trial, so
// that a query for one experiment reads only its trials' events (through the events primary key and
// events_by_type).
constexpr std::string_view kResumeAndRunViews = R"sql(
ALTER TABLE trials ADD COLUMN resume_attempt INTEGER;  -- whose checkpoint; NULL: from step 0
ALTER TABLE trials ADD COLUMN resume_step INTEGER;  -- the steps it holds: the first step to run
ALTER TABLE trials ADD COLUMN resume_checkpoint TEXT;  -- its directory on resume_attempt's node
ALTER TABLE attempts ADD COLUMN first_step INTEGER NOT NULL DEFAULT 0;
-- The controller's copy of a checkpoint, fetched from its node after a checkpointing stop, so a
-- resumed trial can continue on any node (the node may go away with its lease): the digest of the
-- input tree in the controller's blob store holding the checkpoint this attempt's result names;
-- NULL while the controller has no copy.
ALTER TABLE attempts ADD COLUMN checkpoint_tree TEXT;

CREATE VIEW trial_run_attempts AS
SELECT
  a.trial_id,
  a.attempt,
  a.first_step,
  (SELECT n.first_step FROM attempts n
   WHERE n.trial_id = a.trial_id AND n.attempt > a.attempt AND n.attempt <= t.current_attempt
     AND (n.attempt = t.current_attempt OR n.state = 'ended')
   ORDER BY n.attempt LIMIT 1) AS until_step
FROM trials t
JOIN attempts a ON a.trial_id = t.id
WHERE a.attempt = t.current_attempt OR (a.attempt < t.current_attempt AND a.state = 'ended');

-- The latest `result` event of each attempt of each trial's run.
CREATE VIEW trial_run_results AS
SELECT m.trial_id, m.attempt, e.seq, e.json
FROM trial_run_attempts m
JOIN events e ON e.trial_id = m.trial_id AND e.attempt = m.attempt AND e.seq =
  (SELECT MAX(seq) FROM events
   WHERE trial_id = m.trial_id AND attempt = m.attempt AND type = 'result');

)sql";

// The report's views of a trial's run and its phases (their rules above). Migration 5 created them;
// migration 9 recreates them with the data-parallel categories (comm_bytes, gathered_bytes), and
// migration 14 with a resumed run's seconds summed as REAL (two attempts' integer train_seconds
// near INT64_MAX, as a hostile event line may write them, overflowed SQLite's integer SUM and
// failed every report of the experiment): all read this one definition, so a database migrated
// from any version ends with the same views.
// Like the other byte columns, the categories are NULL for a snapshot without them (one from a
// trainer before they were measured: its buffers were then part of other_bytes).
constexpr std::string_view kReportViewsBeforePhases = R"sql(
CREATE VIEW trial_results AS
SELECT
  x.id AS experiment_id,
  x.name AS experiment,
  t.id AS trial_id,
  t.name AS trial,
  t.ordinal,
  NULLIF(t.current_attempt, 0) AS attempt,
  (SELECT group_concat(attempt, ',') FROM
     (SELECT attempt FROM trial_run_attempts WHERE trial_id = t.id ORDER BY attempt))
      AS run_attempts,
  a.node,
  t.state AS outcome,
  t.expect AS expected,
  a.exit_code,
  COALESCE(NULLIF(a.error, ''), NULLIF(json_extract(r.json, '$.error'), '')) AS error,
  json_extract(s.json, '$.load_peak_bytes') AS load_peak_bytes,
  (SELECT MAX(COALESCE(MAX(json_extract(json, '$.peak_bytes')), json_extract(p.json, '$.peak_bytes')),
              COALESCE(json_extract(p.json, '$.peak_bytes'), MAX(json_extract(json, '$.peak_bytes'))))
   FROM trial_run_results WHERE trial_id = t.id) AS peak_bytes,
  (SELECT CASE WHEN COUNT(*) = 1 THEN MAX(json_extract(json, '$.tokens_per_second'))
          ELSE SUM(CAST(json_extract(json, '$.tokens_per_second') AS REAL) *
                   CAST(json_extract(json, '$.train_seconds') AS REAL))
               / SUM(CAST(json_extract(json, '$.train_seconds') AS REAL)) END
   FROM trial_run_results WHERE trial_id = t.id) AS tokens_per_second,
  (SELECT SUM(CAST(json_extract(json, '$.train_seconds') AS REAL)) FROM trial_run_results
   WHERE trial_id = t.id) AS train_seconds,
  json_extract(r.json, '$.final_loss') AS final_loss,
  p.attempt AS at_peak_attempt,
  p.seq AS at_peak_seq,
  json_extract(p.json, '$.step') AS at_peak_step,
  json_extract(p.json, '$.phase') AS at_peak_phase,
  json_extract(p.json, '$.params_bytes') AS params_bytes,
  json_extract(p.json, '$.grads_bytes') AS grads_bytes,
  json_extract(p.json, '$.optim_device_bytes') AS optim_device_bytes,
  json_extract(p.json, '$.optim_host_bytes') AS optim_host_bytes,
  json_extract(p.json, '$.comm_bytes') AS comm_bytes,
  json_extract(p.json, '$.gathered_bytes') AS gathered_bytes,
  json_extract(p.json, '$.other_bytes') AS other_bytes,
  json_extract(p.json, '$.allocated_bytes') AS allocated_bytes,
  json_extract(p.json, '$.reserved_bytes') AS reserved_bytes
FROM trials t
JOIN experiments x ON x.id = t.experiment_id
LEFT JOIN attempts a ON a.trial_id = t.id AND a.attempt = t.current_attempt
LEFT JOIN events s ON s.trial_id = t.id AND s.attempt = t.current_attempt AND s.seq =
  (SELECT MAX(seq) FROM events
   WHERE trial_id = t.id AND attempt = t.current_attempt AND type = 'start')
LEFT JOIN events r ON r.trial_id = t.id AND r.attempt = t.current_attempt AND r.seq =
  (SELECT MAX(seq) FROM events
   WHERE trial_id = t.id AND attempt = t.current_attempt AND type = 'result')
LEFT JOIN events p ON (p.trial_id, p.attempt, p.seq) =
  (SELECT trial_id, attempt, seq FROM events
   WHERE trial_id = t.id AND type = 'snapshot'
     AND attempt IN (SELECT attempt FROM trial_run_attempts WHERE trial_id = t.id)
   ORDER BY json_extract(json, '$.allocated_bytes') DESC, attempt, seq LIMIT 1)
ORDER BY x.id, t.ordinal;

CREATE VIEW trial_phase_peaks AS
SELECT
  t.experiment_id,
  t.id AS trial_id,
  t.name AS trial,
  ph.phase_order,
  ph.phase,
  p.attempt,
  p.seq,
  json_extract(p.json, '$.step') AS step,
  json_extract(p.json, '$.micro_batch') AS micro_batch,
  json_extract(p.json, '$.params_bytes') AS params_bytes,
  json_extract(p.json, '$.grads_bytes') AS grads_bytes,
  json_extract(p.json, '$.optim_device_bytes') AS optim_device_bytes,
  json_extract(p.json, '$.optim_host_bytes') AS optim_host_bytes,
  json_extract(p.json, '$.comm_bytes') AS comm_bytes,
  json_extract(p.json, '$.gathered_bytes') AS gathered_bytes,
  json_extract(p.json, '$.other_bytes') AS other_bytes,
  json_extract(p.json, '$.allocated_bytes') AS allocated_bytes,
  json_extract(p.json, '$.peak_bytes') AS peak_bytes,
  json_extract(p.json, '$.reserved_bytes') AS reserved_bytes
FROM trials t
CROSS JOIN ()sql";
constexpr std::string_view kReportViewsAfterPhases = R"sql() AS ph
JOIN events p ON (p.trial_id, p.attempt, p.seq) =
  (SELECT trial_id, attempt, seq FROM events
   WHERE trial_id = t.id AND type = 'snapshot'
     AND attempt IN (SELECT attempt FROM trial_run_attempts WHERE trial_id = t.id)
     AND json_extract(json, '$.phase') = ph.phase
   ORDER BY json_extract(json, '$.allocated_bytes') DESC, attempt, seq LIMIT 1)
ORDER BY t.experiment_id, t.ordinal, ph.phase_order;
)sql";
constexpr std::string_view kReportViews =
    Joined<kReportViewsBeforePhases, kPhaseRows, kReportViewsAfterPhases>::kText;

// Whether `sql` selects the snapshot's `field` under its own name: "'$.FIELD') AS FIELD".
constexpr bool SelectsField(std::string_view sql, std::string_view field) {
  for (size_t at = sql.find("'$."); at != std::string_view::npos; at = sql.find("'$.", at + 1)) {
    std::string_view rest = sql.substr(at + 3);
    if (!rest.starts_with(field)) continue;
    rest.remove_prefix(field.size());
    if (!rest.starts_with("') AS ")) continue;
    rest.remove_prefix(6);
    if (rest.starts_with(field) && rest.substr(field.size()).find_first_of(",\n") == 0) return true;
  }
  return false;
}
// The views spell the snapshot's fields out in SQL: each must be common/snapshot_event.h's name, so
// a field renamed there fails here, at compile time, and not as NULL columns in the report.
constexpr bool SelectsEverySnapshotField(std::string_view sql) {
  for (std::string_view field : snapshot_event::kByteFields) {
    if (!SelectsField(sql, field)) return false;
  }
  return SelectsField(sql, snapshot_event::kStep) && SelectsField(sql, snapshot_event::kMicroBatch);
}
static_assert(SelectsEverySnapshotField(kReportViews), "trial_phase_peaks: a snapshot field");

// Migration 5 created the view; migration 17 recreates it with others_cpu_share (the share of the
// machine's CPU time other processes took during a one-process trial's step, from llm-train since
// 12-03), migration 18 with pace_seconds (the machine's pace after a one-process CPU trial's step,
// since 12-07): each reads this one definition.
constexpr std::string_view kTrialStepsView = R"sql(
-- The `step` events of each trial's run; step counts from 0, as in the events.
CREATE VIEW trial_steps AS
SELECT
  t.experiment_id,
  t.id AS trial_id,
  t.name AS trial,
  e.attempt,
  json_extract(e.json, '$.step') AS step,
  json_extract(e.json, '$.loss') AS loss,
  json_extract(e.json, '$.lr') AS lr,
  json_extract(e.json, '$.tokens') AS tokens,
  json_extract(e.json, '$.seconds') AS seconds,
  json_extract(e.json, '$.allocated_bytes') AS allocated_bytes,
  json_extract(e.json, '$.peak_bytes') AS peak_bytes,
  json_extract(e.json, '$.others_cpu_share') AS others_cpu_share,
  json_extract(e.json, '$.pace_seconds') AS pace_seconds
FROM trials t
JOIN trial_run_attempts m ON m.trial_id = t.id
JOIN events e ON e.trial_id = t.id AND e.attempt = m.attempt AND e.type = 'step'
WHERE m.until_step IS NULL OR json_extract(e.json, '$.step') < m.until_step
ORDER BY t.experiment_id, t.ordinal, e.attempt, e.seq;
)sql";

// What the agents sampled of each attempt's devices once a second (agent/device_sampler.h): GPU
// utilisation, memory, power and temperature, or the trial's processes' CPU and resident memory.
// Store::AppendDeviceSamples keeps an attempt's last 10 minutes one reading per row and merges
// older readings per device into 10-second rows (`count` readings; mean utilisation and power,
// highest memory and temperature). attempts.device_sample_seq is the highest reading ingested (its
// line in the agent's samples file): what makes ingestion idempotent once rows are merged.
constexpr std::string_view kDeviceSamples = R"sql(
CREATE TABLE device_samples (
  trial_id INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  device TEXT NOT NULL,          -- "cuda:N" (the node's index) or "cpu"
  sampled_at INTEGER NOT NULL,   -- a merged row: its bucket's start
  count INTEGER NOT NULL CHECK (count >= 1),
  utilization_percent REAL,      -- GPU 0-100; CPU percent of one core
  memory_used_bytes INTEGER NOT NULL CHECK (memory_used_bytes >= 0),
  memory_total_bytes INTEGER NOT NULL CHECK (memory_total_bytes >= 0),
  power_watts REAL,
  temperature_celsius REAL,
  PRIMARY KEY (trial_id, attempt, device, sampled_at),
  FOREIGN KEY (trial_id, attempt) REFERENCES attempts(trial_id, attempt) ON DELETE CASCADE
) WITHOUT ROWID;
ALTER TABLE attempts ADD COLUMN device_sample_seq INTEGER NOT NULL DEFAULT 0;
)sql";

// Memory over time, as the HTML report draws it: every `snapshot` event of each attempt of a
// trial's run, in order, beside its attempt's start on the wall clock and device limit (from the
// attempt's latest `start` event: the zero of the snapshots' elapsed_ms, which the trainer counts
// on its monotonic clock; NULL when the attempt has no start event, or one from before the field).
// An attempt of the run without snapshots has one row with NULL seq, so that every attempt of the
// run is listed: its device samples (device_samples) still belong on the axis.
constexpr std::string_view kMemoryTimeline = R"sql(
CREATE VIEW trial_memory_timeline AS
SELECT
  t.experiment_id,
  t.id AS trial_id,
  t.name AS trial,
  m.attempt,
  json_extract(s.json, '$.started_unix_ms') AS attempt_started_unix_ms,
  json_extract(s.json, '$.device_limit_bytes') AS device_limit_bytes,
  e.seq,
  json_extract(e.json, '$.elapsed_ms') AS elapsed_ms,
  json_extract(e.json, '$.step') AS step,
  json_extract(e.json, '$.micro_batch') AS micro_batch,
  json_extract(e.json, '$.phase') AS phase,
  json_extract(e.json, '$.allocated_bytes') AS allocated_bytes,
  json_extract(e.json, '$.reserved_bytes') AS reserved_bytes,
  json_extract(e.json, '$.peak_bytes') AS peak_bytes
FROM trials t
JOIN trial_run_attempts m ON m.trial_id = t.id
LEFT JOIN events s ON s.trial_id = t.id AND s.attempt = m.attempt AND s.seq =
  (SELECT MAX(seq) FROM events WHERE trial_id = t.id AND attempt = m.attempt AND type = 'start')
LEFT JOIN events e ON e.trial_id = t.id AND e.attempt = m.attempt AND e.type = 'snapshot'
ORDER BY t.experiment_id, t.ordinal, m.attempt, e.seq;
)sql";

// A multi-rank trial's (strategy ddp or fsdp, devices > 1) other ranks' event lines: rank r's
// events.rank<r>.jsonl, seq its 1-based line there. Rank 0's lines stay in `events`, which every
// view above reads: rank 0 reports the job's loss, tokens and tokens/s (the trainer sums them over
// the ranks), and its memory is one rank's. The views below read all ranks:
// - all_rank_events: `events` as rank 0 and rank_events, one relation;
// - trial_rank_peaks: per trial of the run and rank, the highest peak_bytes of its snapshots and
//   results and the most allocated bytes of a snapshot; a trial with one rank has one row (rank 0);
// - trial_rank_phase_peaks: per trial, rank and phase, the phase's most allocated bytes (and its
//   highest peak_bytes), in the step anatomy's order with "oom" last;
// - trial_rank_steps: the `step` events of every rank of each trial's run, as trial_steps.
constexpr std::string_view kRankEventsBeforePhases = R"sql(
CREATE TABLE rank_events (
  trial_id INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  rank INTEGER NOT NULL CHECK (rank >= 1),
  seq INTEGER NOT NULL CHECK (seq >= 1),
  type TEXT NOT NULL,
  json TEXT NOT NULL,
  PRIMARY KEY (trial_id, attempt, rank, seq),
  FOREIGN KEY (trial_id, attempt) REFERENCES attempts(trial_id, attempt) ON DELETE CASCADE
) WITHOUT ROWID;
CREATE INDEX rank_events_by_type ON rank_events (trial_id, attempt, type, rank, seq);

CREATE VIEW all_rank_events AS
SELECT trial_id, attempt, 0 AS rank, seq, type, json FROM events
UNION ALL
SELECT trial_id, attempt, rank, seq, type, json FROM rank_events;

CREATE VIEW trial_rank_peaks AS
SELECT
  t.experiment_id,
  t.id AS trial_id,
  t.name AS trial,
  e.rank,
  MAX(json_extract(e.json, '$.peak_bytes')) AS peak_bytes,
  MAX(CASE WHEN e.type = 'snapshot' THEN json_extract(e.json, '$.allocated_bytes') END)
      AS allocated_bytes
FROM trials t
JOIN trial_run_attempts m ON m.trial_id = t.id
JOIN all_rank_events e ON e.trial_id = t.id AND e.attempt = m.attempt
     AND e.type IN ('snapshot', 'result')
GROUP BY t.id, e.rank
ORDER BY t.experiment_id, t.ordinal, e.rank;

CREATE VIEW trial_rank_phase_peaks AS
SELECT
  t.experiment_id,
  t.id AS trial_id,
  t.name AS trial,
  e.rank,
  ph.phase_order,
  ph.phase,
  MAX(json_extract(e.json, '$.allocated_bytes')) AS allocated_bytes,
  MAX(json_extract(e.json, '$.peak_bytes')) AS peak_bytes
FROM trials t
JOIN trial_run_attempts m ON m.trial_id = t.id
JOIN all_rank_events e ON e.trial_id = t.id AND e.attempt = m.attempt AND e.type = 'snapshot'
JOIN ()sql";
constexpr std::string_view kRankEventsAfterPhases =
    R"sql() AS ph ON ph.phase = json_extract(e.json, '$.phase')
GROUP BY t.id, e.rank, ph.phase_order
ORDER BY t.experiment_id, t.ordinal, e.rank, ph.phase_order;

CREATE VIEW trial_rank_steps AS
SELECT
  t.experiment_id,
  t.id AS trial_id,
  t.name AS trial,
  e.attempt,
  e.rank,
  json_extract(e.json, '$.step') AS step,
  json_extract(e.json, '$.loss') AS loss,
  json_extract(e.json, '$.tokens') AS tokens,
  json_extract(e.json, '$.seconds') AS seconds,
  json_extract(e.json, '$.allocated_bytes') AS allocated_bytes,
  json_extract(e.json, '$.peak_bytes') AS peak_bytes
FROM trials t
JOIN trial_run_attempts m ON m.trial_id = t.id
JOIN all_rank_events e ON e.trial_id = t.id AND e.attempt = m.attempt AND e.type = 'step'
WHERE m.until_step IS NULL OR json_extract(e.json, '$.step') < m.until_step
ORDER BY t.experiment_id, t.ordinal, e.attempt, e.rank, e.seq;
)sql";
constexpr std::string_view kRankEvents =
    Joined<kRankEventsBeforePhases, kPhaseRows, kRankEventsAfterPhases>::kText;

// Recreates the report's views with the data-parallel categories (kReportViews).
constexpr std::string_view kDropReportViews = R"sql(
DROP VIEW trial_results;
DROP VIEW trial_phase_peaks;
)sql";

// A multi-node attempt (the trial key `nodes` > 1) runs on several nodes at once: every node of it,
// node rank 0 included (the attempt's own `node`), with the devices it holds there and how its
// run there ended. The attempt itself ends once every node's run has (Store::FinishAttemptNode).
// Single-node attempts have no rows here.
constexpr std::string_view kAttemptNodes = R"sql(
CREATE TABLE attempt_nodes (
  trial_id INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  node_rank INTEGER NOT NULL CHECK (node_rank >= 0),
  node TEXT NOT NULL,
  device_indices_json TEXT NOT NULL,
  ended_at INTEGER,  -- NULL while its run runs
  outcome TEXT CHECK (outcome IS NULL OR outcome IN
      ('ok', 'oom', 'diverged', 'failed', 'cancelled')),
  exit_code INTEGER,
  error TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (trial_id, attempt, node_rank),
  UNIQUE (trial_id, attempt, node),
  FOREIGN KEY (trial_id, attempt) REFERENCES attempts(trial_id, attempt) ON DELETE CASCADE
) WITHOUT ROWID;
CREATE INDEX attempt_nodes_by_node ON attempt_nodes (node);
)sql";

// What `llmctl estimate` predicted for each trial when it was submitted (common/estimate): a
// JSON object (peak_bytes, activation_bytes, model_state_bytes, peak_phase, device_memory_bytes,
// verdict); NULL when the CLI could not estimate it (a model on the hub).
constexpr std::string_view kTrialPredictions = R"sql(
ALTER TABLE trials ADD COLUMN prediction_json TEXT;
)sql";

// Every node of a multi-node attempt samples its own devices, numbering its readings itself: each
// row says which node rank read it (0 for every single-node attempt), and each other node's
// highest ingested reading is kept with its attempt_nodes row (node rank 0's stays in attempts).
constexpr std::string_view kDeviceSamplesByNode = R"sql(
CREATE TABLE device_samples_by_node (
  trial_id INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  node_rank INTEGER NOT NULL CHECK (node_rank >= 0),
  device TEXT NOT NULL,          -- "cuda:N" (the node's index) or "cpu"
  sampled_at INTEGER NOT NULL,   -- a merged row: its bucket's start
  count INTEGER NOT NULL CHECK (count >= 1),
  utilization_percent REAL,      -- GPU 0-100; CPU percent of one core
  memory_used_bytes INTEGER NOT NULL CHECK (memory_used_bytes >= 0),
  memory_total_bytes INTEGER NOT NULL CHECK (memory_total_bytes >= 0),
  power_watts REAL,
  temperature_celsius REAL,
  PRIMARY KEY (trial_id, attempt, node_rank, device, sampled_at),
  FOREIGN KEY (trial_id, attempt) REFERENCES attempts(trial_id, attempt) ON DELETE CASCADE
) WITHOUT ROWID;
INSERT INTO device_samples_by_node
SELECT trial_id, attempt, 0, device, sampled_at, count, utilization_percent, memory_used_bytes,
       memory_total_bytes, power_watts, temperature_celsius
FROM device_samples;
DROP TABLE device_samples;
ALTER TABLE device_samples_by_node RENAME TO device_samples;
ALTER TABLE attempt_nodes ADD COLUMN device_sample_seq INTEGER NOT NULL DEFAULT 0;
)sql";

// Each node's own rates as its agent last reported them (llm-train --probe's JSON,
// common/estimate/rate_probe.h; the controller parses it before storing): one row per node, a new
// probe replacing the old. Kept apart from nodes, whose rows every health check rewrites.
constexpr std::string_view kNodeRates = R"sql(
CREATE TABLE node_rates (
  node TEXT PRIMARY KEY,
  probe_json TEXT NOT NULL,
  stored_at INTEGER NOT NULL
) WITHOUT ROWID;
)sql";

// Each device sample row keeps its reading's seq (its line in its node's samples file; a merged
// row: its last reading's), the order the node took and the store ingested them in. The dates are
// the node's clock, which can step back: a node's latest reading, shown by `llmctl watch` and
// ending its window of unmerged readings, is its highest seq. Rows stored before have 0, and their
// dates decide among them.
constexpr std::string_view kDeviceSampleSeq = R"sql(
ALTER TABLE device_samples ADD COLUMN seq INTEGER NOT NULL DEFAULT 0 CHECK (seq >= 0);
)sql";

// The runs of attempts declared lost that may still go on on their nodes (an agent that refused
// the attempt's stream, one silent for a while, a multi-node attempt's other nodes): each holds its
// devices there (attempts' or attempt_nodes' device_indices_json) until the controller confirms it
// stopped or unknown to its agent (Store::ReleaseLostRun). Kept here, not only in the controller's
// memory, so that a restarted llmctld (killed -9 included) does not place a trial onto them. The
// runs of attempts lost before this migration, on nodes not removed, are kept as well: the llmctld
// that lost them held them in memory only, and this one asks their agents again.
constexpr std::string_view kLostRuns = R"sql(
CREATE TABLE lost_runs (
  trial_id INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  node TEXT NOT NULL,
  PRIMARY KEY (trial_id, attempt, node),
  FOREIGN KEY (trial_id, attempt) REFERENCES attempts(trial_id, attempt) ON DELETE CASCADE
) WITHOUT ROWID;
INSERT INTO lost_runs
SELECT a.trial_id, a.attempt, a.node FROM attempts a
WHERE a.state = 'lost' AND NOT EXISTS (
  SELECT 1 FROM attempt_nodes n WHERE n.trial_id = a.trial_id AND n.attempt = a.attempt)
UNION
SELECT n.trial_id, n.attempt, n.node FROM attempt_nodes n JOIN attempts a
  ON a.trial_id = n.trial_id AND a.attempt = n.attempt
WHERE a.state = 'lost' AND n.ended_at IS NULL;
DELETE FROM lost_runs WHERE node IN (SELECT name FROM nodes WHERE removed_at IS NOT NULL);
)sql";

constexpr std::string_view kDropTrialStepsView = R"sql(
DROP VIEW trial_steps;
)sql";

constexpr std::array<std::string_view, 18> kMigrations = {
    kInitialSchema,
    kNodeLeases,
    kNodeRemoval,
    kAttemptDevices,
    Joined<kResumeAndRunViews, kReportViews, kTrialStepsView>::kText,
    kDeviceSamples,
    kMemoryTimeline,
    kRankEvents,
    Joined<kDropReportViews, kReportViews>::kText,
    kAttemptNodes,
    kTrialPredictions,
    kDeviceSamplesByNode,
    kNodeRates,
    Joined<kDropReportViews, kReportViews>::kText,
    kDeviceSampleSeq,
    kLostRuns,
    Joined<kDropTrialStepsView, kTrialStepsView>::kText,
    Joined<kDropTrialStepsView, kTrialStepsView>::kText};

}  // namespace

std::span<const std::string_view> Migrations() { return kMigrations; }

}  // namespace llmctl::store
