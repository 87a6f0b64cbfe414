-- Restatements of closed months (server/src/closing.rs): a closed month's figures change only
-- through one of these, which keeps what the month said before and after, when and why.
CREATE TABLE restatements (
    id           INTEGER PRIMARY KEY,
    month_ms     BIGINT  NOT NULL,
    created_ms   BIGINT  NOT NULL,
    reason       TEXT    NOT NULL,
    -- Attributed cost per team (and the unattributed buckets) before and after, as JSON
    -- objects of decimal strings.
    before_json  TEXT    NOT NULL,
    after_json   TEXT    NOT NULL
);
CREATE INDEX restatements_by_month ON restatements (month_ms, created_ms);

-- How far retention has deleted raw windows: hours before this may have lost theirs, so they
-- are never attributed again from raw data (that would move their cost to "(unmonitored)").
CREATE TABLE raw_retention (
    only_row           BIGINT  PRIMARY KEY CHECK (only_row = 1),
    deleted_before_ms  BIGINT  NOT NULL
);
