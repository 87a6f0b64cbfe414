-- Days already fetched from AWS Cost Explorer, so final days are not paid for twice.
CREATE TABLE aws_ce_synced_days (
    day_ms     BIGINT  PRIMARY KEY,
    synced_ms  BIGINT  NOT NULL
);

-- Periodic jobs: with several server replicas on one database, the replica holding an
-- unexpired lease runs the job; last_run_ms says when it last finished.
CREATE TABLE job_leases (
    name         TEXT    PRIMARY KEY,
    holder       TEXT,
    expires_ms   BIGINT  NOT NULL,
    last_run_ms  BIGINT
);
