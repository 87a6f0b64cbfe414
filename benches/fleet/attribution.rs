//! Attribution from raw windows: a month of 1,000 GPUs unless told otherwise.

use super::*;

pub(super) async fn attribution(backend: &str, o: &Options) -> Result<()> {
    let gpus = o.attribution_gpus;
    let window_ms = o.attribution_window_secs * 1000;
    let db = fresh_db(backend).await?;
    let seeding = Instant::now();
    seed_hosts(&db, gpus).await?;
    // The month's day partitions first, as the job would have made them ahead of its windows.
    let mut day = MONTH_START_MS;
    while day < MONTH_START_MS + o.attribution_hours * HOUR_MS {
        partitions_as_the_job_keeps_them(&db, day).await?;
        day += 8 * DAY_MS;
    }
    let per_gpu = o.attribution_hours * HOUR_MS / window_ms;
    // Every GPU busy with a labelled process except 2 hours a day; 10% idle all month. Rows go
    // in in time order, as agents' reports arrive, which is what the time indexes are made for.
    let gpu_rows = format!(
        "WITH RECURSIVE {g}, {w}
         INSERT INTO gpu_windows (gpu_uuid, start_ms, end_ms, host_id, batch_id, samples,
             memory_total_bytes, memory_used_max_bytes, util_avg, util_max, mem_util_avg,
             power_avg_watts, temperature_max_c, energy_mj)
         SELECT 'GPU-bench-' || g.i, $3 + w.i * $4, $3 + (w.i + 1) * $4, g.i / 8 + 1, 'seed', 15,
             85899345920, 42949672960, 70.0, 95.0, 30.0, 400.0, 60.0, 400 * $4
         FROM g CROSS JOIN w ORDER BY w.i, g.i",
        g = series("g", 1),
        w = series("w", 2),
    );
    execute(&db, &gpu_rows, &[gpus, per_gpu, MONTH_START_MS, window_ms]).await?;
    let process_rows = format!(
        "WITH RECURSIVE {g}, {w}
         INSERT INTO process_windows (gpu_uuid, start_ms, pid, end_ms, process_name,
             memory_used_max_bytes, sm_util_avg, labels_json, host_id)
         SELECT 'GPU-bench-' || g.i, $3 + w.i * $4, 1000 + g.i % 8, $3 + (w.i + 1) * $4, 'python3',
             42949672960, 70.0,
             '{{\"experiment\":\"run-' || (g.i / 8) || '\",\"model\":\"model-' || (g.i % 17)
                 || '\",\"team\":\"team-' || ((g.i / 8) % 12) || '\"}}',
             g.i / 8 + 1
         FROM g CROSS JOIN w
         WHERE g.i % 10 <> 8 AND ((w.i * $4) / $5) % 24 NOT IN (2, 3)
         ORDER BY w.i, g.i",
        g = series("g", 1),
        w = series("w", 2),
    );
    execute(
        &db,
        &process_rows,
        &[gpus, per_gpu, MONTH_START_MS, window_ms, HOUR_MS],
    )
    .await?;
    execute(&db, "ANALYZE", &[]).await?;
    let windows = count(&db, "SELECT COUNT(*) FROM gpu_windows").await?;
    let processes = count(&db, "SELECT COUNT(*) FROM process_windows").await?;
    println!(
        "attribution: {} of {gpus} GPUs, {}-second windows: {windows} GPU windows, {processes} process windows (seeded in {:.0} s)",
        match o.attribution_hours {
            MONTH_HOURS => "a month".to_owned(),
            h if h % 24 == 0 => format!("{} days", h / 24),
            h => format!("{h} hours"),
        },
        o.attribution_window_secs,
        seeding.elapsed().as_secs_f64()
    );
    let (usage, wall) = timed_server_run(
        &db,
        // October 2026 has closed: attributing it again is a restatement.
        &[
            "rollup",
            "--from",
            "2026-10-01",
            "--to",
            "2026-11-01",
            "--reopen",
            "benchmark",
        ],
    )
    .await?;
    if !usage.success {
        bail!("gpuledger-server rollup failed");
    }
    let hour_rows = count(&db, "SELECT COUNT(*) FROM rollup_hours").await?;
    let gpu_days = (gpus * o.attribution_hours) as f64 / 24.0;
    println!(
        "  gpuledger-server rollup: {wall:.1} s wall, {:.1} s CPU ({:.3} CPU s per GPU-day), {:.0} GPU windows/s, peak RSS {:.0} MiB ({hour_rows} hourly rows written)",
        usage.cpu_s,
        usage.cpu_s / gpu_days,
        windows as f64 / wall,
        usage.max_rss_mib
    );
    // What a GPU-day costs the database to keep, table by table (indexes included): the raw
    // windows for the retention, the rollups for as long as the ledger is kept.
    println!("  storage per GPU-day ({gpu_days:.0} GPU-days):");
    for table in [
        "gpu_windows",
        "process_windows",
        "rollup_hours",
        "rollup_days",
        "rollup_host_hours",
        "rollup_host_days",
        "rollup_usage_days",
    ] {
        let rows = count(&db, &format!("SELECT COUNT(*) FROM {table}")).await?;
        let bytes = table_bytes(&db, table).await?;
        println!(
            "    {table:<18} {:>9.1} rows  {:>9.0} bytes  ({:.0} bytes a row)",
            rows as f64 / gpu_days,
            bytes as f64 / gpu_days,
            bytes as f64 / rows.max(1) as f64
        );
    }
    Ok(())
}

/// What `table` takes on disk with its indexes: PostgreSQL's total relation size (TOAST
/// included) summed over its partitions, SQLite's pages of the table and its indexes (`dbstat`).
pub(super) async fn table_bytes(db: &Db, table: &str) -> Result<i64> {
    if db.backend == "postgres" {
        count(
            db,
            &format!(
                "SELECT COALESCE(SUM(pg_total_relation_size(relid)), 0)::BIGINT
                 FROM pg_partition_tree('{table}')"
            ),
        )
        .await
    } else {
        count(
            db,
            &format!(
                "SELECT COALESCE(SUM(d.pgsize), 0) FROM dbstat d
                 JOIN sqlite_master m ON m.name = d.name WHERE m.tbl_name = '{table}'"
            ),
        )
        .await
    }
}
