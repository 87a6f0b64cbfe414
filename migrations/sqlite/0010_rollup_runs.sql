-- Training runs on monthly pages come from the daily rollup; what a day row cannot tell is in
-- which hours a run had GPU work (busy or held idle) across all its GPUs. Kept per day and
-- experiment label, rebuilt with the day's rows.
CREATE TABLE rollup_experiment_days (
    day_ms         BIGINT NOT NULL,
    experiment     TEXT   NOT NULL,
    first_hour_ms  BIGINT NOT NULL,
    last_hour_ms   BIGINT NOT NULL,
    hours          BIGINT NOT NULL,
    PRIMARY KEY (day_ms, experiment)
);

-- The runs API reads experiment-labelled hours only: a fraction of the hourly rows.
CREATE INDEX rollup_hours_experiments ON rollup_hours (hour_ms) WHERE experiment <> '';
