//! End to end: the real agent reads the fake NVML through nvml-wrapper, spools, delivers to the
//! real server over HTTP, which stores on SQLite or PostgreSQL. Checks the stored aggregates
//! against the scenario, and that a server outage loses and duplicates nothing.

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use gpuledger_core::telemetry::StoredProcessWindow;
use gpuledger_server::store;
use gpuledger_server::store::telemetry::StoredGpuWindow;
use serde_json::json;
use support::*;

const GIB: u64 = 1024 * 1024 * 1024;

struct Fleet {
    _procs: Vec<Proc>,
    training: u32,
    notebook: u32,
    serving: u32,
    batch_job: u32,
}

fn processes() -> Fleet {
    let training = labelled_process(&[
        ("GPULEDGER_MODEL", "llama-70b"),
        ("GPULEDGER_TEAM", "search"),
        ("MLFLOW_RUN_ID", "run-9"),
    ]);
    let notebook = labelled_process(&[
        ("GPULEDGER_EXPERIMENT", "exp-notebook"),
        ("GPULEDGER_TEAM", "research"),
    ]);
    let serving = labelled_process(&[
        ("GPULEDGER_ENDPOINT", "chat"),
        ("GPULEDGER_MODEL", "mistral-7b"),
    ]);
    let batch_job = labelled_process(&[("GPULEDGER_TEAM", "ads")]);
    Fleet {
        training: training.pid(),
        notebook: notebook.pid(),
        serving: serving.pid(),
        batch_job: batch_job.pid(),
        _procs: vec![training, notebook, serving, batch_job],
    }
}

/// Three GPUs: a busy A100 with a training job and a held-idle notebook; an H100 in MIG mode
/// with two `3g.40gb` instances, one busy and one idle (their utilization through GPM, as on
/// real Hopper MIG; per-process utilization is not supported under MIG); a Quadro P400, a
/// board with no power sensor and (before Volta) no energy counter.
fn scenario(f: &Fleet) -> serde_json::Value {
    json!({
        "gpus": [
            {
                "model": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-e2e-a100-0",
                "power_mw": 300_000, "temperature_c": 60, "energy_start_mj": 1_000_000,
                "phases": [{ "gpu_util": 72, "mem_util": 30, "memory_used_bytes": 40 * GIB, "processes": [
                    { "pid": f.training, "name": "python3", "memory_used_bytes": 30 * GIB, "sm_util": 70 },
                    { "pid": f.notebook, "name": "jupyter", "memory_used_bytes": 10 * GIB, "sm_util": 0 }
                ]}]
            },
            {
                "model": "NVIDIA H100 80GB HBM3", "uuid": "GPU-e2e-h100-1",
                "power_mw": 120_000, "temperature_c": 45, "energy_start_mj": 0,
                "mig": [
                    { "profile": "3g.40gb", "gpu_instance_id": 1, "uuid": "MIG-e2e-1a",
                      "phases": [{ "gpu_util": 40, "mem_util": 10, "memory_used_bytes": 8 * GIB, "processes": [
                          { "pid": f.serving, "name": "vllm", "memory_used_bytes": 8 * GIB, "sm_util": 38 }
                      ]}] },
                    { "profile": "3g.40gb", "gpu_instance_id": 2, "uuid": "MIG-e2e-1b",
                      "phases": [{ "gpu_util": 0, "mem_util": 0, "memory_used_bytes": 0 }] }
                ]
            },
            {
                "model": "Quadro P400", "uuid": "GPU-e2e-p400-2",
                "phases": [{ "gpu_util": 15, "mem_util": 5, "memory_used_bytes": GIB, "processes": [
                    { "pid": f.batch_job, "memory_used_bytes": GIB, "sm_util": 12 }
                ]}]
            }
        ]
    })
}

fn write_scenario(dir: &Path, f: &Fleet) -> std::path::PathBuf {
    let path = dir.join("scenario.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&scenario(f)).unwrap()).unwrap();
    path
}

fn by_gpu(windows: &[StoredGpuWindow]) -> BTreeMap<&str, Vec<&StoredGpuWindow>> {
    let mut m: BTreeMap<&str, Vec<&StoredGpuWindow>> = BTreeMap::new();
    for w in windows {
        m.entry(w.gpu_uuid.as_str()).or_default().push(w);
    }
    m
}

/// Every window the agent closed is stored exactly once: `per_gpu` windows for every device (one
/// per batch where a report holds one), each starting where the previous one ended.
fn assert_complete_and_unique(windows: &[StoredGpuWindow], per_gpu: i64, label: &str) {
    let gpus = by_gpu(windows);
    assert_eq!(
        gpus.len(),
        5,
        "{label}: 3 GPUs + 2 MIG instances: {:?}",
        gpus.keys()
    );
    for (uuid, ws) in &gpus {
        assert_eq!(ws.len() as i64, per_gpu, "{label}: {uuid}");
        for pair in ws.windows(2) {
            let gap = pair[1].start_ms - pair[0].end_ms;
            assert!(
                gap == 0,
                "{label}: {uuid}: window at {} follows one ending {} (gap {gap} ms): a window is missing or overlaps",
                pair[1].start_ms,
                pair[0].end_ms
            );
        }
    }
}

fn assert_matches_scenario(
    windows: &[StoredGpuWindow],
    procs: &[StoredProcessWindow],
    f: &Fleet,
    label: &str,
) {
    let gpus = by_gpu(windows);
    for w in &gpus["GPU-e2e-a100-0"] {
        assert_eq!(
            (w.util_avg, w.util_max, w.mem_util_avg),
            (Some(72.0), Some(72.0), Some(30.0)),
            "{label}"
        );
        assert_eq!(w.memory_used_max_bytes, Some((40 * GIB) as i64), "{label}");
        assert_eq!(w.memory_total_bytes, Some((80 * GIB) as i64), "{label}");
        // Every sample read 72 %: the samples per percent, counted by the real agent.
        assert_eq!(
            w.util_histogram,
            Some(format!("[[72,{}]]", w.samples)),
            "{label}"
        );
        assert_eq!(
            (w.power_avg_watts, w.temperature_max_c),
            (Some(300.0), Some(60.0)),
            "{label}"
        );
    }
    // Energy: a full window holds about one second at 300 W = 300,000 mJ.
    let a100 = &gpus["GPU-e2e-a100-0"];
    for w in &a100[1..a100.len() - 1] {
        let e = w.energy_mj.expect("energy is supported on the A100");
        assert!(
            (200_000..=400_000).contains(&e),
            "{label}: window energy {e} mJ is not ~1 s at 300 W"
        );
    }
    for w in &gpus["GPU-e2e-h100-1"] {
        assert_eq!(
            w.util_avg, None,
            "{label}: a MIG parent's 0% is not a reading"
        );
        assert_eq!(
            w.memory_used_max_bytes,
            Some((8 * GIB) as i64),
            "{label}: the parent holds what its instances hold"
        );
    }
    for w in &gpus["MIG-e2e-1a"] {
        assert_eq!(
            w.util_avg,
            Some(40.0),
            "{label}: MIG utilization comes from the instance (GPM)"
        );
        assert_eq!(
            w.mem_util_avg,
            Some(10.0),
            "{label}: DRAM bandwidth through GPM"
        );
    }
    for w in &gpus["MIG-e2e-1b"] {
        assert_eq!(w.util_avg, Some(0.0), "{label}");
    }
    for w in &gpus["GPU-e2e-h100-1"] {
        assert_eq!(w.util_histogram, None, "{label}: no readings, no histogram");
    }
    for w in &gpus["GPU-e2e-p400-2"] {
        assert_eq!(w.util_avg, Some(15.0), "{label}");
        assert_eq!(
            (w.power_avg_watts, w.energy_mj, w.temperature_max_c),
            (None, None, Some(40.0)),
            "{label}: unsupported is absent, not 0"
        );
    }

    let find = |pid: u32| -> Vec<&StoredProcessWindow> {
        procs.iter().filter(|p| p.pid == i64::from(pid)).collect()
    };
    let training = find(f.training);
    assert!(!training.is_empty(), "{label}: training process reported");
    // The test's own account runs the processes it starts.
    let me = String::from_utf8(
        std::process::Command::new("id")
            .arg("-un")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_owned();
    for p in &training {
        assert_eq!(p.gpu_uuid, "GPU-e2e-a100-0");
        assert_eq!(
            (label_of(p, "model"), label_of(p, "team")),
            (Some("llama-70b"), Some("search")),
            "{label}: labels from /proc/<pid>/environ"
        );
        assert!(
            p.labels_json.contains("\"mlflow_run_id\":\"run-9\""),
            "{label}: extra label key: {}",
            p.labels_json
        );
        assert_eq!(p.sm_util_avg, Some(70.0), "{label}");
        assert_eq!(p.memory_used_max_bytes, Some((30 * GIB) as i64), "{label}");
        assert_eq!(p.process_name.as_deref(), Some("python3"), "{label}");
        assert_eq!(
            p.user_name.as_deref(),
            Some(me.as_str()),
            "{label}: the account running it, from /proc/<pid>/status and /etc/passwd"
        );
    }
    for p in find(f.notebook) {
        assert_eq!(
            p.sm_util_avg,
            Some(0.0),
            "{label}: held-idle is 0% SM, measured"
        );
        assert_eq!(label_of(p, "experiment"), Some("exp-notebook"), "{label}");
    }
    for p in find(f.serving) {
        assert_eq!(
            p.gpu_uuid, "MIG-e2e-1a",
            "{label}: MIG processes belong to their instance"
        );
        assert_eq!(
            p.sm_util_avg, None,
            "{label}: no per-process utilization under MIG is absent, not 0"
        );
        assert_eq!(
            (label_of(p, "endpoint"), label_of(p, "model")),
            (Some("chat"), Some("mistral-7b")),
            "{label}"
        );
    }
    let batch = find(f.batch_job);
    assert!(!batch.is_empty(), "{label}");
    for p in batch {
        assert_eq!(p.sm_util_avg, Some(12.0), "{label}");
        assert_eq!(label_of(p, "team"), Some("ads"), "{label}");
    }
}

/// A label the agent read from the process's environment, as stored.
fn label_of<'a>(
    p: &'a gpuledger_core::telemetry::StoredProcessWindow,
    key: &str,
) -> Option<&'a str> {
    let start = p.labels_json.find(&format!("\"{key}\":\""))? + key.len() + 4;
    let len = p.labels_json[start..].find('"')?;
    Some(&p.labels_json[start..start + len])
}

fn spool_is_drained(spool: &Path, label: &str) {
    let left: Vec<_> = std::fs::read_dir(spool)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .collect();
    assert!(
        left.is_empty(),
        "{label}: batches left in the spool: {left:?}"
    );
    let dead = std::fs::read_dir(spool.join("dead-letter"))
        .unwrap()
        .count();
    assert_eq!(dead, 0, "{label}: nothing was refused");
}

async fn round_trip(db: TestDb) {
    let label = db.backend;
    let dir = tempfile::tempdir().unwrap();
    let fleet = processes();
    let scenario = write_scenario(dir.path(), &fleet);
    let token = create_token(&db.url, "e2e", "e2e");
    let server = start_server(&db.url, free_port()).await;
    let spool = dir.path().join("spool");
    let mut agent = start_agent(&AgentOptions {
        server: &server.url,
        token: &token,
        scenario: &scenario,
        spool: &spool,
        cluster: "e2e",
        hostname: "gpu-host-1",
        window: "1s",
    });
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    let status = agent.terminate(Duration::from_secs(15));
    assert!(status.success(), "{label}: agent exit {status:?}");

    let store = db.open().await;
    let windows = store::telemetry::gpu_windows(store.db(), 0, i64::MAX)
        .await
        .unwrap();
    let procs = store::telemetry::process_windows(store.db(), 0, i64::MAX)
        .await
        .unwrap();
    let batches = store::telemetry::batch_count(store.db()).await.unwrap();
    assert!(
        batches >= 4,
        "{label}: expected at least 4 one-second windows, got {batches}"
    );
    assert_complete_and_unique(&windows, batches, label);
    assert_matches_scenario(&windows, &procs, &fleet, label);
    spool_is_drained(&spool, label);
    if label == "postgres" {
        // `serve` makes the days' partitions before its first report: none waits in the default.
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
        let count = |sql: &'static str| sqlx::query_as::<_, (i64,)>(sql);
        let (waiting,) = count("SELECT COUNT(*) FROM gpu_windows_default")
            .fetch_one(&mut c)
            .await
            .unwrap();
        assert_eq!(waiting, 0, "{label}: windows in the default partition");
        let (days,) = count(
            "SELECT COUNT(*) FROM pg_inherits WHERE inhparent = 'gpu_windows'::regclass
             AND inhrelid <> 'gpu_windows_default'::regclass",
        )
        .fetch_one(&mut c)
        .await
        .unwrap();
        // 10 if the test crosses UTC midnight.
        assert!(
            (9..=10).contains(&days),
            "{label}: yesterday, today and the next 7 days: {days}"
        );
    }

    let fleet_rows = store::telemetry::fleet(store.db()).await.unwrap();
    assert!(fleet_rows
        .iter()
        .all(|r| r.cluster == "e2e" && r.hostname == "gpu-host-1"));
    assert_eq!(fleet_rows[0].instance_type.as_deref(), Some("p4d.24xlarge"));
    let viewer = signed_in(&server, "viewer").await;
    let page = viewer
        .get(format!("{}/", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("gpu-host-1") && page.contains("model=llama-70b"),
        "{label}: fleet page shows the host and labels"
    );
}

/// The server is down for the first seconds: the agent spools, retries, and every window
/// arrives exactly once after the server comes up.
async fn outage(db: TestDb) {
    let label = db.backend;
    let dir = tempfile::tempdir().unwrap();
    let fleet = processes();
    let scenario = write_scenario(dir.path(), &fleet);
    let token = create_token(&db.url, "e2e", "e2e");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let spool = dir.path().join("spool");
    let mut agent = start_agent(&AgentOptions {
        server: &url,
        token: &token,
        scenario: &scenario,
        spool: &spool,
        cluster: "e2e",
        hostname: "gpu-host-2",
        window: "1s",
    });
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let spooled = std::fs::read_dir(&spool)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .count();
    assert!(
        spooled >= 2,
        "{label}: windows wait in the spool while the server is down ({spooled})"
    );
    let server_up_ms = gpuledger_server::clock::now_ms();
    let _server = start_server(&db.url, port).await;
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let status = agent.terminate(Duration::from_secs(15));
    assert!(status.success(), "{label}: agent exit {status:?}");

    let store = db.open().await;
    let windows = store::telemetry::gpu_windows(store.db(), 0, i64::MAX)
        .await
        .unwrap();
    let procs = store::telemetry::process_windows(store.db(), 0, i64::MAX)
        .await
        .unwrap();
    let batches = store::telemetry::batch_count(store.db()).await.unwrap();
    assert!(
        windows.iter().any(|w| w.end_ms < server_up_ms),
        "{label}: windows from the outage arrived"
    );
    assert_complete_and_unique(&windows, batches, label);
    assert_matches_scenario(&windows, &procs, &fleet, label);
    spool_is_drained(&spool, label);
}

/// The windows of each stored batch, in the order batches were received.
async fn windows_per_batch(db: &TestDb) -> Vec<i64> {
    use sqlx::Connection;
    let sql = "SELECT windows FROM ingested_batches ORDER BY received_ms, batch_id";
    let rows: Vec<(i64,)> = if db.backend == "postgres" {
        let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::query_as(sql).fetch_all(&mut c).await.unwrap()
    } else {
        let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
        sqlx::query_as(sql).fetch_all(&mut c).await.unwrap()
    };
    rows.into_iter().map(|(n,)| n).collect()
}

/// With `--report-every 3s` and 1-second windows a report carries three windows: every batch
/// but the one sealed on shutdown holds three, and every window arrives once.
async fn reports_of_several_windows(db: TestDb) {
    let label = db.backend;
    let dir = tempfile::tempdir().unwrap();
    let fleet = processes();
    let scenario = write_scenario(dir.path(), &fleet);
    let token = create_token(&db.url, "e2e", "e2e");
    let server = start_server(&db.url, free_port()).await;
    let spool = dir.path().join("spool");
    let mut agent = Proc(
        agent_command(&AgentOptions {
            server: &server.url,
            token: &token,
            scenario: &scenario,
            spool: &spool,
            cluster: "e2e",
            hostname: "gpu-host-5",
            window: "1s",
        })
        .env("GPULEDGER_REPORT_EVERY", "3s")
        .spawn()
        .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(7_500)).await;
    let store = db.open().await;
    let before_shutdown = windows_per_batch(&db).await;
    assert!(
        !before_shutdown.is_empty() && before_shutdown.iter().all(|&n| n == 3),
        "{label}: full batches of three windows while running: {before_shutdown:?}"
    );
    assert!(agent.terminate(Duration::from_secs(15)).success());
    let batches = windows_per_batch(&db).await;
    assert_eq!(
        batches.len(),
        before_shutdown.len() + 1,
        "{label}: the open batch sealed on shutdown: {batches:?}"
    );
    let windows = store::telemetry::gpu_windows(store.db(), 0, i64::MAX)
        .await
        .unwrap();
    let procs = store::telemetry::process_windows(store.db(), 0, i64::MAX)
        .await
        .unwrap();
    assert_complete_and_unique(&windows, batches.iter().sum(), label);
    assert_matches_scenario(&windows, &procs, &fleet, label);
    spool_is_drained(&spool, label);
}

#[tokio::test(flavor = "multi_thread")]
async fn reports_of_several_windows_sqlite() {
    reports_of_several_windows(test_support::sqlite()).await;
}
#[tokio::test(flavor = "multi_thread")]
async fn reports_of_several_windows_postgres() {
    reports_of_several_windows(test_support::postgres().await).await;
}

/// An agent killed outright (no chance to flush) with windows waiting in its open batch sends
/// them once it runs again: closed windows are on disk as they close.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_agent_sends_its_open_batch_when_it_runs_again() {
    let db = test_support::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let fleet = processes();
    let scenario = write_scenario(dir.path(), &fleet);
    let token = create_token(&db.url, "e2e", "e2e");
    let server = start_server(&db.url, free_port()).await;
    let spool = dir.path().join("spool");
    let options = AgentOptions {
        server: &server.url,
        token: &token,
        scenario: &scenario,
        spool: &spool,
        cluster: "e2e",
        hostname: "gpu-host-6",
        window: "1s",
    };
    let agent = |every: &str| {
        Proc(
            agent_command(&options)
                .env("GPULEDGER_REPORT_EVERY", every)
                .spawn()
                .unwrap(),
        )
    };
    let mut first = agent("1h");
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    let killed_ms = gpuledger_server::clock::now_ms();
    let store = db.open().await;
    assert_eq!(
        store::telemetry::batch_count(store.db()).await.unwrap(),
        0,
        "nothing sent before the batch is full"
    );

    let mut second = agent("1h");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(second.terminate(Duration::from_secs(15)).success());
    let batches = windows_per_batch(&db).await;
    assert_eq!(
        batches.len(),
        2,
        "the first run's batch, then the second's: {batches:?}"
    );
    assert!(
        batches[0] >= 2,
        "the first run's closed windows: {batches:?}"
    );
    let windows = store::telemetry::gpu_windows(store.db(), 0, i64::MAX)
        .await
        .unwrap();
    for (uuid, ws) in by_gpu(&windows) {
        let before_kill: Vec<_> = ws.iter().filter(|w| w.end_ms <= killed_ms).collect();
        assert_eq!(before_kill.len() as i64, batches[0], "{uuid}");
        for pair in before_kill.windows(2) {
            assert_eq!(
                pair[1].start_ms, pair[0].end_ms,
                "{uuid}: a gap before the kill"
            );
        }
    }
    spool_is_drained(&spool, "sqlite");
}

#[tokio::test(flavor = "multi_thread")]
async fn telemetry_round_trip_sqlite() {
    round_trip(test_support::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn telemetry_round_trip_postgres() {
    round_trip(test_support::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn server_outage_loses_nothing_sqlite() {
    outage(test_support::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn server_outage_loses_nothing_postgres() {
    outage(test_support::postgres().await).await;
}

/// Runs `gpuledger-agent once` against the fake NVML and parses the report it prints.
fn agent_once(scenario: &Path, args: &[&str]) -> gpuledger_proto::Report {
    let out = std::process::Command::new(artifact("gpuledger-agent"))
        .args(["once", "--imds-endpoint", "off"])
        .args(args)
        .arg("--nvml-lib")
        .arg(artifact("libfake_nvml.so"))
        .env("FAKE_NVML_SCENARIO", scenario)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"))
}

#[test]
fn agent_once_prints_one_report() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = processes();
    let scenario = write_scenario(dir.path(), &fleet);
    let report = agent_once(
        &scenario,
        &[
            "--duration",
            "600ms",
            "--sample-interval",
            "200ms",
            "--cluster",
            "dbg",
        ],
    );
    assert_eq!(report.host.cluster, "dbg");
    assert_eq!(report.windows.len(), 1);
    let w = &report.windows[0];
    assert!(w.samples >= 2, "{} samples", w.samples);
    let uuids: Vec<&str> = w.gpus.iter().map(|g| g.uuid.as_str()).collect();
    assert_eq!(
        uuids,
        [
            "GPU-e2e-a100-0",
            "GPU-e2e-h100-1",
            "GPU-e2e-p400-2",
            "MIG-e2e-1a",
            "MIG-e2e-1b"
        ]
    );
    let mig = w.gpus.iter().find(|g| g.uuid == "MIG-e2e-1a").unwrap();
    assert_eq!(mig.parent_uuid.as_deref(), Some("GPU-e2e-h100-1"));
}

#[test]
fn agent_without_a_driver_fails_with_a_clear_message() {
    let out = std::process::Command::new(artifact("gpuledger-agent"))
        .args([
            "once",
            "--imds-endpoint",
            "off",
            "--nvml-lib",
            "/nonexistent/libnvidia-ml.so",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NVIDIA driver"), "{err}");
}

/// The curl example in docs/report-format.md works as written.
#[tokio::test(flavor = "multi_thread")]
async fn documented_curl_example_is_accepted() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/report-format.md"
    ))
    .unwrap();
    let block = doc
        .split("<!-- example:begin -->")
        .nth(1)
        .and_then(|rest| rest.split("<!-- example:end -->").next())
        .expect("example markers in docs/report-format.md");
    let script: String = block
        .lines()
        .filter(|l| !l.starts_with("```"))
        .collect::<Vec<_>>()
        .join("\n");
    let db = test_support::sqlite();
    let token = create_token(&db.url, "docs", "train-east");
    let server = start_server(&db.url, free_port()).await;
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(&script)
        .env("TOKEN", &token)
        .env("GPULEDGER_URL", &server.url)
        .output()
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{body} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(body.contains("\"status\":\"stored\""), "{body}");
    let store = db.open().await;
    let procs = store::telemetry::process_windows(store.db(), 0, i64::MAX)
        .await
        .unwrap();
    assert_eq!(label_of(&procs[0], "model"), Some("llama-70b"));
}

/// On a MIG GPU without GPM (an A100), the driver can say nothing about an instance's
/// utilization: it is reported absent, never as the parent's meaningless 0%, with where the
/// instance sits (its GPU instance and compute slices) for pricing it.
#[test]
fn mig_without_gpm_reports_no_utilization_rather_than_zero() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("a100-mig.json");
    let doc = json!({ "gpus": [{
        "model": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-a100-mig",
        "mig": [{ "profile": "7g.80gb", "gpu_instance_id": 0, "uuid": "MIG-a100-1",
                  "phases": [{ "gpu_util": 90, "memory_used_bytes": GIB }] }]
    }]});
    std::fs::write(&scenario, doc.to_string()).unwrap();
    let report = agent_once(
        &scenario,
        &["--duration", "200ms", "--sample-interval", "100ms"],
    );
    let gpus = &report.windows[0].gpus;
    assert_eq!(gpus.len(), 2);
    assert!(gpus.iter().all(|g| g.util_avg.is_none()), "{gpus:?}");
    assert_eq!(gpus[1].memory_used_max_bytes, Some(GIB));
    assert_eq!(gpus[0].mig_compute_slices, Some(7));
    let mig = gpus[1].mig.as_ref().unwrap();
    assert_eq!(
        (
            mig.gpu_instance_id,
            mig.gpu_instance_slices,
            mig.compute_instance_slices
        ),
        (0, 7, 7)
    );
    assert_eq!(mig.profile.as_deref(), Some("7g.80gb"));
}

/// SIGTERM in the middle of a window: the partial window is flushed and delivered, not lost.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_flushes_the_open_window() {
    let db = test_support::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let fleet = processes();
    let scenario = write_scenario(dir.path(), &fleet);
    let token = create_token(&db.url, "e2e", "e2e");
    let server = start_server(&db.url, free_port()).await;
    let spool = dir.path().join("spool");
    let mut agent = start_agent(&AgentOptions {
        server: &server.url,
        token: &token,
        scenario: &scenario,
        spool: &spool,
        cluster: "e2e",
        hostname: "gpu-host-3",
        window: "1h",
    });
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(agent.terminate(Duration::from_secs(15)).success());
    let store = db.open().await;
    assert_eq!(
        store::telemetry::batch_count(store.db()).await.unwrap(),
        1,
        "the open window became one batch"
    );
    let windows = store::telemetry::gpu_windows(store.db(), 0, i64::MAX)
        .await
        .unwrap();
    assert_eq!(windows.len(), 5);
    assert!(windows.iter().all(|w| w.samples >= 4), "{windows:?}");
    spool_is_drained(&spool, "sqlite");
}

/// Tokens through the command line: list shows them with their scope and without secrets; a
/// token for every cluster is refused; a rotated token's old secret works for the overlap; a
/// revoked token gets 401.
#[tokio::test(flavor = "multi_thread")]
async fn token_cli_create_list_revoke() {
    let db = test_support::sqlite();
    let token = create_token(&db.url, "rack-7", "rack");
    let server = start_server(&db.url, free_port()).await;
    let list = server_cmd(&db.url)
        .args(["token", "list"])
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&list.stdout);
    assert!(listing.contains("rack-7\tactive"), "{listing}");
    assert!(!listing.contains(&token), "secrets are never listed");

    let reports_url = format!("{}/api/v1/reports", server.url);
    let post = |secret: String| {
        let url = reports_url.clone();
        async move {
            reqwest::Client::new()
                .post(url)
                .bearer_auth(secret)
                .body("{}")
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(
        post(token.clone()).await,
        reqwest::StatusCode::BAD_REQUEST,
        "authenticated, then refused as malformed"
    );
    let unscoped = server_cmd(&db.url)
        .args(["token", "create", "--name", "all", "--cluster", "*"])
        .output()
        .unwrap();
    assert!(
        !unscoped.status.success(),
        "a token for every cluster is refused"
    );
    assert!(String::from_utf8_lossy(&unscoped.stderr).contains("matches every name"));
    let rotate = server_cmd(&db.url)
        .args(["token", "rotate", "rack-7", "--overlap", "1h"])
        .output()
        .unwrap();
    assert!(
        rotate.status.success(),
        "{}",
        String::from_utf8_lossy(&rotate.stderr)
    );
    let rotated = String::from_utf8(rotate.stdout).unwrap().trim().to_owned();
    assert!(rotated.starts_with("gpl_") && rotated != token);
    for secret in [&token, &rotated] {
        assert_eq!(
            post(secret.clone()).await,
            reqwest::StatusCode::BAD_REQUEST,
            "the old secret works during the overlap, the new one from now on"
        );
    }
    let list = server_cmd(&db.url)
        .args(["token", "list"])
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&list.stdout);
    assert!(
        listing.contains("rack-7\tactive\tcluster rack"),
        "{listing}"
    );
    // Serving code on a host without an agent posts counts once its token is bound to the
    // endpoint, and not after the binding is taken back.
    let start_ms = gpuledger_server::clock::now_ms() - 3_600_000;
    let usage = || {
        let url = format!("{}/api/v1/usage", server.url);
        let body = serde_json::json!({"source": "edge-1", "counts": [{"endpoint": "chat-api",
            "start": gpuledger_core::time::rfc3339(start_ms),
            "end": gpuledger_core::time::rfc3339(start_ms + 60_000), "requests": 10}]});
        let secret = rotated.clone();
        async move {
            reqwest::Client::new()
                .post(url)
                .bearer_auth(secret)
                .json(&body)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(usage().await, reqwest::StatusCode::FORBIDDEN);
    let cli = |args: &[&str]| {
        let out = server_cmd(&db.url).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(cli(&["token", "bind", "rack-7", "--endpoint", "chat-api"])
        .contains("may post for endpoint"));
    assert!(cli(&["token", "list"]).contains("rack-7\tendpoint chat-api"));
    assert_eq!(usage().await, reqwest::StatusCode::OK);
    cli(&["token", "unbind", "rack-7", "--endpoint", "chat-api"]);
    assert!(!cli(&["token", "list"]).contains("endpoint chat-api"));
    assert_eq!(usage().await, reqwest::StatusCode::FORBIDDEN);
    let revoke = server_cmd(&db.url)
        .args(["token", "revoke", "rack-7", "--remove-usage"])
        .output()
        .unwrap();
    assert!(revoke.status.success());
    assert!(String::from_utf8_lossy(&revoke.stdout).contains("removed 1 request counts"));
    for secret in [&token, &rotated] {
        assert_eq!(
            post(secret.clone()).await,
            reqwest::StatusCode::UNAUTHORIZED
        );
    }
    let again = server_cmd(&db.url)
        .args(["token", "revoke", "rack-7"])
        .output()
        .unwrap();
    assert!(!again.status.success(), "revoking twice says so");
    assert!(String::from_utf8_lossy(&again.stderr).contains("no active token"));
}

/// `/metrics` is valid Prometheus text exposition, as promtool checks it.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_pass_promtool() {
    let db = test_support::sqlite();
    let token = create_token(&db.url, "m", "default");
    let server = start_server(&db.url, free_port()).await;
    let client = reqwest::Client::new();
    // A rejected and an accepted report, so labelled series exist.
    client
        .post(format!("{}/api/v1/reports", server.url))
        .bearer_auth(&token)
        .body("{}")
        .send()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let fleet = processes();
    let report = agent_once(
        &write_scenario(dir.path(), &fleet),
        &["--duration", "200ms", "--sample-interval", "100ms"],
    );
    let resp = client
        .post(format!("{}/api/v1/reports", server.url))
        .bearer_auth(&token)
        .header("x-gpuledger-spool-depth", "3")
        .json(&report)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
    let text = reqwest::get(format!("{}/metrics", server.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("gpuledger_agent_spool_depth{cluster=\"default\""),
        "{text}"
    );
    assert!(
        text.contains("gpuledger_reports_rejected_total{reason=\"bad_request\"} 1"),
        "{text}"
    );
    assert_promtool_passes(&text);
}

/// The rogue agent of the scoped-tokens issue, over real HTTP against the real server: a token
/// made for another cluster posts a window for `train-east/gpu-node-7` at 100 % with
/// `team=evil`, then the real agent posts the same host, GPU and window at 0 % with `team=ml`.
/// The rogue is refused (403, `host.cluster`), the real window is stored, a rogue token of the
/// same cluster is refused for the bound host, the fleet page shows the refused attempts, and
/// `token list` shows where each token was last used from.
#[tokio::test(flavor = "multi_thread")]
async fn a_rogue_token_cannot_rewrite_a_hosts_costs() {
    for db in [test_support::sqlite(), test_support::postgres().await] {
        let real = create_token(&db.url, "rack-1", "train-east");
        let rogue = create_token(&db.url, "rogue", "scratch");
        let server = start_server(&db.url, free_port()).await;
        let client = reqwest::Client::new();
        let now = gpuledger_server::clock::now_ms();
        let window = |batch: &str, util: f64, team: &str| {
            json!({
                "batch_id": batch,
                "agent_version": "0.1.0",
                "host": {"hostname": "gpu-node-7", "cluster": "train-east"},
                "windows": [{
                    "start_ms": now - 15_000, "end_ms": now, "samples": 15,
                    "gpus": [{
                        "uuid": "GPU-real-0", "index": 0, "name": "NVIDIA H100 80GB HBM3",
                        "util_avg": util, "util_max": util,
                        "processes": [{"pid": 7, "labels": {"team": team}}]
                    }]
                }]
            })
        };
        let post = |token: String, body: serde_json::Value| {
            let (client, url) = (client.clone(), format!("{}/api/v1/reports", server.url));
            async move {
                let resp = client
                    .post(url)
                    .bearer_auth(token)
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                let status = resp.status();
                (status, resp.json::<serde_json::Value>().await.unwrap())
            }
        };
        let (status, body) = post(rogue.clone(), window("rogue-1", 100.0, "evil")).await;
        assert_eq!(status, reqwest::StatusCode::FORBIDDEN, "{body}");
        assert_eq!(body["field"], "host.cluster", "{body}");
        let (status, body) = post(real.clone(), window("real-1", 0.0, "ml")).await;
        assert_eq!(status, reqwest::StatusCode::OK, "{body}");
        assert_eq!(body["status"], "stored", "{body}");

        // A second token for the same cluster cannot take the bound host either.
        let rogue_same = create_token(&db.url, "rogue-2", "train-east");
        let (status, body) = post(rogue_same, window("rogue-2", 100.0, "evil")).await;
        assert_eq!(status, reqwest::StatusCode::FORBIDDEN, "{body}");
        assert_eq!(body["field"], "host.hostname", "{body}");

        let store = db.open().await;
        let windows = store::telemetry::gpu_windows(store.db(), 0, i64::MAX)
            .await
            .unwrap();
        assert_eq!(windows.len(), 1, "{}", db.backend);
        assert_eq!(windows[0].util_avg, Some(0.0), "{}", db.backend);
        let processes = store::telemetry::process_windows(store.db(), 0, i64::MAX)
            .await
            .unwrap();
        assert!(
            processes[0].labels_json.contains("\"ml\""),
            "{}",
            db.backend
        );

        let viewer = signed_in(&server, "viewer").await;
        let fleet = viewer
            .get(format!("{}/", server.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(fleet.contains("Refused reports"), "{fleet}");
        assert!(fleet.contains("rogue") && fleet.contains("train-east/gpu-node-7"));
        let list = server_cmd(&db.url)
            .args(["token", "list"])
            .output()
            .unwrap();
        let listing = String::from_utf8_lossy(&list.stdout);
        let rack = listing.lines().find(|l| l.starts_with("rack-1\t")).unwrap();
        assert!(rack.ends_with("\t127.0.0.1"), "{listing}");
    }
}

/// A host given a new token keeps its data: the real agent's reports are refused (403) while the
/// host belongs to the old token, wait in its spool, and all arrive once an admin moves the host
/// (`token rebind`); nothing goes to the dead-letter folder.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_agent_keeps_its_windows_until_the_host_is_moved() {
    let db = test_support::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let fleet = processes();
    let scenario = write_scenario(dir.path(), &fleet);
    let old = create_token(&db.url, "old", "e2e");
    let new = create_token(&db.url, "new", "e2e");
    let server = start_server(&db.url, free_port()).await;
    let now = gpuledger_server::clock::now_ms();
    let claim = json!({
        "batch_id": "old-1", "agent_version": "0.0.9",
        "host": {"hostname": "gpu-host-1", "cluster": "e2e"},
        "windows": [{"start_ms": now - 3_600_000, "end_ms": now - 3_585_000, "samples": 15,
                     "gpus": [{"uuid": "GPU-old-card", "index": 0, "name": "NVIDIA A100"}]}]
    });
    let resp = reqwest::Client::new()
        .post(format!("{}/api/v1/reports", server.url))
        .bearer_auth(&old)
        .json(&claim)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), reqwest::StatusCode::OK);

    let spool = dir.path().join("spool");
    let mut agent = start_agent(&AgentOptions {
        server: &server.url,
        token: &new,
        scenario: &scenario,
        spool: &spool,
        cluster: "e2e",
        hostname: "gpu-host-1",
        window: "1s",
    });
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let store = db.open().await;
    assert_eq!(
        store::telemetry::batch_count(store.db()).await.unwrap(),
        1,
        "the new token's reports are refused"
    );
    let refused = store::tokens::ingest_refusals(store.db(), 0).await.unwrap();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].reason, "host_of_another_token");
    assert!(
        refused[0].attempts >= 2,
        "the agent kept retrying: {refused:?}"
    );

    let rebind = server_cmd(&db.url)
        .args(["token", "rebind", "e2e/gpu-host-1", "--to", "new"])
        .output()
        .unwrap();
    assert!(
        rebind.status.success(),
        "{}",
        String::from_utf8_lossy(&rebind.stderr)
    );
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let status = agent.terminate(Duration::from_secs(15));
    assert!(status.success(), "agent exit {status:?}");

    let windows = store::telemetry::gpu_windows(store.db(), now - 600_000, i64::MAX)
        .await
        .unwrap();
    let batches = store::telemetry::batch_count(store.db()).await.unwrap() - 1;
    assert!(
        batches >= 5,
        "the refused windows arrived too: {batches} batches"
    );
    let first = windows.iter().map(|w| w.start_ms).min().unwrap();
    assert!(
        first < now + 3_000,
        "the first windows, refused at first, were delivered: first at {}",
        first - now
    );
    spool_is_drained(&spool, "refused then moved");
    assert!(
        store::tokens::ingest_refusals(store.db(), 0)
            .await
            .unwrap()
            .is_empty(),
        "the move settles the refusals"
    );
}
