-- Scheduled exports of the allocation to object storage: one row per period (a day, or a month
-- at its close), written when its files and manifest are in the bucket, or when a try failed
-- (retried from next_attempt_ms on). Whichever replica holds the export job's lease writes it.
CREATE TABLE exports (
    period          TEXT    PRIMARY KEY,
    start_ms        BIGINT  NOT NULL,
    end_ms          BIGINT  NOT NULL,
    status          TEXT    NOT NULL,
    attempts        BIGINT  NOT NULL,
    next_attempt_ms BIGINT  NOT NULL,
    last_error      TEXT,
    manifest_key    TEXT,
    files_json      TEXT,
    updated_ms      BIGINT  NOT NULL
);
