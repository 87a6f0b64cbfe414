//! Real GPUs end to end, through the real agent, the fake NVML configured as real captured
//! machines, and the server: an A100 in MIG mode replayed from a real `nvidia-smi` capture bills
//! its busy tenants as used and its empty slices as idle; a GPU busy with no process the agent
//! can see (a real RTX 3080 capture) is "(unseen process)"'s, and `gpuledger-agent once` says
//! why; a GPU lost mid-run, an XID, a driver reload and an NVML that cannot initialise leave the
//! other GPUs reporting and the agent running.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpuledger_server::store;
use rust_decimal::Decimal;
use serde_json::{json, Value};
use support::*;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn capture(name: &str) -> captures::Capture {
    captures::all()
        .into_iter()
        .find(|c| c.file.ends_with(name))
        .unwrap_or_else(|| panic!("no capture {name}"))
}

fn write(dir: &Path, name: &str, scenario: &Value) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec_pretty(scenario).unwrap()).unwrap();
    path
}

fn money(v: &Value) -> Decimal {
    v.as_str().unwrap_or("0").parse().unwrap()
}

/// Runs the agent as `hostname` on `scenario` for `seconds`, then rolls the ledger up.
async fn report_for(server: &Server, token: &str, scenario: &Path, hostname: &str, seconds: u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(&AgentOptions {
        server: &server.url,
        token,
        scenario,
        spool: &dir.path().join("spool"),
        cluster: "real",
        hostname,
        window: "1s",
    });
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    assert!(agent.terminate(Duration::from_secs(15)).success());
    server_run(&server.db_url, &["rollup"]);
}

/// The real A100-SXM4-80GB capture: MIG on, four 1g.20gb instances (GPU instance ids 3 to 6,
/// 4 of 7 compute slices). Replayed with work on two of them: each tenant pays its 1/7 as used
/// (by presence: an A100 has no GPM, so nothing measures the instances' activity, and their
/// work is never held idle); the two empty instances and the three slices no instance holds are
/// idle, and nothing is charged to a tenant for them.
#[tokio::test(flavor = "multi_thread")]
async fn an_a100_mig_replay_bills_busy_tenants_as_used_and_empty_slices_as_idle() {
    let dir = tempfile::tempdir().unwrap();
    let a100 = capture("telegraf/a100-sxm4-v12.xml");
    // The captured devices (14 SMs, 19,968 MiB on an A100 80GB) are 1g.20gb:
    // tests/e2e/nvml_captures.rs checks the fake's profiles against them.
    let mut scenario = captures::scenario(&a100, |_| vec![("1g.20gb".into(), 19968, 14)]);
    let train = labelled_process(&[("GPULEDGER_TEAM", "vision"), ("GPULEDGER_MODEL", "resnet")]);
    let serve = labelled_process(&[("GPULEDGER_TEAM", "search"), ("GPULEDGER_MODEL", "ranker")]);
    for (slot, pid) in [(0, train.pid()), (1, serve.pid())] {
        scenario["gpus"][0]["mig"][slot]["phases"] = json!([{
            "memory_used_bytes": 4 * GIB + 12 * MIB,
            "processes": [{ "pid": pid, "name": "python3", "memory_used_bytes": 4 * GIB }],
        }]);
    }
    let scenario = write(dir.path(), "a100-mig.json", &scenario);

    let db = test_support::sqlite();
    let token = create_token(&db.url, "real", "real");
    let server = start_server(&db.url, free_port()).await;
    report_for(&server, &token, &scenario, "a100-mig", 4).await;

    let viewer = signed_in(&server, "viewer").await;
    let q = around_now();
    let (body, teams) = allocation_rows(&viewer, &server, &format!("{q}&by=team")).await;
    let (vision, search) = (&teams["vision"], &teams["search"]);
    let slice = money(&vision["used_cost"]);
    assert!(slice > Decimal::ZERO, "{body}");
    for tenant in [vision, search] {
        assert_eq!(money(&tenant["held_idle_cost"]), Decimal::ZERO, "{tenant}");
        assert_eq!(money(&tenant["idle_cost"]), Decimal::ZERO, "{tenant}");
        // Measured by presence: no utilization stands behind the used dollars.
        assert!(tenant["avg_util"].is_null(), "{tenant}");
        let presence = tenant["presence_gpu_hours"].as_f64().unwrap();
        let hours = tenant["gpu_hours"].as_f64().unwrap();
        assert!(
            presence > 0.0 && (presence - hours).abs() < 1e-9,
            "{tenant}"
        );
    }
    let close = |a: Decimal, b: Decimal| (a - b).abs() <= Decimal::new(1, 5);
    assert!(close(money(&search["used_cost"]), slice), "{body}");
    // Two empty instances and three empty slices: five sevenths of the GPU, idle.
    let idle = money(&teams["(idle)"]["idle_cost"]);
    assert!(
        close(idle, slice * Decimal::from(5)),
        "idle {idle} vs 5 × {slice}: {body}"
    );

    let (body, gpus) = allocation_rows(&viewer, &server, &format!("{q}&by=gpu")).await;
    let parent = &gpus["GPU-513536b6-7d19-9063-b049-1e69664bb298"];
    assert!(
        close(money(&parent["idle_cost"]), slice * Decimal::from(3)),
        "the GPU's own idle slices: {body}"
    );
    let empty: Vec<&Value> = gpus
        .iter()
        .filter(|(k, v)| k.starts_with("MIG-") && money(&v["used_cost"]).is_zero())
        .map(|(_, v)| v)
        .collect();
    assert_eq!(empty.len(), 2, "{body}");
    for e in empty {
        assert!(close(money(&e["idle_cost"]), slice), "{e}");
    }
    // The review marks the tenants' used dollars as measured by presence, and says what that is.
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    let review = page_text(&viewer, &format!("{}/review/{month}", server.url)).await;
    assert!(review.contains("Used by presence"), "{review}");
    assert!(review.contains("GPU-h used by presence"), "{review}");
    drop((train, serve));
}

/// The real RTX 3080 capture in which NVML lists no process while the GPU is 65% busy with
/// 9,184 MiB in use (the processes run in another PID namespace): the agent reports the memory
/// as unseen, `once` says why and what to change, and the server bills the work to
/// "(unseen process)", never to idle.
#[tokio::test(flavor = "multi_thread")]
async fn a_busy_gpu_with_no_visible_process_is_the_unseen_owners_and_once_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let rtx = capture("telegraf/rtx-3080-v13.xml");
    let scenario = write(
        dir.path(),
        "rtx.json",
        &captures::scenario(&rtx, |_| vec![]),
    );

    let out = std::process::Command::new(artifact("gpuledger-agent"))
        .args([
            "once",
            "--imds-endpoint",
            "off",
            "--kubernetes",
            "off",
            "--slurm",
            "off",
        ])
        .args(["--duration", "600ms", "--sample-interval", "200ms"])
        .arg("--nvml-lib")
        .arg(artifact("libfake_nvml.so"))
        .env("FAKE_NVML_SCENARIO", &scenario)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: gpuledger_proto::Report = serde_json::from_slice(&out.stdout).unwrap();
    let gpu = &report.windows[0].gpus[0];
    assert!(gpu.processes.is_empty());
    assert_eq!(gpu.unseen_memory_bytes, Some(9184 * MIB), "{gpu:?}");
    assert!(
        stderr.contains("9.0 GiB in use and 65% busy with no process the agent can see"),
        "{stderr}"
    );
    assert!(
        stderr.contains("run the agent where the GPU's processes run"),
        "{stderr}"
    );

    // The agent in a container without the host's PIDs: it says so, and what to change.
    let out = once_in_own_pid_namespace(&scenario);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: gpuledger_proto::Report = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report.windows[0].gpus[0].unseen_cause.as_deref(),
        Some("pid_namespace")
    );
    assert!(
        stderr.contains("the agent runs in a PID namespace of its own")
            && stderr.contains("hostPID: true"),
        "{stderr}"
    );

    let db = test_support::sqlite();
    let token = create_token(&db.url, "real", "real");
    let server = start_server(&db.url, free_port()).await;
    report_for(&server, &token, &scenario, "rtx-hidden", 3).await;
    let viewer = signed_in(&server, "viewer").await;
    let (body, teams) =
        allocation_rows(&viewer, &server, &format!("{}&by=team", around_now())).await;
    let unseen = &teams["(unseen process)"];
    assert!(money(&unseen["used_cost"]) > Decimal::ZERO, "{body}");
    assert!(!teams.contains_key("(idle)"), "busy is never idle: {body}");
    // The fleet page says whose memory it is not.
    let page = page_text(&viewer, &format!("{}/", server.url)).await;
    assert!(
        page.contains("held by processes the agent cannot see"),
        "{page}"
    );
}

/// Replays `scenario` as host `hostname` for `seconds` against a fresh server: the server, its
/// database (kept while the test uses the server) and every window stored.
async fn replay(
    scenario: &Value,
    hostname: &str,
    seconds: u64,
) -> (
    Server,
    TestDb,
    Vec<gpuledger_core::telemetry::AttributionWindow>,
) {
    let dir = tempfile::tempdir().unwrap();
    let scenario = write(dir.path(), "scenario.json", scenario);
    let db = test_support::sqlite();
    let token = create_token(&db.url, "real", "real");
    let server = start_server(&db.url, free_port()).await;
    report_for(&server, &token, &scenario, hostname, seconds).await;
    let store = db.open().await;
    let all = store::rollups::attribution_windows(store.db(), 0, i64::MAX)
        .await
        .unwrap();
    (server, db, all)
}

/// `gpuledger-agent once` on `scenario` inside a PID namespace of its own, with its own `/proc`
/// (as in a container without the host's PIDs): by `unshare` as root, else in a user namespace.
fn once_in_own_pid_namespace(scenario: &Path) -> std::process::Output {
    let agent = artifact("gpuledger-agent");
    let lib = artifact("libfake_nvml.so");
    let run = |prefix: &[&str]| {
        std::process::Command::new("unshare")
            .args(prefix)
            .args(["--pid", "--fork", "--mount-proc"])
            .arg(&agent)
            .args([
                "once",
                "--imds-endpoint",
                "off",
                "--kubernetes",
                "off",
                "--slurm",
                "off",
            ])
            .args(["--duration", "600ms", "--sample-interval", "200ms"])
            .arg("--nvml-lib")
            .arg(&lib)
            .env("FAKE_NVML_SCENARIO", scenario)
            .output()
            .expect("unshare (util-linux) runs")
    };
    let out = run(&[]);
    if out.status.success() {
        return out;
    }
    run(&["--user", "--map-root-user"])
}

/// Stored windows of one GPU, oldest first.
fn windows_of<'a>(
    all: &'a [gpuledger_core::telemetry::AttributionWindow],
    uuid: &str,
) -> Vec<&'a gpuledger_core::telemetry::AttributionWindow> {
    all.iter().filter(|w| w.gpu_uuid == uuid).collect()
}

/// Two A100s at work. GPU 1 reports XID 79 and falls off the bus at 1.5 s: GPU 0 keeps
/// reporting, GPU 1 is reported lost with the XID's meaning and its time is idle. At 3 s the
/// driver is unloaded for a second (a reload): both GPUs are reported unavailable, the agent
/// initialises NVML again with backoff, and GPU 0 reads again. At 7 s GPU 0 reports
/// XID 48 and its process dies: faulted until new work starts on it at 8.5 s.
#[tokio::test(flavor = "multi_thread")]
async fn one_lost_gpu_leaves_the_others_reporting_and_the_agent_rides_out_a_driver_reload() {
    let work = |pid: u32| json!([{ "pid": pid, "name": "python3", "memory_used_bytes": 20 * GIB, "sm_util": 60 }]);
    let scenario = json!({
        "faults": [{ "at_s": 3.0, "until_s": 4.0, "kind": "driver_unloaded" }],
        "gpus": [
            { "model": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-fault-0",
              "phases": [
                  { "at_s": 0, "gpu_util": 60, "processes": work(424_242) },
                  { "at_s": 7.0, "gpu_util": 0, "memory_used_bytes": 0 },
                  { "at_s": 8.5, "gpu_util": 60, "processes": work(434_343) }
              ],
              "faults": [{ "at_s": 7.0, "kind": "xid", "xid": 48 }] },
            { "model": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-fault-1",
              "phases": [{ "gpu_util": 60, "processes": work(424_243) }],
              "faults": [{ "at_s": 1.5, "kind": "xid", "xid": 79 }, { "at_s": 1.5, "kind": "lost" }] }
        ]
    });
    let (server, _db, all) = replay(&scenario, "faulty", 11).await;
    let (gpu0, gpu1) = (
        windows_of(&all, "GPU-fault-0"),
        windows_of(&all, "GPU-fault-1"),
    );
    assert!(
        gpu0.len() >= 9,
        "GPU 0 reported every window: {}",
        gpu0.len()
    );
    // GPU 0: read, then unavailable while the driver is away, then read again.
    let codes: Vec<Option<&str>> = gpu0
        .iter()
        .map(|w| w.fault.as_ref().map(|f| f.code.as_str()))
        .collect();
    let first_away = codes
        .iter()
        .position(|c| *c == Some("driver_unavailable"))
        .unwrap_or_else(|| panic!("{codes:?}"));
    let back = codes[first_away..]
        .iter()
        .position(|c| c.is_none())
        .map(|i| i + first_away)
        .unwrap_or_else(|| panic!("NVML never came back: {codes:?}"));
    assert!(
        gpu0[..first_away].iter().all(|w| w.util_avg == Some(60.0)),
        "{codes:?}"
    );
    assert_eq!(gpu0[back].util_avg, Some(60.0), "{codes:?}");
    // XID 48 with its work gone: faulted, with its meaning, until new work runs.
    let xid: Vec<&&gpuledger_core::telemetry::AttributionWindow> = gpu0
        .iter()
        .filter(|w| w.fault.as_ref().is_some_and(|f| f.code == "xid"))
        .collect();
    assert!(!xid.is_empty(), "{codes:?}");
    assert!(
        xid[0]
            .fault
            .as_ref()
            .unwrap()
            .detail
            .contains("XID 48: double-bit ECC error"),
        "{:?}",
        xid[0].fault
    );
    assert!(
        gpu0.last().unwrap().fault.is_none(),
        "new work ends the XID's fault: {codes:?}"
    );
    // GPU 1: lost from 1.5 s, still reported, with the XID that came with it.
    let lost: Vec<_> = gpu1
        .iter()
        .filter(|w| w.fault.as_ref().is_some_and(|f| f.code == "gpu_lost"))
        .collect();
    assert!(
        lost.len() >= 3,
        "{:?}",
        gpu1.iter().map(|w| &w.fault).collect::<Vec<_>>()
    );
    assert!(
        lost[0]
            .fault
            .as_ref()
            .unwrap()
            .detail
            .contains("XID 79: the GPU has fallen off the bus"),
        "{:?}",
        lost[0].fault
    );
    // The first may hold readings from before the loss; none after.
    assert!(lost[1..].iter().all(|w| w.util_avg.is_none()), "{lost:?}");

    // The ledger: GPU 1's lost time is idle, never its tenant's.
    let viewer = signed_in(&server, "viewer").await;
    let (body, gpus) = allocation_rows(&viewer, &server, &format!("{}&by=gpu", around_now())).await;
    let g1 = &gpus["GPU-fault-1"];
    assert!(
        money(&g1["idle_cost"]) > money(&g1["used_cost"]),
        "lost most of the run: {body}"
    );
}

/// NVML cannot initialise for the first seconds (a driver upgraded under the library): the
/// daemon does not exit; it tries again with backoff and reports once NVML answers.
#[tokio::test(flavor = "multi_thread")]
async fn an_agent_started_before_nvml_can_initialise_waits_for_it() {
    let scenario = json!({
        "faults": [{ "at_s": 0, "until_s": 2.0, "kind": "init_fails" }],
        "gpus": [{ "model": "NVIDIA L4", "uuid": "GPU-late-0", "phases": [{ "gpu_util": 30 }] }]
    });
    let (_server, _db, all) = replay(&scenario, "late", 6).await;
    let late = windows_of(&all, "GPU-late-0");
    assert!(!late.is_empty(), "the agent reported once NVML answered");
    assert!(late.iter().all(|w| w.util_avg == Some(30.0)), "{late:?}");
}
