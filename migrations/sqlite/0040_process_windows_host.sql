-- The host of each process window, as its GPU window has: every table written per window then
-- carries the host, the column a distributed PostgreSQL (Citus) would shard the hot tables by
-- (docs/scale.md). Windows stored before this have none and leave with retention; no read
-- depends on it.
ALTER TABLE process_windows ADD COLUMN host_id BIGINT;
