-- A snapshot of a gvisor task may hold a checkpoint of the sandbox's
-- processes and memory (as the `memory` layer of its manifest): a rollback
-- to it or a fork from it continues them.
ALTER TABLE snapshots ADD COLUMN with_memory BOOLEAN NOT NULL DEFAULT false;
