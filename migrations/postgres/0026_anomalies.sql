-- Each spend anomaly announced once per kind (a spike, then a new level if it holds), whichever
-- replica gets there first: the row is claimed in the transaction that queues the Slack message.
-- An anomaly is named by its owner, currency and first day.
CREATE TABLE anomaly_alerts (
    dimension  TEXT   NOT NULL,
    owner_key  TEXT   NOT NULL,
    currency   TEXT   NOT NULL,
    start_ms   BIGINT NOT NULL,
    kind       TEXT   NOT NULL,
    sent_ms    BIGINT NOT NULL,
    PRIMARY KEY (dimension, owner_key, currency, start_ms, kind)
);

-- Who dismissed an anomaly (looked at it, nothing to do), when, and why.
CREATE TABLE anomaly_dismissals (
    dimension    TEXT   NOT NULL,
    owner_key    TEXT   NOT NULL,
    currency     TEXT   NOT NULL,
    start_ms     BIGINT NOT NULL,
    dismissed_by TEXT   NOT NULL,
    dismissed_ms BIGINT NOT NULL,
    reason       TEXT   NOT NULL,
    PRIMARY KEY (dimension, owner_key, currency, start_ms)
);
