//! Attribution: every dollar of a GPU host's bill, hour by hour, to whoever used its GPUs.
//!
//! For each host and hour:
//! 1. The cost is what the bill says for that instance in that hour (each cost line spread over
//!    the hours of its charge period), or else the rate card's estimate.
//! 2. The host's physical GPUs share it equally; that also spreads the instance's non-GPU cost
//!    (CPU, memory, network) over its GPUs.
//! 3. Each GPU splits its share over time: each reported window by its duration, and time no
//!    window covers is **unmonitored**. A GPU in MIG mode shares each window among its MIG
//!    devices by the compute slices each holds (3 of 7 for a `3g.40gb`; the compute instances
//!    of one GPU instance share its slices); slices no device holds are **idle**. (Reports of
//!    agents that predate slices split it by the devices' memory.)
//! 4. Inside a window, processes doing work share it by SM utilization (by memory where the
//!    driver gives no per-process utilization). Where nothing measures activity (a MIG device
//!    without GPM), processes holding the device use it by their presence. If none works but
//!    some hold memory, they are **held idle** and charged to their owners as such. Memory
//!    held, or work done, by processes the agent cannot see is the "(unseen process)" owner's.
//!    With no process, or a device that could not be read, it is **idle**.
//!
//! All of it becomes one list of weights per host-hour, and each cost is divided by
//! [`split_exact`], so the parts add up to the bill exactly.

use std::collections::{BTreeMap, HashMap};

use foldhash::{HashMap as FastMap, HashMapExt};

use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;

use crate::activity::{self, Activity, Thresholds};
use crate::bill::{spread_over_hours, StoredCostLine};
use crate::idle::IdleConfig;
use crate::money::split_exact;
pub use crate::owners::Owner;
use crate::owners::OwnerSchema;
use crate::ratecard::RateCard;
use crate::telemetry::{AttributionWindow, HostRow, StoredProcessWindow};
use crate::time::{hour_floor, HOUR_MS};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// Processes doing work.
    Used,
    /// Processes holding GPU memory at ~0% utilization.
    HeldIdle,
    /// No process on the GPU.
    Idle,
    /// No telemetry for this time: the agent was down or not installed.
    Unmonitored,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Used => "used",
            Kind::HeldIdle => "held_idle",
            Kind::Idle => "idle",
            Kind::Unmonitored => "unmonitored",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        [Kind::Used, Kind::HeldIdle, Kind::Idle, Kind::Unmonitored]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

/// The rules attribution follows, as configured: when a GPU counts as busy (per cluster), who
/// owns a process (the owner dimensions) and who pays for commitments' unused parts.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    pub busy: IdleConfig,
    pub owners: OwnerSchema,
    pub unused_commitments: crate::commitment::UnusedCharge,
}

/// One attributed part: a slice of one host-hour's cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub hour_ms: i64,
    pub host_id: i64,
    /// The GPU or MIG instance; `None` for a host-hour with no GPU telemetry at all.
    pub gpu_uuid: Option<String>,
    pub owner: Owner,
    pub kind: Kind,
    pub pricing_category: String,
    pub currency: String,
    pub cost: Decimal,
    /// From the rate card rather than a bill.
    pub estimated: bool,
    /// GPU time this part stands for, in physical-GPU seconds.
    pub gpu_seconds: f64,
    /// GPU utilization (%) × `gpu_seconds`, over the time where utilization is known.
    pub util_gpu_seconds: f64,
    /// `gpu_seconds` where utilization is known.
    pub util_known_seconds: f64,
    /// Energy this part stands for, in joules, where NVML measured it.
    pub energy_j: f64,
    /// `gpu_seconds` whose energy NVML measured: less than `gpu_seconds` where some GPUs or
    /// windows report none, so `energy_j` covers only part of the time (unknown is not 0 kWh).
    pub energy_known_seconds: f64,
}

/// What one weight stands for before the cost is divided. Borrowed and interned, not owned:
/// a host-hour has a share per window, so each allocation here was paid millions of times.
#[derive(Debug, Clone)]
struct Share<'w> {
    gpu_uuid: Option<&'w str>,
    owner: OwnerId,
    kind: Kind,
    weight: f64,
    gpu_seconds: f64,
    /// Utilization × seconds, and the seconds, where utilization is known.
    util_gpu_seconds: f64,
    util_known_seconds: f64,
    energy_j: f64,
    energy_known_seconds: f64,
}

/// One cost to divide over a host-hour.
#[derive(Debug, Clone)]
struct CostItem {
    amount: Decimal,
    currency: String,
    pricing_category: String,
    estimated: bool,
    /// The line's tags, where an owner dimension reads them.
    tags: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Attribution {
    pub parts: Vec<Part>,
    /// Cost inside the range on lines that match no known GPU host, per currency: counted in
    /// totals, not attributed.
    pub unattributed: BTreeMap<String, Decimal>,
    /// The same per (hour, currency), for the rollups.
    pub unattributed_hours: BTreeMap<(i64, String), Decimal>,
    pub hosts: HashMap<i64, HostRow>,
}

/// Spreads each cost line over the hours of its charge period in `[from_ms, to_ms)`, exactly.
pub fn line_hours(line: &StoredCostLine, from_ms: i64, to_ms: i64) -> Vec<(i64, Decimal)> {
    spread_over_hours(
        line.effective_cost,
        line.charge_period_start_ms,
        line.charge_period_end_ms,
        from_ms,
        to_ms,
    )
}

/// Which host a bill line belongs to, by normalised instance id. Where an agent reports an
/// instance that was known from the bill alone, the agent's host takes its lines (and of two
/// agents' hosts, the newer): each line has one host, so an hour attributed again moves whole,
/// never counted on both.
pub fn hosts_by_instance_key(hosts: &[HostRow]) -> HashMap<&str, i64> {
    let mut by_key: HashMap<&str, &HostRow> = HashMap::new();
    for h in hosts {
        let Some(key) = h.instance_key.as_deref() else {
            continue;
        };
        let preferred = by_key
            .get(key)
            .is_none_or(|held| (h.from_bill, -h.id) < (held.from_bill, -held.id));
        if preferred {
            by_key.insert(key, h);
        }
    }
    by_key.into_iter().map(|(k, h)| (k, h.id)).collect()
}

/// An owner interned by [`Owners`]: equal owners have the same id, so shares are merged by
/// comparing ids rather than owners' dimension maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct OwnerId(u32);

/// Owners by the schema: a process's from its labels on its host's cluster (each distinct label
/// set read once), nobody's (idle, unmonitored) from the cluster alone, and the processes the
/// agent cannot see as "(unseen process)". Each distinct owner is kept once, under its id.
struct Owners<'a> {
    schema: &'a OwnerSchema,
    cluster: &'a str,
    nobody: OwnerId,
    unseen: OwnerId,
    by_cluster: FastMap<&'a str, (OwnerId, OwnerId)>,
    by_labels: FastMap<(&'a str, &'a str), OwnerId>,
    ids: FastMap<Owner, OwnerId>,
    owners: Vec<Owner>,
}

impl<'a> Owners<'a> {
    fn new(schema: &'a OwnerSchema) -> Self {
        let mut owners = Owners {
            schema,
            cluster: "",
            nobody: OwnerId(0),
            unseen: OwnerId(0),
            by_cluster: FastMap::new(),
            by_labels: FastMap::new(),
            ids: FastMap::new(),
            owners: Vec::new(),
        };
        owners.nobody = owners.intern(schema.owner_of(&BTreeMap::new(), ""));
        owners.unseen = owners.intern(schema.unseen_owner(""));
        owners
    }

    fn intern(&mut self, owner: Owner) -> OwnerId {
        if let Some(id) = self.ids.get(&owner) {
            return *id;
        }
        let id = OwnerId(self.owners.len() as u32);
        self.owners.push(owner.clone());
        self.ids.insert(owner, id);
        id
    }

    fn get(&self, id: OwnerId) -> &Owner {
        &self.owners[id.0 as usize]
    }

    /// Owners on a host of `cluster` from now on.
    fn on_cluster(&mut self, cluster: &'a str) {
        if self.cluster == cluster {
            return;
        }
        self.cluster = cluster;
        let (nobody, unseen) = match self.by_cluster.get(cluster) {
            Some(ids) => *ids,
            None => {
                let nobody = self.intern(self.schema.owner_of(&BTreeMap::new(), cluster));
                let unseen = self.intern(self.schema.unseen_owner(cluster));
                self.by_cluster.insert(cluster, (nobody, unseen));
                (nobody, unseen)
            }
        };
        self.nobody = nobody;
        self.unseen = unseen;
    }

    fn of_holder(&mut self, h: Holder<'a>) -> OwnerId {
        match h {
            Holder::Seen(p) => self.of(p),
            Holder::Unseen(_) => self.unseen,
        }
    }

    fn of(&mut self, p: &'a StoredProcessWindow) -> OwnerId {
        let key = (p.labels_json.as_str(), self.cluster);
        if let Some(id) = self.by_labels.get(&key) {
            return *id;
        }
        let labels: BTreeMap<String, String> =
            serde_json::from_str(&p.labels_json).unwrap_or_default();
        let id = self.intern(self.schema.owner_of(&labels, self.cluster));
        self.by_labels.insert(key, id);
        id
    }
}

/// Who holds a window's device: a process the agent saw, or the memory of processes it cannot see.
#[derive(Debug, Clone, Copy)]
enum Holder<'a> {
    Seen(&'a StoredProcessWindow),
    Unseen(i64),
}

impl Holder<'_> {
    fn memory(&self) -> f64 {
        match self {
            Holder::Seen(p) => p.memory_used_max_bytes.unwrap_or(0).max(0) as f64,
            Holder::Unseen(bytes) => (*bytes).max(0) as f64,
        }
    }

    fn sm(&self) -> Option<f64> {
        match self {
            Holder::Seen(p) => p.sm_util_avg,
            Holder::Unseen(_) => None,
        }
    }
}

/// Each holder's part of `holders`' memory (equal parts where none is known).
fn by_memory<'a>(holders: &[Holder<'a>]) -> Vec<(Holder<'a>, f64)> {
    let total: f64 = holders.iter().map(Holder::memory).sum();
    holders
        .iter()
        .map(|h| {
            let part = if total > 0.0 {
                h.memory() / total
            } else {
                1.0 / holders.len() as f64
            };
            (*h, part)
        })
        .collect()
}

/// The shares of one window of one leaf device, given `weight` (its part of the host-hour).
/// Whether it was busy, held idle or idle is [`Thresholds::of_window`], the same for incidents
/// and the fleet page.
#[allow(clippy::too_many_arguments)]
fn window_shares<'a, 'w>(
    uuid: &'w str,
    w: &AttributionWindow,
    procs: &[&'a StoredProcessWindow],
    owners: &mut Owners<'a>,
    weight: f64,
    gpu_seconds: f64,
    energy_j: Option<f64>,
    rules: Thresholds,
    out: &mut Vec<Share<'w>>,
) {
    let share_at = |owner: OwnerId, kind: Kind, fraction: f64, util: Option<f64>| {
        let secs = gpu_seconds * fraction;
        Share {
            energy_j: energy_j.map_or(0.0, |e| e * fraction),
            energy_known_seconds: if energy_j.is_some() { secs } else { 0.0 },
            gpu_uuid: Some(uuid),
            owner,
            kind,
            weight: weight * fraction,
            gpu_seconds: secs,
            util_gpu_seconds: util.map_or(0.0, |u| u * secs),
            util_known_seconds: if util.is_some() { secs } else { 0.0 },
        }
    };
    let share =
        |owner: OwnerId, kind: Kind, fraction: f64| share_at(owner, kind, fraction, w.util_avg);
    let mut holding: Vec<Holder<'a>> = procs
        .iter()
        .copied()
        .filter(|p| activity::holds(p.memory_used_max_bytes, p.sm_util_avg))
        .map(Holder::Seen)
        .collect();
    if let Some((Some(bytes), _)) = activity::unseen_holder(w) {
        holding.push(Holder::Unseen(bytes));
    }
    let state = rules.of_window(w, procs);
    match state {
        Activity::Busy => {
            // A window whose samples were busy only part of the time is split: that part goes
            // to the work, the rest to whoever held the GPU idle (or to idle), each part with
            // its own mean utilization. Without samples the whole window is busy.
            let split = rules.split(w.util_histogram.as_deref());
            let (busy, busy_util) =
                split.map_or((1.0, w.util_avg), |s| (s.busy_fraction, Some(s.busy_util)));
            // The working holders share it by SM utilization; where the driver gives none, by
            // memory (all of them), or by the GPU's utilization beside others that have one.
            // Processes the agent cannot see get the utilization the seen ones do not account
            // for: the GPU's figure already includes theirs.
            let working: Vec<Holder<'a>> = holding
                .iter()
                .copied()
                .filter(|h| rules.works(h.sm(), state))
                .collect();
            let by_sm = working.iter().any(|h| h.sm().is_some());
            let seen_sm: f64 = working.iter().filter_map(Holder::sm).sum();
            let weights: Vec<f64> = working
                .iter()
                .map(|h| match (by_sm, h.sm()) {
                    (true, Some(sm)) => sm,
                    (true, None) if matches!(h, Holder::Unseen(_)) => {
                        (w.util_avg.unwrap_or(0.0) - seen_sm).max(0.0)
                    }
                    (true, None) => w.util_avg.unwrap_or(0.0),
                    (false, _) => h.memory(),
                })
                .collect();
            let total: f64 = weights.iter().sum();
            if total > 0.0 {
                for (h, v) in working.iter().zip(weights) {
                    out.push(share_at(
                        owners.of_holder(*h),
                        Kind::Used,
                        busy * v / total,
                        busy_util,
                    ));
                }
            } else if !working.is_empty() {
                for h in &working {
                    out.push(share_at(
                        owners.of_holder(*h),
                        Kind::Used,
                        busy / working.len() as f64,
                        busy_util,
                    ));
                }
            } else {
                // Busy with no process in sight (another container's, say): used, by processes
                // the agent cannot see.
                out.push(share_at(owners.unseen, Kind::Used, busy, busy_util));
            }
            if let Some(split) = split {
                let quiet = 1.0 - split.busy_fraction;
                let quiet_util = Some(split.quiet_util);
                if holding.is_empty() {
                    out.push(share_at(owners.nobody, Kind::Idle, quiet, quiet_util));
                }
                for (h, part) in by_memory(&holding) {
                    out.push(share_at(
                        owners.of_holder(h),
                        Kind::HeldIdle,
                        quiet * part,
                        quiet_util,
                    ));
                }
            }
        }
        // Nothing measures the device's activity: its holders use it by their presence.
        Activity::Present => {
            for (h, part) in by_memory(&holding) {
                out.push(share(owners.of_holder(h), Kind::Used, part));
            }
        }
        Activity::HeldIdle => {
            for (h, part) in by_memory(&holding) {
                out.push(share(owners.of_holder(h), Kind::HeldIdle, part));
            }
        }
        Activity::Idle | Activity::Unknown => out.push(share(owners.nobody, Kind::Idle, 1.0)),
    }
}

/// How a window of a GPU in MIG mode is shared: each MIG device reporting in it by its compute
/// slices of the GPU (a compute instance by its part of its GPU instance's), and what no device
/// holds, idle (slices no instance took, and those a layout leaves no memory for). Devices of a
/// report without slices share it by their memory, with none idle. Idle findings price a MIG
/// device by the same parts.
pub fn mig_fractions<'w>(
    gpu: &AttributionWindow,
    devices: &[&'w AttributionWindow],
) -> (Vec<(&'w AttributionWindow, f64)>, f64) {
    if devices.is_empty() {
        return (Vec::new(), 1.0);
    }
    let slices = |d: &AttributionWindow| {
        let m = d.mig;
        Some((
            m.gpu_instance_id?,
            m.instance_slices.filter(|s| *s > 0)?,
            m.compute_slices.filter(|s| *s > 0)?,
        ))
    };
    let placed: Option<Vec<(i64, i64, i64)>> = devices.iter().map(|d| slices(d)).collect();
    match (gpu.mig.gpu_slices.filter(|t| *t > 0), placed) {
        (Some(total), Some(placed)) => {
            // Per GPU instance: its slices, and the compute slices its devices report.
            let mut instances: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
            for (id, gi_slices, ci_slices) in &placed {
                let e = instances.entry(*id).or_insert((*gi_slices, 0));
                e.1 += ci_slices;
            }
            let held: i64 = instances.values().map(|(s, _)| *s).sum();
            // More slices than the GPU has is a bad report: scale it into the GPU.
            let of_gpu = total.max(held) as f64;
            let parts: Vec<(&AttributionWindow, f64)> = devices
                .iter()
                .zip(&placed)
                .map(|(d, (id, _, ci))| {
                    let (gi_slices, reported) = instances[id];
                    (*d, gi_slices as f64 / of_gpu * *ci as f64 / reported as f64)
                })
                .collect();
            let idle = (1.0 - held as f64 / of_gpu).max(0.0);
            (parts, idle)
        }
        _ => {
            let sizes: Vec<f64> = devices
                .iter()
                .map(|d| d.memory_total_bytes.unwrap_or(1).max(1) as f64)
                .collect();
            let total: f64 = sizes.iter().sum();
            let parts = devices
                .iter()
                .zip(sizes)
                .map(|(d, s)| (*d, s / total))
                .collect();
            (parts, 0.0)
        }
    }
}

/// The shares of one host-hour. The first share is always a catch-all (unmonitored or idle),
/// which is where a cost goes if every weight is 0.
fn host_hour_shares<'a, 'w>(
    hour_ms: i64,
    windows: &[&'w AttributionWindow],
    procs: &FastMap<(&str, i64), Vec<&'a StoredProcessWindow>>,
    owners: &mut Owners<'a>,
    rules: Thresholds,
) -> Vec<Share<'w>> {
    let mut out = vec![Share {
        gpu_uuid: None,
        owner: owners.nobody,
        kind: Kind::Unmonitored,
        weight: 0.0,
        gpu_seconds: 0.0,
        util_gpu_seconds: 0.0,
        util_known_seconds: 0.0,
        energy_j: 0.0,
        energy_known_seconds: 0.0,
    }];
    // Physical GPUs and their MIG instances.
    let mut physical: BTreeMap<&'w str, Vec<&'w AttributionWindow>> = BTreeMap::new();
    let mut children: BTreeMap<&'w str, BTreeMap<&'w str, Vec<&'w AttributionWindow>>> =
        BTreeMap::new();
    for w in windows {
        match w.parent_uuid.as_deref() {
            None => physical.entry(&w.gpu_uuid).or_default().push(w),
            Some(parent) => children
                .entry(parent)
                .or_default()
                .entry(&w.gpu_uuid)
                .or_default()
                .push(w),
        }
    }
    for parent in children.keys() {
        physical.entry(parent).or_default();
    }
    if physical.is_empty() {
        // Billed, but no GPU reported: the whole hour is unmonitored.
        out[0].weight = 1.0;
        return out;
    }
    let gpu_share = 1.0 / physical.len() as f64;
    for (gpu, own_windows) in &physical {
        let instances = children.get(gpu);
        // A GPU in MIG mode whose agent reports slices: its own windows are its time, each
        // shared by the MIG devices reporting in it (same start) and idle slices.
        if let Some(instances) =
            instances.filter(|_| own_windows.iter().any(|w| w.mig.gpu_slices.is_some()))
        {
            let mut devices_at: HashMap<i64, Vec<&AttributionWindow>> = HashMap::new();
            for w in instances.values().flatten() {
                devices_at.entry(w.start_ms).or_default().push(w);
            }
            let (spans, covered, scale) = coverage(own_windows, hour_ms);
            for (w, span) in own_windows.iter().zip(spans) {
                let devices = devices_at.get(&w.start_ms).map_or(&[][..], Vec::as_slice);
                let (parts, idle) = mig_fractions(w, devices);
                let t = span * scale / HOUR_MS as f64;
                let seconds = span * scale / 1000.0;
                // NVML measures energy on the physical GPU: its devices get it by their part.
                let energy = energy_in_hour(w, hour_ms);
                for (d, part) in parts {
                    window_shares(
                        &d.gpu_uuid,
                        d,
                        processes_at(procs, &d.gpu_uuid, d.start_ms),
                        owners,
                        gpu_share * part * t,
                        part * seconds,
                        energy.map(|e| e * part),
                        rules,
                        &mut out,
                    );
                }
                if idle > 0.0 {
                    out.push(Share {
                        gpu_uuid: Some(*gpu),
                        owner: owners.nobody,
                        kind: Kind::Idle,
                        weight: gpu_share * idle * t,
                        gpu_seconds: idle * seconds,
                        util_gpu_seconds: 0.0,
                        util_known_seconds: 0.0,
                        energy_j: energy.map_or(0.0, |e| e * idle),
                        energy_known_seconds: if energy.is_some() {
                            idle * seconds
                        } else {
                            0.0
                        },
                    });
                }
            }
            out.extend(unmonitored(
                gpu,
                gpu_share,
                1.0,
                covered * scale,
                owners.nobody,
            ));
            continue;
        }
        // NVML measures energy on the physical GPU: MIG instances get it by their size.
        let parent_energies: Vec<f64> = own_windows
            .iter()
            .filter_map(|w| energy_in_hour(w, hour_ms))
            .collect();
        let parent_energy: Option<f64> =
            (!parent_energies.is_empty()).then(|| parent_energies.iter().sum());
        let leaves: Vec<(&'w str, f64, &Vec<&'w AttributionWindow>)> = match instances {
            Some(instances) => {
                let sizes: Vec<f64> = instances
                    .values()
                    .map(|ws| {
                        ws.iter()
                            .filter_map(|w| w.memory_total_bytes)
                            .max()
                            .unwrap_or(1) as f64
                    })
                    .collect();
                let total: f64 = sizes.iter().sum();
                instances
                    .iter()
                    .zip(sizes)
                    .map(|((uuid, ws), size)| (*uuid, gpu_share * size / total, ws))
                    .collect()
            }
            None => vec![(*gpu, gpu_share, own_windows)],
        };
        for (uuid, leaf_share, ws) in leaves {
            let (spans, covered, scale) = coverage(ws, hour_ms);
            let physical_fraction = leaf_share / gpu_share;
            for (w, span) in ws.iter().zip(spans) {
                let energy = match energy_in_hour(w, hour_ms) {
                    Some(e) => Some(e),
                    None if instances.is_some() && covered > 0.0 => {
                        parent_energy.map(|e| e * physical_fraction * span / covered)
                    }
                    None => None,
                };
                let t = span * scale / HOUR_MS as f64;
                window_shares(
                    uuid,
                    w,
                    processes_at(procs, uuid, w.start_ms),
                    owners,
                    leaf_share * t,
                    physical_fraction * span * scale / 1000.0,
                    energy,
                    rules,
                    &mut out,
                );
            }
            out.extend(unmonitored(
                uuid,
                leaf_share,
                physical_fraction,
                covered * scale,
                owners.nobody,
            ));
        }
    }
    merge(out)
}

/// The processes of a device's window.
fn processes_at<'p, 'k, 'a>(
    procs: &'p FastMap<(&'k str, i64), Vec<&'a StoredProcessWindow>>,
    uuid: &'k str,
    start_ms: i64,
) -> &'p [&'a StoredProcessWindow] {
    procs
        .get(&(uuid, start_ms))
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// The part of a window's energy that falls inside the hour, in joules.
fn energy_in_hour(w: &AttributionWindow, hour_ms: i64) -> Option<f64> {
    let len = (w.end_ms - w.start_ms).max(1) as f64;
    let inside = (w.end_ms.min(hour_ms + HOUR_MS) - w.start_ms.max(hour_ms)).max(0) as f64;
    w.energy_mj.map(|e| e as f64 / 1000.0 * inside / len)
}

/// Each window's milliseconds inside the hour, their sum, and the scale that fits overlapping
/// windows (which should not happen) into the hour.
fn coverage(ws: &[&AttributionWindow], hour_ms: i64) -> (Vec<f64>, f64, f64) {
    let spans: Vec<f64> = ws
        .iter()
        .map(|w| (w.end_ms.min(hour_ms + HOUR_MS) - w.start_ms.max(hour_ms)).max(0) as f64)
        .collect();
    let covered: f64 = spans.iter().sum();
    let scale = if covered > HOUR_MS as f64 {
        HOUR_MS as f64 / covered
    } else {
        1.0
    };
    (spans, covered, scale)
}

/// The time of a device (`share` of the host-hour, `physical_fraction` of its GPU) no window
/// covered: unmonitored.
fn unmonitored(
    uuid: &str,
    share: f64,
    physical_fraction: f64,
    covered_ms: f64,
    nobody: OwnerId,
) -> Option<Share<'_>> {
    let uncovered = (1.0 - covered_ms / HOUR_MS as f64).max(0.0);
    (uncovered > 0.0).then_some(Share {
        gpu_uuid: Some(uuid),
        owner: nobody,
        kind: Kind::Unmonitored,
        weight: share * uncovered,
        gpu_seconds: physical_fraction * uncovered * 3600.0,
        util_gpu_seconds: 0.0,
        util_known_seconds: 0.0,
        energy_j: 0.0,
        energy_known_seconds: 0.0,
    })
}

/// One share per (GPU, owner, kind), in first-seen order so the catch-all stays first.
fn merge(shares: Vec<Share<'_>>) -> Vec<Share<'_>> {
    let mut index: FastMap<(Option<&str>, OwnerId, Kind), usize> = FastMap::new();
    let mut out: Vec<Share> = Vec::new();
    for s in shares {
        let key = (s.gpu_uuid, s.owner, s.kind);
        match index.get(&key) {
            Some(&i) => {
                let m = &mut out[i];
                m.weight += s.weight;
                m.gpu_seconds += s.gpu_seconds;
                m.util_gpu_seconds += s.util_gpu_seconds;
                m.util_known_seconds += s.util_known_seconds;
                m.energy_j += s.energy_j;
                m.energy_known_seconds += s.energy_known_seconds;
            }
            None => {
                index.insert(key, out.len());
                out.push(s);
            }
        }
    }
    out
}

/// [`attribute_by`] with the default thresholds and owner dimensions.
pub fn attribute(
    hosts: Vec<HostRow>,
    windows: &[AttributionWindow],
    processes: &[StoredProcessWindow],
    lines: &[StoredCostLine],
    card: &RateCard,
    from_ms: i64,
    to_ms: i64,
) -> Attribution {
    attribute_by(
        hosts,
        windows,
        processes,
        lines,
        card,
        &IdleConfig::default(),
        &OwnerSchema::default(),
        from_ms,
        to_ms,
    )
}

/// Attributes `[from_ms, to_ms)` (whole hours) from already-loaded data; whether a window was
/// busy, held idle or idle by each host's cluster's thresholds in `busy`; who owned it by the
/// owner dimensions in `schema`.
///
/// `lines` are the bill's lines overlapping the range and, for the hours after the bill's last
/// line, each host's newest lines ending before it: an hour a host reported and no line covers
/// is estimated at what the bill last charged that host for an hour (its commitments and
/// negotiated rates included), within [`crate::bill::LAST_BILLED_LOOKBACK_MS`]; only a host
/// the bill has not charged in that time is priced from the rate card.
#[allow(clippy::too_many_arguments)]
pub fn attribute_by(
    hosts: Vec<HostRow>,
    windows: &[AttributionWindow],
    processes: &[StoredProcessWindow],
    lines: &[StoredCostLine],
    card: &RateCard,
    busy: &IdleConfig,
    schema: &OwnerSchema,
    from_ms: i64,
    to_ms: i64,
) -> Attribution {
    let by_key = hosts_by_instance_key(&hosts);
    let reads_tags = schema.reads_tags();
    // Bill items per (host, hour).
    let mut billed: BTreeMap<(i64, i64), Vec<CostItem>> = BTreeMap::new();
    let mut unattributed_hours: BTreeMap<(i64, String), Decimal> = BTreeMap::new();
    for line in lines {
        // A commitment's unused part is nobody's, even where the bill names a resource on it
        // (as FOCUS 1.2's flexibility examples do): it stays unattributed, for the fleet.
        let host = line
            .resource_key
            .as_deref()
            .filter(|_| !line.is_unused_commitment())
            .and_then(|k| by_key.get(k));
        let tags: Option<BTreeMap<String, String>> = (reads_tags && host.is_some())
            .then(|| crate::bill::tags_of(&line.tags_json))
            .filter(|t| !t.is_empty());
        for (hour, amount) in line_hours(line, from_ms, to_ms) {
            match host {
                Some(host_id) => billed.entry((*host_id, hour)).or_default().push(CostItem {
                    amount,
                    currency: line.currency.clone(),
                    pricing_category: line.pricing_category.clone(),
                    estimated: false,
                    tags: tags.clone(),
                }),
                None => {
                    *unattributed_hours
                        .entry((hour, line.currency.clone()))
                        .or_default() += amount
                }
            }
        }
    }
    let mut last_billed = last_billed_before(lines, &by_key, reads_tags, from_ms);
    let mut host_windows: BTreeMap<(i64, i64), Vec<&AttributionWindow>> = BTreeMap::new();
    for w in windows {
        host_windows
            .entry((w.host_id, hour_floor(w.start_ms)))
            .or_default()
            .push(w);
    }
    let mut procs: FastMap<(&str, i64), Vec<&StoredProcessWindow>> = FastMap::new();
    for p in processes {
        procs
            .entry((p.gpu_uuid.as_str(), p.start_ms))
            .or_default()
            .push(p);
    }
    let hosts: HashMap<i64, HostRow> = hosts.into_iter().map(|h| (h.id, h)).collect();
    let mut owners = Owners::new(schema);
    let no_tags = BTreeMap::new();

    let mut keys: Vec<(i64, i64)> = billed.keys().chain(host_windows.keys()).copied().collect();
    keys.sort_unstable();
    keys.dedup();
    let mut parts = Vec::new();
    for (host_id, hour) in keys {
        let ws = host_windows
            .get(&(host_id, hour))
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        // Keys come by host, then hour: the last billed hour is known for every hour after.
        let items = match billed.remove(&(host_id, hour)) {
            Some(items) => {
                last_billed.insert(host_id, (hour, items.clone()));
                items
            }
            None => estimate(
                hosts.get(&host_id),
                ws,
                hour,
                (card, last_billed.get(&host_id)),
            ),
        };
        if items.is_empty() {
            continue;
        }
        let cluster = hosts.get(&host_id).map_or("", |h| h.cluster.as_str());
        let rules = busy.thresholds(cluster);
        owners.on_cluster(cluster);
        let shares = host_hour_shares(hour, ws, &procs, &mut owners, rules);
        let billed_weights: Vec<f64> = shares.iter().map(|s| s.weight).collect();
        // An estimate already covers only the time the host was seen: none of it is unmonitored.
        let estimate_weights: Vec<f64> = shares
            .iter()
            .map(|s| {
                if s.kind == Kind::Unmonitored {
                    0.0
                } else {
                    s.weight
                }
            })
            .collect();
        // GPU time is shared among the cost items (say, committed and on-demand lines for
        // the same hour) in proportion to their amounts, so it is counted once in total.
        let magnitude: Decimal = items.iter().map(|i| i.amount.abs()).sum();
        let count = items.len() as f64;
        for item in items {
            let time_fraction = if magnitude.is_zero() {
                1.0 / count
            } else {
                (item.amount.abs() / magnitude).to_f64().unwrap_or(0.0)
            };
            let weights = if item.estimated {
                &estimate_weights
            } else {
                &billed_weights
            };
            for ((share, cost), weight) in shares
                .iter()
                .zip(split_exact(item.amount, weights))
                .zip(weights)
            {
                if cost.is_zero()
                    && (*weight == 0.0 || item.estimated && share.kind == Kind::Unmonitored)
                {
                    continue;
                }
                // A dimension no process label gave may come from the line's tags.
                let owner = if reads_tags {
                    let tags = item.tags.as_ref().unwrap_or(&no_tags);
                    schema.with_tags(owners.get(share.owner), tags, cluster)
                } else {
                    owners.get(share.owner).clone()
                };
                parts.push(Part {
                    hour_ms: hour,
                    host_id,
                    gpu_uuid: share.gpu_uuid.map(str::to_owned),
                    owner,
                    kind: share.kind,
                    pricing_category: item.pricing_category.clone(),
                    currency: item.currency.clone(),
                    cost,
                    estimated: item.estimated,
                    gpu_seconds: share.gpu_seconds * time_fraction,
                    util_gpu_seconds: share.util_gpu_seconds * time_fraction,
                    util_known_seconds: share.util_known_seconds * time_fraction,
                    energy_j: share.energy_j * time_fraction,
                    energy_known_seconds: share.energy_known_seconds * time_fraction,
                });
            }
        }
    }
    let mut unattributed: BTreeMap<String, Decimal> = BTreeMap::new();
    for ((_, currency), amount) in &unattributed_hours {
        *unattributed.entry(currency.clone()).or_default() += amount;
    }
    Attribution {
        parts,
        unattributed,
        unattributed_hours,
        hosts,
    }
}

/// Each host's newest billed hour before `from_ms` and what the bill charged for it: from the
/// lines that end by then (a commitment's unused part is not what the host costs).
fn last_billed_before(
    lines: &[StoredCostLine],
    by_key: &HashMap<&str, i64>,
    reads_tags: bool,
    from_ms: i64,
) -> HashMap<i64, (i64, Vec<CostItem>)> {
    let before: Vec<(i64, &StoredCostLine)> = lines
        .iter()
        .filter(|l| l.charge_period_end_ms <= from_ms && !l.is_unused_commitment())
        .filter_map(|l| {
            let host = *by_key.get(l.resource_key.as_deref()?)?;
            Some((host, l))
        })
        .collect();
    let last_hour = |l: &StoredCostLine| {
        hour_floor(l.charge_period_end_ms.max(l.charge_period_start_ms + 1) - 1)
    };
    let mut newest: HashMap<i64, i64> = HashMap::new();
    for (host, l) in &before {
        let hour = newest.entry(*host).or_insert(i64::MIN);
        *hour = (*hour).max(last_hour(l));
    }
    let mut out: HashMap<i64, (i64, Vec<CostItem>)> = HashMap::new();
    for (host, l) in before {
        let hour = newest[&host];
        for (_, amount) in line_hours(l, hour, hour + HOUR_MS) {
            out.entry(host)
                .or_insert_with(|| (hour, Vec::new()))
                .1
                .push(CostItem {
                    amount,
                    currency: l.currency.clone(),
                    pricing_category: l.pricing_category.clone(),
                    estimated: false,
                    tags: reads_tags
                        .then(|| crate::bill::tags_of(&l.tags_json))
                        .filter(|t| !t.is_empty()),
                });
        }
    }
    out
}

/// The estimate for a host-hour with telemetry and no bill, for the time the host was seen
/// reporting in that hour: at what the bill charged the host for its last billed hour, where
/// that is within [`crate::bill::LAST_BILLED_LOOKBACK_MS`], else at the rate card's price.
fn estimate(
    host: Option<&HostRow>,
    ws: &[&AttributionWindow],
    hour: i64,
    (card, last_billed): (&RateCard, Option<&(i64, Vec<CostItem>)>),
) -> Vec<CostItem> {
    let (Some(first), Some(last)) = (
        ws.iter().map(|w| w.start_ms).min(),
        ws.iter().map(|w| w.end_ms).max(),
    ) else {
        return Vec::new();
    };
    let seen = (last.min(hour + HOUR_MS) - first.max(hour)).max(0);
    let for_seen = |hourly: Decimal| {
        (hourly * Decimal::from(seen) / Decimal::from(HOUR_MS)).round_dp(crate::money::MAX_SCALE)
    };
    if let Some((_, items)) =
        last_billed.filter(|(at, _)| hour - at <= crate::bill::LAST_BILLED_LOOKBACK_MS)
    {
        return items
            .iter()
            .map(|i| CostItem {
                amount: for_seen(i.amount),
                estimated: true,
                ..i.clone()
            })
            .collect();
    }
    let mut physical: BTreeMap<&str, &str> = BTreeMap::new();
    for w in ws.iter().filter(|w| w.parent_uuid.is_none()) {
        physical.insert(&w.gpu_uuid, w.gpu_name.as_deref().unwrap_or(""));
    }
    let names: Vec<&str> = physical.values().copied().collect();
    let spot = host.and_then(|h| h.lifecycle.as_deref()) == Some("spot");
    let Some((hourly, category)) =
        card.host_price(host.and_then(|h| h.instance_type.as_deref()), &names, spot)
    else {
        return Vec::new();
    };
    vec![CostItem {
        amount: for_seen(hourly),
        currency: card.currency.clone(),
        pricing_category: category.into(),
        estimated: true,
        tags: None,
    }]
}

#[cfg(any(test, feature = "test-support"))]
pub mod fixtures;
#[cfg(test)]
mod tests;
