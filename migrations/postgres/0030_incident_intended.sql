-- Someone said an incident's idle GPUs are idle on purpose (a standby, a reservation held for a
-- launch): it stays on the pages, marked with who said so and when, and is not brought up again
-- in Slack. A new incident on the same GPUs, after this one ends, is announced as usual.
ALTER TABLE incidents ADD COLUMN intended_by TEXT;
ALTER TABLE incidents ADD COLUMN intended_ms BIGINT;
