-- Sections of a page computed from a closed month (its week's shape, its scale-to-zero
-- windows): final figures, kept as computed so each view reads one row instead of summing a
-- month of a whole fleet's hourly rollups again. `key` says for whom (the viewer's scope) and
-- under which owner dimensions; `generation` which state of the month's rollups they were drawn
-- from. The roll-up counts each month's rewrites in `rollup_generations`, in the transaction
-- that rewrites an hour of it: a section is read back only while its generation is the month's,
-- so one computed while a roll-up ran is never served.
CREATE TABLE section_snapshots (
    section     TEXT   NOT NULL,
    key         TEXT   NOT NULL,
    from_ms     BIGINT NOT NULL,
    to_ms       BIGINT NOT NULL,
    generation  BIGINT NOT NULL,
    computed_ms BIGINT NOT NULL,
    body        TEXT   NOT NULL,
    PRIMARY KEY (section, key, from_ms, to_ms)
);
CREATE INDEX section_snapshots_by_range ON section_snapshots (from_ms, to_ms);

CREATE TABLE rollup_generations (
    month_ms   BIGINT PRIMARY KEY,
    generation BIGINT NOT NULL
);
