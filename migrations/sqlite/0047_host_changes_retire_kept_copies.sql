-- A host's provider, instance, type, lifecycle or region is read live beside the rollups (the
-- review's regions and grids, its types, a GPU's page), and kept copies of past days carry
-- them as they were when kept. When one of them changes, every kept copy is retired as a
-- roll-up retires those of the days it rewrites: each day's generation moves on, so no kept
-- section, snapshot or recommendation drawn before the change reads as current, and one a view
-- is computing meanwhile is never kept. A host's attributes rarely change, so all days at once.
CREATE TRIGGER hosts_attributes_retire_kept_copies
AFTER UPDATE OF provider, instance_id, instance_key, instance_type, lifecycle, region ON hosts
WHEN OLD.provider IS NOT NEW.provider
  OR OLD.instance_id IS NOT NEW.instance_id
  OR OLD.instance_key IS NOT NEW.instance_key
  OR OLD.instance_type IS NOT NEW.instance_type
  OR OLD.lifecycle IS NOT NEW.lifecycle
  OR OLD.region IS NOT NEW.region
BEGIN
  UPDATE rollup_day_generations SET generation = generation + 1;
  -- The same by month for replicas of a version before migration 0042 (see 0042).
  UPDATE rollup_generations SET generation = generation + 1;
END;
