-- Read-only API tokens for BI tools: they read what a viewer reads (GET only), never write,
-- never ingest. Stored as SHA-256 hashes; revoked, they stop working at once on every replica.
CREATE TABLE read_tokens (
    id            INTEGER PRIMARY KEY,
    name          TEXT   NOT NULL UNIQUE,
    token_hash    TEXT   NOT NULL UNIQUE,
    created_by    TEXT   NOT NULL,
    created_ms    BIGINT NOT NULL,
    revoked_ms    BIGINT,
    last_used_ms  BIGINT
);
