-- PostgreSQL twin of ../0009_api_keys.sql.

-- Keys for the E2B-compatible API (its clients send one in `X-API-Key`),
-- each under a name people know it by (to list it, to revoke it). Only
-- the SHA-256 of a key is kept, as hex, and the store never sees the key
-- itself (the caller hashes it): a copy of the database lets no one in.
-- The hash is unique because a request finds its key by it.
CREATE TABLE api_keys (
    name          TEXT PRIMARY KEY,
    hash          TEXT NOT NULL UNIQUE,
    created_ms    BIGINT NOT NULL,
    -- The latest request that presented the key (NULL: none yet), so that
    -- keys no one uses any more can be told and revoked.
    last_used_ms  BIGINT
);
