-- Right-sizing reads who used which GPU how hard: per hour, GPU and endpoint or model label, the
-- number of GPU windows in each 5-point band of GPU utilization (so a look-back's p95 comes from
-- summed counts) and the largest GPU memory one of its processes held. Rebuilt with the hour's
-- cost rows by the roll-up job, so recommendations never read raw windows.
CREATE TABLE rollup_usage_hours (
    hour_ms            BIGINT NOT NULL,
    host_id            BIGINT NOT NULL,
    gpu_uuid           TEXT   NOT NULL,
    -- 'endpoint' or 'model'
    owner_by           TEXT   NOT NULL,
    owner_key          TEXT   NOT NULL,
    -- floor(utilization / 5), 0 to 20; -1 for windows without utilization
    util_band          BIGINT NOT NULL,
    windows            BIGINT NOT NULL,
    peak_memory_bytes  BIGINT NOT NULL
);
CREATE INDEX rollup_usage_hours_by_hour ON rollup_usage_hours (hour_ms);

-- The same summed per UTC day: what a look-back of whole days reads.
CREATE TABLE rollup_usage_days (
    day_ms             BIGINT NOT NULL,
    host_id            BIGINT NOT NULL,
    gpu_uuid           TEXT   NOT NULL,
    owner_by           TEXT   NOT NULL,
    owner_key          TEXT   NOT NULL,
    util_band          BIGINT NOT NULL,
    windows            BIGINT NOT NULL,
    peak_memory_bytes  BIGINT NOT NULL
);
CREATE INDEX rollup_usage_days_by_day ON rollup_usage_days (day_ms);

-- Recommendations as last computed from the rollups, per range: pages read one row. A range still
-- under way is recomputed by a periodic job and expires after minutes; a range that had ended
-- when computed is kept until a roll-up rewrites one of its days (late data, a new bill).
CREATE TABLE recommendation_snapshots (
    from_ms      BIGINT NOT NULL,
    to_ms        BIGINT NOT NULL,
    observed_ms  BIGINT NOT NULL,
    computed_ms  BIGINT NOT NULL,
    body         TEXT   NOT NULL,
    PRIMARY KEY (from_ms, to_ms, observed_ms)
);
