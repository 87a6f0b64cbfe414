//! Finding idle capacity in the reported windows.
//!
//! A GPU is **idle** when its utilization has stayed under the cluster's threshold, with no
//! process holding its memory, for the cluster's duration; a host when all its GPUs are; a
//! cluster when all its reporting hosts are. A process is **holding a GPU idle** when it keeps
//! memory at ~0% SM utilization for that duration. Findings name the widest idle scope: a whole
//! cluster, else whole hosts, else the idle GPUs of a host; held-idle processes on their own.
//!
//! A host that stopped reporting is not idle, it is unmonitored: it yields nothing here.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use crate::activity::{self, Activity};
use crate::idle::IdleConfig;
use crate::telemetry::{gpu_label, AttributionWindow, HostRow, StoredProcessWindow};

/// Windows further apart than this break an idle run (the agent was away).
pub const MAX_GAP_MS: i64 = 3 * 60_000;
/// A host whose last window ended longer ago than this is not reporting.
pub const STALE_AFTER_MS: i64 = 5 * 60_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum IncidentKind {
    ClusterIdle,
    HostIdle,
    GpusIdle,
    HeldIdle,
}

impl IncidentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            IncidentKind::ClusterIdle => "cluster_idle",
            IncidentKind::HostIdle => "host_idle",
            IncidentKind::GpusIdle => "gpus_idle",
            IncidentKind::HeldIdle => "held_idle",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::ClusterIdle,
            Self::HostIdle,
            Self::GpusIdle,
            Self::HeldIdle,
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
    pub since_ms: i64,
}

/// A process holding a GPU idle, as a person would look for it: on which GPU, its pid and name,
/// who runs it and its owner labels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
pub struct IdleDevice {
    pub host: String,
    pub uuid: String,
    /// NVML index (a MIG instance has its GPU's); `None` when the GPU is no longer listed.
    pub index: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<HeldProcess>,
}

impl IdleDevice {
    /// `#3`, or the end of its UUID where the index is unknown.
    pub fn label(&self) -> String {
        gpu_label(self.index, &self.uuid, false)
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
            .filter(|d| d.processes.is_empty())
            .map(|d| d.label())
            .collect();
        if !bare.is_empty() {
            lines.push(format!("{host}: GPU {}", bare.join(", ")));
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
}

struct Leaf<'a> {
    uuid: &'a str,
    parent: Option<&'a str>,
    windows: Vec<&'a AttributionWindow>,
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

pub fn find(
    hosts: &[HostRow],
    windows: &[AttributionWindow],
    processes: &[StoredProcessWindow],
    config: &IdleConfig,
    now_ms: i64,
) -> Vec<Finding> {
    let host_by_id: HashMap<i64, &HostRow> = hosts.iter().map(|h| (h.id, h)).collect();
    let mut procs: HashMap<(&str, i64), Vec<&StoredProcessWindow>> = HashMap::new();
    for p in processes {
        procs
            .entry((p.gpu_uuid.as_str(), p.start_ms))
            .or_default()
            .push(p);
    }
    let holding =
        |p: &&StoredProcessWindow| activity::holds(p.memory_used_max_bytes, p.sm_util_avg);

    // Devices per host: leaves are GPUs without MIG instances, and MIG instances.
    let mut by_device: BTreeMap<(i64, &str), Leaf> = BTreeMap::new();
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

    let mut findings = Vec::new();
    // Held-idle processes per host: one incident (and one Slack message) per host, listing its
    // GPUs, not one per GPU or process.
    let mut held: BTreeMap<i64, Vec<Finding>> = BTreeMap::new();
    // Per host: physical GPU -> idle since (None = not idle), and held-idle processes.
    let mut host_gpus: BTreeMap<i64, BTreeMap<&str, Option<i64>>> = BTreeMap::new();
    for ((host_id, uuid), leaf) in &by_device {
        let Some(host) = host_by_id.get(host_id) else {
            continue;
        };
        let (_, duration) = config.for_cluster(&host.cluster);
        let rules = config.thresholds(&host.cluster);
        let duration_ms = duration.as_millis() as i64;
        let physical = leaf.parent.unwrap_or(uuid);
        if parents.contains(&(*host_id, *uuid)) {
            // A MIG-mode GPU: its instances decide.
            host_gpus
                .entry(*host_id)
                .or_default()
                .entry(physical)
                .or_insert(Some(i64::MIN));
            continue;
        }
        let since = idle_since(&leaf.windows, now_ms, |w| {
            let ps = procs.get(&(leaf.uuid, w.start_ms)).into_iter().flatten();
            rules.activity(
                w.util_avg,
                ps.map(|p| (p.memory_used_max_bytes, p.sm_util_avg)),
            ) == Activity::Idle
        })
        .filter(|s| now_ms - s >= duration_ms);
        let slot = host_gpus
            .entry(*host_id)
            .or_default()
            .entry(physical)
            .or_insert(Some(i64::MIN));
        *slot = match (*slot, since) {
            (Some(a), Some(b)) => Some(a.max(b)),
            _ => None,
        };

        // Held idle: each process keeping memory at ~0% SM for the whole duration.
        let pids: BTreeSet<i64> = leaf
            .windows
            .iter()
            .flat_map(|w| procs.get(&(leaf.uuid, w.start_ms)).into_iter().flatten())
            .filter(|p| holding(p))
            .map(|p| p.pid)
            .collect();
        for pid in pids {
            let mut owner = None;
            let since = idle_since(&leaf.windows, now_ms, |w| {
                let p = procs
                    .get(&(leaf.uuid, w.start_ms))
                    .and_then(|ps| ps.iter().find(|p| p.pid == pid && holding(p)));
                match p {
                    Some(p) => {
                        owner.get_or_insert(*p);
                        // Held, not working: as attribution decides it for the same window.
                        let all = procs.get(&(leaf.uuid, w.start_ms)).into_iter().flatten();
                        let state = rules.activity(
                            w.util_avg,
                            all.map(|q| (q.memory_used_max_bytes, q.sm_util_avg)),
                        );
                        !rules.works(p.sm_util_avg, state)
                    }
                    None => false,
                }
            });
            let (Some(since), Some(p)) = (since, owner) else {
                continue;
            };
            if now_ms - since < duration_ms {
                continue;
            }
            // Every label the process carries: who to ask, whatever the owner dimensions are.
            let owners: BTreeMap<String, String> =
                serde_json::from_str::<BTreeMap<String, String>>(&p.labels_json)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|(_, v)| !v.is_empty())
                    .collect();
            let siblings = by_device
                .values()
                .filter(|l| l.parent.is_some() && l.parent == leaf.parent)
                .count()
                .max(1);
            let process = HeldProcess {
                gpu_uuid: uuid.to_string(),
                pid,
                name: p.process_name.clone(),
                user: p.user_name.clone(),
                owners: owners.clone(),
            };
            held.entry(*host_id).or_default().push(Finding {
                processes: vec![process],
                key: format!("held:{}/{}", host.cluster, host.hostname),
                kind: IncidentKind::HeldIdle,
                cluster: host.cluster.clone(),
                hostname: Some(host.hostname.clone()),
                host_ids: vec![*host_id],
                gpus: vec![uuid.to_string()],
                gpu_equivalents: if leaf.parent.is_some() {
                    1.0 / siblings as f64
                } else {
                    1.0
                },
                owners,
                since_ms: since,
            });
        }
    }

    findings.extend(held.into_values().filter_map(merge_held));

    // Hosts and clusters.
    let mut clusters: BTreeMap<&str, Vec<HostState>> = BTreeMap::new();
    for (host_id, gpus) in &host_gpus {
        let Some(host) = host_by_id.get(host_id) else {
            continue;
        };
        let idle: Vec<&str> = gpus
            .iter()
            .filter(|(_, s)| s.is_some())
            .map(|(g, _)| *g)
            .collect();
        let all = gpus.keys().copied().collect();
        let host_since = if idle.len() == gpus.len() {
            gpus.values().map(|s| s.unwrap_or(i64::MIN)).max()
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
            });
    }
    for (cluster, hosts_in) in clusters {
        let cluster_idle = hosts_in.iter().all(|h| h.since.is_some());
        if cluster_idle && !hosts_in.is_empty() {
            let gpus: Vec<String> = hosts_in
                .iter()
                .flat_map(|h| h.all.iter().map(|g| g.to_string()))
                .collect();
            findings.push(Finding {
                key: format!("cluster:{cluster}"),
                kind: IncidentKind::ClusterIdle,
                cluster: cluster.to_owned(),
                hostname: None,
                host_ids: hosts_in.iter().map(|h| h.host_id).collect(),
                gpu_equivalents: gpus.len() as f64,
                gpus,
                owners: BTreeMap::new(),
                processes: Vec::new(),
                since_ms: hosts_in
                    .iter()
                    .filter_map(|h| h.since)
                    .max()
                    .unwrap_or(now_ms),
            });
            continue;
        }
        for HostState {
            host_id,
            since,
            idle,
            ..
        } in hosts_in
        {
            let Some(host) = host_by_id.get(&host_id) else {
                continue;
            };
            if idle.is_empty() {
                continue;
            }
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
                        .filter_map(|u| g.get(u).copied().flatten())
                        .max()
                        .unwrap_or(now_ms)
                })
                .unwrap_or(now_ms);
            findings.push(Finding {
                key,
                kind,
                cluster: cluster.to_owned(),
                hostname: Some(host.hostname.clone()),
                host_ids: vec![host_id],
                gpu_equivalents: idle.len() as f64,
                gpus: idle.iter().map(|g| g.to_string()).collect(),
                owners: BTreeMap::new(),
                processes: Vec::new(),
                since_ms: since.unwrap_or(idle_since),
            });
        }
    }
    findings.sort_by(|a, b| a.key.cmp(&b.key));
    findings
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = 1_800_000_000_000;
    const MIN: i64 = 60_000;

    fn host(id: i64, cluster: &str) -> HostRow {
        HostRow {
            id,
            cluster: cluster.into(),
            hostname: format!("{cluster}-{id}"),
            provider: None,
            instance_id: None,
            instance_key: None,
            instance_type: None,
            lifecycle: None,
            from_bill: false,
        }
    }

    /// One-minute windows for `minutes` ending at `end`, at `util`.
    fn run(host_id: i64, uuid: &str, end: i64, minutes: i64, util: f64) -> Vec<AttributionWindow> {
        (0..minutes)
            .map(|m| AttributionWindow {
                host_id,
                gpu_uuid: uuid.into(),
                parent_uuid: None,
                gpu_name: None,
                start_ms: end - (minutes - m) * MIN,
                end_ms: end - (minutes - m - 1) * MIN,
                memory_total_bytes: Some(80 << 30),
                util_avg: Some(util),
                util_histogram: None,
                energy_mj: None,
            })
            .collect()
    }

    fn proc_in(w: &AttributionWindow, pid: i64, sm: f64, team: &str) -> StoredProcessWindow {
        StoredProcessWindow {
            gpu_uuid: w.gpu_uuid.clone(),
            start_ms: w.start_ms,
            pid,
            process_name: None,
            memory_used_max_bytes: Some(10 << 30),
            sm_util_avg: Some(sm),
            labels_json: serde_json::json!({"experiment": "notebook", "team": team}).to_string(),
            container_id: None,
            pod_uid: None,
            user_name: None,
        }
    }

    #[test]
    fn a_cluster_idle_past_its_duration_is_one_finding() {
        let hosts = [host(1, "idle"), host(2, "idle"), host(3, "busy")];
        let mut w = run(1, "a", T, 45, 0.0);
        w.extend(run(1, "b", T, 45, 1.0));
        w.extend(run(2, "c", T, 45, 2.0));
        w.extend(run(3, "d", T, 45, 80.0));
        let f = find(&hosts, &w, &[], &IdleConfig::default(), T);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(
            (f[0].kind, f[0].key.as_str()),
            (IncidentKind::ClusterIdle, "cluster:idle")
        );
        assert_eq!(f[0].gpus.len(), 3);
        assert_eq!(f[0].since_ms, T - 45 * MIN);
        // 20 minutes is not long enough.
        let f = find(&hosts, &w, &[], &IdleConfig::default(), T - 25 * MIN);
        assert!(f.is_empty(), "{f:?}");
    }

    #[test]
    fn partly_idle_hosts_and_gpus() {
        let hosts = [host(1, "c"), host(2, "c")];
        let mut w = run(1, "a", T, 40, 0.0);
        w.extend(run(1, "b", T, 40, 0.0));
        w.extend(run(2, "c", T, 40, 0.0));
        w.extend(run(2, "d", T, 40, 90.0));
        let f = find(&hosts, &w, &[], &IdleConfig::default(), T);
        let kinds: Vec<(&str, IncidentKind, usize)> = f
            .iter()
            .map(|f| (f.key.as_str(), f.kind, f.gpus.len()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("gpus:c/c-2", IncidentKind::GpusIdle, 1),
                ("host:c/c-1", IncidentKind::HostIdle, 2)
            ]
        );
    }

    #[test]
    fn a_gap_or_a_busy_spell_restarts_the_clock_and_silence_is_not_idleness() {
        let hosts = [host(1, "c")];
        let mut w = run(1, "a", T - 30 * MIN, 20, 0.0);
        w.extend(run(1, "a", T, 25, 0.0)); // a 5-minute gap before these
        assert!(find(&hosts, &w, &[], &IdleConfig::default(), T).is_empty());
        let mut w = run(1, "a", T - 20 * MIN, 30, 0.0);
        w.extend(run(1, "a", T, 20, 50.0));
        assert!(find(&hosts, &w, &[], &IdleConfig::default(), T).is_empty());
        // Idle, but the host stopped reporting 10 minutes ago.
        let w = run(1, "a", T - 10 * MIN, 45, 0.0);
        assert!(find(&hosts, &w, &[], &IdleConfig::default(), T).is_empty());
    }

    #[test]
    fn a_notebook_holding_memory_at_zero_is_held_idle_with_its_owner() {
        let hosts = [host(1, "c")];
        let w = run(1, "a", T, 40, 0.0);
        let procs: Vec<_> = w.iter().map(|w| proc_in(w, 7, 0.0, "research")).collect();
        let f = find(&hosts, &w, &procs, &IdleConfig::default(), T);
        assert_eq!(f.len(), 1, "held, not plain idle: {f:?}");
        assert_eq!(f[0].kind, IncidentKind::HeldIdle);
        assert_eq!(
            f[0].owners.get("team").map(String::as_str),
            Some("research")
        );
        assert_eq!(f[0].key, "held:c/c-1");
        // The same process doing work is not held idle.
        let busy: Vec<_> = w.iter().map(|w| proc_in(w, 7, 30.0, "research")).collect();
        let w_busy = run(1, "a", T, 40, 30.0);
        assert!(find(&hosts, &w_busy, &busy, &IdleConfig::default(), T).is_empty());
    }

    /// Who holds a GPU is one rule for alerts and for the bill (`activity::holds`): a process the
    /// driver reports SM work for but no memory holds it as much as one holding memory, so the
    /// incident names the owner that attribution charges the held-idle hours to.
    #[test]
    fn a_process_without_memory_but_with_a_trickle_of_sm_is_named_as_holding() {
        let hosts = [host(1, "c")];
        let w = run(1, "a", T, 40, 0.0);
        let procs: Vec<_> = w
            .iter()
            .map(|w| StoredProcessWindow {
                memory_used_max_bytes: None,
                ..proc_in(w, 7, 0.5, "research")
            })
            .collect();
        let f = find(&hosts, &w, &procs, &IdleConfig::default(), T);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].kind, IncidentKind::HeldIdle);
        assert_eq!(f[0].processes.len(), 1, "{f:?}");
        assert_eq!(
            f[0].owners.get("team").map(String::as_str),
            Some("research")
        );
    }

    /// A notebook host whose processes hold 4 GPUs idle is one finding listing the 4 GPUs, with
    /// each owner once: one incident and one Slack message, not four.
    #[test]
    fn a_host_holding_gpus_idle_is_one_finding() {
        let hosts = [host(1, "c")];
        let mut windows = Vec::new();
        let mut procs = Vec::new();
        for (i, gpu) in ["a", "b", "c", "d"].into_iter().enumerate() {
            let w = run(1, gpu, T, 40, 0.0);
            let team = if i < 3 { "research" } else { "vision" };
            procs.extend(w.iter().map(|w| proc_in(w, 7 + i as i64, 0.0, team)));
            windows.extend(w);
        }
        let f = find(&hosts, &windows, &procs, &IdleConfig::default(), T);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].kind, IncidentKind::HeldIdle);
        assert_eq!(f[0].gpus, ["a", "b", "c", "d"]);
        assert_eq!(f[0].gpu_equivalents, 4.0);
        assert_eq!(f[0].owners["team"], "research, vision");
    }

    #[test]
    fn per_cluster_thresholds() {
        let hosts = [host(1, "strict")];
        let w = run(1, "a", T, 40, 3.0);
        let mut cfg = IdleConfig::default();
        cfg.clusters.insert(
            "strict".into(),
            crate::idle::IdleOverride {
                threshold_percent: Some(2.0),
                duration: None,
            },
        );
        assert!(
            find(&hosts, &w, &[], &cfg, T).is_empty(),
            "3% is busy under a 2% threshold"
        );
        assert_eq!(find(&hosts, &w, &[], &IdleConfig::default(), T).len(), 1);
    }
}
