-- Waste incidents (idle clusters, hosts and GPUs; GPUs held idle) and what was said about them.

CREATE TABLE incidents (
    id                INTEGER PRIMARY KEY,
    incident_key      TEXT    NOT NULL,     -- what is idle, e.g. cluster:train-east
    kind              TEXT    NOT NULL,     -- cluster_idle | host_idle | gpus_idle | held_idle
    cluster           TEXT    NOT NULL,
    hostname          TEXT,
    gpus_json         TEXT    NOT NULL,
    owners_json       TEXT    NOT NULL,
    started_ms        BIGINT  NOT NULL,
    ended_ms          BIGINT,               -- NULL while open
    last_seen_ms      BIGINT  NOT NULL,
    cost_per_hour     TEXT    NOT NULL,     -- exact decimal
    estimated         BIGINT  NOT NULL,     -- 1 when priced from the rate card
    wasted            TEXT    NOT NULL,     -- exact decimal, so far
    last_notified_ms  BIGINT
);
CREATE UNIQUE INDEX incidents_one_open_per_key ON incidents (incident_key) WHERE ended_ms IS NULL;
CREATE INDEX incidents_by_start ON incidents (started_ms);

-- Alerts for a cluster are held back until until_ms.
CREATE TABLE snoozes (
    cluster     TEXT    PRIMARY KEY,
    until_ms    BIGINT  NOT NULL,
    by_user     TEXT    NOT NULL,
    created_ms  BIGINT  NOT NULL
);

-- The Slack outbox: written by the evaluator, sent (and retried) by the sender, kept as history.
-- The route is a name from the config; the webhook URL is looked up at send time, never stored.
CREATE TABLE slack_messages (
    id               INTEGER PRIMARY KEY,
    incident_id      BIGINT  REFERENCES incidents (id),
    event            TEXT    NOT NULL,      -- opened | reminder | resolved | test
    route            TEXT    NOT NULL,
    payload          TEXT    NOT NULL,
    created_ms       BIGINT  NOT NULL,
    status           TEXT    NOT NULL,      -- pending | sent | failed
    attempts         BIGINT  NOT NULL,
    next_attempt_ms  BIGINT  NOT NULL,
    last_error       TEXT,
    sent_ms          BIGINT
);
CREATE INDEX slack_messages_due ON slack_messages (status, next_attempt_ms);
