-- Kept sections checked against each day's count of roll-up rewrites rather than each month's.
-- The roll-up rewrites the month under way's latest hour every minute, which moved the month's
-- count every minute: nothing of the month under way could be kept, not even its days long
-- past. Counted per day, a section over the month's days before today stays current until one
-- of those days is rewritten (late data, a restatement).
--
-- A new table rather than new columns: a section in `section_snapshots` carries a month count,
-- one here a day count, and the two must never be compared. Replicas of the version before keep
-- using `section_snapshots` and `rollup_generations` during a rolling upgrade; the roll-up still
-- moves those on for them, and a later migration drops them.
CREATE TABLE kept_sections (
    section     TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    from_ms     BIGINT  NOT NULL,
    to_ms       BIGINT  NOT NULL,
    generation  BIGINT  NOT NULL,
    computed_ms BIGINT  NOT NULL,
    -- 1 for a range whose end moves on each day (the month under way's days so far, the same
    -- stretch of the month before): the next day's replaces it.
    grows       INTEGER NOT NULL,
    body        TEXT    NOT NULL,
    PRIMARY KEY (section, key, from_ms, to_ms)
);
CREATE INDEX kept_sections_by_range ON kept_sections (from_ms, to_ms);

CREATE TABLE rollup_day_generations (
    day_ms     BIGINT PRIMARY KEY,
    generation BIGINT NOT NULL
);
