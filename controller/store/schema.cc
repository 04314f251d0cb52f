#include "controller/store/schema.h"

#include <array>

namespace llmctl::store {
namespace {

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

constexpr std::array<std::string_view, 4> kMigrations = {kInitialSchema, kNodeLeases, kNodeRemoval,
                                                         kAttemptDevices};

}  // namespace

std::span<const std::string_view> Migrations() { return kMigrations; }

}  // namespace llmctl::store
