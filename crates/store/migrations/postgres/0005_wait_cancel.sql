-- A cancelled wait: it ended without an event. `satisfied_ms` is set too
-- (when it ended), so that it no longer counts as pending anywhere.
ALTER TABLE waits ADD COLUMN cancelled_ms BIGINT;
