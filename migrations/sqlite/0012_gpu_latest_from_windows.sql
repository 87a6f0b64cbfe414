-- A GPU's latest state (utilization, memory, window end) is read from its newest window in
-- gpu_windows, so a report no longer rewrites every GPU's row: `gpus` keeps only what a GPU is
-- and where it sits, written when that changes.
ALTER TABLE gpus DROP COLUMN last_window_start_ms;
ALTER TABLE gpus DROP COLUMN last_window_end_ms;
ALTER TABLE gpus DROP COLUMN last_util_avg;
ALTER TABLE gpus DROP COLUMN last_memory_used_bytes;
