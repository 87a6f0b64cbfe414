-- People: sign-in with roles (viewer reads; admin also manages tokens, bills, alert routes).
CREATE TABLE users (
    id             INTEGER PRIMARY KEY,
    username       TEXT    NOT NULL UNIQUE,
    password_hash  TEXT    NOT NULL,        -- argon2id, PHC string
    role           TEXT    NOT NULL,        -- viewer | admin
    created_ms     BIGINT  NOT NULL
);

-- Sessions live in the database so every replica behind the load balancer knows them.
CREATE TABLE sessions (
    token_hash  TEXT    PRIMARY KEY,       -- SHA-256 of the cookie value
    user_id     BIGINT  NOT NULL REFERENCES users (id),
    csrf_token  TEXT    NOT NULL,
    created_ms  BIGINT  NOT NULL,
    expires_ms  BIGINT  NOT NULL
);
CREATE INDEX sessions_by_expiry ON sessions (expires_ms);
