//! NVIDIA's dcgm-exporter as a source, for fleets that run it already: its Prometheus endpoint
//! read each tick into the same [`DeviceSample`]s NVML gives, so the same windows, reports and
//! attribution follow.
//!
//! What the exporter says (its text format, `etc/default-counters.csv`, and the Kubernetes
//! mapping from the kubelet's PodResources API):
//! - each series carries `gpu` (index), `UUID` (`uuid` with `--use-old-namespace`), `modelName`
//!   and, for a MIG GPU instance, `GPU_I_PROFILE` (`3g.40gb`) and `GPU_I_ID`; in its default
//!   device mode a GPU in MIG mode has only per-instance series, named by its own UUID;
//! - a GPU (or instance) allocated to a pod carries `namespace`, `pod`, `container` (`pod_uid`
//!   where enabled); read through Prometheus they may be `exported_*`, with the old namespace
//!   `pod_namespace`, `pod_name`, `container_name`;
//! - utilization is `DCGM_FI_DEV_GPU_UTIL` (percent; not on MIG instances) or
//!   `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (a 0–1 ratio, per instance too); frame buffer in MiB; power
//!   in W; energy a millijoule counter. dcgm-exporter 4.9 renames these to DCGM 4.7's names and
//!   units (`DCGM_FI_DEV_GPU_UTIL_RATIO`, `DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO`,
//!   `DCGM_FI_DEV_FB_USED_BYTES`, `DCGM_FI_DEV_BOARD_POWER_WATTS`,
//!   `DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL`, …): both names are read, each in its own unit.
//!
//! The exporter lists pods, not processes: each pod on a device becomes one process of the
//! report, named by its container, with the pod's namespace, name and container as its labels
//! (the namespace is its team by default) and a stable made-up pid. Memory in use on a device
//! no pod holds is reported as held by processes the agent cannot see.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use gpuledger_proto::MigPlacement;

use crate::collect::{CollectError, DeviceSample, GpuSource, ProcessSample};
use crate::owners::Owner;

const MIB: f64 = 1024.0 * 1024.0;

/// What a series measures, whatever the exporter's version calls it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Field {
    /// GPU utilization, percent.
    Util,
    /// Graphics engine activity, 0–1 (the only activity a MIG instance has).
    GrActive,
    /// Memory-controller utilization, percent.
    MemUtil,
    /// DRAM activity, 0–1.
    DramActive,
    FbUsed,
    FbFree,
    FbReserved,
    FbTotal,
    Watts,
    /// Energy counter, millijoules.
    EnergyMj,
    Celsius,
}

/// Metric names (upper-cased: `--use-old-namespace` writes them lower-case) and what each is,
/// with the factor to its field's unit.
const METRICS: &[(&str, Field, f64)] = &[
    ("DCGM_FI_DEV_GPU_UTIL", Field::Util, 1.0),
    ("DCGM_FI_DEV_GPU_UTIL_RATIO", Field::Util, 100.0),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", Field::GrActive, 1.0),
    ("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", Field::GrActive, 1.0),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", Field::MemUtil, 1.0),
    ("DCGM_FI_DEV_MEM_COPY_UTIL_RATIO", Field::MemUtil, 100.0),
    ("DCGM_FI_PROF_DRAM_ACTIVE", Field::DramActive, 1.0),
    ("DCGM_FI_PROF_DRAM_UTIL_RATIO", Field::DramActive, 1.0),
    ("DCGM_FI_DEV_FB_USED", Field::FbUsed, MIB),
    ("DCGM_FI_DEV_FB_USED_BYTES", Field::FbUsed, 1.0),
    ("DCGM_FI_DEV_FB_FREE", Field::FbFree, MIB),
    ("DCGM_FI_DEV_FB_FREE_BYTES", Field::FbFree, 1.0),
    ("DCGM_FI_DEV_FB_RESERVED", Field::FbReserved, MIB),
    ("DCGM_FI_DEV_FB_RESERVED_BYTES", Field::FbReserved, 1.0),
    ("DCGM_FI_DEV_FB_TOTAL", Field::FbTotal, MIB),
    ("DCGM_FI_DEV_FB_CAPACITY_BYTES", Field::FbTotal, 1.0),
    ("DCGM_FI_DEV_FB_TOTAL_BYTES", Field::FbTotal, 1.0),
    ("DCGM_FI_DEV_POWER_USAGE", Field::Watts, 1.0),
    ("DCGM_FI_DEV_BOARD_POWER_WATTS", Field::Watts, 1.0),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", Field::EnergyMj, 1.0),
    (
        "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL",
        Field::EnergyMj,
        1000.0,
    ),
    ("DCGM_FI_DEV_GPU_TEMP", Field::Celsius, 1.0),
    ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", Field::Celsius, 1.0),
];

fn label<'a>(labels: &'a prometheus_parse::Labels, names: &[&str]) -> Option<&'a str> {
    names
        .iter()
        .find_map(|n| labels.get(n))
        .filter(|v| !v.is_empty())
}

/// A pod (and container) a device is allocated to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Pod {
    namespace: String,
    pod: String,
    container: Option<String>,
}

/// One GPU or MIG GPU instance, as its series describe it.
#[derive(Debug, Default)]
struct Device {
    index: u32,
    model: String,
    profile: Option<String>,
    /// Each field's value, and whether it came from a series naming a pod (per-pod values
    /// where the exporter splits a shared GPU; the device's own series wins).
    fields: BTreeMap<Field, (f64, bool)>,
    /// Each pod with its UID, where a series gives it.
    pods: BTreeMap<Pod, Option<String>>,
    /// Memory each pod holds, where the exporter splits a shared GPU by pod (`pod_uid` series).
    pod_memory: BTreeMap<Pod, u64>,
}

impl Device {
    fn get(&self, f: Field) -> Option<f64> {
        self.fields
            .get(&f)
            .map(|(v, _)| *v)
            .filter(|v| v.is_finite())
    }

    fn bytes(&self, f: Field) -> Option<u64> {
        self.get(f).map(|v| v.max(0.0).round() as u64)
    }

    /// The device's memory: used, and total as used + free + reserved where the exporter gives
    /// no total.
    fn memory(&self) -> (Option<u64>, Option<u64>) {
        let used = self.bytes(Field::FbUsed);
        let total = self.bytes(Field::FbTotal).or_else(|| {
            let free = self.bytes(Field::FbFree)?;
            Some(used.unwrap_or(0) + free + self.bytes(Field::FbReserved).unwrap_or(0))
        });
        (used, total)
    }

    fn percent(&self, percent: Field, ratio: Field) -> Option<u32> {
        self.get(percent)
            .or_else(|| self.get(ratio).map(|r| r * 100.0))
            .map(|p| p.round().clamp(0.0, 100.0) as u32)
    }
}

/// The compute slices of a GPU in MIG mode, by its model (dcgm-exporter does not say): 4 on an
/// A30 and an RTX PRO 6000, 7 on A100, H100, H200 and B200.
fn compute_slices(model: &str) -> u32 {
    if model.contains("A30") || model.contains("RTX PRO 6000") {
        4
    } else {
        7
    }
}

/// A process id for a pod's container, stable from one scrape to the next (FNV-1a of its
/// names), in a range real pids never reach.
fn pod_pid(pod: &Pod) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    let key = format!(
        "{}/{}/{}",
        pod.namespace,
        pod.pod,
        pod.container.as_deref().unwrap_or("")
    );
    for b in key.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    0x4000_0000 | (h & 0x3fff_ffff)
}

/// The device's pods as processes, sharing its memory in use.
fn processes(d: &Device) -> Vec<ProcessSample> {
    let used = d.bytes(Field::FbUsed);
    let n = d.pods.len().max(1) as u64;
    d.pods
        .iter()
        .map(|(p, uid)| {
            let mut labels = BTreeMap::from([
                ("k8s_namespace".to_owned(), p.namespace.clone()),
                ("k8s_pod".to_owned(), p.pod.clone()),
            ]);
            if let Some(c) = &p.container {
                labels.insert("k8s_container".into(), c.clone());
            }
            ProcessSample {
                pid: pod_pid(p),
                name: p.container.clone().or_else(|| Some(p.pod.clone())),
                memory_used_bytes: d.pod_memory.get(p).copied().or(used.map(|u| u / n)),
                sm_util: None,
                owner: Some(Owner {
                    labels,
                    pod_uid: uid.clone(),
                    ..Default::default()
                }),
            }
        })
        .collect()
}

/// The GPUs and MIG devices a scrape of dcgm-exporter describes.
pub fn devices(text: &str) -> Result<Vec<DeviceSample>, String> {
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .map_err(|e| format!("not the Prometheus text format: {e}"))?;
    // Per (GPU UUID, GPU instance id).
    let mut found: BTreeMap<(String, Option<u32>), Device> = BTreeMap::new();
    let mut recognised = 0usize;
    for s in &scrape.samples {
        let name = s.metric.to_ascii_uppercase();
        let Some((_, field, factor)) = METRICS.iter().find(|(n, ..)| *n == name) else {
            continue;
        };
        let value = match s.value {
            prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Untyped(v) => v * factor,
            _ => continue,
        };
        let Some(uuid) = label(&s.labels, &["UUID", "uuid"]) else {
            continue;
        };
        recognised += 1;
        let instance = label(&s.labels, &["GPU_I_ID"]).and_then(|i| i.parse().ok());
        let d = found.entry((uuid.to_owned(), instance)).or_default();
        d.index = label(&s.labels, &["gpu"])
            .and_then(|i| i.parse().ok())
            .unwrap_or(d.index);
        if let Some(m) = label(&s.labels, &["modelName", "model_name"]) {
            d.model = m.to_owned();
        }
        if let Some(p) = label(&s.labels, &["GPU_I_PROFILE"]) {
            d.profile = Some(p.to_owned());
        }
        let namespace = label(
            &s.labels,
            &["namespace", "exported_namespace", "pod_namespace"],
        );
        let pod = label(&s.labels, &["pod", "exported_pod", "pod_name"]);
        let of_pod = match (namespace, pod) {
            (Some(namespace), Some(pod)) => {
                let pod = Pod {
                    namespace: namespace.to_owned(),
                    pod: pod.to_owned(),
                    container: label(
                        &s.labels,
                        &["container", "exported_container", "container_name"],
                    )
                    .map(str::to_owned),
                };
                let uid = label(&s.labels, &["pod_uid"]);
                if let (Some(_), Field::FbUsed) = (uid, field) {
                    d.pod_memory
                        .insert(pod.clone(), value.max(0.0).round() as u64);
                }
                let known = d.pods.entry(pod).or_default();
                if let Some(u) = uid {
                    *known = Some(u.to_owned());
                }
                true
            }
            _ => false,
        };
        match d.fields.get(field) {
            Some((_, from_pod)) if !from_pod || of_pod => {}
            _ => {
                d.fields.insert(*field, (value, of_pod));
            }
        }
    }
    if recognised == 0 && !scrape.samples.is_empty() {
        return Err(format!(
            "{} series, none dcgm-exporter's GPU metrics (is this dcgm-exporter's /metrics?)",
            scrape.samples.len()
        ));
    }
    Ok(samples(&found))
}

fn samples(found: &BTreeMap<(String, Option<u32>), Device>) -> Vec<DeviceSample> {
    let mut out = Vec::new();
    let whole = |uuid: &str| found.get(&(uuid.to_owned(), None));
    let gpus: BTreeSet<&str> = found.keys().map(|(u, _)| u.as_str()).collect();
    for uuid in gpus {
        let instances: Vec<(u32, &Device)> = found
            .iter()
            .filter_map(|((u, i), d)| (u == uuid).then_some((*i)?).map(|i| (i, d)))
            .collect();
        let gpu = whole(uuid);
        // The GPU itself: its own series, or (MIG mode, default device mode) what its
        // instances repeat of the board (power, temperature, energy) and add up to (memory).
        let board = gpu.or_else(|| instances.first().map(|(_, d)| *d));
        let Some(board) = board else {
            continue;
        };
        let (mut used, mut total) = gpu.map_or((None, None), Device::memory);
        if gpu.is_none() {
            let parts: Vec<(Option<u64>, Option<u64>)> =
                instances.iter().map(|(_, d)| d.memory()).collect();
            used = parts.iter().map(|p| p.0).sum();
            total = parts.iter().map(|p| p.1).sum();
        }
        let mut parent = DeviceSample {
            uuid: uuid.to_owned(),
            index: board.index,
            name: board.model.clone(),
            memory_total_bytes: total,
            memory_used_bytes: used,
            power_mw: board.get(Field::Watts).map(|w| (w * 1000.0).round() as u32),
            temperature_c: board.get(Field::Celsius).map(|c| c.round() as u32),
            energy_counter_mj: board.get(Field::EnergyMj).map(|e| e.round() as u64),
            ..Default::default()
        };
        if instances.is_empty() {
            parent.gpu_util = board.percent(Field::Util, Field::GrActive);
            parent.mem_util = board.percent(Field::MemUtil, Field::DramActive);
            parent.processes = processes(board);
            if parent.processes.is_empty() {
                parent.unseen_memory_bytes = used;
            }
            out.push(parent);
            continue;
        }
        parent.mig_compute_slices = Some(compute_slices(&board.model));
        out.push(parent);
        for (gi, d) in instances {
            let (used, total) = d.memory();
            let slices = d
                .profile
                .as_deref()
                .and_then(|p| p.split('g').next())
                .and_then(|n| n.parse().ok())
                .filter(|n| *n >= 1);
            let procs = processes(d);
            out.push(DeviceSample {
                uuid: format!("MIG-{}-gi{gi}", uuid.trim_start_matches("GPU-")),
                index: d.index,
                name: match &d.profile {
                    Some(p) => format!("{} MIG {p}", d.model),
                    None => d.model.clone(),
                },
                parent_uuid: Some(uuid.to_owned()),
                memory_total_bytes: total,
                memory_used_bytes: used,
                // DCGM_FI_DEV_GPU_UTIL is not measured on an instance (0 or absent): its
                // graphics engine's activity is.
                gpu_util: d
                    .get(Field::GrActive)
                    .map(|r| (r * 100.0).round().clamp(0.0, 100.0) as u32),
                mem_util: d
                    .get(Field::DramActive)
                    .map(|r| (r * 100.0).round().clamp(0.0, 100.0) as u32),
                unseen_memory_bytes: if procs.is_empty() { used } else { None },
                processes: procs,
                mig: slices.map(|s| MigPlacement {
                    gpu_instance_id: gi,
                    compute_instance_id: 0,
                    profile: d.profile.clone(),
                    gpu_instance_slices: s,
                    compute_instance_slices: s,
                }),
                ..Default::default()
            });
        }
    }
    out
}

/// The exporter's endpoint, read each tick.
pub struct DcgmSource {
    url: String,
    client: reqwest::Client,
    /// The agent's runtime: sampling runs on a blocking thread, which waits for the request on it.
    runtime: tokio::runtime::Handle,
    /// Whether the last scrape failed (a failure is logged once, and the recovery).
    failing: bool,
}

impl DcgmSource {
    /// Must be made inside the agent's runtime.
    pub fn new(url: String, timeout: Duration) -> anyhow::Result<Self> {
        Ok(DcgmSource {
            url,
            client: reqwest::Client::builder().timeout(timeout).build()?,
            runtime: tokio::runtime::Handle::current(),
            failing: false,
        })
    }
}

impl GpuSource for DcgmSource {
    fn sample(&mut self) -> Result<Vec<DeviceSample>, CollectError> {
        let read = self
            .runtime
            .block_on(crate::exposition::fetch(&self.client, &self.url))
            .and_then(|text| devices(&text));
        match read {
            Ok(samples) => {
                if self.failing {
                    tracing::info!(url = %self.url, "dcgm-exporter answers again");
                    self.failing = false;
                }
                Ok(samples)
            }
            Err(e) => {
                if !self.failing {
                    tracing::warn!(url = %self.url, error = %e, "dcgm-exporter cannot be read; its GPUs are unmonitored until it can");
                    self.failing = true;
                }
                Err(CollectError::Source(format!(
                    "dcgm-exporter at {}: {e}",
                    self.url
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fleet as dcgm-exporter up to 4.8 writes it (default counters, Kubernetes mode): an A100
    /// whole to one pod, an H100 in MIG mode (default device mode: instance series only) with a
    /// 3g.40gb for another pod and an empty one, an A10G nobody holds.
    const OLD: &str = r#"# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a1",pci_bus_id="00000000:10:1C.0",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15",container="model",namespace="search",pod="ranker-0"} 61
DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-b2",pci_bus_id="00000000:10:1D.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15",container="trainer",namespace="vision",pod="train-0"} 45
DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-b2",pci_bus_id="00000000:10:1D.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15"} 45
DCGM_FI_DEV_GPU_TEMP{gpu="2",UUID="GPU-c3",pci_bus_id="00000000:10:1E.0",device="nvidia2",modelName="NVIDIA A10G",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15"} 30
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a1",pci_bus_id="00000000:10:1C.0",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15",container="model",namespace="search",pod="ranker-0"} 312.400000
DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-b2",pci_bus_id="00000000:10:1D.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15",container="trainer",namespace="vision",pod="train-0"} 250.000000
DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-b2",pci_bus_id="00000000:10:1D.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15"} 250.000000
DCGM_FI_DEV_POWER_USAGE{gpu="2",UUID="GPU-c3",pci_bus_id="00000000:10:1E.0",device="nvidia2",modelName="NVIDIA A10G",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15"} 25.580000
# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-a1",pci_bus_id="00000000:10:1C.0",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15",container="model",namespace="search",pod="ranker-0"} 4686000
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a1",pci_bus_id="00000000:10:1C.0",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15",container="model",namespace="search",pod="ranker-0"} 70
DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-c3",pci_bus_id="00000000:10:1E.0",device="nvidia2",modelName="NVIDIA A10G",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15"} 0
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-a1",pci_bus_id="00000000:10:1C.0",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15",container="model",namespace="search",pod="ranker-0"} 60611
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-b2",pci_bus_id="00000000:10:1D.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15",container="trainer",namespace="vision",pod="train-0"} 30085
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-b2",pci_bus_id="00000000:10:1D.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15"} 40325
DCGM_FI_DEV_FB_FREE{gpu="2",UUID="GPU-c3",pci_bus_id="00000000:10:1E.0",device="nvidia2",modelName="NVIDIA A10G",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15"} 22593
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a1",pci_bus_id="00000000:10:1C.0",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15",container="model",namespace="search",pod="ranker-0"} 20480
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-b2",pci_bus_id="00000000:10:1D.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15",container="trainer",namespace="vision",pod="train-0"} 10240
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-b2",pci_bus_id="00000000:10:1D.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15"} 0
DCGM_FI_DEV_FB_USED{gpu="2",UUID="GPU-c3",pci_bus_id="00000000:10:1E.0",device="nvidia2",modelName="NVIDIA A10G",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15"} 0
# HELP DCGM_FI_DEV_FB_RESERVED Framebuffer memory reserved (in MiB).
# TYPE DCGM_FI_DEV_FB_RESERVED gauge
DCGM_FI_DEV_FB_RESERVED{gpu="0",UUID="GPU-a1",pci_bus_id="00000000:10:1C.0",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15",container="model",namespace="search",pod="ranker-0"} 829
DCGM_FI_DEV_FB_RESERVED{gpu="2",UUID="GPU-c3",pci_bus_id="00000000:10:1E.0",device="nvidia2",modelName="NVIDIA A10G",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15"} 435
# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.
# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-a1",pci_bus_id="00000000:10:1C.0",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15",container="model",namespace="search",pod="ranker-0"} 0.693000
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="1",UUID="GPU-b2",pci_bus_id="00000000:10:1D.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15",container="trainer",namespace="vision",pod="train-0"} 0.500000
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="1",UUID="GPU-b2",pci_bus_id="00000000:10:1D.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15"} 0.000000
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="2",UUID="GPU-c3",pci_bus_id="00000000:10:1E.0",device="nvidia2",modelName="NVIDIA A10G",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15"} 0.000000
"#;

    /// The same fleet with dcgm-exporter 4.9's names and units (DCGM 4.7: ratios, bytes,
    /// joules) and its `hostname` label.
    fn renamed() -> String {
        let mut text = OLD
            .replace("Hostname=", "hostname=")
            .replace("DCGM_FI_DRIVER_VERSION=", "DCGM_FI_SYSTEM_DRIVER_VERSION=")
            .replace("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS")
            .replace("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS")
            .replace(
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
            );
        // Unit changes: percent to ratio, MiB to bytes, millijoules to joules.
        let mut out = String::new();
        for line in text.lines() {
            let converted = match line.rsplit_once(' ') {
                Some((head, v)) if !line.starts_with('#') => {
                    let v: f64 = v.parse().unwrap();
                    let (name, factor) = if head.starts_with("DCGM_FI_DEV_GPU_UTIL{") {
                        (
                            head.replacen("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO", 1),
                            0.01,
                        )
                    } else if head.starts_with("DCGM_FI_DEV_FB_") {
                        let name = head.split('{').next().unwrap();
                        (head.replacen(name, &format!("{name}_BYTES"), 1), MIB)
                    } else if head.starts_with("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") {
                        (
                            head.replacen(
                                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                                "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL",
                                1,
                            ),
                            0.001,
                        )
                    } else {
                        (head.to_owned(), 1.0)
                    };
                    format!("{name} {:.6}", v * factor)
                }
                _ => line.to_owned(),
            };
            out.push_str(&converted);
            out.push('\n');
        }
        text = out;
        text
    }

    #[test]
    fn a_fleet_reads_as_the_agent_reads_it() {
        let got = devices(OLD).unwrap();
        let uuids: Vec<&str> = got.iter().map(|d| d.uuid.as_str()).collect();
        assert_eq!(
            uuids,
            ["GPU-a1", "GPU-b2", "MIG-b2-gi1", "MIG-b2-gi2", "GPU-c3"]
        );
        let a100 = &got[0];
        assert_eq!(
            (a100.index, a100.name.as_str()),
            (0, "NVIDIA A100-SXM4-80GB")
        );
        assert_eq!(
            (a100.gpu_util, a100.power_mw, a100.temperature_c),
            (Some(70), Some(312_400), Some(61))
        );
        assert_eq!(a100.energy_counter_mj, Some(4_686_000));
        assert_eq!(a100.memory_used_bytes, Some(20480 << 20));
        assert_eq!(a100.memory_total_bytes, Some((20480 + 60611 + 829) << 20));
        let ranker = &a100.processes[0];
        let labels = &ranker.owner.as_ref().unwrap().labels;
        assert_eq!(
            (
                labels["k8s_namespace"].as_str(),
                labels["k8s_pod"].as_str(),
                labels["k8s_container"].as_str()
            ),
            ("search", "ranker-0", "model")
        );
        assert_eq!(
            (
                ranker.name.as_deref(),
                ranker.memory_used_bytes,
                ranker.sm_util
            ),
            (Some("model"), Some(20480 << 20), None)
        );
        assert_eq!(a100.unseen_memory_bytes, None, "a pod holds it");
        // MIG: the GPU from what its instances repeat, each instance by its slices.
        let h100 = &got[1];
        assert_eq!(
            (h100.mig_compute_slices, h100.power_mw, h100.gpu_util),
            (Some(7), Some(250_000), None)
        );
        assert_eq!(h100.memory_used_bytes, Some(10240 << 20));
        let busy = &got[2];
        assert_eq!(
            (busy.parent_uuid.as_deref(), busy.gpu_util, busy.index),
            (Some("GPU-b2"), Some(50), 1)
        );
        let placed = busy.mig.as_ref().unwrap();
        assert_eq!(
            (
                placed.gpu_instance_id,
                placed.gpu_instance_slices,
                placed.compute_instance_slices
            ),
            (1, 3, 3)
        );
        assert_eq!(busy.name, "NVIDIA H100 80GB HBM3 MIG 3g.40gb");
        assert_eq!(
            busy.processes[0].owner.as_ref().unwrap().labels["k8s_namespace"],
            "vision"
        );
        assert_eq!((got[3].gpu_util, got[3].processes.len()), (Some(0), 0));
        // Nobody holds the A10G: its memory in use (none) is nobody's it can see.
        assert_eq!(
            (got[4].gpu_util, got[4].unseen_memory_bytes),
            (Some(0), Some(0))
        );
        // The pid of a pod's container is the same at every scrape.
        assert_eq!(devices(OLD).unwrap()[0].processes[0].pid, ranker.pid);
    }

    #[test]
    fn dcgm_exporter_4_9_names_and_units_read_the_same() {
        assert_eq!(devices(&renamed()).unwrap(), devices(OLD).unwrap());
    }

    /// `--use-old-namespace`: lower-case metric names, `uuid`, and the old pod label names.
    #[test]
    fn the_old_namespace_reads_the_same() {
        let old = OLD
            .lines()
            .map(|l| match l.split_once('{') {
                Some((name, rest)) if !l.starts_with('#') => {
                    format!("{}{{{rest}", name.to_ascii_lowercase())
                }
                _ => l.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n")
            .replace("UUID=", "uuid=")
            .replace("container=", "container_name=")
            .replace("namespace=", "pod_namespace=")
            .replace("pod=", "pod_name=");
        assert_eq!(devices(&old).unwrap(), devices(OLD).unwrap());
    }

    /// Time-slicing with `--kubernetes-virtual-gpus`: each series repeated per pod (`vgpu`), and
    /// per-pod memory series beside the device's own: two processes, the device's own figures.
    #[test]
    fn a_shared_gpu_is_one_device_with_a_process_per_pod() {
        let line = |metric: &str, extra: &str, v: &str| {
            format!("{metric}{{gpu=\"0\",UUID=\"GPU-s\",pci_bus_id=\"\",device=\"nvidia0\",modelName=\"NVIDIA L4\",Hostname=\"n\"{extra}}} {v}\n")
        };
        let a = ",container=\"chat\",namespace=\"chat\",pod=\"chat-a\",vgpu=\"0\"";
        let b = ",container=\"chat\",namespace=\"chat\",pod=\"chat-b\",vgpu=\"1\"";
        let text = [
            line("DCGM_FI_DEV_GPU_UTIL", a, "60"),
            line("DCGM_FI_DEV_GPU_UTIL", b, "60"),
            line("DCGM_FI_DEV_FB_USED", "", "8000"),
            line(
                "DCGM_FI_DEV_FB_USED",
                &format!("{a},pod_uid=\"u-a\""),
                "5000",
            ),
            line(
                "DCGM_FI_DEV_FB_USED",
                &format!("{b},pod_uid=\"u-b\""),
                "3000",
            ),
            line("DCGM_FI_DEV_FB_FREE", "", "14000"),
        ]
        .concat();
        let got = devices(&text).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].memory_used_bytes,
            Some(8000 << 20),
            "the device's own series"
        );
        assert_eq!(got[0].gpu_util, Some(60));
        let pods: Vec<&str> = got[0]
            .processes
            .iter()
            .map(|p| p.owner.as_ref().unwrap().labels["k8s_pod"].as_str())
            .collect();
        assert_eq!(pods, ["chat-a", "chat-b"]);
        // Each pod's own memory, where the exporter splits it.
        let memory: Vec<Option<u64>> = got[0]
            .processes
            .iter()
            .map(|p| p.memory_used_bytes)
            .collect();
        assert_eq!(memory, [Some(5000 << 20), Some(3000 << 20)]);
        assert_eq!(
            got[0].processes[0]
                .owner
                .as_ref()
                .unwrap()
                .pod_uid
                .as_deref(),
            Some("u-a")
        );
        assert_ne!(got[0].processes[0].pid, got[0].processes[1].pid);
    }

    #[test]
    fn another_exporter_or_garbage_is_said_so() {
        let e = devices("# TYPE up gauge\nup{job=\"node\"} 1\n").unwrap_err();
        assert!(e.contains("none dcgm-exporter's GPU metrics"), "{e}");
        // Lines it cannot read are skipped; an empty scrape is no GPU.
        assert!(devices("not a metric line\n\n").unwrap().is_empty());
    }
}
