-- People who sign in through OpenID Connect are named by the provider's issuer and subject (a
-- name alone could be taken over by a new account at the provider); NULL for local users.
ALTER TABLE users ADD COLUMN oidc_subject TEXT;
CREATE UNIQUE INDEX users_oidc_subject ON users (oidc_subject);

-- Sign-ins under way at the provider: what its callback needs (the PKCE verifier, the nonce,
-- where to go next), keyed by the SHA-256 of the state, so that any replica can take it.
CREATE TABLE oidc_logins (
    state_hash  TEXT   PRIMARY KEY,
    verifier    TEXT   NOT NULL,
    nonce       TEXT   NOT NULL,
    next        TEXT   NOT NULL,
    created_ms  BIGINT NOT NULL
);
