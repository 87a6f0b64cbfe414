-- A process's owner labels are kept once, in labels_json: owner dimensions read theirs from it
-- (see 0020 and docs/owners.md). The four default labels' own columns were written beside it
-- and read by nothing since.
ALTER TABLE process_windows DROP COLUMN model;
ALTER TABLE process_windows DROP COLUMN experiment;
ALTER TABLE process_windows DROP COLUMN endpoint;
ALTER TABLE process_windows DROP COLUMN team;
