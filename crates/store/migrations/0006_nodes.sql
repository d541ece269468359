-- The daemons sharing this database, one row per node name: registered at
-- start, heartbeat refreshed while it runs. A node whose heartbeat is old
-- is down (what "old" is, the runtime decides).
CREATE TABLE nodes (
    name          TEXT PRIMARY KEY,
    url           TEXT NOT NULL,              -- its API, as it announced it
    started_ms    INTEGER NOT NULL,
    heartbeat_ms  INTEGER NOT NULL,
    version       TEXT NOT NULL
);

-- The node whose daemon runs the task's sandbox: set when the sandbox is
-- up, cleared when it goes away (suspend, destroy, lost).
ALTER TABLE tasks ADD COLUMN node TEXT;
