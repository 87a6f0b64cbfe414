-- Months a finance lead signed off because their bill is final (server/src/closing.rs): such a
-- month closes at once instead of days after it ends, and so does every month before it.
CREATE TABLE month_sign_offs (
    month_ms   BIGINT  PRIMARY KEY,
    signed_ms  BIGINT  NOT NULL,
    by_user    TEXT    NOT NULL,
    note       TEXT    NOT NULL
);
