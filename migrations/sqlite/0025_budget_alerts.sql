-- Each budget threshold announced once per owner and month, whichever replica gets there first:
-- the row is claimed in the transaction that queues the Slack message.
CREATE TABLE budget_alerts (
    dimension  TEXT   NOT NULL,
    owner_key  TEXT   NOT NULL,
    month_ms   BIGINT NOT NULL,
    basis      TEXT   NOT NULL,
    percent    BIGINT NOT NULL,
    sent_ms    BIGINT NOT NULL,
    PRIMARY KEY (dimension, owner_key, month_ms, basis, percent)
);
