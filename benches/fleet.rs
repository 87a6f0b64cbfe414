//! The fleet benchmark: prints the figures `docs/benchmarks.md` quotes, on SQLite and PostgreSQL.
//!
//! - ingest end to end (HTTP reports to the real server → committed rows), beside the same rows
//!   inserted in bulk into the same database in the same run, and their ratio;
//! - monthly review page and allocation API latency (p50, p95) for a month of 1,000 and of
//!   10,000 GPUs (rollups seeded in the database, as the roll-up job leaves them);
//! - attribution of a month of 1,000 GPUs from raw windows (`gpuledger-server rollup`), its
//!   time and peak RSS;
//! - the agent's CPU time and RSS sampling 8 GPUs at 1 s against the fake NVML;
//! - FOCUS import (`gpuledger-server billing import-focus`) of a large export as CSV, CSV.gz
//!   and Parquet: rows/s and peak RSS, beside reading the same CSV with the csv crate alone;
//! - the FOCUS export (`format=focus`, `format=focus-parquet`) of a month of 1,000 GPUs: time,
//!   size and the server's RSS above idle while it streams.
//!
//! Run it with `scripts/bench` (builds release binaries, starts a throwaway PostgreSQL). Options
//! after `--`: `--quick` (small sizes, a smoke run), `--only ingest,review,attribution,agent`,
//! `--backends sqlite,postgres`, `--agent-seconds N`, `--attribution-window-secs N`,
//! `--attribution-days N` (31: the month) or `--attribution-hours N`, `--attribution-gpus N`
//! (1,000), `--ingest-rounds N` (5; the median is the figure), `--ingest-windows-per-report N`
//! (4, the agent's default: a report a minute of 15-second windows), `--import-rows N` (500,000).

#[path = "../tests/e2e/support/mod.rs"]
mod support;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpuledger_proto::{GpuWindow, ProcessWindow, Report};
use sqlx::Connection;
use support::{
    artifact, create_token, eight_gpu_report, free_port, server_run, signed_in, start_server,
    GPUS_PER_HOST, WINDOW_MS,
};

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;
/// The month the latency and attribution figures read: October 2026 (31 days).
const MONTH_START_MS: i64 = 1_790_812_800_000;
const MONTH: &str = "2026-10";
const MONTH_HOURS: i64 = 31 * 24;

struct Options {
    quick: bool,
    only: Vec<String>,
    backends: Vec<String>,
    agent_seconds: u64,
    attribution_window_secs: i64,
    /// Hours of October 2026 attributed, from its start.
    attribution_hours: i64,
    attribution_gpus: i64,
    ingest_rounds: usize,
    /// Windows in each report the simulated agents send.
    ingest_windows_per_report: usize,
    import_rows: u64,
    /// Fleet sizes whose month the review is timed on.
    review_gpus: Vec<i64>,
    /// The review timed on the month under way (at the real clock, seeded up to the hour under
    /// way) instead of October 2026, closed.
    review_under_way: bool,
    /// Timed views of each page (more to profile the server while it serves them).
    review_requests: usize,
}

impl Options {
    fn parse() -> Result<Self> {
        let mut o = Options {
            quick: false,
            only: vec![],
            backends: vec!["sqlite".into(), "postgres".into()],
            agent_seconds: 120,
            attribution_window_secs: 300,
            attribution_hours: MONTH_HOURS,
            attribution_gpus: 1_000,
            ingest_rounds: 5,
            ingest_windows_per_report: 4,
            import_rows: 500_000,
            review_gpus: vec![1_000, 10_000],
            review_under_way: false,
            review_requests: 20,
        };
        let mut review_gpus_given = false;
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            let mut value =
                |name: &str| args.next().with_context(|| format!("{name} needs a value"));
            match a.as_str() {
                "--bench" => {} // cargo bench passes it
                "--quick" => o.quick = true,
                "--review-under-way" => o.review_under_way = true,
                "--only" => o.only = value("--only")?.split(',').map(str::to_owned).collect(),
                "--backends" => {
                    o.backends = value("--backends")?.split(',').map(str::to_owned).collect()
                }
                "--agent-seconds" => o.agent_seconds = value("--agent-seconds")?.parse()?,
                "--attribution-days" => {
                    o.attribution_hours = 24 * value("--attribution-days")?.parse::<i64>()?
                }
                "--attribution-hours" => {
                    o.attribution_hours = value("--attribution-hours")?.parse()?
                }
                "--attribution-gpus" => {
                    o.attribution_gpus = value("--attribution-gpus")?.parse()?
                }
                "--ingest-rounds" => o.ingest_rounds = value("--ingest-rounds")?.parse()?,
                "--ingest-windows-per-report" => {
                    o.ingest_windows_per_report = value("--ingest-windows-per-report")?.parse()?
                }
                "--review-requests" => o.review_requests = value("--review-requests")?.parse()?,
                "--import-rows" => o.import_rows = value("--import-rows")?.parse()?,
                "--review-gpus" => {
                    review_gpus_given = true;
                    o.review_gpus = value("--review-gpus")?
                        .split(',')
                        .map(str::parse)
                        .collect::<Result<_, _>>()?
                }
                "--attribution-window-secs" => {
                    o.attribution_window_secs = value("--attribution-window-secs")?.parse()?
                }
                other => bail!("unknown argument {other}"),
            }
        }
        if o.quick {
            o.agent_seconds = o.agent_seconds.min(20);
            o.attribution_window_secs = o.attribution_window_secs.max(900);
            o.ingest_rounds = 1;
            o.attribution_gpus = o.attribution_gpus.min(100);
            o.import_rows = o.import_rows.min(5_000);
            o.review_requests = o.review_requests.min(5);
            if !review_gpus_given {
                o.review_gpus = vec![100, 1_000];
            }
        }
        if o.review_requests == 0 {
            bail!("--review-requests needs at least 1");
        }
        if o.review_gpus.iter().any(|&n| n < 1) {
            bail!("--review-gpus needs fleet sizes of at least 1");
        }
        if o.import_rows == 0 {
            bail!("--import-rows needs at least 1");
        }
        if !(1..=MONTH_HOURS).contains(&o.attribution_hours) {
            bail!(
                "--attribution-days is 1 to 31 and --attribution-hours 1 to 744 (of October 2026)"
            );
        }
        if o.attribution_gpus < 1 {
            bail!("--attribution-gpus needs at least 1");
        }
        if o.ingest_rounds == 0 {
            bail!("--ingest-rounds needs at least 1");
        }
        if !(1..=16).contains(&o.ingest_windows_per_report) {
            bail!("--ingest-windows-per-report is 1 to 16");
        }
        Ok(o)
    }

    fn wants(&self, part: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| p == part)
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let o = Options::parse()?;
    println!(
        "gpuledger fleet benchmark{}",
        if o.quick { " (quick)" } else { "" }
    );
    println!(
        "machine: {} cores, {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model()
    );
    for backend in &o.backends {
        if backend == "postgres" && std::env::var("GPULEDGER_TEST_PG_URL").is_err() {
            bail!("postgres needs GPULEDGER_TEST_PG_URL: run scripts/bench, which starts one");
        }
        println!("\n== {backend} ==");
        if o.wants("ingest") {
            ingest(backend, &o).await?;
        }
        if o.wants("review") {
            for &gpus in &o.review_gpus {
                review_latency(backend, gpus, &o).await?;
            }
        }
        if o.wants("attribution") {
            attribution(backend, &o).await?;
        }
        if o.wants("import") {
            import(backend, &o).await?;
        }
        if o.wants("export") {
            export(backend, if o.quick { 100 } else { 1_000 }).await?;
        }
    }
    if o.wants("agent") {
        println!("\n== agent ==");
        agent(&o).await?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Databases and processes

struct Db {
    url: String,
    backend: String,
    // Keeps the SQLite file's directory alive.
    _test: support::TestDb,
}

async fn fresh_db(backend: &str) -> Result<Db> {
    let test = match backend {
        "sqlite" => support::test_support::sqlite(),
        "postgres" => support::test_support::postgres().await,
        other => bail!("unknown backend {other}"),
    };
    // Any command migrates the database.
    server_run(&test.url, &["token", "list"]);
    Ok(Db {
        url: test.url.clone(),
        backend: backend.to_owned(),
        _test: test,
    })
}

/// Runs SQL on the database (seeding), one statement at a time.
async fn execute(db: &Db, sql: &str, binds: &[i64]) -> Result<()> {
    macro_rules! run {
        ($conn:expr) => {{
            let mut q = sqlx::query(sql);
            for b in binds {
                q = q.bind(*b);
            }
            q.execute(&mut $conn).await?;
        }};
    }
    if db.backend == "postgres" {
        let mut conn = sqlx::PgConnection::connect(&db.url).await?;
        run!(conn);
    } else {
        let mut conn = sqlx::SqliteConnection::connect(&db.url).await?;
        run!(conn);
    }
    Ok(())
}

/// Peak resident set of a running process (the kernel's high-water mark), in MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    proc_status_kib(pid, "VmHWM:") as f64 / 1024.0
}

fn proc_status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// What a finished child used, from `wait4`: CPU seconds (user + system) and peak RSS.
struct Usage {
    success: bool,
    cpu_s: f64,
    max_rss_mib: f64,
}

async fn wait_usage(child: std::process::Child) -> Result<Usage> {
    let pid = child.id() as libc::pid_t;
    tokio::task::spawn_blocking(move || {
        let _keep = child; // std's Child neither waits nor kills on drop
        let mut status = 0;
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if r != pid {
            bail!("wait4 failed: {}", std::io::Error::last_os_error());
        }
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        Ok(Usage {
            success: libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            cpu_s: secs(ru.ru_utime) + secs(ru.ru_stime),
            max_rss_mib: ru.ru_maxrss as f64 / 1024.0,
        })
    })
    .await?
}

/// Runs a server command on `db` as a child process: what it used, and its wall time.
async fn timed_server_run(db: &Db, args: &[&str]) -> Result<(Usage, f64)> {
    let started = Instant::now();
    let child = Command::new(artifact("gpuledger-server"))
        .env("GPULEDGER_DATABASE_URL", &db.url)
        .env("GPULEDGER_LOG", "warn")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()?;
    let usage = wait_usage(child).await?;
    Ok((usage, started.elapsed().as_secs_f64()))
}

/// CPU seconds spent so far: by the whole machine (busy time from `/proc/stat`), by this
/// benchmark process (the simulated agents or the bulk writers) and, when named, by a
/// child process (the server). What the machine spent beyond the two is the database's.
#[derive(Clone, Copy)]
struct CpuClock {
    machine_s: f64,
    bench_s: f64,
    child_s: f64,
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}

impl CpuClock {
    fn now(child: Option<u32>) -> CpuClock {
        let ticks = clock_ticks();
        let machine_s = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| {
                let cpu = s.lines().next()?.split_whitespace().skip(1);
                // user nice system idle iowait irq softirq steal: busy is all but idle and iowait.
                let v: Vec<f64> = cpu.take(8).filter_map(|x| x.parse().ok()).collect();
                (v.len() == 8).then(|| (v.iter().sum::<f64>() - v[3] - v[4]) / ticks)
            })
            .unwrap_or(0.0);
        let child_s = child
            .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
            .and_then(|s| {
                // Fields after the command name (which may hold spaces): utime is the 12th, stime the 13th.
                let rest = s.rsplit_once(')')?.1;
                let f: Vec<&str> = rest.split_whitespace().collect();
                Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / ticks)
            })
            .unwrap_or(0.0);
        // SAFETY: getrusage fills the struct it is given.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        CpuClock {
            machine_s,
            bench_s: secs(ru.ru_utime) + secs(ru.ru_stime),
            child_s,
        }
    }

    /// "database 1.2 ms, server 0.8 ms, agents 0.5 ms" of CPU per report since `start`.
    fn per_report(&self, start: &CpuClock, reports: i64, child: &str, bench: &str) -> String {
        let per = |s: f64| s * 1e3 / reports as f64;
        let bench_s = self.bench_s - start.bench_s;
        let child_s = self.child_s - start.child_s;
        let db_s = (self.machine_s - start.machine_s - bench_s - child_s).max(0.0);
        let mut out = format!("database and the rest {:.2} ms", per(db_s));
        if !child.is_empty() {
            out += &format!(", {child} {:.2} ms", per(child_s));
        }
        out + &format!(", {bench} {:.2} ms", per(bench_s))
    }
}

fn percentile(sorted_ms: &[f64], p: f64) -> f64 {
    if sorted_ms.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted_ms.len() as f64).ceil() as usize;
    sorted_ms[rank.clamp(1, sorted_ms.len()) - 1]
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

// ---------------------------------------------------------------------------------------------
// Ingest: HTTP reports → committed rows, against the same rows inserted in bulk.

/// Connections the simulated agents send over at once.
const INGEST_AGENTS: usize = 64;
/// The fleet whose reports they send: 1,250 hosts of 8 GPUs, 10,000 GPUs.
const INGEST_HOSTS: usize = 1_250;
/// Rows per statement of the bulk baseline: 2,000 rows of 14 columns stay below SQLite's
/// 32,766 bound values (and PostgreSQL's 65,535).
const BULK_ROWS_PER_STATEMENT: usize = 2_000;

/// GPU windows each host sends in a round of the ingest figure, whatever the report size.
const INGEST_WINDOWS_PER_HOST: i64 = 16;

/// One agent report as the agent sends it (by default four 15 s windows of 8 GPUs, one labelled
/// process each), from an AWS host the rate card prices: the `seq`th report of `host`.
fn agent_report(host: usize, seq: i64, prefix: &str, windows: usize) -> Report {
    // Recent windows: the server refuses those older than its retention.
    let base = (gpuledger_server::now_ms() - DAY_MS) / HOUR_MS * HOUR_MS;
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
fn reports_of_agent(agent: usize, reports_per_host: i64) -> impl Iterator<Item = (usize, i64)> {
    (0..reports_per_host).flat_map(move |seq| {
        (agent..INGEST_HOSTS)
            .step_by(INGEST_AGENTS)
            .map(move |h| (h, seq))
    })
}

/// One round of the ingest figure, on a fresh database: the baselines, then the same rows over
/// HTTP.
struct IngestRound {
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
async fn ingest(backend: &str, o: &Options) -> Result<()> {
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

async fn ingest_round(
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
    partitions_as_the_job_keeps_them(&db, gpuledger_server::now_ms()).await?;
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
async fn group_counts(client: &reqwest::Client, url: &str) -> Result<(f64, f64, f64)> {
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

async fn count(db: &Db, sql: &str) -> Result<i64> {
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
async fn bulk_inserts(db: &Db, reports_per_host: i64, per_report: usize) -> Result<f64> {
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
async fn per_report_inserts(db: &Db, reports_per_host: i64, per_report: usize) -> Result<f64> {
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

// ---------------------------------------------------------------------------------------------
// Review page and allocation API on a month of rollups.

/// Numbers `0..$n` as a recursive CTE (works on SQLite and PostgreSQL alike).
fn series(name: &str, bind: usize) -> String {
    format!("{name}(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM {name} WHERE i + 1 < ${bind})")
}

/// A month of hourly and daily rollups for `gpus` GPUs (8 per host), as the roll-up job leaves
/// them. Each host's 8 GPUs do one kind of work: 40% of hosts train (a run label that changes
/// every 3 days, idle 2 hours a day), 40% serve an endpoint (held idle 6 hours a day), 10% run
/// notebooks (a team label only), 10% sit idle.
async fn seed_rollups(db: &Db, gpus: i64, (month_start_ms, hours): (i64, i64)) -> Result<()> {
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

async fn seed_hosts(db: &Db, gpus: i64) -> Result<()> {
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
async fn partitions_as_the_job_keeps_them(
    db: &Db,
    now_ms: i64,
) -> Result<gpuledger_server::store::partitions::PartitionWork> {
    use gpuledger_server::store::partitions::{make_ahead, Waiting};
    let store = gpuledger_server::store::connect(&db.url).await?;
    Ok(make_ahead(store.db(), now_ms, i64::MIN, Waiting::Move).await?)
}

async fn review_latency(backend: &str, gpus: i64, o: &Options) -> Result<()> {
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

// ---------------------------------------------------------------------------------------------
// Attribution from raw windows: a month of 1,000 GPUs unless told otherwise.

async fn attribution(backend: &str, o: &Options) -> Result<()> {
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
async fn table_bytes(db: &Db, table: &str) -> Result<i64> {
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

// ---------------------------------------------------------------------------------------------
// FOCUS import: a large AWS-style FOCUS 1.2 export, as CSV, CSV.gz and Parquet.

const FOCUS_BENCH_HEADER: &str = "AvailabilityZone,BilledCost,BillingAccountId,BillingAccountName,BillingAccountType,BillingCurrency,BillingPeriodEnd,BillingPeriodStart,CapacityReservationId,CapacityReservationStatus,ChargeCategory,ChargeClass,ChargeDescription,ChargeFrequency,ChargePeriodEnd,ChargePeriodStart,CommitmentDiscountCategory,CommitmentDiscountId,CommitmentDiscountName,CommitmentDiscountQuantity,CommitmentDiscountStatus,CommitmentDiscountType,CommitmentDiscountUnit,ConsumedQuantity,ConsumedUnit,ContractedCost,ContractedUnitPrice,EffectiveCost,InvoiceId,InvoiceIssuerName,ListCost,ListUnitPrice,PricingCategory,PricingCurrency,PricingCurrencyContractedUnitPrice,PricingCurrencyEffectiveCost,PricingCurrencyListUnitPrice,PricingQuantity,PricingUnit,ProviderName,PublisherName,RegionId,RegionName,ResourceId,ResourceName,ResourceType,ServiceCategory,ServiceName,ServiceSubcategory,SkuId,SkuMeter,SkuPriceDetails,SkuPriceId,SubAccountId,SubAccountName,SubAccountType,Tags,x_Discounts,x_Operation,x_ServiceCode,x_UsageType";

/// Writes `rows` hourly lines for 2,000 instances from October 2026 on, about a kilobyte each
/// as AWS writes them; returns the exact billed total.
fn write_focus_csv(path: &std::path::Path, rows: u64) -> Result<rust_decimal::Decimal> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(out, "{FOCUS_BENCH_HEADER}")?;
    let mut total = rust_decimal::Decimal::ZERO;
    let iso = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .map(|d| d.format("%Y-%m-%dT%H:%M:%SZ").to_string())
            .unwrap_or_default()
    };
    for row in 0..rows {
        let instance = row % 2_000;
        let hour = MONTH_START_MS + (row / 2_000) as i64 % MONTH_HOURS * HOUR_MS;
        let cost = rust_decimal::Decimal::new(32_772_600_000 + (row % 997) as i64 * 1_000_003, 9);
        total += cost;
        writeln!(
            out,
            "us-east-1a,{cost},111122223333,acme-payer,Billing Account,USD,2026-11-01T00:00:00Z,2026-10-01T00:00:00Z,,,Usage,,\"$32.7726 per On Demand Linux p4d.24xlarge Instance Hour\",Usage-Based,{},{},,,,,,,,1,Hrs,{cost},32.7726,{cost},INV-2026-10,\"Amazon Web Services, Inc.\",{cost},32.7726,Standard,USD,32.7726,{cost},32.7726,1,Hours,AWS,\"Amazon Web Services, Inc.\",us-east-1,US East (N. Virginia),arn:aws:ec2:us-east-1:111122223333:instance/i-{instance:017x},train-{instance},Instance,Compute,Amazon Elastic Compute Cloud,Virtual Machines,SKU{instance:05},Instance Usage,\"{{\"\"InstanceType\"\":\"\"p4d.24xlarge\"\",\"\"OperatingSystem\"\":\"\"Linux\"\"}}\",SKU{instance:05}.JRTCKXETXF.6YS6EN2CT7,222233334444,ml-training,Linked Account,\"{{\"\"user:team\"\":\"\"team-{}\"\",\"\"user:project\"\":\"\"llm\"\"}}\",,RunInstances,AmazonEC2,USE1-BoxUsage:p4d.24xlarge",
            iso(hour + HOUR_MS),
            iso(hour),
            instance % 12,
        )?;
    }
    out.flush()?;
    Ok(total)
}

/// The floor an importer cannot beat: the csv crate reading every record of the file.
fn read_csv_rows(path: &std::path::Path) -> Result<u64> {
    let mut reader = csv::Reader::from_path(path)?;
    let mut record = csv::StringRecord::new();
    let mut rows = 0;
    while reader.read_record(&mut record)? {
        rows += 1;
    }
    Ok(rows)
}

async fn import(backend: &str, o: &Options) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let csv_path = dir.path().join("focus-2026-10.csv");
    let billed = write_focus_csv(&csv_path, o.import_rows)?;
    let gz_path = dir.path().join("focus-2026-10.csv.gz");
    {
        let mut enc = flate2::write::GzEncoder::new(
            std::fs::File::create(&gz_path)?,
            flate2::Compression::default(),
        );
        std::io::copy(&mut std::fs::File::open(&csv_path)?, &mut enc)?;
        enc.finish()?;
    }
    // Parquet as AWS Data Exports write it, by pyarrow (the venv scripts/setup makes).
    let parquet_path = dir.path().join("focus-2026-10.parquet");
    let converted = Command::new(support::python_tool("python"))
        .args([
            "-c",
            "import sys, pyarrow.csv as c, pyarrow.parquet as p\n\
             t = c.read_csv(sys.argv[1], convert_options=c.ConvertOptions(strings_can_be_null=True))\n\
             p.write_table(t, sys.argv[2], row_group_size=100_000, compression='snappy')",
        ])
        .arg(&csv_path)
        .arg(&parquet_path)
        .output()?;
    if !converted.status.success() {
        bail!(
            "writing the Parquet copy: {}",
            String::from_utf8_lossy(&converted.stderr)
        );
    }
    let mib = |p: &std::path::Path| {
        std::fs::metadata(p).map_or(0.0, |m| m.len() as f64 / (1 << 20) as f64)
    };
    println!(
        "import: a FOCUS 1.2 export of {} rows ({:.0} MiB as CSV, {:.0} MiB gzip, {:.0} MiB Parquet)",
        o.import_rows,
        mib(&csv_path),
        mib(&gz_path),
        mib(&parquet_path)
    );
    let started = Instant::now();
    let read = read_csv_rows(&csv_path)?;
    let floor = read as f64 / started.elapsed().as_secs_f64();
    println!("  csv crate reading the CSV alone:   {floor:>8.0} rows/s");
    for path in [&csv_path, &gz_path, &parquet_path] {
        let db = fresh_db(backend).await?;
        let file = path.to_string_lossy();
        let (usage, wall) = timed_server_run(&db, &["billing", "import-focus", &file]).await?;
        if !usage.success {
            bail!("importing {} failed", path.display());
        }
        // The import's total is per currency and billing period; the export bills one currency.
        let stored: Vec<(String, String)> = {
            let sql = "SELECT currency, billed_total FROM billing_file_periods";
            if db.backend == "postgres" {
                let mut conn = sqlx::PgConnection::connect(&db.url).await?;
                sqlx::query_as(sql).fetch_all(&mut conn).await?
            } else {
                let mut conn = sqlx::SqliteConnection::connect(&db.url).await?;
                sqlx::query_as(sql).fetch_all(&mut conn).await?
            }
        };
        let mut total = rust_decimal::Decimal::ZERO;
        for (currency, amount) in &stored {
            if currency != "USD" {
                bail!(
                    "{}: a total in {currency}, the export bills USD",
                    path.display()
                );
            }
            total += amount.parse::<rust_decimal::Decimal>()?;
        }
        if total != billed {
            bail!("{}: billed total {total} is not {billed}", path.display());
        }
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let rate = o.import_rows as f64 / wall;
        println!(
            "  import-focus {:<24} {rate:>8.0} rows/s ({wall:.1} s wall, {:.1} s CPU), peak RSS {:.0} MiB, ratio to the csv read {:.2}",
            name.unwrap_or_default(),
            usage.cpu_s,
            usage.max_rss_mib,
            rate / floor
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The FOCUS export of a month: rollups as the roll-up job leaves them for billed hosts, and the
// bill's hourly line per host.

async fn export(backend: &str, gpus: i64) -> Result<()> {
    let db = fresh_db(backend).await?;
    let seeding = Instant::now();
    seed_rollups(&db, gpus, (MONTH_START_MS, MONTH_HOURS)).await?;
    execute(&db, "UPDATE rollup_hours SET estimated = 0", &[]).await?;
    execute(
        &db,
        "UPDATE hosts SET instance_key = 'i-bench-' || id, instance_id = 'i-bench-' || id",
        &[],
    )
    .await?;
    execute(
        &db,
        "INSERT INTO billing_imports (id, source, name, content_sha256, imported_ms, row_count)
         VALUES (1, 'focus', 'bench.csv', 'bench', 0, 0)",
        &[],
    )
    .await?;
    // One hourly line per host: its 8 GPUs' hour, with the columns an AWS export carries.
    let lines = format!(
        "WITH RECURSIVE {s}, {h}
         INSERT INTO cost_lines (import_id, line_no, provider, billing_account_id,
             billing_period_start_ms, charge_period_start_ms, charge_period_end_ms,
             charge_category, resource_id, resource_key, billed_cost, effective_cost, list_cost,
             currency, pricing_category, service_name, sku_id, region, instance_type, tags_json,
             extra_json)
         SELECT 1, s.i * $2 + h.i + 2, 'AWS', '111122223333', $3, $3 + h.i * $4,
             $3 + (h.i + 1) * $4, 'Usage', 'arn:aws:ec2:us-east-1:111122223333:instance/i-bench-' || (s.i + 1),
             'i-bench-' || (s.i + 1), '98.32', '98.32', '98.32', 'USD', 'on_demand',
             'Amazon Elastic Compute Cloud', 'SKU', 'us-east-1', 'p5.48xlarge', '{{\"team\":\"ml\"}}',
             '{{\"BillingAccountName\":\"payer\",\"ChargeDescription\":\"$98.32 per On Demand Linux p5.48xlarge Instance Hour\",\"ChargeFrequency\":\"Usage-Based\",\"ContractedCost\":\"98.32\",\"InvoiceIssuerName\":\"AWS\",\"PricingQuantity\":\"1\",\"PricingUnit\":\"Hours\",\"PublisherName\":\"AWS\",\"ServiceCategory\":\"Compute\",\"SkuPriceId\":\"SKU.JRTCKXETXF\",\"SubAccountId\":\"444455556666\",\"x_UsageType\":\"USE1-BoxUsage:p5.48xlarge\"}}'
         FROM s CROSS JOIN h",
        s = series("s", 1),
        h = series("h", 2),
    );
    execute(
        &db,
        &lines,
        &[(gpus + 7) / 8, MONTH_HOURS, MONTH_START_MS, HOUR_MS],
    )
    .await?;
    execute(&db, "ANALYZE", &[]).await?;
    let bill_lines = count(&db, "SELECT COUNT(*) FROM cost_lines").await?;
    println!(
        "export: a month of {gpus} GPUs, {bill_lines} hourly bill lines (seeded in {:.0} s)",
        seeding.elapsed().as_secs_f64()
    );
    for format in ["focus", "focus-parquet"] {
        // A server of its own for each format, so idle is idle.
        let server = start_server(&db.url, free_port()).await;
        let viewer = signed_in(&server, "viewer").await;
        let pid = server.proc.pid();
        let url = format!(
            "{}/api/v1/allocation?from={MONTH}-01&to=2026-11-01&format={format}",
            server.url
        );
        // A day first, so what is loaded once (code, pools, caches) counts as idle.
        let warm = url.replace("to=2026-11-01", "to=2026-10-02");
        viewer.get(&warm).send().await?.bytes().await?;
        let idle = proc_status_kib(pid, "VmRSS:") as f64 / 1024.0;
        let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = {
            let (peak, done) = (peak.clone(), done.clone());
            tokio::spawn(async move {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    peak.fetch_max(
                        proc_status_kib(pid, "VmRSS:"),
                        std::sync::atomic::Ordering::Relaxed,
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        };
        let started = Instant::now();
        let mut resp = viewer.get(&url).send().await?;
        if !resp.status().is_success() {
            bail!("{url}: {}", resp.status());
        }
        let mut bytes = 0usize;
        while let Some(chunk) = resp.chunk().await? {
            bytes += chunk.len();
        }
        let wall = started.elapsed().as_secs_f64();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        sampler.await?;
        let peak = peak.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1024.0;
        println!(
            "  format={format:<14} {:>7.1} MiB in {wall:.1} s; server RSS idle {idle:.0} MiB, peak while exporting {peak:.0} MiB (+{:.0} MiB)",
            bytes as f64 / (1 << 20) as f64,
            peak - idle
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The agent: 8 GPUs sampled every second against the fake NVML.

async fn agent(o: &Options) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let db = fresh_db("sqlite").await?;
    let token = create_token(&db.url, "bench-agent", "bench");
    let mut server = start_server(&db.url, free_port()).await;
    // Real processes for the agent to read labels of; they outlive the run.
    let mut sleepers = Vec::new();
    for g in 0..8 {
        sleepers.push(support::Proc(
            Command::new("sleep")
                .arg((o.agent_seconds + 120).to_string())
                .env("GPULEDGER_MODEL", format!("model-{g}"))
                .env("GPULEDGER_TEAM", "bench")
                .stdin(Stdio::null())
                .spawn()?,
        ));
    }
    let gpus: Vec<serde_json::Value> = sleepers
        .iter()
        .enumerate()
        .map(|(g, p)| {
            serde_json::json!({
                "model": "NVIDIA H100 80GB HBM3",
                "uuid": format!("GPU-agent-bench-{g}"),
                "power_mw": 400_000, "temperature_c": 60, "energy_start_mj": 1_000_000,
                "phases": [{ "at_s": 0, "gpu_util": 70, "mem_util": 30,
                             "memory_used_bytes": 42_949_672_960u64,
                             "processes": [{ "pid": p.pid(), "name": "python3",
                                             "memory_used_bytes": 42_949_672_960u64, "sm_util": 68 }] }]
            })
        })
        .collect();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        serde_json::to_vec(&serde_json::json!({ "driver_version": "550.54.15", "gpus": gpus }))?,
    )?;
    let started = Instant::now();
    let child = Command::new(artifact("gpuledger-agent"))
        .args(["run", "--server", &server.url, "--token", &token])
        .arg("--nvml-lib")
        .arg(artifact("libfake_nvml.so"))
        .arg("--spool-dir")
        .arg(dir.path().join("spool"))
        .args(["--cluster", "bench", "--hostname", "bench-agent"])
        .args([
            "--imds-endpoint",
            "off",
            "--sample-interval",
            "1s",
            "--window",
            "15s",
        ])
        .env("FAKE_NVML_SCENARIO", &scenario)
        .env("GPULEDGER_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()?;
    let pid = child.id();
    tokio::time::sleep(Duration::from_secs(o.agent_seconds)).await;
    let rss_now = proc_status_kib(pid, "VmRSS:") as f64 / 1024.0;
    unsafe {
        libc::kill(pid as i32, libc::SIGTERM);
    }
    let usage = wait_usage(child).await?;
    let wall = started.elapsed().as_secs_f64();
    let stored = count(
        &db,
        "SELECT COUNT(*) FROM gpu_windows WHERE gpu_uuid LIKE 'GPU-agent-bench-%'",
    )
    .await?;
    server.proc.terminate(Duration::from_secs(30));
    println!(
        "agent: 8 GPUs sampled every 1 s, 15 s windows sent a minute at a time, for {wall:.0} s against the fake NVML ({stored} GPU windows reached the server)"
    );
    println!(
        "  CPU {:.2} s = {:.3}% of a core (target ≤ 0.1%), {:.1} s per hour; peak RSS {:.1} MiB (target ≤ 15 MB)",
        usage.cpu_s,
        usage.cpu_s / wall * 100.0,
        usage.cpu_s / wall * 3600.0,
        // The larger of the kernel's high-water mark and the last /proc reading (which also
        // counts shared pages).
        usage.max_rss_mib.max(rss_now)
    );
    if stored == 0 {
        bail!("the agent delivered nothing");
    }
    Ok(())
}
