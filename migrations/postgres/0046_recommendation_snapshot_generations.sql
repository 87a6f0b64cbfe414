-- A recommendation snapshot remembers the generation of the rollups it was drawn from (the sum
-- of `rollup_day_generations` over its days, read before computing), as kept sections do: one
-- computed while a roll-up rewrote its days is never served for an ended range, and one drawn
-- from older rollups never replaces a newer one. Rows from before are of no known generation
-- (-1) and are computed again on their next view.
ALTER TABLE recommendation_snapshots ADD COLUMN generation BIGINT NOT NULL DEFAULT -1;
