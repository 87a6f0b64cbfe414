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

-- The daily rollup summed over each host's GPUs: what monthly pages and the allocation API read
-- unless they show single GPUs (a host's GPUs mostly serve one owner, so ~8× fewer rows).
-- Rebuilt with the day's rows.
CREATE TABLE rollup_host_days (
    day_ms              BIGINT  NOT NULL,
    host_id             BIGINT  NOT NULL,
    model               TEXT    NOT NULL,
    experiment          TEXT    NOT NULL,
    endpoint            TEXT    NOT NULL,
    team                TEXT    NOT NULL,
    kind                TEXT    NOT NULL,
    pricing_category    TEXT    NOT NULL,
    currency            TEXT    NOT NULL,
    estimated           BIGINT  NOT NULL,
    cost_nano           BIGINT  NOT NULL,
    cost_atto           BIGINT  NOT NULL,
    gpu_seconds         DOUBLE PRECISION NOT NULL,
    util_gpu_seconds    DOUBLE PRECISION NOT NULL,
    util_known_seconds  DOUBLE PRECISION NOT NULL,
    energy_j            DOUBLE PRECISION NOT NULL
);
CREATE INDEX rollup_host_days_by_day ON rollup_host_days (day_ms);

-- The heatmap reads a few GPUs' days.
CREATE INDEX rollup_days_by_gpu ON rollup_days (gpu_uuid, day_ms);

