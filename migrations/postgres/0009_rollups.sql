-- Rollups: attribution's output kept per hour and per day, so pages and the allocation API read a
-- few rows per GPU and owner instead of every raw window (which retention then deletes).
--
-- Money stays exact and summable in SQL on both backends: an amount (at most 18 decimal places)
-- is cost_nano whole nano-units (floor) plus cost_atto, the rest in 10^-18 units (0 ≤ atto < 10^9).
-- gpu_uuid is '' for a host-hour with no GPU telemetry; owner labels are '' when absent.

CREATE TABLE rollup_hours (
    hour_ms             BIGINT  NOT NULL,
    host_id             BIGINT  NOT NULL,
    gpu_uuid            TEXT    NOT NULL,
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
CREATE INDEX rollup_hours_by_hour ON rollup_hours (hour_ms);

-- The same summed per UTC day: what monthly pages read.
CREATE TABLE rollup_days (
    day_ms              BIGINT  NOT NULL,
    host_id             BIGINT  NOT NULL,
    gpu_uuid            TEXT    NOT NULL,
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
CREATE INDEX rollup_days_by_day ON rollup_days (day_ms);

-- Billed cost in an hour on lines that match no GPU host: in totals, not attributed.
CREATE TABLE rollup_unattributed (
    hour_ms    BIGINT NOT NULL,
    currency   TEXT   NOT NULL,
    cost_nano  BIGINT NOT NULL,
    cost_atto  BIGINT NOT NULL,
    PRIMARY KEY (hour_ms, currency)
);

-- Hours whose inputs changed since they were last rolled up: per host for reports (so agents of
-- different hosts never wait on one row), host 0 for bills. The generation grows with every
-- change, so a roll-up that read an hour clears a mark only if nothing came since.
CREATE TABLE rollup_dirty_hours (
    hour_ms     BIGINT NOT NULL,
    host_id     BIGINT NOT NULL,
    generation  BIGINT NOT NULL,
    PRIMARY KEY (hour_ms, host_id)
);
