-- Viewers and read-only tokens scoped to teams: a JSON array of team names; NULL sees every
-- team (admins always do).
ALTER TABLE users ADD COLUMN teams TEXT;
ALTER TABLE read_tokens ADD COLUMN teams TEXT;
