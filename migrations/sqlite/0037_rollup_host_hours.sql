-- The hourly rollup summed over each host's GPUs, per owner, kind and price, with the GPUs that
-- carried it (a JSON array): what the review's idle history, coverage per instance type, week's
-- shape and scale-to-zero windows read. They need each hour but never a single GPU's figures,
-- and a host's GPUs mostly serve one owner, so this holds about 8× fewer rows than
-- rollup_hours. Rebuilt with each hour's rows.
CREATE TABLE rollup_host_hours (
    hour_ms             BIGINT  NOT NULL,
    host_id             BIGINT  NOT NULL,
    owner_id            BIGINT  NOT NULL,
    kind                TEXT    NOT NULL,
    pricing_category    TEXT    NOT NULL,
    currency            TEXT    NOT NULL,
    estimated           BIGINT  NOT NULL,
    cost_nano           BIGINT  NOT NULL,
    cost_atto           BIGINT  NOT NULL,
    gpu_seconds         REAL NOT NULL,
    gpus                TEXT    NOT NULL
);
CREATE INDEX rollup_host_hours_by_hour ON rollup_host_hours (hour_ms);

-- Sums stay exact: atto parts carry over into nano parts in integer math.
INSERT INTO rollup_host_hours (hour_ms, host_id, owner_id, kind, pricing_category, currency,
    estimated, cost_nano, cost_atto, gpu_seconds, gpus)
SELECT hour_ms, host_id, owner_id, kind, pricing_category, currency, estimated,
    CAST(SUM(cost_nano) AS BIGINT) + CAST(SUM(cost_atto) AS BIGINT) / 1000000000,
    CAST(SUM(cost_atto) AS BIGINT) % 1000000000,
    SUM(gpu_seconds), json_group_array(DISTINCT gpu_uuid)
FROM rollup_hours
GROUP BY hour_ms, host_id, owner_id, kind, pricing_category, currency, estimated;
