//! Finding idle capacity in the reported windows.
//!
//! A GPU is **idle** when its utilization has stayed under the cluster's threshold, with no
//! process holding its memory, for the cluster's duration; a host when all its GPUs are; a
//! cluster when all its reporting hosts are. A process is **holding a GPU idle** when it keeps
//! memory at ~0% SM utilization for that duration. Findings name the widest idle scope: a whole
//! cluster, else whole hosts, else the idle GPUs of a host; held-idle processes on their own.
//!
//! A host that stopped reporting is not idle, it is unmonitored: it yields nothing here.
//!
//! A GPU that **could not be read** (lost, a fatal XID, the driver away) for [`FAULT_AFTER_MS`]
//! while showing no work is a fault: one finding per host, naming each GPU's fault. Its time is
//! idle in the ledger; the finding says why.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use crate::activity::{self, Activity};
use crate::idle::IdleConfig;
use crate::telemetry::{gpu_label, AttributionWindow, HostRow, StoredProcessWindow};

/// Windows further apart than this break an idle run (the agent was away).
pub const MAX_GAP_MS: i64 = 3 * 60_000;
/// A host whose last window ended longer ago than this is not reporting.
pub const STALE_AFTER_MS: i64 = 5 * 60_000;
/// How long a GPU stays unreadable before it is an incident: a driver reload takes seconds, a
/// GPU that fell off the bus stays off until someone acts.
pub const FAULT_AFTER_MS: i64 = 5 * 60_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum IncidentKind {
    ClusterIdle,
    HostIdle,
    GpusIdle,
    HeldIdle,
    /// GPUs that could not be read (lost, a fatal XID, the driver away).
    GpuFault,
}

impl IncidentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            IncidentKind::ClusterIdle => "cluster_idle",
            IncidentKind::HostIdle => "host_idle",
            IncidentKind::GpusIdle => "gpus_idle",
            IncidentKind::HeldIdle => "held_idle",
            IncidentKind::GpuFault => "gpu_fault",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::ClusterIdle,
            Self::HostIdle,
            Self::GpusIdle,
            Self::HeldIdle,
            Self::GpuFault,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
    pub fn title(self) -> &'static str {
        match self {
            IncidentKind::ClusterIdle => "Idle cluster",
            IncidentKind::HostIdle => "Idle host",
            IncidentKind::GpusIdle => "Idle GPUs",
            IncidentKind::HeldIdle => "GPU held idle",
            IncidentKind::GpuFault => "GPU fault",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// Stable while the same thing stays idle: the incident it belongs to.
    pub key: String,
    pub kind: IncidentKind,
    pub cluster: String,
    pub hostname: Option<String>,
    pub host_ids: Vec<i64>,
    /// Physical GPUs idle (for held idle: the GPU or MIG instance held).
    pub gpus: Vec<String>,
    /// Physical-GPU equivalents the finding stands for (a MIG instance is a fraction).
    pub gpu_equivalents: f64,
    /// Owner labels of a held-idle process.
    pub owners: BTreeMap<String, String>,
    /// The processes holding the GPUs idle (held-idle findings only).
    pub processes: Vec<HeldProcess>,
    /// Each faulted GPU's fault, in words (fault findings only).
    pub faults: BTreeMap<String, String>,
    pub since_ms: i64,
}

/// A process holding a GPU idle, as a person would look for it: on which GPU, its pid and name,
/// who runs it and its owner labels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HeldProcess {
    pub gpu_uuid: String,
    pub pid: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub owners: BTreeMap<String, String>,
}

impl HeldProcess {
    /// `pid 4242 python3, user ana, team=research experiment=notebook`.
    pub fn describe(&self) -> String {
        if self.pid == UNSEEN_PID {
            return "processes the agent cannot see (`gpuledger-agent once` on the host says why)"
                .into();
        }
        let mut out = format!("pid {}", self.pid);
        if let Some(n) = &self.name {
            out.push_str(&format!(" {n}"));
        }
        if let Some(u) = &self.user {
            out.push_str(&format!(", user {u}"));
        }
        if !self.owners.is_empty() {
            let owners: Vec<String> = self
                .owners
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            out.push_str(&format!(", {}", owners.join(" ")));
        }
        out
    }
}

/// One GPU of an incident, named as `nvidia-smi` names it on its host, with the processes
/// holding it idle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct IdleDevice {
    pub host: String,
    pub uuid: String,
    /// NVML index (a MIG instance has its GPU's); `None` when the GPU is no longer listed.
    pub index: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<HeldProcess>,
    /// What went wrong with it, in words (fault incidents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
}

impl IdleDevice {
    /// `#3` (a MIG device `#3 MIG …a1b2c3`), or the end of its UUID where the index is unknown.
    pub fn label(&self) -> String {
        // NVML names every MIG device `MIG-…`.
        gpu_label(self.index, &self.uuid, self.uuid.starts_with("MIG-"))
    }
}

/// An incident's GPUs as lines a person reads: per host the idle GPUs by index
/// (`scratch-00: GPU #0, #1, #2`), and a line per process holding one
/// (`train-east-07 GPU #3: pid 4242 python3, user ana, team=research`).
pub fn describe_devices(devices: &[IdleDevice]) -> Vec<String> {
    let mut hosts: Vec<&str> = Vec::new();
    for d in devices {
        if !hosts.contains(&d.host.as_str()) {
            hosts.push(&d.host);
        }
    }
    let mut lines = Vec::new();
    for host in hosts {
        let mine: Vec<&IdleDevice> = devices.iter().filter(|d| d.host == host).collect();
        let bare: Vec<String> = mine
            .iter()
            .filter(|d| d.processes.is_empty() && d.fault.is_none())
            .map(|d| d.label())
            .collect();
        if !bare.is_empty() {
            lines.push(format!("{host}: GPU {}", bare.join(", ")));
        }
        for d in &mine {
            if let Some(fault) = &d.fault {
                lines.push(format!("{host} GPU {}: {fault}", d.label()));
            }
        }
        for d in mine.iter().filter(|d| !d.processes.is_empty()) {
            for p in &d.processes {
                lines.push(format!("{host} GPU {}: {}", d.label(), p.describe()));
            }
        }
    }
    lines
}

/// The start of the trailing run of windows for which `idle` holds, if the run reaches the
/// latest window and that window is recent.
fn idle_since<'a>(
    windows: &[&'a AttributionWindow],
    now_ms: i64,
    mut idle: impl FnMut(&'a AttributionWindow) -> bool,
) -> Option<i64> {
    let last = windows.last()?;
    if last.end_ms < now_ms - STALE_AFTER_MS {
        return None;
    }
    let mut since = None;
    let mut next_start: Option<i64> = None;
    for w in windows.iter().rev() {
        let gap = next_start.map_or(0, |n| n - w.end_ms);
        if !idle(w) || gap > MAX_GAP_MS {
            break;
        }
        since = Some(w.start_ms);
        next_start = Some(w.start_ms);
    }
    since
}

/// A host's idle state: since when all its GPUs are idle (if they all are), which are.
struct HostState<'a> {
    host_id: i64,
    since: Option<i64>,
    idle: Vec<&'a str>,
    all: Vec<&'a str>,
    /// Its GPUs in MIG mode: idle with all their devices, slices no device holds included.
    mig_gpus: Vec<&'a str>,
}

impl HostState<'_> {
    /// Every GPU of a wholly idle host: its units and its GPUs in MIG mode.
    fn whole(&self) -> impl Iterator<Item = String> + '_ {
        self.all.iter().chain(&self.mig_gpus).map(|g| g.to_string())
    }

    /// Its physical GPUs: the units that are whole GPUs, and the GPUs in MIG mode.
    fn physical(&self, by_device: &BTreeMap<(i64, &str), Leaf<'_>>) -> f64 {
        let whole = self
            .all
            .iter()
            .filter(|u| {
                by_device
                    .get(&(self.host_id, **u))
                    .is_none_or(|l| l.parent.is_none())
            })
            .count();
        (whole + self.mig_gpus.len()) as f64
    }
}

struct Leaf<'a> {
    uuid: &'a str,
    parent: Option<&'a str>,
    windows: Vec<&'a AttributionWindow>,
}

/// GPUs unreadable for [`FAULT_AFTER_MS`] with no work in sight, one finding per host. The
/// agent puts a fault on the physical GPU's window (a lost GPU is reported alone, its MIG
/// devices gone); a GPU in MIG mode whose devices still work is not faulted, whatever its XID.
fn faults(
    by_device: &BTreeMap<(i64, &str), Leaf<'_>>,
    host_by_id: &HashMap<i64, &HostRow>,
    procs: &HashMap<(&str, i64), Vec<&StoredProcessWindow>>,
    config: &IdleConfig,
    now_ms: i64,
) -> Vec<Finding> {
    let at = |uuid: &str, w: &AttributionWindow| {
        procs
            .get(&(uuid, w.start_ms))
            .map(|v| v.as_slice())
            .unwrap_or(&[])
            .to_vec()
    };
    let mut per_host: BTreeMap<i64, Finding> = BTreeMap::new();
    for ((host_id, uuid), gpu) in by_device.iter().filter(|(_, l)| l.parent.is_none()) {
        let Some(host) = host_by_id.get(host_id) else {
            continue;
        };
        let rules = config.thresholds(&host.cluster);
        let devices: Vec<&Leaf<'_>> = by_device
            .values()
            .filter(|l| l.parent == Some(*uuid))
            .collect();
        let device_works = |start: i64| {
            devices.iter().any(|d| {
                d.windows
                    .iter()
                    .filter(|w| w.start_ms == start)
                    .any(|w| rules.of_window(w, &at(d.uuid, w)).in_use())
            })
        };
        let since = idle_since(&gpu.windows, now_ms, |w| {
            rules.of_window(w, &at(uuid, w)) == Activity::Unknown && !device_works(w.start_ms)
        });
        let Some(since) = since.filter(|s| now_ms - s >= FAULT_AFTER_MS) else {
            continue;
        };
        let detail = gpu
            .windows
            .last()
            .and_then(|w| w.fault.as_ref())
            .map(|f| f.detail.clone())
            .unwrap_or_default();
        let f = per_host.entry(*host_id).or_insert_with(|| Finding {
            key: format!("fault:{}/{}", host.cluster, host.hostname),
            kind: IncidentKind::GpuFault,
            cluster: host.cluster.clone(),
            hostname: Some(host.hostname.clone()),
            host_ids: vec![*host_id],
            gpus: Vec::new(),
            gpu_equivalents: 0.0,
            owners: BTreeMap::new(),
            processes: Vec::new(),
            faults: BTreeMap::new(),
            since_ms: since,
        });
        f.gpus.push(uuid.to_string());
        f.gpu_equivalents += 1.0;
        f.faults.insert(uuid.to_string(), detail);
        f.since_ms = f.since_ms.max(since);
    }
    per_host.into_values().collect()
}

/// Physical-GPU equivalents of `units` of a host (a MIG device is part of one).
fn parts_of(
    host_gpus: &BTreeMap<i64, BTreeMap<&str, (Option<i64>, f64)>>,
    host_id: i64,
    units: &[&str],
) -> f64 {
    let Some(gpus) = host_gpus.get(&host_id) else {
        return 0.0;
    };
    units
        .iter()
        .filter_map(|u| gpus.get(u))
        .map(|(_, part)| part)
        .sum()
}

/// The pid a held-idle finding gives the processes the agent cannot see.
pub const UNSEEN_PID: i64 = 0;

/// The part of its physical GPU a device is: 1 for a GPU; a MIG device its compute slices of
/// its GPU's (as attribution prices it), or an equal part where slices are not reported.
fn gpu_part(leaf: &Leaf<'_>, by_device: &BTreeMap<(i64, &str), Leaf<'_>>, host_id: i64) -> f64 {
    let Some(parent) = leaf.parent else {
        return 1.0;
    };
    // Its part in its GPU's latest window, as attribution prices that window.
    let priced = leaf.windows.last().and_then(|mine| {
        let gpu = by_device
            .get(&(host_id, parent))?
            .windows
            .iter()
            .find(|w| w.start_ms == mine.start_ms)?;
        let devices: Vec<&AttributionWindow> = by_device
            .values()
            .filter(|l| l.parent == Some(parent))
            .filter_map(|l| {
                l.windows
                    .iter()
                    .find(|w| w.start_ms == mine.start_ms)
                    .copied()
            })
            .collect();
        let (parts, _) = crate::attribution::shares::mig_fractions(gpu, &devices);
        parts
            .into_iter()
            .find(|(d, _)| d.gpu_uuid == mine.gpu_uuid)
            .map(|(_, part)| part)
    });
    priced.unwrap_or_else(|| {
        let siblings = by_device
            .values()
            .filter(|l| l.parent == Some(parent))
            .count();
        1.0 / siblings.max(1) as f64
    })
}

/// One host's held-idle processes as one finding: its GPUs once each, the owners of all (values
/// joined where they differ), since the latest start (held idle together since then at least).
fn merge_held(mut parts: Vec<Finding>) -> Option<Finding> {
    let mut merged = parts.pop()?;
    let mut gpus: BTreeMap<String, f64> = merged
        .gpus
        .iter()
        .map(|g| (g.clone(), merged.gpu_equivalents))
        .collect();
    let mut owners: BTreeMap<String, BTreeSet<String>> = merged
        .owners
        .iter()
        .map(|(k, v)| (k.clone(), BTreeSet::from([v.clone()])))
        .collect();
    for p in parts {
        for g in &p.gpus {
            gpus.insert(g.clone(), p.gpu_equivalents);
        }
        merged.processes.extend(p.processes);
        for (k, v) in p.owners {
            owners.entry(k).or_default().insert(v);
        }
        merged.since_ms = merged.since_ms.max(p.since_ms);
    }
    merged
        .processes
        .sort_by(|a, b| (&a.gpu_uuid, a.pid).cmp(&(&b.gpu_uuid, b.pid)));
    merged.gpu_equivalents = gpus.values().sum();
    merged.gpus = gpus.into_keys().collect();
    merged.owners = owners
        .into_iter()
        .map(|(k, v)| (k, v.into_iter().collect::<Vec<_>>().join(", ")))
        .collect();
    Some(merged)
}

/// Devices per host: leaves are GPUs without MIG instances, and MIG instances.
type Devices<'a> = BTreeMap<(i64, &'a str), Leaf<'a>>;
/// Process windows per GPU and window start.
type Procs<'a> = HashMap<(&'a str, i64), Vec<&'a StoredProcessWindow>>;
/// Per host: each GPU, or MIG device of a GPU in MIG mode -> idle since (None = not idle) and
/// the part of a physical GPU it is.
type HostGpus<'a> = BTreeMap<i64, BTreeMap<&'a str, (Option<i64>, f64)>>;

pub fn find(
    hosts: &[HostRow],
    windows: &[AttributionWindow],
    processes: &[StoredProcessWindow],
    config: &IdleConfig,
    now_ms: i64,
) -> Vec<Finding> {
    let host_by_id: HashMap<i64, &HostRow> = hosts.iter().map(|h| (h.id, h)).collect();
    let mut procs: Procs = HashMap::new();
    for p in processes {
        procs
            .entry((p.gpu_uuid.as_str(), p.start_ms))
            .or_default()
            .push(p);
    }
    let (by_device, parents) = devices(windows);

    let mut findings = Vec::new();
    // Held-idle processes per host: one incident (and one Slack message) per host, listing its
    // GPUs, not one per GPU or process.
    let mut held: BTreeMap<i64, Vec<Finding>> = BTreeMap::new();
    let mut host_gpus: HostGpus = BTreeMap::new();
    for ((host_id, uuid), leaf) in &by_device {
        let Some(host) = host_by_id.get(host_id) else {
            continue;
        };
        let (_, duration) = config.for_cluster(&host.cluster);
        let rules = config.thresholds(&host.cluster);
        let duration_ms = duration.as_millis() as i64;
        if parents.contains(&(*host_id, *uuid)) {
            // A MIG-mode GPU: each of its devices is idle or not on its own.
            continue;
        }
        let at = |w: &AttributionWindow| {
            procs
                .get(&(leaf.uuid, w.start_ms))
                .map(Vec::as_slice)
                .unwrap_or(&[])
        };
        let since = idle_since(&leaf.windows, now_ms, |w| {
            rules.of_window(w, at(w)) == Activity::Idle
        })
        .filter(|s| now_ms - s >= duration_ms);
        host_gpus
            .entry(*host_id)
            .or_default()
            .insert(uuid, (since, gpu_part(leaf, &by_device, *host_id)));
        let by_processes = held_by_processes(
            (leaf, host),
            (&rules, duration_ms),
            (&procs, &by_device),
            now_ms,
        );
        if !by_processes.is_empty() {
            held.entry(*host_id).or_default().extend(by_processes);
        }
    }

    findings.extend(held.into_values().filter_map(merge_held));
    findings.extend(faults(&by_device, &host_by_id, &procs, config, now_ms));
    findings.extend(idle_hosts_and_clusters(
        &host_gpus,
        (&parents, &by_device),
        &host_by_id,
        now_ms,
    ));
    findings.sort_by(|a, b| a.key.cmp(&b.key));
    findings
}

/// The windows' devices per host, each with its windows in time order, and the GPUs in MIG
/// mode (the parents of MIG devices).
fn devices(windows: &[AttributionWindow]) -> (Devices<'_>, BTreeSet<(i64, &str)>) {
    let mut by_device: Devices = BTreeMap::new();
    for w in windows {
        by_device
            .entry((w.host_id, w.gpu_uuid.as_str()))
            .or_insert_with(|| Leaf {
                uuid: &w.gpu_uuid,
                parent: w.parent_uuid.as_deref(),
                windows: Vec::new(),
            })
            .windows
            .push(w);
    }
    let parents: BTreeSet<(i64, &str)> = by_device
        .iter()
        .filter_map(|((h, _), l)| l.parent.map(|p| (*h, p)))
        .collect();
    for leaf in by_device.values_mut() {
        leaf.windows.sort_by_key(|w| w.start_ms);
    }
    (by_device, parents)
}

/// Held idle on one device: each process keeping memory at ~0% SM for the whole duration, and
/// the processes the agent cannot see (as one holder, pid 0) where their memory does.
fn held_by_processes(
    (leaf, host): (&Leaf<'_>, &HostRow),
    (rules, duration_ms): (&activity::Thresholds, i64),
    (procs, by_device): (&Procs<'_>, &Devices<'_>),
    now_ms: i64,
) -> Vec<Finding> {
    let holding =
        |p: &&StoredProcessWindow| activity::holds(p.memory_used_max_bytes, p.sm_util_avg);
    let at = |w: &AttributionWindow| {
        procs
            .get(&(leaf.uuid, w.start_ms))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    };
    let mut pids: BTreeSet<i64> = leaf
        .windows
        .iter()
        .flat_map(|w| at(w).iter())
        .filter(|p| holding(p))
        .map(|p| p.pid)
        .collect();
    if leaf
        .windows
        .iter()
        .any(|w| activity::unseen_holder(w).is_some())
    {
        pids.insert(UNSEEN_PID);
    }
    let mut held = Vec::new();
    for pid in pids {
        let mut owner = None;
        let since = idle_since(&leaf.windows, now_ms, |w| {
            let sm = if pid == UNSEEN_PID {
                activity::unseen_holder(w).map(|(_, sm)| sm)
            } else {
                at(w).iter().find(|p| p.pid == pid && holding(p)).map(|p| {
                    owner.get_or_insert(*p);
                    p.sm_util_avg
                })
            };
            // Held, not working: as attribution decides it for the same window (a faulted
            // window's time is idle for the fault, nobody's).
            let state = rules.of_window(w, at(w));
            state != Activity::Unknown && sm.is_some_and(|sm| !rules.works(sm, state))
        });
        let Some(since) = since else {
            continue;
        };
        if now_ms - since < duration_ms {
            continue;
        }
        // Every label the process carries: who to ask, whatever the owner dimensions are.
        let owners: BTreeMap<String, String> = owner
            .map(|p| {
                serde_json::from_str::<BTreeMap<String, String>>(&p.labels_json)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|(_, v)| !v.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let process = HeldProcess {
            gpu_uuid: leaf.uuid.to_string(),
            pid,
            name: owner.and_then(|p| p.process_name.clone()),
            user: owner.and_then(|p| p.user_name.clone()),
            owners: owners.clone(),
        };
        held.push(Finding {
            processes: vec![process],
            key: format!("held:{}/{}", host.cluster, host.hostname),
            kind: IncidentKind::HeldIdle,
            cluster: host.cluster.clone(),
            hostname: Some(host.hostname.clone()),
            host_ids: vec![host.id],
            gpus: vec![leaf.uuid.to_string()],
            gpu_equivalents: gpu_part(leaf, by_device, host.id),
            owners,
            faults: BTreeMap::new(),
            since_ms: since,
        });
    }
    held
}

/// Idle clusters (every host idle), and otherwise idle hosts and the idle GPUs of busy ones.
fn idle_hosts_and_clusters(
    host_gpus: &HostGpus<'_>,
    (parents, by_device): (&BTreeSet<(i64, &str)>, &Devices<'_>),
    host_by_id: &HashMap<i64, &HostRow>,
    now_ms: i64,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    let mut clusters: BTreeMap<&str, Vec<HostState>> = BTreeMap::new();
    for (host_id, gpus) in host_gpus {
        let Some(host) = host_by_id.get(host_id) else {
            continue;
        };
        let idle: Vec<&str> = gpus
            .iter()
            .filter(|(_, (s, _))| s.is_some())
            .map(|(g, _)| *g)
            .collect();
        let all = gpus.keys().copied().collect();
        let mig_gpus = parents
            .iter()
            .filter(|(h, _)| h == host_id)
            .map(|(_, g)| *g)
            .collect();
        let host_since = if idle.len() == gpus.len() {
            gpus.values().map(|(s, _)| s.unwrap_or(i64::MIN)).max()
        } else {
            None
        };
        clusters
            .entry(host.cluster.as_str())
            .or_default()
            .push(HostState {
                host_id: *host_id,
                since: host_since,
                idle,
                all,
                mig_gpus,
            });
    }
    for (cluster, hosts_in) in clusters {
        let cluster_idle = hosts_in.iter().all(|h| h.since.is_some());
        if cluster_idle && !hosts_in.is_empty() {
            findings.push(idle_cluster(cluster, &hosts_in, by_device, now_ms));
            continue;
        }
        for state in hosts_in {
            let Some(host) = host_by_id.get(&state.host_id) else {
                continue;
            };
            if state.idle.is_empty() {
                continue;
            }
            findings.push(idle_host(&state, host, (host_gpus, by_device), now_ms));
        }
    }
    findings
}

fn idle_cluster(
    cluster: &str,
    hosts_in: &[HostState<'_>],
    by_device: &Devices<'_>,
    now_ms: i64,
) -> Finding {
    let gpus: Vec<String> = hosts_in.iter().flat_map(HostState::whole).collect();
    let equivalents = hosts_in.iter().map(|h| h.physical(by_device)).sum();
    Finding {
        key: format!("cluster:{cluster}"),
        kind: IncidentKind::ClusterIdle,
        cluster: cluster.to_owned(),
        hostname: None,
        host_ids: hosts_in.iter().map(|h| h.host_id).collect(),
        gpu_equivalents: equivalents,
        gpus,
        owners: BTreeMap::new(),
        processes: Vec::new(),
        faults: BTreeMap::new(),
        since_ms: hosts_in
            .iter()
            .filter_map(|h| h.since)
            .max()
            .unwrap_or(now_ms),
    }
}

/// A wholly idle host, or the idle GPUs of a host that works.
fn idle_host(
    state: &HostState<'_>,
    host: &HostRow,
    (host_gpus, by_device): (&HostGpus<'_>, &Devices<'_>),
    now_ms: i64,
) -> Finding {
    let (host_id, since, idle) = (state.host_id, state.since, &state.idle);
    let cluster = &host.cluster;
    let (kind, key) = match since {
        Some(_) => (
            IncidentKind::HostIdle,
            format!("host:{cluster}/{}", host.hostname),
        ),
        None => (
            IncidentKind::GpusIdle,
            format!("gpus:{cluster}/{}", host.hostname),
        ),
    };
    let idle_since = host_gpus
        .get(&host_id)
        .map(|g| {
            idle.iter()
                .filter_map(|u| g.get(u).and_then(|(s, _)| *s))
                .max()
                .unwrap_or(now_ms)
        })
        .unwrap_or(now_ms);
    Finding {
        key,
        kind,
        cluster: cluster.to_owned(),
        hostname: Some(host.hostname.clone()),
        host_ids: vec![host_id],
        // A wholly idle host is idle whole: its GPUs in MIG mode too, with the slices no device
        // holds; else the idle units alone.
        gpu_equivalents: match since {
            Some(_) => state.physical(by_device),
            None => parts_of(host_gpus, host_id, idle),
        },
        gpus: match since {
            Some(_) => state.whole().collect(),
            None => idle.iter().map(|g| g.to_string()).collect(),
        },
        owners: BTreeMap::new(),
        processes: Vec::new(),
        faults: BTreeMap::new(),
        since_ms: since.unwrap_or(idle_since),
    }
}

#[cfg(test)]
mod tests;
