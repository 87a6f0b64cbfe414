//! Review page and allocation API on a month of rollups.

use super::*;

/// Numbers `0..$n` as a recursive CTE (works on SQLite and PostgreSQL alike).
pub(super) fn series(name: &str, bind: usize) -> String {
    format!("{name}(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM {name} WHERE i + 1 < ${bind})")
}

/// A month of hourly and daily rollups for `gpus` GPUs (8 per host), as the roll-up job leaves
/// them. Each host's 8 GPUs do one kind of work: 40% of hosts train (a run label that changes
/// every 3 days, idle 2 hours a day), 40% serve an endpoint (held idle 6 hours a day), 10% run
/// notebooks (a team label only), 10% sit idle.
pub(super) async fn seed_rollups(
    db: &Db,
    gpus: i64,
    (month_start_ms, hours): (i64, i64),
) -> Result<()> {
    seed_hosts(db, gpus).await?;
    // The hours with their owner labels first (a scratch table), then each distinct owner once
    // in `owners`, as the roll-up writes them: one JSON text, keys in order.
    execute(
        db,
        "CREATE TABLE bench_hours (hour_ms BIGINT, host_id BIGINT, gpu_uuid TEXT, model TEXT,
             experiment TEXT, endpoint TEXT, team TEXT, owner TEXT, kind TEXT,
             util_gpu_seconds DOUBLE PRECISION)",
        &[],
    )
    .await?;
    let label = |name: &str| {
        format!("CASE WHEN {name} <> '' THEN '\"{name}\":\"' || {name} || '\",' ELSE '' END")
    };
    let rows = format!(
        "WITH RECURSIVE {g}, {h}
         INSERT INTO bench_hours (hour_ms, host_id, gpu_uuid, model, experiment, endpoint, team,
             owner, kind, util_gpu_seconds)
         SELECT hour_ms, host_id, gpu_uuid, model, experiment, endpoint, team,
             '{{' || rtrim({e} || {x} || {m} || {t}, ',') || '}}', kind, util_gpu_seconds
         FROM (SELECT $3 + hi * $4 AS hour_ms, gi / 8 + 1 AS host_id, 'GPU-bench-' || gi AS gpu_uuid,
             CASE WHEN kind = 'idle' OR c = 9 THEN '' ELSE 'model-' || ((gi / 8) % 17) END AS model,
             CASE WHEN c < 4 AND kind = 'used' THEN 'run-' || (gi / 8) || '-' || (hi / 72) ELSE '' END
                 AS experiment,
             CASE WHEN c BETWEEN 4 AND 7 THEN 'ep-' || ((gi / 8) % 40) ELSE '' END AS endpoint,
             CASE WHEN kind = 'idle' THEN '' ELSE 'team-' || ((gi / 8) % 12) END AS team,
             kind, CASE WHEN kind = 'used' THEN 2520.0 ELSE 0.0 END AS util_gpu_seconds
         FROM (SELECT g.i AS gi, h.i AS hi, (g.i / 8) % 10 AS c,
                      CASE WHEN (g.i / 8) % 10 = 8 THEN 'idle'
                           WHEN (g.i / 8) % 10 < 4 AND h.i % 24 IN (2, 3) THEN 'idle'
                           WHEN (g.i / 8) % 10 BETWEEN 4 AND 7 AND h.i % 24 < 6 THEN 'held_idle'
                           ELSE 'used' END AS kind
               FROM g CROSS JOIN h) x) y",
        g = series("g", 1),
        h = series("h", 2),
        e = label("endpoint"),
        x = label("experiment"),
        m = label("model"),
        t = label("team"),
    );
    execute(db, &rows, &[gpus, hours, month_start_ms, HOUR_MS]).await?;
    execute(
        db,
        "INSERT INTO owners (labels) SELECT DISTINCT owner FROM bench_hours",
        &[],
    )
    .await?;
    // Each owner's values, as the roll-up writes them with a new owner.
    let values = if db.backend == "postgres" {
        "INSERT INTO owner_values (owner_id, dimension, value)
         SELECT o.id, j.key, j.value #>> '{}'
         FROM owners o CROSS JOIN LATERAL jsonb_each(o.labels::jsonb) j
         WHERE jsonb_typeof(j.value) = 'string' AND j.value #>> '{}' <> ''"
    } else {
        "INSERT INTO owner_values (owner_id, dimension, value)
         SELECT o.id, j.key, j.value FROM owners o, json_each(o.labels) j
         WHERE j.type = 'text' AND j.value <> ''"
    };
    execute(db, values, &[]).await?;
    execute(
        db,
        "INSERT INTO rollup_hours (hour_ms, host_id, gpu_uuid, owner_id, kind, pricing_category,
             currency, estimated, cost_nano, cost_atto, gpu_seconds, util_gpu_seconds,
             util_known_seconds, energy_j, energy_known_seconds)
         SELECT b.hour_ms, b.host_id, b.gpu_uuid, o.id, b.kind, 'on_demand', 'USD', 1,
             12290000000, 0, 3600.0, b.util_gpu_seconds, 3600.0, 1440000.0, 3600.0
         FROM bench_hours b JOIN owners o ON o.labels = b.owner",
        &[],
    )
    .await?;
    let days = "INSERT INTO rollup_days (day_ms, host_id, gpu_uuid, owner_id, kind,
             pricing_category, currency, estimated, cost_nano, cost_atto, gpu_seconds,
             util_gpu_seconds, util_known_seconds, energy_j, energy_known_seconds)
         SELECT $1 + ((hour_ms - $1) / $2) * $2 AS day, host_id, gpu_uuid, owner_id, kind,
             pricing_category, currency, estimated, SUM(cost_nano), SUM(cost_atto),
             SUM(gpu_seconds), SUM(util_gpu_seconds), SUM(util_known_seconds), SUM(energy_j),
             SUM(energy_known_seconds)
         FROM rollup_hours
         GROUP BY day, host_id, gpu_uuid, owner_id, kind, pricing_category, currency, estimated";
    execute(db, days, &[month_start_ms, DAY_MS]).await?;
    let host_days = "INSERT INTO rollup_host_days (day_ms, host_id, owner_id, kind,
             pricing_category, currency, estimated, cost_nano, cost_atto, gpu_seconds,
             util_gpu_seconds, util_known_seconds, energy_j, energy_known_seconds)
         SELECT day_ms, host_id, owner_id, kind, pricing_category, currency, estimated,
             SUM(cost_nano), SUM(cost_atto), SUM(gpu_seconds), SUM(util_gpu_seconds),
             SUM(util_known_seconds), SUM(energy_j), SUM(energy_known_seconds)
         FROM rollup_days
         GROUP BY day_ms, host_id, owner_id, kind, pricing_category, currency, estimated";
    execute(db, host_days, &[]).await?;
    let gpus = if db.backend == "postgres" {
        "json_agg(DISTINCT gpu_uuid)::text"
    } else {
        "json_group_array(DISTINCT gpu_uuid)"
    };
    let host_hours = format!(
        "INSERT INTO rollup_host_hours (hour_ms, host_id, owner_id, kind, pricing_category,
             currency, estimated, cost_nano, cost_atto, gpu_seconds, gpus)
         SELECT hour_ms, host_id, owner_id, kind, pricing_category, currency, estimated,
             SUM(cost_nano), SUM(cost_atto), SUM(gpu_seconds), {gpus}
         FROM rollup_hours
         GROUP BY hour_ms, host_id, owner_id, kind, pricing_category, currency, estimated"
    );
    execute(db, &host_hours, &[]).await?;
    let runs = "INSERT INTO rollup_experiment_days (day_ms, experiment, first_hour_ms,
             last_hour_ms, hours)
         SELECT $1 + ((hour_ms - $1) / $2) * $2 AS day, experiment, MIN(hour_ms), MAX(hour_ms),
             COUNT(DISTINCT hour_ms)
         FROM bench_hours WHERE experiment <> '' AND kind IN ('used', 'held_idle')
         GROUP BY day, experiment";
    execute(db, runs, &[month_start_ms, DAY_MS]).await?;
    // Usage for right-sizing, per day (what the review's 7 whole days read): each model and
    // endpoint GPU-day's 15-second windows in three utilization bands, 10–25% (held idle: band
    // 0), at 30 GiB of peak memory: endpoints that would fit a smaller GPU.
    let usage = format!(
        "WITH RECURSIVE {b}, d AS (
             SELECT $2 + ((hour_ms - $2) / $3) * $3 AS day_ms, host_id, gpu_uuid, model,
                 endpoint, kind, 3600.0 * COUNT(*) AS gpu_seconds
             FROM bench_hours WHERE kind IN ('used', 'held_idle')
             GROUP BY day_ms, host_id, gpu_uuid, model, experiment, endpoint, team, kind)
         INSERT INTO rollup_usage_days (day_ms, host_id, gpu_uuid, owner_by, owner_key,
             util_band, windows, peak_memory_bytes)
         SELECT day_ms, host_id, gpu_uuid, owner_by, owner_key,
             CASE WHEN kind = 'held_idle' THEN 0 ELSE 2 + b.i END,
             CAST(gpu_seconds / 45 AS BIGINT), 32212254720
         FROM (SELECT day_ms, host_id, gpu_uuid, 'model' AS owner_by, model AS owner_key, kind,
                      gpu_seconds
               FROM d WHERE model <> ''
               UNION ALL
               SELECT day_ms, host_id, gpu_uuid, 'endpoint', endpoint, kind, gpu_seconds
               FROM d WHERE endpoint <> '') o
         CROSS JOIN b",
        b = series("b", 1)
    );
    execute(db, &usage, &[3, month_start_ms, DAY_MS]).await?;
    execute(db, "DROP TABLE bench_hours", &[]).await?;
    execute(db, "ANALYZE", &[]).await?;
    Ok(())
}

pub(super) async fn seed_hosts(db: &Db, gpus: i64) -> Result<()> {
    let sql = format!(
        "WITH RECURSIVE {s}
         INSERT INTO hosts (id, cluster, hostname, provider, instance_type, region, agent_version,
                            last_report_ms)
         SELECT i + 1, 'cluster-' || (i % 8), 'host-' || i, 'aws', 'p5.48xlarge', 'us-east-1',
                'bench', $2
         FROM s",
        s = series("s", 1)
    );
    execute(db, &sql, &[(gpus + 7) / 8, MONTH_START_MS]).await?;
    let sql = format!(
        "WITH RECURSIVE {s}
         INSERT INTO gpus (uuid, host_id, gpu_index, name, memory_total_bytes)
         SELECT 'GPU-bench-' || i, i / 8 + 1, i % 8, 'NVIDIA H100 80GB HBM3', 85899345920
         FROM s",
        s = series("s", 1)
    );
    execute(db, &sql, &[gpus]).await
}

/// Rows seeded straight into the database wait in PostgreSQL's default partitions: makes their
/// partitions (and those around `now_ms`) and moves them in, as the server's job keeps them.
pub(super) async fn partitions_as_the_job_keeps_them(
    db: &Db,
    now_ms: i64,
) -> Result<gpuledger_server::store::partitions::PartitionWork> {
    use gpuledger_server::store::partitions::{make_ahead, Waiting};
    let store = gpuledger_server::store::connect(&db.url).await?;
    Ok(make_ahead(store.db(), now_ms, i64::MIN, Waiting::Move).await?)
}

pub(super) async fn review_latency(backend: &str, gpus: i64, o: &Options) -> Result<()> {
    let db = fresh_db(backend).await?;
    let seeding = Instant::now();
    // October 2026, closed; or the month under way, up to the hour under way.
    let (month_start, hours, month, next) = if o.review_under_way {
        use gpuledger_core::time::{hour_floor, month_label, month_start_ms, next_month_start};
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis() as i64;
        let start = month_start_ms(now);
        let next = next_month_start(now);
        let hours = ((hour_floor(now) - start) / HOUR_MS).max(1);
        (start, hours, month_label(start), month_label(next))
    } else {
        (
            MONTH_START_MS,
            MONTH_HOURS,
            MONTH.to_owned(),
            "2026-11".to_owned(),
        )
    };
    seed_rollups(&db, gpus, (month_start, hours)).await?;
    let partitions = partitions_as_the_job_keeps_them(&db, month_start).await?;
    let hour_rows = count(&db, "SELECT COUNT(*) FROM rollup_hours").await?;
    let day_rows = count(&db, "SELECT COUNT(*) FROM rollup_days").await?;
    let host_day_rows = count(&db, "SELECT COUNT(*) FROM rollup_host_days").await?;
    let host_hour_rows = count(&db, "SELECT COUNT(*) FROM rollup_host_hours").await?;
    let seeded_s = seeding.elapsed().as_secs_f64();
    if !partitions.partitions.is_empty() {
        println!(
            "  {} partitions made, {} rows moved in",
            partitions.partitions.len(),
            partitions.rows_moved
        );
    }

    let mut server = start_server(&db.url, free_port()).await;
    let client = signed_in(&server, "viewer").await;
    let requests = o.review_requests;
    let pages = [
        ("review page", format!("{}/review/{month}", server.url)),
        (
            "allocation API (by team)",
            format!(
                "{}/api/v1/allocation?from={month}-01&to={next}-01&by=team",
                server.url
            ),
        ),
    ];
    println!(
        "{} of {gpus} GPUs: {hour_rows} hourly, {day_rows} daily, {host_hour_rows} host-hourly and {host_day_rows} host-daily rollup rows (seeded in {seeded_s:.0} s)",
        if o.review_under_way {
            format!("{month} under way, {hours} hours")
        } else {
            "month".to_owned()
        }
    );
    for (name, url) in &pages {
        let mut times = Vec::new();
        for i in 0..requests + 2 {
            let started = Instant::now();
            let resp = client.get(url).send().await?;
            let status = resp.status();
            let body = resp.bytes().await?;
            if !status.is_success() {
                bail!("{name}: {status}: {}", String::from_utf8_lossy(&body));
            }
            if i == 0 && name.starts_with("review") {
                // The month's first view computes its recommendations from the rollups and
                // stores them, and keeps its heaviest sections (a closed month's ledger reads
                // too); later views read them back until a roll-up rewrites the month.
                println!(
                    "  {:<26} {:>7.1} ms  (computes the recommendations and the kept sections)",
                    "first review view",
                    started.elapsed().as_secs_f64() * 1e3
                );
                if String::from_utf8_lossy(&body).contains("No recommendation from") {
                    bail!("{name}: the review shows no recommendation");
                }
            }
            // Two warm-up requests: the first fills the database's caches.
            if i >= 2 {
                times.push(started.elapsed().as_secs_f64() * 1e3);
            }
        }
        times.sort_by(f64::total_cmp);
        println!(
            "  {name:<26} p50 {:>7.1} ms  p95 {:>7.1} ms  ({requests} requests)",
            percentile(&times, 50.0),
            percentile(&times, 95.0)
        );
    }
    println!(
        "  server peak RSS {:.0} MiB",
        peak_rss_mib(server.proc.pid())
    );
    server.proc.terminate(Duration::from_secs(30));
    Ok(())
}
