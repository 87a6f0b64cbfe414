-- How far training runs had got, as training code posts it (POST /api/v1/usage, "progress"):
-- the step (and epoch) a run had reached at a time, per source. Counts are cumulative, so a
-- resend, or another rank reporting the same step, changes nothing: a run's steps in a range are
-- its highest step reported in it less its highest before it. What cost per step divides by.
CREATE TABLE run_progress (
    experiment  TEXT   NOT NULL,
    source      TEXT   NOT NULL,
    at_ms       BIGINT NOT NULL,
    step        BIGINT NOT NULL,
    epoch       BIGINT,
    token_id    BIGINT NOT NULL,
    received_ms BIGINT NOT NULL,
    PRIMARY KEY (experiment, source, at_ms)
);
CREATE INDEX run_progress_by_time ON run_progress (at_ms);
