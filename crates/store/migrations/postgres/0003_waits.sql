-- Waits: what a suspended (or about to be suspended) task is blocked on.
-- At most one pending wait per task.
CREATE TABLE waits (
    id           TEXT PRIMARY KEY,
    task_id      TEXT NOT NULL REFERENCES tasks(id),
    what         TEXT NOT NULL,          -- JSON WaitFor
    kind         TEXT NOT NULL,          -- approval | webhook | timer
    fire_at_ms   BIGINT,                 -- timers only
    created_ms   BIGINT NOT NULL,
    satisfied_ms BIGINT,
    event_id     TEXT
);
CREATE UNIQUE INDEX waits_one_pending ON waits (task_id) WHERE satisfied_ms IS NULL;
CREATE INDEX waits_timers ON waits (fire_at_ms) WHERE satisfied_ms IS NULL AND kind = 'timer';

-- The durable inbox: every event is written here before it is acknowledged.
CREATE TABLE inbox (
    id          TEXT PRIMARY KEY,
    task_id     TEXT NOT NULL REFERENCES tasks(id),
    source      TEXT NOT NULL,
    name        TEXT NOT NULL,
    delivery    TEXT,                    -- a sender's delivery id (webhook-id)
    data        TEXT NOT NULL,           -- JSON
    received_ms BIGINT NOT NULL,
    wait_id     TEXT,                    -- the wait it satisfied
    -- Insertion order (SQLite's rowid): oldest first within a millisecond.
    ord         BIGINT GENERATED ALWAYS AS IDENTITY
);
CREATE UNIQUE INDEX inbox_one_delivery ON inbox (task_id, source, delivery) WHERE delivery IS NOT NULL;
CREATE INDEX inbox_unconsumed ON inbox (task_id, received_ms) WHERE wait_id IS NULL;

ALTER TABLE tasks ADD COLUMN recovery_note TEXT;
ALTER TABLE tasks ADD COLUMN webhook_secret TEXT;
-- The uid slot of the task's last sandbox: a wake on the same slot finds the
-- suspended disk's files owned right and needs no restore.
ALTER TABLE tasks ADD COLUMN last_uid_slot BIGINT;
