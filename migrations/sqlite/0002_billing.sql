-- Billing: imported bills and their cost lines. Amounts are exact decimals stored as text.

CREATE TABLE billing_imports (
    id               INTEGER PRIMARY KEY,
    source           TEXT    NOT NULL,          -- focus | aws-cost-explorer
    name             TEXT    NOT NULL,          -- file name, or the synced period
    content_sha256   TEXT    NOT NULL UNIQUE,   -- the same content imports once
    imported_ms      BIGINT  NOT NULL,
    row_count        BIGINT  NOT NULL,
    billed_total     TEXT    NOT NULL,
    effective_total  TEXT    NOT NULL
);

CREATE TABLE cost_lines (
    id                          INTEGER PRIMARY KEY,
    import_id                   BIGINT  NOT NULL REFERENCES billing_imports (id),
    line_no                     BIGINT  NOT NULL,
    provider                    TEXT    NOT NULL,
    billing_account_id          TEXT    NOT NULL,
    billing_period_start_ms     BIGINT  NOT NULL,
    charge_period_start_ms      BIGINT  NOT NULL,
    charge_period_end_ms        BIGINT  NOT NULL,
    charge_category             TEXT    NOT NULL,
    resource_id                 TEXT,
    resource_key                TEXT,
    billed_cost                 TEXT    NOT NULL,
    effective_cost              TEXT    NOT NULL,
    list_cost                   TEXT    NOT NULL,
    currency                    TEXT    NOT NULL,
    pricing_category            TEXT    NOT NULL,
    commitment_discount_id      TEXT,
    commitment_discount_status  TEXT,
    service_name                TEXT,
    sku_id                      TEXT,
    region                      TEXT,
    instance_type               TEXT,
    tags_json                   TEXT    NOT NULL,
    extra_json                  TEXT    NOT NULL
);
CREATE INDEX cost_lines_by_resource ON cost_lines (resource_key, charge_period_start_ms);
CREATE INDEX cost_lines_by_period ON cost_lines (provider, billing_account_id, billing_period_start_ms);
CREATE INDEX cost_lines_by_time ON cost_lines (charge_period_start_ms);
CREATE INDEX cost_lines_by_import ON cost_lines (import_id);

-- Hosts join bills on their normalised instance id.
ALTER TABLE hosts ADD COLUMN instance_key TEXT;
CREATE INDEX hosts_by_instance_key ON hosts (instance_key);
