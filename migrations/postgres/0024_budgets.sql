-- Monthly budgets per owner key on one dimension (a team, a model, a cluster, ...): each holds
-- from its month on until one is set for a later month. The amount is an exact decimal text.
CREATE TABLE budgets (
    dimension      TEXT   NOT NULL,
    owner_key      TEXT   NOT NULL,
    from_month_ms  BIGINT NOT NULL,
    amount         TEXT   NOT NULL,
    currency       TEXT   NOT NULL,
    set_by         TEXT   NOT NULL,
    set_ms         BIGINT NOT NULL,
    PRIMARY KEY (dimension, owner_key, from_month_ms)
);
