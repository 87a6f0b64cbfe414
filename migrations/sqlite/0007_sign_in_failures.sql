-- Failed sign-ins, counted per username and per client address over a short window so that
-- password guessing is slowed on every replica alike (the count lives in the shared database).
CREATE TABLE sign_in_failures (
    at_ms     BIGINT NOT NULL,
    username  TEXT   NOT NULL,
    client    TEXT   NOT NULL
);
CREATE INDEX sign_in_failures_by_user ON sign_in_failures (username, at_ms);
CREATE INDEX sign_in_failures_by_client ON sign_in_failures (client, at_ms);
CREATE INDEX sign_in_failures_by_time ON sign_in_failures (at_ms);
