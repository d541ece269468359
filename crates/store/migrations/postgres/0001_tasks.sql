-- PostgreSQL twin of ../0001_tasks.sql: the same tables and rules, in
-- PostgreSQL's types (SQLite's INTEGER is 64-bit: BIGINT here).

-- Tasks: the durable unit of work.
CREATE TABLE tasks (
    id               TEXT PRIMARY KEY,
    name             TEXT UNIQUE,
    state            TEXT NOT NULL,
    config           TEXT NOT NULL,           -- JSON TaskConfig
    step             BIGINT NOT NULL DEFAULT 0,
    memory           TEXT NOT NULL DEFAULT '',
    created_ms       BIGINT NOT NULL,
    last_activity_ms BIGINT NOT NULL,
    sandbox_state    TEXT NOT NULL DEFAULT 'none',
    sandbox_note     TEXT
);

-- The live compute of a task: zero or one row per task. The uid slot is
-- unique, so no two live sandboxes ever share a host uid range.
CREATE TABLE sandboxes (
    task_id          TEXT PRIMARY KEY REFERENCES tasks(id),
    uid_slot         BIGINT NOT NULL UNIQUE,
    init_pid         INTEGER,
    init_start_time  BIGINT,                  -- guards against pid reuse
    started_ms       BIGINT NOT NULL
);

-- The append-only event log of each task.
CREATE TABLE events (
    task_id     TEXT NOT NULL REFERENCES tasks(id),
    seq         BIGINT NOT NULL,
    time_ms     BIGINT NOT NULL,
    kind        TEXT NOT NULL,
    actor       TEXT NOT NULL,
    args        TEXT NOT NULL,                -- JSON, as written (hashed as read back)
    exit_code   INTEGER,
    duration_ms BIGINT,
    PRIMARY KEY (task_id, seq)
);

-- Refuses the statement with the message it is given.
CREATE FUNCTION cairn_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%', TG_ARGV[0] USING ERRCODE = 'restrict_violation';
END
$$;

CREATE TRIGGER events_no_update BEFORE UPDATE ON events
FOR EACH ROW EXECUTE FUNCTION cairn_refuse('the event log is append-only');

CREATE TRIGGER events_no_delete BEFORE DELETE ON events
FOR EACH ROW EXECUTE FUNCTION cairn_refuse('the event log is append-only');

-- SQLite has no TRUNCATE; here it would bypass the row triggers.
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
FOR EACH STATEMENT EXECUTE FUNCTION cairn_refuse('the event log is append-only');
