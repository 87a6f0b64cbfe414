//! How one host-hour splits among who used its GPUs: each GPU (a GPU in MIG mode by its
//! devices' compute slices, or their memory where no slices are reported) and each of its
//! windows, busy, held idle or idle by the cluster's thresholds, among the processes holding it
//! by their memory, with what no window covers unmonitored.

use std::collections::{BTreeMap, HashMap};

use foldhash::{HashMap as FastMap, HashMapExt};

use super::{Kind, OwnerId, Owners, Share};
use crate::activity::{self, Activity, Thresholds};
use crate::telemetry::{AttributionWindow, StoredProcessWindow};
use crate::time::HOUR_MS;

/// Who holds a window's device: a process the agent saw, or the memory of processes it cannot see.
#[derive(Debug, Clone, Copy)]
pub(super) enum Holder<'a> {
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
pub(crate) fn mig_fractions<'w>(
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

/// What every share of one host-hour is read with: the hour, the processes of each device's
/// windows, and the cluster's thresholds.
struct HourReading<'p, 'k, 'a> {
    hour_ms: i64,
    procs: &'p FastMap<(&'k str, i64), Vec<&'a StoredProcessWindow>>,
    rules: Thresholds,
}

/// A host-hour's windows per physical GPU, and per GPU in MIG mode its devices' windows.
type Physical<'w> = BTreeMap<&'w str, Vec<&'w AttributionWindow>>;
/// A physical GPU's MIG devices, each with its windows.
type Instances<'w> = BTreeMap<&'w str, Vec<&'w AttributionWindow>>;
type MigDevices<'w> = BTreeMap<&'w str, Instances<'w>>;

fn by_physical_gpu<'w>(windows: &[&'w AttributionWindow]) -> (Physical<'w>, MigDevices<'w>) {
    let mut physical: Physical = BTreeMap::new();
    let mut children: MigDevices = BTreeMap::new();
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
    (physical, children)
}

/// The shares of one host-hour. The first share is always a catch-all (unmonitored or idle),
/// which is where a cost goes if every weight is 0.
pub(super) fn host_hour_shares<'a, 'w>(
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
    let (physical, children) = by_physical_gpu(windows);
    if physical.is_empty() {
        // Billed, but no GPU reported: the whole hour is unmonitored.
        out[0].weight = 1.0;
        return out;
    }
    let reading = HourReading {
        hour_ms,
        procs,
        rules,
    };
    let gpu_share = 1.0 / physical.len() as f64;
    for (gpu, own_windows) in &physical {
        let instances = children.get(gpu);
        // A GPU in MIG mode whose agent reports slices: its own windows are its time, each
        // shared by the MIG devices reporting in it (same start) and idle slices.
        match instances.filter(|_| own_windows.iter().any(|w| w.mig.gpu_slices.is_some())) {
            Some(instances) => slice_shares(
                (gpu, own_windows, instances),
                gpu_share,
                &reading,
                owners,
                &mut out,
            ),
            None => device_shares(
                (gpu, own_windows, instances),
                gpu_share,
                &reading,
                owners,
                &mut out,
            ),
        }
    }
    merge(out)
}

/// The shares of a GPU in MIG mode whose agent reports its slices: each of its own windows
/// shared by the MIG devices reporting in it (same start) and the idle slices.
fn slice_shares<'a, 'w>(
    (gpu, own_windows, instances): (&'w str, &[&'w AttributionWindow], &Instances<'w>),
    gpu_share: f64,
    at: &HourReading<'_, '_, 'a>,
    owners: &mut Owners<'a>,
    out: &mut Vec<Share<'w>>,
) {
    let mut devices_at: HashMap<i64, Vec<&AttributionWindow>> = HashMap::new();
    for w in instances.values().flatten() {
        devices_at.entry(w.start_ms).or_default().push(w);
    }
    let (spans, covered, scale) = coverage(own_windows, at.hour_ms);
    for (w, span) in own_windows.iter().zip(spans) {
        let devices = devices_at.get(&w.start_ms).map_or(&[][..], Vec::as_slice);
        let (parts, idle) = mig_fractions(w, devices);
        let t = span * scale / HOUR_MS as f64;
        let seconds = span * scale / 1000.0;
        // NVML measures energy on the physical GPU: its devices get it by their part.
        let energy = energy_in_hour(w, at.hour_ms);
        for (d, part) in parts {
            window_shares(
                &d.gpu_uuid,
                d,
                processes_at(at.procs, &d.gpu_uuid, d.start_ms),
                owners,
                gpu_share * part * t,
                part * seconds,
                energy.map(|e| e * part),
                at.rules,
                out,
            );
        }
        if idle > 0.0 {
            out.push(Share {
                gpu_uuid: Some(gpu),
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
}

/// The shares of a whole GPU, or of a GPU in MIG mode whose devices report without slices
/// (each device its part of the GPU by its memory).
fn device_shares<'a, 'w>(
    (gpu, own_windows, instances): (&'w str, &[&'w AttributionWindow], Option<&Instances<'w>>),
    gpu_share: f64,
    at: &HourReading<'_, '_, 'a>,
    owners: &mut Owners<'a>,
    out: &mut Vec<Share<'w>>,
) {
    let hour_ms = at.hour_ms;
    // NVML measures energy on the physical GPU: MIG instances get it by their size.
    let parent_energies: Vec<f64> = own_windows
        .iter()
        .filter_map(|w| energy_in_hour(w, hour_ms))
        .collect();
    let parent_energy: Option<f64> =
        (!parent_energies.is_empty()).then(|| parent_energies.iter().sum());
    let leaves: Vec<(&'w str, f64, &[&'w AttributionWindow])> = match instances {
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
                .map(|((uuid, ws), size)| (*uuid, gpu_share * size / total, ws.as_slice()))
                .collect()
        }
        None => vec![(gpu, gpu_share, own_windows)],
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
                processes_at(at.procs, uuid, w.start_ms),
                owners,
                leaf_share * t,
                physical_fraction * span * scale / 1000.0,
                energy,
                at.rules,
                out,
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
