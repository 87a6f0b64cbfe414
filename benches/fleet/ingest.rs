//! Ingest: HTTP reports → committed rows, against the same rows inserted in bulk.

use super::*;

/// Connections the simulated agents send over at once.
pub(super) const INGEST_AGENTS: usize = 64;
/// The fleet whose reports they send: 1,250 hosts of 8 GPUs, 10,000 GPUs.
pub(super) const INGEST_HOSTS: usize = 1_250;
/// Rows per statement of the bulk baseline: 2,000 rows of 14 columns stay below SQLite's
/// 32,766 bound values (and PostgreSQL's 65,535).
pub(super) const BULK_ROWS_PER_STATEMENT: usize = 2_000;

/// GPU windows each host sends in a round of the ingest figure, whatever the report size.
pub(super) const INGEST_WINDOWS_PER_HOST: i64 = 16;

/// One agent report as the agent sends it (by default four 15 s windows of 8 GPUs, one labelled
/// process each), from an AWS host the rate card prices: the `seq`th report of `host`.
pub(super) fn agent_report(host: usize, seq: i64, prefix: &str, windows: usize) -> Report {
    // Recent windows: the server refuses those older than its retention.
    let base = (gpuledger_server::clock::now_ms() - DAY_MS) / HOUR_MS * HOUR_MS;
    let first = base + seq * windows as i64 * WINDOW_MS;
    let mut r = eight_gpu_report(prefix, host, seq as u64, first);
    for k in 1..windows as i64 {
        let next = eight_gpu_report(prefix, host, seq as u64, first + k * WINDOW_MS);
        r.windows.extend(next.windows);
    }
    r.host.provider = Some("aws".into());
    r.host.instance_type = Some("p5.48xlarge".into());
    r
}

/// The reports one of the `INGEST_AGENTS` connections sends, in order: each round of windows,
/// its share of the fleet's hosts.
pub(super) fn reports_of_agent(
    agent: usize,
    reports_per_host: i64,
) -> impl Iterator<Item = (usize, i64)> {
    (0..reports_per_host).flat_map(move |seq| {
        (agent..INGEST_HOSTS)
            .step_by(INGEST_AGENTS)
            .map(move |h| (h, seq))
    })
}

/// One round of the ingest figure, on a fresh database: the baselines, then the same rows over
/// HTTP.
pub(super) struct IngestRound {
    http_rate: f64,
    bulk_rate: f64,
    per_report_rate: f64,
    p50_ms: f64,
    p95_ms: f64,
    http_cpu: String,
    bulk_cpu: String,
    rss_mib: f64,
    mean_group: f64,
    alone: f64,
}

impl IngestRound {
    fn ratio(&self) -> f64 {
        self.http_rate / self.bulk_rate
    }
}

/// Ingest in rounds, each on a fresh database with the baselines measured just before: what else
/// the machine does drifts over seconds, so one pair of figures can land on either side of a
/// target by chance; the median round is the figure.
pub(super) async fn ingest(backend: &str, o: &Options) -> Result<()> {
    let per_report = o.ingest_windows_per_report;
    let reports_per_host: i64 = if o.quick {
        1
    } else {
        (INGEST_WINDOWS_PER_HOST / per_report as i64).max(1)
    };
    let reports = INGEST_HOSTS as i64 * reports_per_host;
    let windows = reports * i64::from(GPUS_PER_HOST) * per_report as i64;
    println!(
        "ingest: {windows} GPU-windows in {reports} reports of {per_report} windows from a fleet of {} GPUs ({INGEST_HOSTS} hosts) over {INGEST_AGENTS} concurrent connections, {} rounds",
        INGEST_HOSTS * GPUS_PER_HOST as usize,
        o.ingest_rounds
    );
    let mut rounds = Vec::new();
    for round in 1..=o.ingest_rounds {
        let r = ingest_round(backend, reports_per_host, per_report).await?;
        println!(
            "  round {round}: end to end {:>6.0}/s, bulk insert {:>6.0}/s, ratio {:.2} (a transaction per report {:>6.0}/s)",
            r.http_rate,
            r.bulk_rate,
            r.ratio(),
            r.per_report_rate
        );
        rounds.push(r);
    }
    rounds.sort_by(|a, b| a.ratio().total_cmp(&b.ratio()));
    let r = &rounds[rounds.len() / 2];
    println!("  the median round:");
    println!(
        "  end to end (HTTP → committed):  {:>9.0} GPU-windows/s  (report latency p50 {:.1} ms, p95 {:.1} ms; {:.1} reports per group, {:.0} written alone)",
        r.http_rate, r.p50_ms, r.p95_ms, r.mean_group, r.alone
    );
    println!(
        "  bulk insert, same rows:         {:>9.0} GPU-windows/s",
        r.bulk_rate
    );
    println!(
        "  a transaction per report:       {:>9.0} GPU-windows/s (end to end / this: {:.2})",
        r.per_report_rate,
        r.http_rate / r.per_report_rate
    );
    println!(
        "  CPU per report of {per_report}, end to end: {}",
        r.http_cpu
    );
    println!(
        "  CPU per report of {per_report}, bulk:       {}",
        r.bulk_cpu
    );
    let rss = rounds.iter().map(|r| r.rss_mib).fold(0.0, f64::max);
    println!(
        "  ratio to bulk {:.2} (target ≥ 0.50; rounds {:.2}–{:.2}); server peak RSS {rss:.0} MiB",
        r.ratio(),
        rounds[0].ratio(),
        rounds[rounds.len() - 1].ratio()
    );
    Ok(())
}

pub(super) async fn ingest_round(
    backend: &str,
    reports_per_host: i64,
    per_report: usize,
) -> Result<IngestRound> {
    let reports = INGEST_HOSTS as i64 * reports_per_host;
    let windows = reports * i64::from(GPUS_PER_HOST) * per_report as i64;
    let db = fresh_db(backend).await?;
    let host_sql = "INSERT INTO hosts (id, cluster, hostname, last_report_ms) VALUES (999999, 'raw', 'raw', 0)";
    execute(&db, host_sql, &[]).await?;

    // Baselines first: the same rows straight into the same tables, in bulk and a transaction
    // per report.
    let bulk_cpu = CpuClock::now(None);
    let bulk_s = bulk_inserts(&db, reports_per_host, per_report).await?;
    let bulk_cpu = CpuClock::now(None).per_report(&bulk_cpu, reports, "", "writer");
    let per_report_s = per_report_inserts(&db, reports_per_host, per_report).await?;

    // The baselines' rows waited in the default partition: moved now, as the job would have
    // long before, rather than while the server ingests the same days.
    partitions_as_the_job_keeps_them(&db, gpuledger_server::clock::now_ms()).await?;
    let token = create_token(&db.url, "bench", "http-*");
    let mut server = start_server(&db.url, free_port()).await;
    let client = reqwest::Client::new();
    let server_pid = server.proc.pid();
    let groups_before = group_counts(&client, &server.url).await?;
    let http_cpu = CpuClock::now(Some(server_pid));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for agent in 0..INGEST_AGENTS {
        let (client, url, token) = (client.clone(), server.url.clone(), token.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            for (host, seq) in reports_of_agent(agent, reports_per_host) {
                let body = agent_report(host, seq, "http", per_report);
                let sent = Instant::now();
                let resp = client
                    .post(format!("{url}/api/v1/reports"))
                    .bearer_auth(&token)
                    .json(&body)
                    .send()
                    .await?;
                if !resp.status().is_success() {
                    bail!("report refused: {}: {}", resp.status(), resp.text().await?);
                }
                latencies.push(sent.elapsed().as_secs_f64() * 1e3);
            }
            Ok::<_, anyhow::Error>(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await??);
    }
    let http_s = started.elapsed().as_secs_f64();
    let http_cpu =
        CpuClock::now(Some(server_pid)).per_report(&http_cpu, reports, "server", "agents");
    let groups_after = group_counts(&client, &server.url).await?;
    let rss_mib = peak_rss_mib(server_pid);
    server.proc.terminate(Duration::from_secs(30));
    latencies.sort_by(f64::total_cmp);

    let stored = count(
        &db,
        "SELECT COUNT(*) FROM gpu_windows WHERE gpu_uuid LIKE 'GPU-http-%'",
    )
    .await?;
    if stored != windows {
        bail!("ingest stored {stored} GPU-windows of {windows}");
    }
    let groups = (groups_after.0 - groups_before.0).max(1.0);
    Ok(IngestRound {
        http_rate: windows as f64 / http_s,
        bulk_rate: windows as f64 / bulk_s,
        per_report_rate: windows as f64 / per_report_s,
        p50_ms: percentile(&latencies, 50.0),
        p95_ms: percentile(&latencies, 95.0),
        http_cpu,
        bulk_cpu,
        rss_mib,
        mean_group: (groups_after.1 - groups_before.1) / groups,
        alone: groups_after.2 - groups_before.2,
    })
}

/// The server's ingest groups, the reports in them and those written alone so far, from
/// `/metrics`.
pub(super) async fn group_counts(client: &reqwest::Client, url: &str) -> Result<(f64, f64, f64)> {
    let text = client
        .get(format!("{url}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok((
        value("gpuledger_ingest_groups_total "),
        value("gpuledger_ingest_grouped_reports_total "),
        value("gpuledger_ingest_reports_written_alone_total "),
    ))
}

pub(super) async fn count(db: &Db, sql: &str) -> Result<i64> {
    Ok(if db.backend == "postgres" {
        let mut c = sqlx::PgConnection::connect(&db.url).await?;
        sqlx::query_scalar(sql).fetch_one(&mut c).await?
    } else {
        let mut c = sqlx::SqliteConnection::connect(&db.url).await?;
        sqlx::query_scalar(sql).fetch_one(&mut c).await?
    })
}

/// Appends `reports`' GPU and process windows to two multi-row inserts (the columns the agent's
/// default report fills), as if all stored from one host.
macro_rules! push_rows {
    ($db:ty, $reports:expr) => {{
        let reports: &[Report] = $reports;
        let mut gpus = sqlx::QueryBuilder::<$db>::new(
            "INSERT INTO gpu_windows (gpu_uuid, start_ms, end_ms, host_id, batch_id,
                samples, memory_total_bytes, memory_used_max_bytes, util_avg,
                util_max, mem_util_avg, power_avg_watts, temperature_max_c,
                energy_mj) ",
        );
        let rows = reports
            .iter()
            .flat_map(|r| r.windows.iter().map(move |w| (r, w)))
            .flat_map(|(r, w)| w.gpus.iter().map(move |g| (r, w, g)));
        gpus.push_values(rows, |mut b, (r, w, g)| {
            b.push_bind(g.uuid.clone())
                .push_bind(w.start_ms)
                .push_bind(w.end_ms)
                .push_bind(999_999i64)
                .push_bind(r.batch_id.clone())
                .push_bind(i64::from(w.samples))
                .push_bind(g.memory_total_bytes.map(|v| v as i64))
                .push_bind(g.memory_used_max_bytes.map(|v| v as i64))
                .push_bind(g.util_avg)
                .push_bind(g.util_max)
                .push_bind(g.mem_util_avg)
                .push_bind(g.power_avg_watts)
                .push_bind(g.temperature_max_c)
                .push_bind(g.energy_mj.map(|v| v as i64));
        });
        let mut procs = sqlx::QueryBuilder::<$db>::new(
            "INSERT INTO process_windows (gpu_uuid, start_ms, pid, end_ms,
                process_name, memory_used_max_bytes, sm_util_avg, labels_json,
                container_id, pod_uid, host_id) ",
        );
        let rows = reports
            .iter()
            .flat_map(|r| &r.windows)
            .flat_map(|w| w.gpus.iter().map(move |g| (w, g)))
            .flat_map(|(w, g)| g.processes.iter().map(move |p| (w, g, p)));
        let rows: Vec<(&gpuledger_proto::Window, &GpuWindow, &ProcessWindow)> = rows.collect();
        procs.push_values(rows, |mut b, (w, g, p)| {
            b.push_bind(g.uuid.clone())
                .push_bind(w.start_ms)
                .push_bind(i64::from(p.pid))
                .push_bind(w.end_ms)
                .push_bind(p.name.clone())
                .push_bind(p.memory_used_max_bytes.map(|v| v as i64))
                .push_bind(p.sm_util_avg)
                .push_bind(serde_json::to_string(&p.labels).unwrap_or_default())
                .push_bind(p.container_id.clone())
                .push_bind(p.pod_uid.clone())
                .push_bind(999_999i64);
        });
        (gpus, procs)
    }};
}

/// The baseline: the same rows inserted in bulk, `BULK_ROWS_PER_STATEMENT` rows a statement and
/// one transaction per statement pair, by one writer per core (SQLite: one writer, as it
/// allows), with no HTTP, validation, host upsert, idempotency or rollup marks. The reports are
/// built before the clock starts.
pub(super) async fn bulk_inserts(db: &Db, reports_per_host: i64, per_report: usize) -> Result<f64> {
    let reports_per_statement = BULK_ROWS_PER_STATEMENT / (GPUS_PER_HOST as usize * per_report);
    let writers = if db.backend == "postgres" {
        std::thread::available_parallelism().map_or(2, usize::from)
    } else {
        1
    };
    let mut chunks: Vec<Vec<Vec<Report>>> = (0..writers).map(|_| Vec::new()).collect();
    let all: Vec<Report> = (0..reports_per_host)
        .flat_map(|seq| (0..INGEST_HOSTS).map(move |h| agent_report(h, seq, "bulk", per_report)))
        .collect();
    for (i, chunk) in all.chunks(reports_per_statement).enumerate() {
        chunks[i % writers].push(chunk.to_vec());
    }
    macro_rules! insert_all {
        ($pool:expr, $db:ty) => {{
            let pool = Arc::new($pool);
            let started = Instant::now();
            let mut tasks = Vec::new();
            for mine in chunks {
                let pool = pool.clone();
                tasks.push(tokio::spawn(async move {
                    for chunk in &mine {
                        let (mut gpus, mut procs) = push_rows!($db, chunk);
                        let mut tx = pool.begin().await?;
                        gpus.build().execute(&mut *tx).await?;
                        procs.build().execute(&mut *tx).await?;
                        tx.commit().await?;
                    }
                    Ok::<_, anyhow::Error>(())
                }));
            }
            for t in tasks {
                t.await??;
            }
            started.elapsed().as_secs_f64()
        }};
    }
    with_baseline_pool!(db, writers, insert_all)
}

/// The former baseline: each report's windows in its own transaction, one multi-row statement
/// per table, by as many concurrent writers as agents (SQLite: one at a time).
pub(super) async fn per_report_inserts(
    db: &Db,
    reports_per_host: i64,
    per_report: usize,
) -> Result<f64> {
    macro_rules! insert_all {
        ($pool:expr, $db:ty) => {{
            let pool = Arc::new($pool);
            let started = Instant::now();
            let mut tasks = Vec::new();
            for agent in 0..INGEST_AGENTS {
                let pool = pool.clone();
                tasks.push(tokio::spawn(async move {
                    for (host, seq) in reports_of_agent(agent, reports_per_host) {
                        let r = [agent_report(host, seq, "raw", per_report)];
                        let (mut gpus, mut procs) = push_rows!($db, &r);
                        let mut tx = pool.begin().await?;
                        gpus.build().execute(&mut *tx).await?;
                        procs.build().execute(&mut *tx).await?;
                        tx.commit().await?;
                    }
                    Ok::<_, anyhow::Error>(())
                }));
            }
            for t in tasks {
                t.await??;
            }
            started.elapsed().as_secs_f64()
        }};
    }
    // As many connections as the server's pool.
    with_baseline_pool!(db, 16, insert_all)
}

/// Runs `$insert_all!(pool, backend type)` on a pool of `$connections` to `$db` (SQLite: one, with
/// the server's settings: WAL, synchronous=NORMAL).
macro_rules! with_baseline_pool {
    ($db:expr, $connections:expr, $insert_all:ident) => {{
        let db: &Db = $db;
        Ok(if db.backend == "postgres" {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections($connections as u32)
                .connect(&db.url)
                .await?;
            $insert_all!(pool, sqlx::Postgres)
        } else {
            let options: sqlx::sqlite::SqliteConnectOptions = db.url.parse()?;
            let options = options
                .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                .synchronous(sqlx::sqlite::SqliteSynchronous::Normal)
                .busy_timeout(Duration::from_secs(30));
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(1)
                .connect_with(options)
                .await?;
            $insert_all!(pool, sqlx::Sqlite)
        })
    }};
}
use with_baseline_pool;
