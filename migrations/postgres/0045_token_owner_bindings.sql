-- Request counts and runs' progress (POST /api/v1/usage) name an endpoint or an experiment; a
-- token may post them for owners whose processes ran on hosts it reports, or for those an
-- admin bound to it here (serving code on hosts without an agent, a trainer's coordinator).
-- `role` is the owner role the name is a value of: 'endpoint' or 'experiment'.
CREATE TABLE token_owner_bindings (
    token_id  BIGINT NOT NULL REFERENCES api_tokens (id),
    role      TEXT   NOT NULL,
    value     TEXT   NOT NULL,
    bound_ms  BIGINT NOT NULL,
    PRIMARY KEY (token_id, role, value)
);
