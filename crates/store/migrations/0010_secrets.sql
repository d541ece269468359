-- Secrets the egress proxy may inject into a task's requests, under the
-- names rules use. The store holds each value sealed (XChaCha20-Poly1305,
-- under the daemon's secrets key, which the store never holds in the
-- clear): a copy of the database reveals no value. Never a value in a
-- task's config, its events, snapshots, ledger or delivery record.
CREATE TABLE secrets (
    name          TEXT PRIMARY KEY,
    -- base64 of nonce || ciphertext; the name is bound in as associated data.
    sealed        TEXT NOT NULL,
    created_ms    INTEGER NOT NULL,
    -- The latest `set` (a new value under the same name).
    updated_ms    INTEGER NOT NULL,
    -- The latest request that used it (NULL: none yet), and how many did.
    last_used_ms  INTEGER,
    uses          INTEGER NOT NULL DEFAULT 0
);
