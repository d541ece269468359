-- The ledger: every event-log entry carries the hash of the one before it
-- and its own (see crates/ledger/src/chain.rs for the encoding). Entries
-- written before this migration get theirs once, at the next start, in
-- chain order (`ledger_backfill` says which; a row leaves it when done).
ALTER TABLE events ADD COLUMN prev_hash TEXT;
ALTER TABLE events ADD COLUMN hash TEXT;

CREATE TABLE ledger_backfill (
    task_id TEXT PRIMARY KEY,
    upto    INTEGER NOT NULL          -- the last seq written before the ledger
);
INSERT INTO ledger_backfill (task_id, upto) SELECT task_id, MAX(seq) FROM events GROUP BY task_id;

-- Still append-only: the one update allowed is filling in the hashes of an
-- entry that has none, without touching anything else.
DROP TRIGGER events_no_update;
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
WHEN OLD.hash IS NOT NULL OR OLD.prev_hash IS NOT NULL
  OR NEW.hash IS NULL OR NEW.prev_hash IS NULL
  OR NEW.task_id IS NOT OLD.task_id OR NEW.seq IS NOT OLD.seq
  OR NEW.time_ms IS NOT OLD.time_ms OR NEW.kind IS NOT OLD.kind
  OR NEW.actor IS NOT OLD.actor OR NEW.args IS NOT OLD.args
  OR NEW.exit_code IS NOT OLD.exit_code OR NEW.duration_ms IS NOT OLD.duration_ms
BEGIN SELECT RAISE(ABORT, 'the event log is append-only'); END;

-- New entries are written with their hashes.
CREATE TRIGGER events_hashed BEFORE INSERT ON events
WHEN NEW.hash IS NULL OR NEW.prev_hash IS NULL
BEGIN SELECT RAISE(ABORT, 'an event-log entry is written with its hash'); END;

-- Signed checkpoints of a task's chain head: the DSSE envelope (JSON) and
-- the fields it signs, for lookups. Append-only too.
CREATE TABLE checkpoints (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id  TEXT NOT NULL REFERENCES tasks(id),
    seq      INTEGER NOT NULL,
    head     TEXT NOT NULL,
    time_ms  INTEGER NOT NULL,
    key_id   TEXT NOT NULL,
    actor    TEXT NOT NULL,          -- who asked (not signed)
    envelope TEXT NOT NULL
);
CREATE INDEX checkpoints_by_task ON checkpoints (task_id, seq);

CREATE TRIGGER checkpoints_no_update BEFORE UPDATE ON checkpoints
BEGIN SELECT RAISE(ABORT, 'checkpoints are append-only'); END;

CREATE TRIGGER checkpoints_no_delete BEFORE DELETE ON checkpoints
BEGIN SELECT RAISE(ABORT, 'checkpoints are append-only'); END;
