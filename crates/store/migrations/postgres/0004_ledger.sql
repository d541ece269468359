-- The ledger: every event-log entry carries the hash of the one before it
-- and its own (see crates/ledger/src/chain.rs for the encoding).
--
-- Unlike SQLite's, no PostgreSQL database holds entries from before the
-- ledger, so there is nothing to hash afterwards: no `ledger_backfill`
-- table, and the log refuses every UPDATE, as it has since 0001.
ALTER TABLE events ADD COLUMN prev_hash TEXT;
ALTER TABLE events ADD COLUMN hash TEXT;

-- New entries are written with their hashes.
CREATE TRIGGER events_hashed BEFORE INSERT ON events
FOR EACH ROW WHEN (NEW.hash IS NULL OR NEW.prev_hash IS NULL)
EXECUTE FUNCTION cairn_refuse('an event-log entry is written with its hash');

-- Signed checkpoints of a task's chain head: the DSSE envelope (JSON) and
-- the fields it signs, for lookups. Append-only too.
CREATE TABLE checkpoints (
    id       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id  TEXT NOT NULL REFERENCES tasks(id),
    seq      BIGINT NOT NULL,
    head     TEXT NOT NULL,
    time_ms  BIGINT NOT NULL,
    key_id   TEXT NOT NULL,
    actor    TEXT NOT NULL,          -- who asked (not signed)
    envelope TEXT NOT NULL
);
CREATE INDEX checkpoints_by_task ON checkpoints (task_id, seq);

CREATE TRIGGER checkpoints_no_update BEFORE UPDATE ON checkpoints
FOR EACH ROW EXECUTE FUNCTION cairn_refuse('checkpoints are append-only');

CREATE TRIGGER checkpoints_no_delete BEFORE DELETE ON checkpoints
FOR EACH ROW EXECUTE FUNCTION cairn_refuse('checkpoints are append-only');

CREATE TRIGGER checkpoints_no_truncate BEFORE TRUNCATE ON checkpoints
FOR EACH STATEMENT EXECUTE FUNCTION cairn_refuse('checkpoints are append-only');
