-- Owners as data: the owner dimensions come from the config's schema, so rollups no longer hold
-- one column per dimension. Each distinct owner (every dimension's value at once) is one row of
-- `owners`, keyed by one text: a JSON object of its non-empty values, keys in order, no spaces
-- (`{"model":"llama","team":"research"}`, `{}` for nobody), the form the server writes.
-- Rollup rows refer to it by id. Rows keep their identity, so every amount is kept as it was.

CREATE TABLE owners (
    id      INTEGER PRIMARY KEY,
    labels  TEXT    NOT NULL UNIQUE
);

-- Each combination of the four old columns, with its text.
CREATE TEMP TABLE owner_map AS
SELECT DISTINCT model, experiment, endpoint, team,
    '{' || rtrim(
           CASE WHEN endpoint <> '' THEN '"endpoint":' || json_quote(endpoint) || ',' ELSE '' END
        || CASE WHEN experiment <> '' THEN '"experiment":' || json_quote(experiment) || ',' ELSE '' END
        || CASE WHEN model <> '' THEN '"model":' || json_quote(model) || ',' ELSE '' END
        || CASE WHEN team <> '' THEN '"team":' || json_quote(team) || ',' ELSE '' END,
        ',') || '}' AS labels
FROM (SELECT model, experiment, endpoint, team FROM rollup_hours
      UNION SELECT model, experiment, endpoint, team FROM rollup_days
      UNION SELECT model, experiment, endpoint, team FROM rollup_host_days);

INSERT INTO owners (labels) SELECT DISTINCT labels FROM owner_map ORDER BY labels;

CREATE TABLE rollup_hours_by_owner (
    hour_ms             BIGINT  NOT NULL,
    host_id             BIGINT  NOT NULL,
    gpu_uuid            TEXT    NOT NULL,
    owner_id            BIGINT  NOT NULL,
    kind                TEXT    NOT NULL,
    pricing_category    TEXT    NOT NULL,
    currency            TEXT    NOT NULL,
    estimated           BIGINT  NOT NULL,
    cost_nano           BIGINT  NOT NULL,
    cost_atto           BIGINT  NOT NULL,
    gpu_seconds         REAL    NOT NULL,
    util_gpu_seconds    REAL    NOT NULL,
    util_known_seconds  REAL    NOT NULL,
    energy_j            REAL    NOT NULL
);
INSERT INTO rollup_hours_by_owner
SELECT r.hour_ms, r.host_id, r.gpu_uuid, o.id, r.kind, r.pricing_category, r.currency,
    r.estimated, r.cost_nano, r.cost_atto, r.gpu_seconds, r.util_gpu_seconds,
    r.util_known_seconds, r.energy_j
FROM rollup_hours r
JOIN owner_map m ON m.model = r.model AND m.experiment = r.experiment
    AND m.endpoint = r.endpoint AND m.team = r.team
JOIN owners o ON o.labels = m.labels;
DROP TABLE rollup_hours;
ALTER TABLE rollup_hours_by_owner RENAME TO rollup_hours;
CREATE INDEX rollup_hours_by_hour ON rollup_hours (hour_ms);

CREATE TABLE rollup_days_by_owner (
    day_ms              BIGINT  NOT NULL,
    host_id             BIGINT  NOT NULL,
    gpu_uuid            TEXT    NOT NULL,
    owner_id            BIGINT  NOT NULL,
    kind                TEXT    NOT NULL,
    pricing_category    TEXT    NOT NULL,
    currency            TEXT    NOT NULL,
    estimated           BIGINT  NOT NULL,
    cost_nano           BIGINT  NOT NULL,
    cost_atto           BIGINT  NOT NULL,
    gpu_seconds         REAL    NOT NULL,
    util_gpu_seconds    REAL    NOT NULL,
    util_known_seconds  REAL    NOT NULL,
    energy_j            REAL    NOT NULL
);
INSERT INTO rollup_days_by_owner
SELECT r.day_ms, r.host_id, r.gpu_uuid, o.id, r.kind, r.pricing_category, r.currency,
    r.estimated, r.cost_nano, r.cost_atto, r.gpu_seconds, r.util_gpu_seconds,
    r.util_known_seconds, r.energy_j
FROM rollup_days r
JOIN owner_map m ON m.model = r.model AND m.experiment = r.experiment
    AND m.endpoint = r.endpoint AND m.team = r.team
JOIN owners o ON o.labels = m.labels;
DROP TABLE rollup_days;
ALTER TABLE rollup_days_by_owner RENAME TO rollup_days;
CREATE INDEX rollup_days_by_day ON rollup_days (day_ms);
CREATE INDEX rollup_days_by_gpu ON rollup_days (gpu_uuid, day_ms);

CREATE TABLE rollup_host_days_by_owner (
    day_ms              BIGINT  NOT NULL,
    host_id             BIGINT  NOT NULL,
    owner_id            BIGINT  NOT NULL,
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
INSERT INTO rollup_host_days_by_owner
SELECT r.day_ms, r.host_id, o.id, r.kind, r.pricing_category, r.currency,
    r.estimated, r.cost_nano, r.cost_atto, r.gpu_seconds, r.util_gpu_seconds,
    r.util_known_seconds, r.energy_j
FROM rollup_host_days r
JOIN owner_map m ON m.model = r.model AND m.experiment = r.experiment
    AND m.endpoint = r.endpoint AND m.team = r.team
JOIN owners o ON o.labels = m.labels;
DROP TABLE rollup_host_days;
ALTER TABLE rollup_host_days_by_owner RENAME TO rollup_host_days;
CREATE INDEX rollup_host_days_by_day ON rollup_host_days (day_ms);

DROP TABLE owner_map;
