-- How many of a window's samples read each GPU utilization percent (`[[percent, samples], …]`
-- as JSON, where the agent measured it), so attribution splits a partly busy window at each
-- cluster's own threshold (server/src/activity.rs).
ALTER TABLE gpu_windows ADD COLUMN util_histogram TEXT;
