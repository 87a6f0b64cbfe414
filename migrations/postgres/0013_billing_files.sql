-- A billing period often comes in several files (multi-part exports, incremental reports): each
-- file's share of each (provider, billing account, billing period) it covers is kept here, with
-- when and by which import it was replaced, so the billing page can show what makes a period.
ALTER TABLE billing_imports ADD COLUMN delivery TEXT;  -- the export run it came in (manifest id)

CREATE TABLE billing_file_periods (
    import_id                BIGINT NOT NULL REFERENCES billing_imports (id),
    provider                 TEXT   NOT NULL,
    billing_account_id       TEXT   NOT NULL,
    billing_period_start_ms  BIGINT NOT NULL,
    currency                 TEXT   NOT NULL,
    row_count                BIGINT NOT NULL,
    -- Exact decimal text. NULL only for files imported before this table existed: the server
    -- sums their lines once, on first read (SQLite has no exact decimal sum to do it here).
    billed_total             TEXT,
    effective_total          TEXT,
    replaced_ms              BIGINT,
    replaced_by              BIGINT,
    PRIMARY KEY (import_id, provider, billing_account_id, billing_period_start_ms, currency)
);
CREATE INDEX billing_file_periods_by_period
    ON billing_file_periods (provider, billing_account_id, billing_period_start_ms);

INSERT INTO billing_file_periods (import_id, provider, billing_account_id, billing_period_start_ms,
                                  currency, row_count)
SELECT import_id, provider, billing_account_id, billing_period_start_ms, currency, COUNT(*)
FROM cost_lines
GROUP BY import_id, provider, billing_account_id, billing_period_start_ms, currency;

-- Lines by file and hour: a new file's first lines are compared with the files already in force
-- for its periods (a new export taken for a part would count the period twice).
DROP INDEX cost_lines_by_import;
CREATE INDEX cost_lines_by_import ON cost_lines (import_id, charge_period_start_ms);
