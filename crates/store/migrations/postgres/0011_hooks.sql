-- PostgreSQL twin of ../0011_hooks.sql.

-- Outgoing notifications: hooks the operator configures (a URL, the event
-- kinds it takes, every task or one) and their outbox. An event of a kind
-- a hook takes puts a row in the outbox in the transaction that appends
-- the event (the trigger below), so that nothing acknowledged is lost to
-- a crash; a sender takes each (hook, task) stream's oldest row, posts it
-- and deletes it on a 2xx answer (at least once, in order per task).
CREATE TABLE hooks (
    id          TEXT PRIMARY KEY,
    url         TEXT NOT NULL,
    -- NULL: every task's events.
    task_id     TEXT REFERENCES tasks(id),
    -- 'standard' (Standard Webhooks) or 'e2b' (E2B's lifecycle webhooks).
    format      TEXT NOT NULL,
    -- The signing secret, sealed under the secrets key (as secrets.sealed).
    sealed      TEXT NOT NULL,
    created_ms  BIGINT NOT NULL,
    -- Notifications answered with a 2xx, and the latest of them.
    sent        BIGINT NOT NULL DEFAULT 0,
    last_sent_ms BIGINT
);

-- The event-log kinds (events.kind) each hook takes.
CREATE TABLE hook_kinds (
    hook_id     TEXT NOT NULL REFERENCES hooks(id),
    kind        TEXT NOT NULL,
    PRIMARY KEY (kind, hook_id)
);

CREATE TABLE hook_outbox (
    id           BIGSERIAL PRIMARY KEY,
    -- No reference to hooks: an event appended while its hook is removed
    -- must not fail on it; a row of a removed hook is dropped unsent.
    hook_id      TEXT NOT NULL,
    task_id      TEXT NOT NULL,
    seq          BIGINT NOT NULL,
    created_ms   BIGINT NOT NULL,
    -- 'pending' until answered with a 2xx (then deleted), 'failed' once
    -- given up (kept, shown, until the hook is removed).
    state        TEXT NOT NULL DEFAULT 'pending',
    attempts     BIGINT NOT NULL DEFAULT 0,
    -- Not before this time (the backoff after a failed attempt).
    next_ms      BIGINT NOT NULL,
    last_error   TEXT,
    -- A node sending it now holds it until then (a node that dies while
    -- sending lets it go when the claim runs out).
    claimed_by   TEXT,
    claimed_until BIGINT NOT NULL DEFAULT 0,
    UNIQUE (hook_id, task_id, seq)
);
CREATE INDEX hook_outbox_streams ON hook_outbox (state, hook_id, task_id, id);

CREATE FUNCTION cairn_events_to_hooks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO hook_outbox (hook_id, task_id, seq, created_ms, next_ms)
    SELECT h.id, NEW.task_id, NEW.seq, NEW.time_ms, NEW.time_ms
    FROM hook_kinds k JOIN hooks h ON h.id = k.hook_id
    WHERE k.kind = NEW.kind AND (h.task_id IS NULL OR h.task_id = NEW.task_id);
    RETURN NULL;
END
$$;
CREATE TRIGGER events_to_hooks AFTER INSERT ON events
    FOR EACH ROW EXECUTE FUNCTION cairn_events_to_hooks();
