-- Telemetry: agent tokens, hosts, GPUs and the windows agents report.
-- Times are epoch milliseconds; memory in bytes; utilization in percent.

CREATE TABLE api_tokens (
    id          INTEGER PRIMARY KEY,
    name        TEXT    NOT NULL UNIQUE,
    token_hash  TEXT    NOT NULL UNIQUE,
    created_ms  BIGINT  NOT NULL,
    revoked_ms  BIGINT
);

CREATE TABLE hosts (
    id              INTEGER PRIMARY KEY,
    cluster         TEXT   NOT NULL,
    hostname        TEXT   NOT NULL,
    provider        TEXT,
    instance_id     TEXT,
    instance_type   TEXT,
    region          TEXT,
    agent_version   TEXT,
    last_report_ms  BIGINT NOT NULL,
    spool_depth     BIGINT,
    spool_dropped   BIGINT,
    UNIQUE (cluster, hostname)
);

-- One row per accepted batch: the unique key is what makes ingest idempotent.
CREATE TABLE ingested_batches (
    batch_id     TEXT    PRIMARY KEY,
    host_id      BIGINT  NOT NULL REFERENCES hosts (id),
    token_id     BIGINT  NOT NULL REFERENCES api_tokens (id),
    received_ms  BIGINT  NOT NULL,
    windows      BIGINT  NOT NULL
);

-- The latest known state of each GPU (or MIG instance), for the fleet page.
CREATE TABLE gpus (
    uuid                    TEXT    PRIMARY KEY,
    host_id                 BIGINT  NOT NULL REFERENCES hosts (id),
    gpu_index               BIGINT  NOT NULL,
    name                    TEXT    NOT NULL,
    parent_uuid             TEXT,
    memory_total_bytes      BIGINT,
    last_window_start_ms    BIGINT  NOT NULL,
    last_window_end_ms      BIGINT  NOT NULL,
    last_util_avg           REAL,
    last_memory_used_bytes  BIGINT
);

CREATE TABLE gpu_windows (
    gpu_uuid               TEXT    NOT NULL,
    start_ms               BIGINT  NOT NULL,
    end_ms                 BIGINT  NOT NULL,
    host_id                BIGINT  NOT NULL REFERENCES hosts (id),
    batch_id               TEXT    NOT NULL,
    samples                BIGINT  NOT NULL,
    memory_total_bytes     BIGINT,
    memory_used_max_bytes  BIGINT,
    util_avg               REAL,
    util_max               REAL,
    mem_util_avg           REAL,
    power_avg_watts        REAL,
    temperature_max_c      REAL,
    energy_mj              BIGINT,
    PRIMARY KEY (gpu_uuid, start_ms)
);
CREATE INDEX gpu_windows_by_host_time ON gpu_windows (host_id, start_ms);
CREATE INDEX gpu_windows_by_time ON gpu_windows (start_ms);

CREATE TABLE process_windows (
    gpu_uuid               TEXT    NOT NULL,
    start_ms               BIGINT  NOT NULL,
    pid                    BIGINT  NOT NULL,
    end_ms                 BIGINT  NOT NULL,
    process_name           TEXT,
    memory_used_max_bytes  BIGINT,
    sm_util_avg            REAL,
    model                  TEXT,
    experiment             TEXT,
    endpoint               TEXT,
    team                   TEXT,
    labels_json            TEXT    NOT NULL,
    container_id           TEXT,
    pod_uid                TEXT,
    PRIMARY KEY (gpu_uuid, start_ms, pid)
);
CREATE INDEX process_windows_by_time ON process_windows (start_ms);
