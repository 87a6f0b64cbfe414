//! End to end on a real Slurm (Debian's slurmctld, slurmd and munge, started by the test): jobs
//! submitted with `sbatch` and no variable of ours hold fake-NVML GPUs; the real agent finds
//! each process's job, asks the controller with `squeue --json`, and the job's account becomes
//! its team in the API and the review. With the controller away, sampling goes on and the
//! owner is reported unknown with its cause.

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use gpuledger_server::store;
use serde_json::{json, Value};
use support::slurm::SlurmCluster;
use support::*;

const GIB: u64 = 1024 * 1024 * 1024;

/// One A100 whose processes are the jobs' (busy) and one idle.
fn scenario(dir: &Path, pids: &[u32]) -> std::path::PathBuf {
    let processes: Vec<Value> = pids
        .iter()
        .map(|pid| json!({ "pid": pid, "name": "python3", "memory_used_bytes": 10 * GIB, "sm_util": 30 }))
        .collect();
    let doc = json!({ "gpus": [{
        "model": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-slurm-a100-0",
        "power_mw": 300_000, "energy_start_mj": 0,
        "phases": [{ "gpu_util": 90, "mem_util": 30, "memory_used_bytes": 30 * GIB, "processes": processes }]
    }]});
    let path = dir.join("scenario.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    path
}

/// The agent of the cluster's node, one-second windows, asking the cluster's controller.
fn agent_on(
    cluster: &SlurmCluster,
    server: &Server,
    token: &str,
    scenario: &Path,
    dir: &Path,
) -> std::process::Command {
    let mut cmd = agent_command(&AgentOptions {
        server: &server.url,
        token,
        scenario,
        spool: &dir.join("spool"),
        cluster: "hpc",
        hostname: &cluster.node,
        window: "1s",
    });
    cmd.env("SLURM_CONF", &cluster.conf);
    cmd
}

fn labels_by_pid(procs: &[gpuledger_core::telemetry::StoredProcessWindow]) -> BTreeMap<i64, Value> {
    procs
        .iter()
        .map(|p| (p.pid, serde_json::from_str(&p.labels_json).unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slurm_jobs_account_becomes_its_team_without_a_variable_set() {
    let cluster = SlurmCluster::start();
    let (vision_job, vision) = cluster.run_job(&[
        "--account=vision",
        "--job-name=resnet-sweep",
        // A comment over two lines: the label keeps it on one.
        "--comment=sweep 3 of 8\nlr=3e-4",
    ]);
    let (eval_job, eval) = cluster.run_job(&["--account=nlp", "--job-name=llm-eval", "--array=4"]);
    // A job whose process names its own team: the environment wins over the account.
    let (_, declared) = cluster.run_job(&[
        "--account=vision",
        "--export=GPULEDGER_TEAM=search",
        "--job-name=declared",
    ]);

    let db = test_support::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let scenario = scenario(dir.path(), &[vision, eval, declared]);
    let token = create_token(&db.url, "slurm", "hpc");
    // Cost per job and per array (a job not in an array is its own), as docs/owners.md shows.
    let config = dir.path().join("server.toml");
    std::fs::write(
        &config,
        "[owners]\n\
         slurm_job = { from = [\"label:slurm_job_id\"] }\n\
         slurm_array = { from = [\"label:slurm_array_job_id\", \"label:slurm_job_id\"] }\n",
    )
    .unwrap();
    let server = start_server_with(&db.url, free_port(), Some(&config)).await;
    let mut agent = Proc(
        agent_on(&cluster, &server, &token, &scenario, dir.path())
            .spawn()
            .expect("spawn agent"),
    );
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    assert!(agent.terminate(Duration::from_secs(15)).success());

    let store = db.open().await;
    let procs = store::telemetry::process_windows(store.db(), 0, i64::MAX)
        .await
        .unwrap();
    let labels = labels_by_pid(&procs);
    let v = &labels[&i64::from(vision)];
    assert_eq!(v["slurm_job_id"], vision_job.to_string());
    assert_eq!(v["slurm_account"], "vision");
    assert_eq!(v["slurm_job_name"], "resnet-sweep");
    assert_eq!(v["slurm_partition"], "gpu");
    assert_eq!(v["slurm_user"], support::slurm::user_name().as_str());
    assert_eq!(v["slurm_comment"], "sweep 3 of 8 lr=3e-4");
    assert!(v.get("team").is_none(), "no variable of ours was set: {v}");
    let e = &labels[&i64::from(eval)];
    assert_eq!(e["slurm_account"], "nlp");
    assert_eq!(e["slurm_array_job_id"], eval_job.to_string());
    assert_eq!(e["slurm_array_task_id"], "4");
    assert_eq!(labels[&i64::from(declared)]["team"], "search");
    assert!(
        procs
            .iter()
            .all(|p| p.labels_json.contains("slurm_account")),
        "every window, the first included, carries the job's account: {procs:?}"
    );

    // The ledger: the rate card prices the host, and the GPU's cost splits among the teams.
    // The roll-up reads owners with the server's config, as `serve` does.
    server_run(&db.url, &["rollup", "--config", config.to_str().unwrap()]);
    let viewer = signed_in(&server, "viewer").await;
    let q = around_now();
    let (body, teams) = allocation_rows(&viewer, &server, &format!("{q}&by=team")).await;
    for team in ["vision", "nlp", "search"] {
        let cost: f64 = teams
            .get(team)
            .unwrap_or_else(|| panic!("no {team} in {body}"))["cost"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(cost > 0.0, "{team}: {body}");
    }
    // The three processes used the GPU alike: each team carries a third of the used cost.
    assert_eq!(teams["vision"]["cost"], teams["nlp"]["cost"], "{body}");
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    let page = |path: String| {
        let viewer = viewer.clone();
        async move {
            let resp = viewer.get(path).send().await.unwrap();
            assert!(resp.status().is_success(), "{}", resp.status());
            resp.text().await.unwrap()
        }
    };
    let review = page(format!("{}/review/{month}", server.url)).await;
    assert!(
        review.contains("vision") && review.contains("nlp"),
        "the review names the accounts as teams"
    );

    // Per job: cost, GPU-hours, utilization and held-idle share, in the API, its CSV and the
    // review's drill-down.
    let (by_job, jobs) = allocation_rows(&viewer, &server, &format!("{q}&by=slurm_job")).await;
    let job_row = &jobs[&vision_job.to_string()];
    assert_eq!(job_row["cost"], teams["vision"]["cost"], "{by_job}");
    assert!(job_row["gpu_hours"].as_f64().unwrap() > 0.0, "{job_row}");
    assert!(job_row["avg_util"].as_f64().is_some(), "{job_row}");
    assert!(job_row.get("held_idle_cost").is_some(), "{job_row}");
    // The array's task counts under the array; a plain job under itself.
    let (by_array, arrays) =
        allocation_rows(&viewer, &server, &format!("{q}&by=slurm_array")).await;
    assert!(arrays.contains_key(&eval_job.to_string()), "{by_array}");
    assert!(arrays.contains_key(&vision_job.to_string()), "{by_array}");
    let csv = page(format!(
        "{}/api/v1/allocation?{q}&by=slurm_job&format=csv",
        server.url
    ))
    .await;
    assert!(
        csv.lines().any(|l| l.contains(&format!(",{vision_job},"))),
        "{csv}"
    );
    let drill = page(format!(
        "{}/review/{month}/slurm_job?key={vision_job}",
        server.url
    ))
    .await;
    assert!(drill.contains(&cluster.node), "the job's host: {drill}");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_the_controller_away_sampling_goes_on_and_the_cause_is_reported() {
    let mut cluster = SlurmCluster::start();
    let (job, pid) = cluster.run_job(&["--account=vision", "--job-name=orphan"]);
    cluster.stop_controller();

    let db = test_support::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let scenario = scenario(dir.path(), &[pid]);
    let token = create_token(&db.url, "slurm", "hpc");
    let server = start_server(&db.url, free_port()).await;
    let mut agent = Proc(
        agent_on(&cluster, &server, &token, &scenario, dir.path())
            .args(["--slurm-timeout", "1s"])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn agent"),
    );
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    assert!(agent.terminate(Duration::from_secs(15)).success());
    let mut logged = String::new();
    std::io::Read::read_to_string(agent.0.stderr.as_mut().unwrap(), &mut logged).unwrap();

    let store = db.open().await;
    assert!(
        store::telemetry::batch_count(store.db()).await.unwrap() >= 3,
        "sampling went on"
    );
    let procs = store::telemetry::process_windows(store.db(), 0, i64::MAX)
        .await
        .unwrap();
    assert!(!procs.is_empty());
    for p in &procs {
        let labels: Value = serde_json::from_str(&p.labels_json).unwrap();
        assert_eq!(labels["slurm_job_id"], job.to_string(), "the job is known");
        assert!(labels.get("slurm_account").is_none(), "{labels}");
    }
    assert_eq!(
        logged.matches("Slurm jobs' owners unknown").count(),
        1,
        "said once, not per sample: {logged}"
    );
    let metrics = reqwest::get(format!("{}/metrics", server.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let counted = metrics
        .lines()
        .find(|l| {
            l.starts_with("gpuledger_process_windows_owner_unknown_total")
                && l.contains("cause=\"slurm_timeout\"")
                && l.contains("cluster=\"hpc\"")
        })
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(!counted.ends_with(" 0"), "{counted}");

    // `once` says the same to whoever debugs the host, and still prints the GPU.
    let out = std::process::Command::new(artifact("gpuledger-agent"))
        .args(["once", "--imds-endpoint", "off", "--slurm-timeout", "1s"])
        .arg("--nvml-lib")
        .arg(artifact("libfake_nvml.so"))
        .env("FAKE_NVML_SCENARIO", &scenario)
        .env("SLURM_CONF", &cluster.conf)
        .env("GPULEDGER_LOG", "error")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let process = &report["windows"][0]["gpus"][0]["processes"][0];
    assert_eq!(process["owner_unknown"], "slurm_timeout", "{report}");
    assert_eq!(process["labels"]["slurm_job_id"], job.to_string());

    // Without squeue at all: the cause says so.
    let out = std::process::Command::new(artifact("gpuledger-agent"))
        .args(["once", "--imds-endpoint", "off"])
        .args(["--slurm-squeue", "/nonexistent/squeue"])
        .arg("--nvml-lib")
        .arg(artifact("libfake_nvml.so"))
        .env("FAKE_NVML_SCENARIO", &scenario)
        .env("GPULEDGER_LOG", "error")
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["windows"][0]["gpus"][0]["processes"][0]["owner_unknown"],
        "slurm_not_installed"
    );
}
