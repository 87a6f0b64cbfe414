-- Units of work reported by serving code (POST /api/v1/usage): request counts per endpoint and
-- period, so the review can say what 1,000 requests cost. One row per (endpoint, source,
-- period start): a resend replaces, a second replica (source) adds.
CREATE TABLE usage_counts (
    endpoint     TEXT   NOT NULL,
    source       TEXT   NOT NULL,
    start_ms     BIGINT NOT NULL,
    end_ms       BIGINT NOT NULL,
    requests     BIGINT NOT NULL,
    token_id     BIGINT NOT NULL,
    received_ms  BIGINT NOT NULL,
    PRIMARY KEY (endpoint, source, start_ms)
);
CREATE INDEX usage_counts_by_start ON usage_counts (start_ms);
