-- History in partitions: raw windows one per UTC day, hourly attribution one per UTC month, so
-- that retention drops a past day whole instead of deleting its rows one by one, and a month's
-- reads touch only its own partitions. The hourly retention job makes the partitions of the
-- coming days and months ahead of their rows (server/src/store/partitions.rs).
--
-- An existing table is not copied: it becomes the first partition, holding everything before the
-- day (or month) after its latest row. Attaching it reads it once to check that bound, and
-- rewrites nothing. Retention drops it whole once it passes that bound, and deletes its older
-- rows in batches until then. An empty table (a new database) is dropped instead.
--
-- Each table also has a default partition, so that no row ever fails for want of a partition (a
-- window from an agent's spool older than the partitions made, a clock far ahead). The job moves
-- such rows into the partition it makes for them.

CREATE FUNCTION gpuledger_attach_history(parent TEXT, old TEXT, col TEXT, span TEXT)
RETURNS VOID LANGUAGE plpgsql AS $$
DECLARE
    latest BIGINT;
    bound BIGINT;
    label TEXT;
BEGIN
    EXECUTE format('SELECT max(%I) FROM %I', col, old) INTO latest;
    IF latest IS NULL THEN
        EXECUTE format('DROP TABLE %I', old);
    ELSE
        IF span = 'day' THEN
            bound := (floor(latest / 86400000.0)::BIGINT + 1) * 86400000;
            label := to_char(to_timestamp(bound / 1000) AT TIME ZONE 'UTC', 'YYYYMMDD');
        ELSE
            bound := (extract(epoch FROM date_trunc('month', to_timestamp(latest / 1000)
                AT TIME ZONE 'UTC') + INTERVAL '1 month') * 1000)::BIGINT;
            label := to_char(to_timestamp(bound / 1000) AT TIME ZONE 'UTC', 'YYYYMM');
        END IF;
        EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (MINVALUE) TO (%s)',
            parent, old, bound);
        EXECUTE format('ALTER TABLE %I RENAME TO %I', old, parent || '_before_' || label);
    END IF;
    EXECUTE format('CREATE TABLE %I PARTITION OF %I DEFAULT', parent || '_default', parent);
END
$$;

-- Raw windows, by day of start_ms. The old tables' indexes are renamed first so the partitioned
-- tables keep the names; attaching matches each old index to its new one.
ALTER TABLE gpu_windows RENAME TO gpu_windows_old;
ALTER INDEX gpu_windows_pkey RENAME TO gpu_windows_old_pkey;
ALTER INDEX gpu_windows_by_host_time RENAME TO gpu_windows_old_by_host_time;
ALTER INDEX gpu_windows_by_time RENAME TO gpu_windows_old_by_time;
CREATE TABLE gpu_windows (LIKE gpu_windows_old INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (start_ms);
ALTER TABLE gpu_windows ADD CONSTRAINT gpu_windows_pkey PRIMARY KEY (gpu_uuid, start_ms);
ALTER TABLE gpu_windows ADD CONSTRAINT gpu_windows_host_id_fkey
    FOREIGN KEY (host_id) REFERENCES hosts (id);
CREATE INDEX gpu_windows_by_host_time ON gpu_windows (host_id, start_ms);
CREATE INDEX gpu_windows_by_time ON gpu_windows (start_ms);
SELECT gpuledger_attach_history('gpu_windows', 'gpu_windows_old', 'start_ms', 'day');

ALTER TABLE process_windows RENAME TO process_windows_old;
ALTER INDEX process_windows_pkey RENAME TO process_windows_old_pkey;
ALTER INDEX process_windows_by_time RENAME TO process_windows_old_by_time;
CREATE TABLE process_windows (LIKE process_windows_old INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (start_ms);
ALTER TABLE process_windows ADD CONSTRAINT process_windows_pkey
    PRIMARY KEY (gpu_uuid, start_ms, pid);
CREATE INDEX process_windows_by_time ON process_windows (start_ms);
SELECT gpuledger_attach_history('process_windows', 'process_windows_old', 'start_ms', 'day');

-- Hourly attribution, by month of hour_ms.
ALTER TABLE rollup_hours RENAME TO rollup_hours_old;
ALTER INDEX rollup_hours_by_hour RENAME TO rollup_hours_old_by_hour;
CREATE TABLE rollup_hours (LIKE rollup_hours_old INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (hour_ms);
CREATE INDEX rollup_hours_by_hour ON rollup_hours (hour_ms);
SELECT gpuledger_attach_history('rollup_hours', 'rollup_hours_old', 'hour_ms', 'month');

ALTER TABLE rollup_host_hours RENAME TO rollup_host_hours_old;
ALTER INDEX rollup_host_hours_by_hour RENAME TO rollup_host_hours_old_by_hour;
CREATE TABLE rollup_host_hours
    (LIKE rollup_host_hours_old INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (hour_ms);
CREATE INDEX rollup_host_hours_by_hour ON rollup_host_hours (hour_ms);
SELECT gpuledger_attach_history('rollup_host_hours', 'rollup_host_hours_old', 'hour_ms', 'month');

ALTER TABLE rollup_usage_hours RENAME TO rollup_usage_hours_old;
ALTER INDEX rollup_usage_hours_by_hour RENAME TO rollup_usage_hours_old_by_hour;
CREATE TABLE rollup_usage_hours
    (LIKE rollup_usage_hours_old INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (hour_ms);
CREATE INDEX rollup_usage_hours_by_hour ON rollup_usage_hours (hour_ms);
SELECT gpuledger_attach_history('rollup_usage_hours', 'rollup_usage_hours_old', 'hour_ms', 'month');

ALTER TABLE rollup_unattributed RENAME TO rollup_unattributed_old;
ALTER INDEX rollup_unattributed_pkey RENAME TO rollup_unattributed_old_pkey;
CREATE TABLE rollup_unattributed
    (LIKE rollup_unattributed_old INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (hour_ms);
ALTER TABLE rollup_unattributed ADD CONSTRAINT rollup_unattributed_pkey
    PRIMARY KEY (hour_ms, currency);
SELECT gpuledger_attach_history('rollup_unattributed', 'rollup_unattributed_old', 'hour_ms',
    'month');

DROP FUNCTION gpuledger_attach_history(TEXT, TEXT, TEXT, TEXT);
