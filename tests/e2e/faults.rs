//! Faults, with the real binaries: the server SIGKILLed in the middle of ingest under load and
//! restarted; an agent SIGKILLed with batches in its spool and restarted; a billing import
//! SIGKILLed halfway. Nothing is lost, nothing is stored twice, nothing is half stored.

use crate::support;

use gpuledger_server::store;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpuledger_proto::{GpuWindow, HostInfo, Report, Window};
use rust_decimal::Decimal;
use serde_json::json;
use support::{
    create_token, free_port, server_cmd, start_agent, start_server, test_support, AgentOptions,
    Proc, TestDb,
};

const GIB: u64 = 1 << 30;

/// One GPU, `uuid`, at work (the fake NVML's scenario format).
fn scenario(dir: &Path, uuid: &str) -> PathBuf {
    let path = dir.join(format!("{uuid}.json"));
    let s = json!({"gpus": [{
        "model": "NVIDIA A100-SXM4-80GB", "uuid": uuid,
        "power_mw": 250_000, "energy_start_mj": 0,
        "phases": [{ "gpu_util": 60, "mem_util": 20, "memory_used_bytes": 20 * GIB }]
    }]});
    std::fs::write(&path, serde_json::to_vec(&s).unwrap()).unwrap();
    path
}

fn spooled_windows(spool: &Path) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    // No folder yet: the agent has not started spooling.
    let Ok(entries) = std::fs::read_dir(spool) else {
        return out;
    };
    for e in entries.flatten() {
        if e.path().extension().is_some_and(|x| x == "json") {
            // The agent may delete a batch (acknowledged) between listing and reading it.
            let Ok(bytes) = std::fs::read(e.path()) else {
                continue;
            };
            let r: Report = serde_json::from_slice(&bytes).unwrap();
            for w in r.windows {
                for g in w.gpus {
                    out.push((g.uuid, w.start_ms));
                }
            }
        }
    }
    out
}

/// A synthetic agent with 8 GPUs: `batches` one-second windows, each batch resent with the
/// same id until the server acknowledges it, as the real agent's spool does.
async fn synthetic_agent(url: String, token: String, host: String, batches: usize, t0: i64) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    for b in 0..batches {
        let start = t0 + b as i64 * 1_000;
        let report = Report {
            batch_id: format!("{host}-{b}"),
            agent_version: "load".into(),
            host: HostInfo {
                hostname: host.clone(),
                cluster: "faults".into(),
                ..Default::default()
            },
            windows: vec![Window {
                serving: Vec::new(),
                start_ms: start,
                end_ms: start + 1_000,
                samples: 1,
                gpus: (0..8)
                    .map(|g| GpuWindow {
                        uuid: format!("GPU-{host}-{g}"),
                        index: g,
                        name: "NVIDIA H100 80GB HBM3".into(),
                        memory_total_bytes: Some(80 * GIB),
                        memory_used_max_bytes: Some(GIB),
                        util_avg: Some(50.0),
                        util_max: Some(60.0),
                        ..Default::default()
                    })
                    .collect(),
            }],
        };
        loop {
            let sent = client
                .post(format!("{url}/api/v1/reports"))
                .bearer_auth(&token)
                .json(&report)
                .send()
                .await;
            match sent {
                Ok(r) if r.status().is_success() => break,
                Ok(r) if r.status().is_client_error() => {
                    panic!("{host}: batch {b} refused: {}", r.status())
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

async fn server_killed_mid_ingest(db: TestDb) {
    let label = db.backend;
    let dir = tempfile::tempdir().unwrap();
    let token = create_token(&db.url, "faults", "faults");
    let port = free_port();
    let mut server = start_server(&db.url, port).await;
    let url = server.url.clone();
    // Two real agents through the fake NVML, and 12 synthetic 8-GPU agents posting as fast as
    // the server takes them.
    let mut agents: Vec<(Proc, PathBuf)> = (0..2)
        .map(|i| {
            let scenario = scenario(dir.path(), &format!("GPU-real-{i}"));
            let spool = dir.path().join(format!("spool-{i}"));
            let proc = start_agent(&AgentOptions {
                server: &url,
                token: &token,
                scenario: &scenario,
                spool: &spool,
                cluster: "faults",
                hostname: &format!("real-{i}"),
                window: "1s",
            });
            (proc, spool)
        })
        .collect();
    const HOSTS: usize = 12;
    const BATCHES: usize = 150;
    let t0 = gpuledger_server::clock::now_ms() - 20 * 60_000;
    let load: Vec<_> = (0..HOSTS)
        .map(|h| {
            tokio::spawn(synthetic_agent(
                url.clone(),
                token.clone(),
                format!("load-{h}"),
                BATCHES,
                t0,
            ))
        })
        .collect();
    // Kill the server while reports are in flight, keep it down a moment, restart it.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let store = db.open().await;
    let before_kill = store::telemetry::batch_count(store.db()).await.unwrap();
    server.proc.0.kill().unwrap();
    server.proc.0.wait().unwrap();
    assert!(before_kill > 0, "{label}: ingest was under way when killed");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    server = start_server(&db.url, port).await;
    for task in load {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("the load finished")
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for (agent, _) in agents.iter_mut() {
        let status = agent.terminate(Duration::from_secs(15));
        assert!(status.success(), "{label}: agent exit {status:?}");
    }

    let windows = store::telemetry::gpu_windows(store.db(), 0, i64::MAX)
        .await
        .unwrap();
    let mut per_gpu: BTreeMap<&str, Vec<(i64, i64)>> = BTreeMap::new();
    for w in &windows {
        per_gpu
            .entry(w.gpu_uuid.as_str())
            .or_default()
            .push((w.start_ms, w.end_ms));
    }
    for h in 0..HOSTS {
        for g in 0..8 {
            let uuid = format!("GPU-load-{h}-{g}");
            let ws = per_gpu
                .get(uuid.as_str())
                .unwrap_or_else(|| panic!("{label}: {uuid}"));
            assert_eq!(
                ws.len(),
                BATCHES,
                "{label}: {uuid}: every window exactly once"
            );
            assert!(
                ws.windows(2).all(|p| p[1].0 == p[0].1),
                "{label}: {uuid} contiguous"
            );
        }
    }
    // The real agents' windows: contiguous across the outage, spool drained.
    let mut real = 0;
    for i in 0..2 {
        let ws = per_gpu
            .get(format!("GPU-real-{i}").as_str())
            .expect("the real agents reported");
        assert!(ws.len() >= 4, "{label}: {}", ws.len());
        assert!(
            ws.windows(2).all(|p| p[1].0 == p[0].1),
            "{label}: real agent {i}: no window lost across the restart"
        );
        real += ws.len();
    }
    for (_, spool) in &agents {
        assert!(
            spooled_windows(spool).is_empty(),
            "{label}: the spool drained"
        );
    }
    let total: usize = per_gpu.values().map(Vec::len).sum();
    assert_eq!(total, windows.len());
    let batches = store::telemetry::batch_count(store.db()).await.unwrap() as usize;
    assert_eq!(
        batches,
        HOSTS * BATCHES + real,
        "{label}: one stored batch per window sent, none twice"
    );
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_killed_mid_ingest_loses_and_duplicates_nothing_sqlite() {
    server_killed_mid_ingest(test_support::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_killed_mid_ingest_loses_and_duplicates_nothing_postgres() {
    server_killed_mid_ingest(test_support::postgres().await).await;
}

/// The agent is SIGKILLed (no flush, no goodbye) while the server is away; started again on
/// the same spool, it delivers what it had spooled.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_agent_resumes_its_spool() {
    let db = test_support::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let token = create_token(&db.url, "faults", "faults");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let scenario = scenario(dir.path(), "GPU-restarted-0");
    let spool = dir.path().join("spool");
    let options = AgentOptions {
        server: &url,
        token: &token,
        scenario: &scenario,
        spool: &spool,
        cluster: "faults",
        hostname: "restarted",
        window: "1s",
    };
    let mut agent = start_agent(&options);
    // Until at least two windows wait in the spool (a loaded machine starts the agent slowly).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    while spooled_windows(&spool).len() < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    agent.0.kill().unwrap();
    agent.0.wait().unwrap();
    let spooled = spooled_windows(&spool);
    assert!(
        spooled.len() >= 2,
        "batches waited in the spool: {spooled:?}"
    );
    let _server = start_server(&db.url, port).await;
    let mut agent = start_agent(&options);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !spooled_windows(&spool).iter().all(|w| !spooled.contains(w)) {
        assert!(Instant::now() < deadline, "the old spool was never sent");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let status = agent.terminate(Duration::from_secs(15));
    assert!(status.success());
    let store = db.open().await;
    let stored: Vec<(String, i64)> = store::telemetry::gpu_windows(store.db(), 0, i64::MAX)
        .await
        .unwrap()
        .into_iter()
        .map(|w| (w.gpu_uuid, w.start_ms))
        .collect();
    for w in &spooled {
        assert_eq!(
            stored.iter().filter(|s| *s == w).count(),
            1,
            "spooled window {w:?} stored once"
        );
    }
    let mut sorted = stored.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), stored.len(), "no window twice");
}

const BILL_HEADER: &str = "ProviderName,BillingAccountId,ChargePeriodStart,ChargePeriodEnd,ChargeCategory,BilledCost,EffectiveCost,ListCost,BillingCurrency,ResourceId\n";

/// A FOCUS file for one account and May 2026: `rows` hourly rows of `cost` each.
fn bill(path: &Path, rows: usize, cost: &str) {
    let mut s = String::from(BILL_HEADER);
    for i in 0..rows {
        let day = 1 + (i / 24) % 28;
        let hour = i % 24;
        s.push_str(&format!(
            "AWS,111122223333,2026-05-{day:02}T{hour:02}:00:00Z,2026-05-{day:02}T{hour:02}:59:59Z,Usage,{cost},{cost},{cost},USD,i-{i:08x}\n"
        ));
    }
    std::fs::write(path, s).unwrap();
}

async fn billed_total(db: &TestDb) -> (Decimal, usize) {
    let store = db.open().await;
    let from = 1_777_593_600_000; // 2026-05-01
    let lines = store::bills::cost_lines(store.db(), from, from + 31 * 86_400_000)
        .await
        .unwrap();
    let total = lines.iter().map(|l| l.billed_cost).sum();
    (total, lines.len())
}

async fn import_killed_halfway(db: TestDb) {
    let label = db.backend;
    let dir = tempfile::tempdir().unwrap();
    let (small, big) = (dir.path().join("may-v1.csv"), dir.path().join("may-v2.csv"));
    bill(&small, 10, "1.50");
    const BIG: usize = 60_000;
    bill(&big, BIG, "0.01");
    // may-v2 is a new export of the whole of May, not another part of it: --whole-periods.
    let import = |file: &Path| {
        server_cmd(&db.url)
            .args(["billing", "import-focus", "--whole-periods"])
            .arg(file)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn import")
    };
    let status = import(&small).wait().unwrap();
    assert!(status.success());
    let first = billed_total(&db).await;
    assert_eq!(first, ("15.00".parse().unwrap(), 10), "{label}");

    // How long a whole import of the big file takes, on a copy for another account.
    let other = dir.path().join("other.csv");
    std::fs::write(
        &other,
        std::fs::read_to_string(&big)
            .unwrap()
            .replace("111122223333", "999988887777"),
    )
    .unwrap();
    let started = Instant::now();
    assert!(import(&other).wait().unwrap().success());
    let whole = started.elapsed();

    // Kill the replacing import at several points of its run: each time the database holds the
    // first bill or the whole second one, never a mix.
    let mut kept_first = 0;
    for fraction in [0.3, 0.6, 0.85] {
        let mut child = Proc(import(&big));
        tokio::time::sleep(whole.mul_f64(fraction)).await;
        let _ = child.0.kill();
        let _ = child.0.wait();
        let (total, lines) = billed_total(&db).await;
        let mine = lines - BIG; // the other account's lines are all there
        if (total - Decimal::from(600), mine) == first {
            kept_first += 1;
        } else {
            assert_eq!(
                (total, lines),
                (Decimal::from(1_200), 2 * BIG),
                "{label}: killed at {fraction} of the import: the old bill or the new one, whole"
            );
        }
    }
    assert!(
        kept_first >= 1,
        "{label}: at least one kill landed before the commit"
    );
    // Finished, the newer export replaces the older one.
    assert!(import(&big).wait().unwrap().success());
    assert_eq!(
        billed_total(&db).await,
        (Decimal::from(1_200), 2 * BIG),
        "{label}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_billing_import_killed_halfway_leaves_the_previous_bill_sqlite() {
    import_killed_halfway(test_support::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_billing_import_killed_halfway_leaves_the_previous_bill_postgres() {
    import_killed_halfway(test_support::postgres().await).await;
}

/// A PostgreSQL of this test's own (stopping the shared one would fail other tests), with the
/// control script `scripts/with-postgres` provides. Closing stdin ends it.
struct OwnPostgres {
    proc: Proc,
    url: String,
    ctl: String,
}

impl OwnPostgres {
    fn start() -> OwnPostgres {
        use std::io::BufRead;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/with-postgres");
        let mut child = std::process::Command::new(script)
            .args([
                "bash",
                "-c",
                r#"echo "$GPULEDGER_TEST_PG_URL $GPULEDGER_TEST_PG_CTL"; read -r _"#,
            ])
            .env_remove("GPULEDGER_TEST_PG_PORT")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start scripts/with-postgres");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let (url, ctl) = line.trim().split_once(' ').expect("URL and control script");
        OwnPostgres {
            url: url.to_owned(),
            ctl: ctl.to_owned(),
            proc: Proc(child),
        }
    }

    fn ctl(&self, action: &str) {
        let status = std::process::Command::new(&self.ctl)
            .arg(action)
            .status()
            .unwrap();
        assert!(status.success(), "pg_ctl {action}");
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        // Closing stdin ends the wrapped command; the script then stops and deletes the server.
        drop(self.proc.0.stdin.take());
        let _ = self.proc.0.wait();
    }
}

/// PostgreSQL goes away for a minute: the server says 503 (health, ingest, pages that need the
/// database) and keeps serving what it can; the agent spools; everything arrives afterwards.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_down_for_a_minute_loses_nothing() {
    let pg = OwnPostgres::start();
    let dir = tempfile::tempdir().unwrap();
    let token = create_token(&pg.url, "faults", "faults");
    let server = start_server(&pg.url, free_port()).await;
    let scenario = scenario(dir.path(), "GPU-pgdown-0");
    let spool = dir.path().join("spool");
    let mut agent = start_agent(&AgentOptions {
        server: &server.url,
        token: &token,
        scenario: &scenario,
        spool: &spool,
        cluster: "faults",
        hostname: "pg-outage",
        window: "1s",
    });
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    pg.ctl("stop");
    let client = reqwest::Client::new();
    let get = |path: &str| client.get(format!("{}{path}", server.url)).send();
    assert_eq!(get("/healthz").await.unwrap().status(), 503);
    let resp = client
        .post(format!("{}/api/v1/reports", server.url))
        .bearer_auth(&token)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "unavailable", "{body}");
    // The sign-in page needs no database; a page that does says so plainly.
    assert_eq!(get("/login").await.unwrap().status(), 200);
    let page = client
        .get(format!("{}/review", server.url))
        .header("cookie", "gpl_session=whoever")
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 503);
    assert!(page
        .text()
        .await
        .unwrap()
        .contains("database is unavailable"));

    tokio::time::sleep(Duration::from_secs(60)).await;
    let waiting = spooled_windows(&spool);
    assert!(waiting.len() >= 30, "the agent spooled: {}", waiting.len());
    pg.ctl("start");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !spooled_windows(&spool).is_empty() {
        assert!(Instant::now() < deadline, "the spool never drained");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(get("/healthz").await.unwrap().status(), 200);
    let status = agent.terminate(Duration::from_secs(15));
    assert!(status.success());

    let store = gpuledger_server::store::connect(&pg.url).await.unwrap();
    let windows = store::telemetry::gpu_windows(store.db(), 0, i64::MAX)
        .await
        .unwrap();
    assert!(windows.len() >= 60, "{}", windows.len());
    assert!(
        windows.windows(2).all(|p| p[1].start_ms == p[0].end_ms),
        "every window, once, in order, across the outage"
    );
    for w in &waiting {
        assert!(windows
            .iter()
            .any(|s| (s.gpu_uuid.as_str(), s.start_ms) == (w.0.as_str(), w.1)));
    }
    assert_eq!(
        store::telemetry::batch_count(store.db()).await.unwrap() as usize,
        windows.len()
    );
}

/// The spool's disk fills up (a 16 KiB tmpfs, mounted in a private mount namespace so the test
/// needs no host privileges): the oldest batch is dropped with a log line, the agent keeps
/// running, and once the server is back it reports the dropped count and the newest windows.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_spool_disk_drops_the_oldest_and_the_agent_keeps_running() {
    let db = test_support::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let token = create_token(&db.url, "faults", "faults");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let scenario = scenario(dir.path(), "GPU-diskfull-0");
    let spool = dir.path().join("spool");
    std::fs::create_dir_all(&spool).unwrap();
    let agent = support::agent_command(&AgentOptions {
        server: &url,
        token: &token,
        scenario: &scenario,
        spool: &spool,
        cluster: "faults",
        hostname: "disk-full",
        window: "1s",
    });
    let log = dir.path().join("agent.log");
    let mut wrapped = std::process::Command::new("unshare");
    wrapped
        .args([
            "--map-root-user",
            "--mount",
            "sh",
            "-c",
            r#"mount -t tmpfs -o size=16k tmpfs "$0" && exec "$@""#,
        ])
        .arg(&spool)
        .arg(agent.get_program())
        .args(agent.get_args())
        .envs(
            agent
                .get_envs()
                .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v.to_owned()))),
        )
        .stdin(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut agent = Proc(wrapped.spawn().expect("unshare (util-linux)"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log)
        .unwrap()
        .contains("spool full: dropped the oldest batch")
    {
        assert!(
            agent.0.try_wait().unwrap().is_none(),
            "the agent exited: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        assert!(Instant::now() < deadline, "no drop was logged");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        agent.0.try_wait().unwrap().is_none(),
        "the agent keeps running"
    );

    let server_up = gpuledger_server::clock::now_ms();
    let server = start_server(&db.url, port).await;
    let metrics_url = format!("{}/metrics", server.url);
    let deadline = Instant::now() + Duration::from_secs(20);
    let dropped = loop {
        let text = reqwest::get(&metrics_url)
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let value = text
            .lines()
            .find(|l| l.starts_with("gpuledger_agent_spool_dropped{") && l.contains("disk-full"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok());
        if let Some(v) = value.filter(|v| *v > 0.0) {
            break v;
        }
        assert!(Instant::now() < deadline, "the dropped count never arrived");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(dropped >= 1.0);
    let status = agent.terminate(Duration::from_secs(15));
    assert!(status.success(), "{status:?}");
    let store = db.open().await;
    let windows = store::telemetry::gpu_windows(store.db(), 0, i64::MAX)
        .await
        .unwrap();
    assert!(
        windows.iter().any(|w| w.end_ms <= server_up),
        "the newest spooled windows, from before the server came back, arrived"
    );
    let mut starts: Vec<i64> = windows.iter().map(|w| w.start_ms).collect();
    starts.dedup();
    assert_eq!(starts.len(), windows.len(), "none twice");
}
