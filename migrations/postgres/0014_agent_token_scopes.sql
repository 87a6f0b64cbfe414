-- Agent tokens scoped to what they may report (docs/security.md, "Agent tokens").
--
-- A token is made for one cluster, optionally for the host names a glob pattern matches. A host
-- is bound to the first token that reports it (hosts.token_id); another token reporting it, or
-- one of its GPUs, is refused until an admin moves it (`token rebind`).
--
-- Tokens made before scopes existed keep working: each is bound to the hosts it already reported
-- (the token of a host's first batch), and one that reported a single cluster is scoped to it.
-- One that reported several clusters, or none yet, keeps `cluster` NULL: it may report the
-- clusters it has reported before, and one that never reported takes the first cluster it reports.
ALTER TABLE api_tokens ADD COLUMN cluster TEXT;
ALTER TABLE api_tokens ADD COLUMN host_pattern TEXT;
ALTER TABLE api_tokens ADD COLUMN expires_ms BIGINT;
ALTER TABLE api_tokens ADD COLUMN last_used_ms BIGINT;
ALTER TABLE api_tokens ADD COLUMN last_address TEXT;
-- Rotation: the secret replaced last keeps working until previous_expires_ms, so agents roll
-- over to the new one without a gap.
ALTER TABLE api_tokens ADD COLUMN previous_token_hash TEXT;
ALTER TABLE api_tokens ADD COLUMN previous_expires_ms BIGINT;
CREATE UNIQUE INDEX api_tokens_by_previous_hash ON api_tokens (previous_token_hash);

ALTER TABLE hosts ADD COLUMN token_id BIGINT REFERENCES api_tokens (id);
CREATE INDEX hosts_by_token ON hosts (token_id);
UPDATE hosts SET token_id = (
    SELECT b.token_id FROM ingested_batches b
    WHERE b.host_id = hosts.id
    ORDER BY b.received_ms, b.batch_id
    LIMIT 1
);
UPDATE api_tokens SET cluster = (
    SELECT MIN(h.cluster) FROM hosts h WHERE h.token_id = api_tokens.id
)
WHERE (SELECT COUNT(DISTINCT h.cluster) FROM hosts h WHERE h.token_id = api_tokens.id) = 1;

-- What a retried batch must repeat exactly to be answered "duplicate" (SHA-256 of the report).
-- NULL for batches stored before: a retry of one of those is taken as a duplicate, as it was.
ALTER TABLE ingested_batches ADD COLUMN content_sha256 TEXT;

-- Reports refused because of whom they came from: counted per token, host and reason, and shown
-- on the fleet page until an admin acts on them.
CREATE TABLE ingest_refusals (
    token_id    BIGINT  NOT NULL REFERENCES api_tokens (id),
    cluster     TEXT    NOT NULL,
    hostname    TEXT    NOT NULL,
    reason      TEXT    NOT NULL,
    message     TEXT    NOT NULL,
    first_ms    BIGINT  NOT NULL,
    last_ms     BIGINT  NOT NULL,
    attempts    BIGINT  NOT NULL,
    PRIMARY KEY (token_id, cluster, hostname, reason)
);
CREATE INDEX ingest_refusals_by_time ON ingest_refusals (last_ms);

-- Raised inside the one-statement ingest (store/postgres.rs) when a window was already stored,
-- so that nothing of the report is written. It never holds a row.
CREATE TABLE ingest_window_guard (
    windows_all_new BOOLEAN NOT NULL CONSTRAINT ingest_window_already_stored CHECK (windows_all_new)
);
