-- A task runs on at most one node at a time: the node holding its lease.
-- The lease is taken before a sandbox is built for the task (create, wake,
-- recovery, fork), renewed with the node's heartbeats and dropped when
-- the task is suspended or ends. The token grows by one at each
-- acquisition by a node that did not hold a live lease, never on renewal,
-- and stays when the lease is dropped: a write carrying an older token is
-- refused (fencing).
ALTER TABLE tasks ADD COLUMN lease_node TEXT;
-- The node that took the lease last (kept when the lease is dropped): a
-- node's local copy of the task's disk is current only if it was this one.
ALTER TABLE tasks ADD COLUMN last_node TEXT;
ALTER TABLE tasks ADD COLUMN lease_token INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN lease_expires_ms INTEGER;

-- Secrets every node of a cluster shares (the API token, the key that
-- signs approval links): the first node to start writes its own, the
-- others adopt them.
CREATE TABLE cluster_secrets (
    name   TEXT PRIMARY KEY,
    value  TEXT NOT NULL
);

-- Who is using the blob store right now, cluster-wide: a snapshot, restore
-- or fork holds a shared row, `cairn gc` an exclusive one, and neither
-- begins while the other kind is held by another node (gc would delete
-- the packs a snapshot is about to reference). Rows run out unless their
-- node renews them, so a dead node's rows do not block forever.
CREATE TABLE blob_locks (
    id          TEXT PRIMARY KEY,
    node        TEXT NOT NULL,
    exclusive   BOOLEAN NOT NULL,
    expires_ms  INTEGER NOT NULL
);

-- The public keys each node signs ledger checkpoints and delivery records
-- with (its secret keys never leave it), so that any node verifies what
-- any other signed.
CREATE TABLE node_keys (
    key_id      TEXT PRIMARY KEY,
    node        TEXT NOT NULL,
    public_key  TEXT NOT NULL,
    created_ms  INTEGER NOT NULL
);
