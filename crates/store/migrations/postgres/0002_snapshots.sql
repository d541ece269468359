-- Snapshots: immutable captures of a task's writable layer. The data is
-- the manifest (and the chunks it names) in the blob store; this row is
-- written last, so a snapshot is visible only once all of it is durable.
CREATE TABLE snapshots (
    id          TEXT PRIMARY KEY,
    task_id     TEXT NOT NULL REFERENCES tasks(id),
    parent      TEXT,                    -- may name another task's snapshot (forks)
    kind        TEXT NOT NULL,
    note        TEXT NOT NULL,
    healthy     BOOLEAN NOT NULL,
    step        BIGINT NOT NULL,
    memory      TEXT NOT NULL,
    config      TEXT NOT NULL,           -- JSON TaskConfig at capture time
    manifest    TEXT NOT NULL,           -- blob id of the manifest
    files       BIGINT NOT NULL,
    bytes       BIGINT NOT NULL,
    added_bytes BIGINT NOT NULL,
    freeze_ms   DOUBLE PRECISION NOT NULL,
    duration_ms DOUBLE PRECISION NOT NULL,
    created_ms  BIGINT NOT NULL,
    -- Insertion order, which SQLite keeps as the rowid: it breaks ties
    -- between snapshots of the same millisecond.
    ord         BIGINT GENERATED ALWAYS AS IDENTITY
);
CREATE INDEX snapshots_by_task ON snapshots (task_id, created_ms);

-- The latest rollback (JSON RollbackNote), shown to the agent.
ALTER TABLE tasks ADD COLUMN rollback_note TEXT;
-- The manifest whose inode/ctime fields describe the task's disk as it is
-- now: what the next snapshot compares against to read only changed files.
ALTER TABLE tasks ADD COLUMN baseline TEXT;
