-- Sections of a page computed from a closed month (its week's shape, its scale-to-zero
-- windows): final figures, kept as computed so each view reads one row instead of summing a
-- month of a whole fleet's hourly rollups again. `key` says for whom (the viewer's scope) and
-- under which owner dimensions. The roll-up deletes those over any hour it rewrites, in the
-- same transaction, and a restatement deletes its months' again once it is done.
CREATE TABLE section_snapshots (
    section     TEXT   NOT NULL,
    key         TEXT   NOT NULL,
    from_ms     BIGINT NOT NULL,
    to_ms       BIGINT NOT NULL,
    computed_ms BIGINT NOT NULL,
    body        TEXT   NOT NULL,
    PRIMARY KEY (section, key, from_ms, to_ms)
);
CREATE INDEX section_snapshots_by_range ON section_snapshots (from_ms, to_ms);
