-- What real GPUs report beyond readings (docs/report-format.md): where a MIG device sits (its GPU
-- instance's id and compute slices, the slices its compute instance has of them) and a MIG-mode
-- GPU's compute slices, so a GPU's cost is shared by the slices each device holds and the rest
-- is idle; memory held by processes the agent cannot see, and why; and a device's fault (lost,
-- a critical XID, the driver away) with its meaning in words.
ALTER TABLE gpu_windows ADD COLUMN mig_gpu_slices BIGINT;
ALTER TABLE gpu_windows ADD COLUMN mig_gpu_instance_id BIGINT;
ALTER TABLE gpu_windows ADD COLUMN mig_instance_slices BIGINT;
ALTER TABLE gpu_windows ADD COLUMN mig_compute_slices BIGINT;
ALTER TABLE gpu_windows ADD COLUMN unseen_memory_bytes BIGINT;
ALTER TABLE gpu_windows ADD COLUMN unseen_cause TEXT;
ALTER TABLE gpu_windows ADD COLUMN fault_code TEXT;
ALTER TABLE gpu_windows ADD COLUMN fault_detail TEXT;
