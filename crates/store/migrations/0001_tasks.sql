-- Tasks: the durable unit of work.
CREATE TABLE tasks (
    id               TEXT PRIMARY KEY,
    name             TEXT UNIQUE,
    state            TEXT NOT NULL,
    config           TEXT NOT NULL,           -- JSON TaskConfig
    step             INTEGER NOT NULL DEFAULT 0,
    memory           TEXT NOT NULL DEFAULT '',
    created_ms       INTEGER NOT NULL,
    last_activity_ms INTEGER NOT NULL,
    sandbox_state    TEXT NOT NULL DEFAULT 'none',
    sandbox_note     TEXT
);

-- The live compute of a task: zero or one row per task. The uid slot is
-- unique, so no two live sandboxes ever share a host uid range.
CREATE TABLE sandboxes (
    task_id          TEXT PRIMARY KEY REFERENCES tasks(id),
    uid_slot         INTEGER NOT NULL UNIQUE,
    init_pid         INTEGER,
    init_start_time  INTEGER,                 -- guards against pid reuse
    started_ms       INTEGER NOT NULL
);

-- The append-only event log of each task.
CREATE TABLE events (
    task_id     TEXT NOT NULL REFERENCES tasks(id),
    seq         INTEGER NOT NULL,
    time_ms     INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    actor       TEXT NOT NULL,
    args        TEXT NOT NULL,                -- JSON
    exit_code   INTEGER,
    duration_ms INTEGER,
    PRIMARY KEY (task_id, seq)
);

CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'the event log is append-only'); END;

CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'the event log is append-only'); END;
