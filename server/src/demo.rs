//! A simulated fleet for `gpuledger-server demo`: a few clusters of hosts whose windows go
//! through the same validation and ingest code as real agent reports.

use std::collections::BTreeMap;

use gpuledger_proto::{GpuWindow, HostInfo, ProcessWindow, Report, Window};

use crate::store::{AgentStatus, Store, StoreError};
use crate::validate::{self, Limits};

const GIB: u64 = 1024 * 1024 * 1024;
const WINDOW_MS: i64 = 60_000;

struct HostSpec {
    cluster: &'static str,
    hostname: String,
    instance_type: &'static str,
    gpu_name: &'static str,
    gpu_mem: u64,
    gpus: u32,
    workload: Workload,
}

#[derive(Clone, Copy)]
enum Workload {
    /// A training run keeping every GPU busy.
    Training(&'static str, &'static str),
    /// An inference endpoint following the day: busy by day, quiet at night.
    Inference(&'static str, &'static str),
    /// A notebook holding memory and doing nothing.
    HeldIdle(&'static str),
    /// Nothing at all.
    Idle,
}

fn fleet() -> Vec<HostSpec> {
    let mut hosts = Vec::new();
    for i in 0..4 {
        hosts.push(HostSpec {
            cluster: "train-east",
            hostname: format!("train-east-{i:02}"),
            instance_type: "p4d.24xlarge",
            gpu_name: "NVIDIA A100-SXM4-80GB",
            gpu_mem: 80 * GIB,
            gpus: 8,
            workload: if i < 3 {
                Workload::Training("llama-70b-ft", "exp-lr-sweep-3")
            } else {
                Workload::HeldIdle("research")
            },
        });
    }
    for i in 0..3 {
        hosts.push(HostSpec {
            cluster: "serve-west",
            hostname: format!("serve-west-{i:02}"),
            instance_type: "g5.12xlarge",
            gpu_name: "NVIDIA A10G",
            gpu_mem: 24 * GIB,
            gpus: 4,
            workload: Workload::Inference("chat-api", "mistral-7b"),
        });
    }
    hosts.push(HostSpec {
        cluster: "serve-west",
        hostname: "serve-west-big".into(),
        instance_type: "p4de.24xlarge",
        gpu_name: "NVIDIA A100-SXM4-80GB",
        gpu_mem: 80 * GIB,
        gpus: 8,
        workload: Workload::Inference("embeddings", "bge-large"),
    });
    for i in 0..2 {
        hosts.push(HostSpec {
            cluster: "scratch",
            hostname: format!("scratch-{i:02}"),
            instance_type: "p5.48xlarge",
            gpu_name: "NVIDIA H100 80GB HBM3",
            gpu_mem: 80 * GIB,
            gpus: 8,
            workload: Workload::Idle,
        });
    }
    hosts
}

/// A cheap deterministic wobble in [0, 1) so the demo looks alive but is reproducible.
fn wobble(seed: u64) -> f64 {
    let x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((x >> 33) % 1000) as f64 / 1000.0
}

fn gpu_window(spec: &HostSpec, g: u32, t_ms: i64) -> GpuWindow {
    let seed = (t_ms as u64 / 1000) ^ (u64::from(g) << 40) ^ spec.hostname.len() as u64;
    let hour = (t_ms / 3_600_000) % 24;
    let (util, mem, proc_labels): (f64, u64, Option<BTreeMap<String, String>>) = match spec.workload
    {
        Workload::Training(model, exp) => (
            85.0 + 10.0 * wobble(seed),
            spec.gpu_mem * 9 / 10,
            Some(BTreeMap::from([
                ("model".into(), model.into()),
                ("experiment".into(), exp.into()),
                ("team".into(), "foundation".into()),
            ])),
        ),
        Workload::Inference(endpoint, model) => {
            let daytime = (8..20).contains(&hour);
            let base = if daytime { 55.0 } else { 12.0 };
            (
                base + 15.0 * wobble(seed),
                if spec.gpu_mem > 40 * GIB {
                    10 * GIB
                } else {
                    14 * GIB
                },
                Some(BTreeMap::from([
                    ("endpoint".into(), endpoint.into()),
                    ("model".into(), model.into()),
                    ("team".into(), "applied".into()),
                ])),
            )
        }
        Workload::HeldIdle(team) => (
            0.5 * wobble(seed),
            30 * GIB,
            Some(BTreeMap::from([
                ("team".into(), team.into()),
                ("experiment".into(), "notebook".into()),
            ])),
        ),
        Workload::Idle => (0.0, 0, None),
    };
    let processes = proc_labels
        .map(|labels| {
            vec![ProcessWindow {
                pid: 10_000 + g,
                name: Some("python3".into()),
                memory_used_max_bytes: Some(mem),
                sm_util_avg: Some((util - 2.0).max(0.0)),
                labels,
                ..Default::default()
            }]
        })
        .unwrap_or_default();
    let watts = 60.0 + 3.2 * util;
    GpuWindow {
        uuid: format!("GPU-demo-{}-{g}", spec.hostname),
        index: g,
        name: spec.gpu_name.into(),
        parent_uuid: None,
        memory_total_bytes: Some(spec.gpu_mem),
        memory_used_max_bytes: Some(mem),
        util_avg: Some(util),
        util_max: Some((util + 5.0).min(100.0)),
        mem_util_avg: Some(util / 2.0),
        power_avg_watts: Some(watts),
        temperature_max_c: Some(35.0 + util / 3.0),
        energy_mj: Some((watts * WINDOW_MS as f64) as u64),
        processes,
    }
}

/// Ingests `hours` of one-minute windows for the simulated fleet, ending now.
pub async fn seed(
    store: &dyn Store,
    token_id: i64,
    now_ms: i64,
    hours: i64,
) -> Result<usize, StoreError> {
    let end = now_ms - now_ms % WINDOW_MS;
    let start = end - hours * 3_600_000;
    let limits = Limits::default();
    let mut batches = 0;
    for spec in fleet() {
        let host = HostInfo {
            hostname: spec.hostname.clone(),
            cluster: spec.cluster.into(),
            provider: Some("aws".into()),
            instance_id: Some(format!("i-demo{:0>13}", spec.hostname.replace('-', ""))),
            instance_type: Some(spec.instance_type.into()),
            region: Some("us-east-1".into()),
            lifecycle: Some("on_demand".into()),
        };
        // One report per hour of windows, as an agent catching up after an outage would send.
        let mut t = start;
        while t < end {
            let hour_end = (t + 3_600_000).min(end);
            let mut windows = Vec::new();
            while t < hour_end {
                windows.push(Window {
                    start_ms: t,
                    end_ms: t + WINDOW_MS,
                    samples: 60,
                    gpus: (0..spec.gpus).map(|g| gpu_window(&spec, g, t)).collect(),
                });
                t += WINDOW_MS;
            }
            let report = Report {
                batch_id: format!("demo-{}-{}", spec.hostname, t),
                agent_version: "demo".into(),
                host: host.clone(),
                windows,
            };
            validate::validate(&report, now_ms, &limits)
                .map_err(|e| StoreError::Invalid(e.to_string()))?;
            store
                .ingest(&report, token_id, AgentStatus::default(), now_ms)
                .await?;
            batches += 1;
        }
    }
    Ok(batches)
}
