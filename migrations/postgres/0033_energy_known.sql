-- GPU-seconds whose energy NVML measured, beside the energy: a part whose GPUs report no energy
-- counter (pre-Volta boards, MIG devices of a GPU without one, a lost GPU) is unknown, not 0 kWh,
-- and a figure that covers only part of its GPU time says so. Rows written before this knew no
-- better than their energy: where they hold some, all their time counts as measured.
ALTER TABLE rollup_hours ADD COLUMN energy_known_seconds DOUBLE PRECISION NOT NULL DEFAULT 0;
UPDATE rollup_hours SET energy_known_seconds = gpu_seconds WHERE energy_j > 0;
ALTER TABLE rollup_days ADD COLUMN energy_known_seconds DOUBLE PRECISION NOT NULL DEFAULT 0;
UPDATE rollup_days SET energy_known_seconds = gpu_seconds WHERE energy_j > 0;
ALTER TABLE rollup_host_days ADD COLUMN energy_known_seconds DOUBLE PRECISION NOT NULL DEFAULT 0;
UPDATE rollup_host_days SET energy_known_seconds = gpu_seconds WHERE energy_j > 0;
