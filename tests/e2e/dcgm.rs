//! dcgm-exporter as a source: the agent reads an exporter's Prometheus endpoint (served here
//! exactly as dcgm-exporter writes it, default counters in Kubernetes mode) with `--source
//! dcgm`, and the same fleet read through NVML by the agent gives the same review: the same
//! owners, each paying the same part of the bill, used, idle and held idle alike, at the same
//! utilization. An exporter that is down leaves the GPUs unmonitored and the agent running.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use rust_decimal::Decimal;
use serde_json::{json, Value};
use support::*;

const GIB: u64 = 1 << 30;

/// One series line as dcgm-exporter's template writes it: the GPU's labels in its order, an
/// instance's `GPU_I_PROFILE`/`GPU_I_ID`, the host, the driver label, then the pod's.
fn series(metric: &str, gpu: &Gpu, instance: Option<&Instance>, value: &str) -> String {
    let mut labels = format!(
        "gpu=\"{}\",UUID=\"{}\",pci_bus_id=\"00000000:10:1{}.0\",device=\"nvidia{}\",modelName=\"{}\"",
        gpu.index, gpu.uuid, gpu.index, gpu.index, gpu.model
    );
    if let Some(i) = instance {
        labels.push_str(&format!(
            ",GPU_I_PROFILE=\"{}\",GPU_I_ID=\"{}\"",
            i.profile, i.id
        ));
    }
    labels.push_str(",Hostname=\"dcgm-node\",DCGM_FI_DRIVER_VERSION=\"550.54.15\"");
    let pod = instance.map_or(gpu.pod, |i| i.pod);
    if let Some((namespace, pod, container)) = pod {
        labels.push_str(&format!(
            ",container=\"{container}\",namespace=\"{namespace}\",pod=\"{pod}\""
        ));
    }
    format!("{metric}{{{labels}}} {value}\n")
}

struct Instance {
    id: u32,
    profile: &'static str,
    activity: f64,
    used_mib: u64,
    pod: Option<(&'static str, &'static str, &'static str)>,
}

struct Gpu {
    index: u32,
    uuid: &'static str,
    model: &'static str,
    util: u32,
    used_mib: u64,
    free_mib: u64,
    pod: Option<(&'static str, &'static str, &'static str)>,
    instances: Vec<Instance>,
}

fn fleet() -> Vec<Gpu> {
    vec![
        Gpu {
            index: 0,
            uuid: "GPU-d1a10000-0000-4000-8000-000000000000",
            model: "NVIDIA A100-SXM4-80GB",
            util: 70,
            used_mib: 20480,
            free_mib: 60571,
            pod: Some(("search", "ranker-0", "model")),
            instances: vec![],
        },
        Gpu {
            index: 1,
            uuid: "GPU-d1b20000-0000-4000-8000-000000000000",
            model: "NVIDIA H100 80GB HBM3",
            util: 0,
            used_mib: 0,
            free_mib: 0,
            pod: None,
            instances: vec![
                Instance {
                    id: 1,
                    profile: "3g.40gb",
                    activity: 0.5,
                    used_mib: 10240,
                    pod: Some(("vision", "train-0", "trainer")),
                },
                Instance {
                    id: 2,
                    profile: "3g.40gb",
                    activity: 0.0,
                    used_mib: 0,
                    pod: None,
                },
            ],
        },
        Gpu {
            index: 2,
            uuid: "GPU-d1c30000-0000-4000-8000-000000000000",
            model: "NVIDIA A10G",
            util: 0,
            used_mib: 0,
            free_mib: 22593,
            pod: None,
            instances: vec![],
        },
    ]
}

/// The fleet's `/metrics` as dcgm-exporter 4.x writes it: `# HELP` and `# TYPE` per counter,
/// whole numbers as `%d`, decimals as `%f`; in MIG mode only the instances' series.
fn exposition(fleet: &[Gpu]) -> String {
    let mut out = String::new();
    let family = |out: &mut String,
                  metric: &str,
                  kind: &str,
                  help: &str,
                  each: &dyn Fn(&Gpu, Option<&Instance>) -> Option<String>| {
        out.push_str(&format!("# HELP {metric} {help}\n# TYPE {metric} {kind}\n"));
        for g in fleet {
            if g.instances.is_empty() {
                if let Some(v) = each(g, None) {
                    out.push_str(&series(metric, g, None, &v));
                }
            }
            for i in &g.instances {
                if let Some(v) = each(g, Some(i)) {
                    out.push_str(&series(metric, g, Some(i), &v));
                }
            }
        }
    };
    family(
        &mut out,
        "DCGM_FI_DEV_GPU_TEMP",
        "gauge",
        "GPU temperature (in C).",
        &|_, _| Some("45".into()),
    );
    family(
        &mut out,
        "DCGM_FI_DEV_POWER_USAGE",
        "gauge",
        "Power draw (in W).",
        &|g, _| Some(format!("{:.6}", 60.0 + f64::from(g.util) * 3.0)),
    );
    family(
        &mut out,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        &|_, _| Some("4686000".into()),
    );
    // GPU_UTIL is not measured on MIG instances: no series.
    family(
        &mut out,
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        "GPU utilization (in %).",
        &|g, i| i.is_none().then(|| g.util.to_string()),
    );
    family(
        &mut out,
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "Framebuffer memory free (in MiB).",
        &|g, i| {
            Some(match i {
                Some(i) => (40325 - i.used_mib).to_string(),
                None => g.free_mib.to_string(),
            })
        },
    );
    family(
        &mut out,
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "Framebuffer memory used (in MiB).",
        &|g, i| Some(i.map_or(g.used_mib, |i| i.used_mib).to_string()),
    );
    family(
        &mut out,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        &|g, i| {
            Some(format!(
                "{:.6}",
                i.map_or(f64::from(g.util) / 100.0, |i| i.activity)
            ))
        },
    );
    out
}

/// The same fleet for the fake NVML, its work done by real processes declaring the teams the
/// pods' namespaces are.
fn scenario(search: u32, vision: u32) -> Value {
    json!({ "gpus": [
        { "model": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-d1a10000-0000-4000-8000-000000000000",
          "phases": [{ "gpu_util": 70, "memory_used_bytes": 20 * GIB,
                       "processes": [{ "pid": search, "name": "model", "memory_used_bytes": 20 * GIB, "sm_util": 68 }] }] },
        { "model": "NVIDIA H100 80GB HBM3", "uuid": "GPU-d1b20000-0000-4000-8000-000000000000",
          "mig": [
              { "profile": "3g.40gb", "gpu_instance_id": 1, "uuid": "MIG-d1b2-1",
                "phases": [{ "gpu_util": 50, "memory_used_bytes": 10 * GIB,
                             "processes": [{ "pid": vision, "name": "trainer", "memory_used_bytes": 10 * GIB }] }] },
              { "profile": "3g.40gb", "gpu_instance_id": 2, "uuid": "MIG-d1b2-2", "phases": [{ "gpu_util": 0 }] }
          ] },
        { "model": "NVIDIA A10G", "uuid": "GPU-d1c30000-0000-4000-8000-000000000000", "phases": [{ "gpu_util": 0 }] }
    ]})
}

/// Serves `body` at `/metrics` as the exporter does.
async fn exporter(body: String) -> String {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let body = body.clone();
            async move { ([("content-type", "text/plain; charset=utf-8")], body) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/metrics")
}

/// Each team's part of the attributed cost (used, held idle, idle), its average utilization,
/// and which of its kinds carry dollars.
fn teams(rows: &BTreeMap<String, Value>) -> BTreeMap<String, (f64, Option<f64>, [bool; 3])> {
    let money = |v: &Value| -> Decimal { v.as_str().unwrap_or("0").parse().unwrap() };
    let total: Decimal = rows.values().map(|r| money(&r["cost"])).sum();
    rows.iter()
        .map(|(k, r)| {
            let share = money(&r["cost"]) / total;
            let kinds = [
                money(&r["used_cost"]) > Decimal::ZERO,
                money(&r["held_idle_cost"]) > Decimal::ZERO,
                money(&r["idle_cost"]) > Decimal::ZERO,
            ];
            (
                k.clone(),
                (
                    share.to_string().parse().unwrap(),
                    r["avg_util"].as_f64(),
                    kinds,
                ),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dcgm_exporter_scrape_gives_the_same_review_as_the_agent_for_the_same_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let search = labelled_process(&[("GPULEDGER_TEAM", "search")]);
    let vision = labelled_process(&[("GPULEDGER_TEAM", "vision")]);
    let scenario_path = dir.path().join("fleet.json");
    std::fs::write(
        &scenario_path,
        scenario(search.pid(), vision.pid()).to_string(),
    )
    .unwrap();
    let url = exporter(exposition(&fleet())).await;

    // The same fleet twice, each to a server of its own: through NVML, and through the exporter.
    let (nvml_db, dcgm_db) = (test_support::sqlite(), test_support::sqlite());
    let nvml_server = start_server(&nvml_db.url, free_port()).await;
    let dcgm_server = start_server(&dcgm_db.url, free_port()).await;
    let options = |server: &Server, token: &str, spool: &str| {
        let mut cmd = agent_command(&AgentOptions {
            server: &server.url,
            token,
            scenario: &scenario_path,
            spool: &dir.path().join(spool),
            cluster: "fleet",
            hostname: "gpu-node",
            window: "1s",
        });
        cmd.args(["--kubernetes", "off", "--slurm", "off"]);
        cmd
    };
    let nvml_token = create_token(&nvml_db.url, "nvml", "fleet");
    let dcgm_token = create_token(&dcgm_db.url, "dcgm", "fleet");
    let mut through_nvml = Proc(options(&nvml_server, &nvml_token, "a").spawn().unwrap());
    let mut through_dcgm = Proc(
        options(&dcgm_server, &dcgm_token, "b")
            .args(["--source", "dcgm", "--dcgm-url", &url])
            .spawn()
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(through_nvml.terminate(Duration::from_secs(15)).success());
    assert!(through_dcgm.terminate(Duration::from_secs(15)).success());

    let q = format!("{}&by=team", around_now());
    let mut seen = Vec::new();
    for server in [&nvml_server, &dcgm_server] {
        server_run(&server.db_url, &["rollup"]);
        let viewer = signed_in(server, "viewer").await;
        let (body, rows) = allocation_rows(&viewer, server, &q).await;
        seen.push((body, teams(&rows)));
    }
    let (nvml, dcgm) = (&seen[0].1, &seen[1].1);
    assert_eq!(
        nvml.keys().collect::<Vec<_>>(),
        ["(idle)", "search", "vision"],
        "{}",
        seen[0].0
    );
    assert_eq!(
        nvml.keys().collect::<Vec<_>>(),
        dcgm.keys().collect::<Vec<_>>(),
        "{}",
        seen[1].0
    );
    for (team, (share, util, kinds)) in nvml {
        let (d_share, d_util, d_kinds) = &dcgm[team];
        assert!(
            (share - d_share).abs() < 0.02,
            "{team}: {share} through NVML, {d_share} through dcgm-exporter"
        );
        assert_eq!(kinds, d_kinds, "{team}: used, held idle, idle");
        match (util, d_util) {
            (Some(a), Some(b)) => assert!((a - b).abs() < 1.0, "{team}: {a}% against {b}%"),
            (a, b) => assert_eq!(a, b, "{team}"),
        }
    }
    // The vision tenant pays its 3 of the H100's 7 slices, the rest of that GPU is idle.
    assert!(dcgm["vision"].2 == [true, false, false]);
    drop((search, vision));
}

/// An exporter that is not there: `once` fails and says which and why (the daemon logs the same
/// once and reports nothing: its GPUs are unmonitored, never idle).
#[tokio::test(flavor = "multi_thread")]
async fn an_exporter_that_is_down_is_said_so_and_waited_for() {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/metrics");
    let out = std::process::Command::new(artifact("gpuledger-agent"))
        .args([
            "once",
            "--imds-endpoint",
            "off",
            "--source",
            "dcgm",
            "--dcgm-url",
            &url,
        ])
        .args(["--duration", "300ms", "--sample-interval", "100ms"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("dcgm-exporter cannot be read"), "{stderr}");
    assert!(stderr.contains(&url), "{stderr}");
}
