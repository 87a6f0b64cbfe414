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

#[path = "../../tests/e2e/support/mod.rs"]
mod support;

mod agent;
mod attribution;
mod export;
mod focus_import;
mod ingest;
mod review;

use agent::*;
use attribution::*;
use export::*;
use focus_import::*;
use ingest::*;
use review::*;

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
