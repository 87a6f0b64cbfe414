-- An import's totals are per currency (billing_file_periods): one sum over dollars and
-- euros was no figure at all.
ALTER TABLE billing_imports DROP COLUMN billed_total;
ALTER TABLE billing_imports DROP COLUMN effective_total;
