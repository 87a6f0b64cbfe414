//! Folding per-second samples into one aggregate per window.
//!
//! Per GPU: average and max utilization, max memory, average power, max temperature and the
//! energy used. Per process: max memory and average SM utilization, with its owner read once
//! when first seen. A value no sample had stays absent.

use std::collections::{BTreeMap, HashMap};

use gpuledger_proto::{
    DeviceFault, GpuWindow, MigPlacement, ProcessWindow, Window, UNSEEN_MEMORY_FLOOR_BYTES,
};

use crate::collect::DeviceSample;
use crate::owners::{Owner, OwnerReader};

#[derive(Default)]
struct Mean {
    sum: f64,
    n: u32,
}

impl Mean {
    fn add(&mut self, v: Option<u32>) {
        if let Some(v) = v {
            self.sum += f64::from(v);
            self.n += 1;
        }
    }
    fn get(&self) -> Option<f64> {
        (self.n > 0).then(|| self.sum / f64::from(self.n))
    }
}

fn max_opt<T: Ord + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

#[derive(Default)]
struct ProcessAcc {
    name: Option<String>,
    memory_max: Option<u64>,
    sm_util: Mean,
    owner: Owner,
}

#[derive(Default)]
struct GpuAcc {
    index: u32,
    name: String,
    parent_uuid: Option<String>,
    memory_total: Option<u64>,
    memory_used_max: Option<u64>,
    util: Mean,
    util_max: Option<u32>,
    /// Samples per utilization percent.
    util_counts: BTreeMap<u32, u32>,
    mem_util: Mean,
    power_mw: Mean,
    temperature_max: Option<u32>,
    /// Energy used inside the window so far (mJ), and the counter's latest reading.
    energy_used: Option<u64>,
    energy_last: Option<u64>,
    processes: BTreeMap<u32, ProcessAcc>,
    mig: Option<MigPlacement>,
    mig_compute_slices: Option<u32>,
    unseen: Option<u64>,
    unseen_cause: Option<&'static str>,
    /// The latest fault the window saw, and in how many of the device's samples.
    fault: Option<DeviceFault>,
    faulted_samples: u32,
    /// Samples that read this device at all.
    samples: u32,
}

/// Accumulates samples for the open window.
pub struct WindowBuilder {
    start_ms: Option<i64>,
    samples: u32,
    gpus: BTreeMap<String, GpuAcc>,
    /// Energy counter at the end of the previous window, so no joule falls between windows.
    previous_energy: HashMap<String, u64>,
    owners: OwnerReader,
}

impl WindowBuilder {
    pub fn new(owners: OwnerReader) -> Self {
        WindowBuilder {
            start_ms: None,
            samples: 0,
            gpus: BTreeMap::new(),
            previous_energy: HashMap::new(),
            owners,
        }
    }

    pub fn add(&mut self, at_ms: i64, devices: Vec<DeviceSample>) {
        self.start_ms.get_or_insert(at_ms);
        self.samples += 1;
        for d in devices {
            let (device, parent) = (d.uuid.clone(), d.parent_uuid.clone());
            let acc = self.gpus.entry(d.uuid).or_default();
            acc.index = d.index;
            acc.name = d.name;
            acc.parent_uuid = d.parent_uuid;
            acc.memory_total = d.memory_total_bytes.or(acc.memory_total);
            acc.memory_used_max = max_opt(acc.memory_used_max, d.memory_used_bytes);
            acc.util.add(d.gpu_util);
            acc.util_max = max_opt(acc.util_max, d.gpu_util);
            if let Some(u) = d.gpu_util {
                *acc.util_counts.entry(u.min(100)).or_default() += 1;
            }
            acc.mem_util.add(d.mem_util);
            acc.power_mw.add(d.power_mw);
            acc.temperature_max = max_opt(acc.temperature_max, d.temperature_c);
            if let Some(e) = d.energy_counter_mj {
                // From the counter's reading before (this window's, or the last window's end,
                // so no joule falls between windows). A counter that went back was reset (a
                // driver reload): what it counted since is not known, so that step adds nothing.
                let before = acc
                    .energy_last
                    .or_else(|| self.previous_energy.get(&device).copied());
                let step = before.map_or(0, |b| e.saturating_sub(b));
                acc.energy_used = Some(acc.energy_used.unwrap_or(0) + step);
                acc.energy_last = Some(e);
            }
            acc.mig = d.mig.or(acc.mig.take());
            acc.mig_compute_slices = d.mig_compute_slices.or(acc.mig_compute_slices);
            // The least any sample saw: processes the agent cannot see hold memory steadily,
            // while a process that ended between reading the memory and listing the processes
            // leaves its memory unaccounted for in one sample only.
            acc.unseen = match (acc.unseen, d.unseen_memory_bytes) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            acc.unseen_cause = d.unseen_cause.or(acc.unseen_cause);
            acc.samples += 1;
            if d.fault.is_some() {
                acc.faulted_samples += 1;
            }
            acc.fault = d.fault.or(acc.fault.take());
            for p in d.processes {
                let proc_acc = acc
                    .processes
                    .entry(p.pid)
                    .or_insert_with(|| match &p.owner {
                        // The source named it (dcgm-exporter's pod).
                        Some(owner) => ProcessAcc {
                            owner: owner.clone(),
                            ..Default::default()
                        },
                        None => {
                            let mut owner = self.owners.read(p.pid);
                            self.owners
                                .add_pod_facts(&mut owner, &device, parent.as_deref());
                            ProcessAcc {
                                owner,
                                name: self.owners.process_name(p.pid),
                                ..Default::default()
                            }
                        }
                    });
                if p.name.is_some() {
                    proc_acc.name = p.name;
                }
                proc_acc.memory_max = max_opt(proc_acc.memory_max, p.memory_used_bytes);
                proc_acc.sm_util.add(p.sm_util);
            }
        }
    }

    /// Starts the next window at `start_ms` (the boundary the last one closed on), so windows
    /// follow each other without gaps however late the next sample comes.
    pub fn begin_at(&mut self, start_ms: i64) {
        self.start_ms = Some(start_ms);
    }

    /// Closes the window at `end_ms` and starts the next one empty. `None` if nothing was sampled.
    pub fn close(&mut self, end_ms: i64) -> Option<Window> {
        let start_ms = self.start_ms.take()?;
        if self.samples == 0 {
            return None;
        }
        let samples = std::mem::take(&mut self.samples);
        let gpus = std::mem::take(&mut self.gpus);
        let mut out = Vec::with_capacity(gpus.len());
        for (uuid, g) in gpus {
            if let Some(last) = g.energy_last {
                self.previous_energy.insert(uuid.clone(), last);
            }
            let energy_mj = g.energy_used;
            let owners = &self.owners;
            let processes = g
                .processes
                .into_iter()
                .map(|(pid, mut p)| {
                    // A Slurm job first seen this window may have been described since.
                    owners.add_slurm_facts(&mut p.owner);
                    ProcessWindow {
                        pid,
                        name: p.name,
                        memory_used_max_bytes: p.memory_max,
                        sm_util_avg: p.sm_util.get(),
                        labels: p.owner.labels,
                        container_id: p.owner.container_id,
                        pod_uid: p.owner.pod_uid,
                        user: p.owner.user,
                        owner_unknown: p.owner.unknown,
                    }
                })
                .collect();
            out.push(GpuWindow {
                uuid,
                index: g.index,
                name: g.name,
                parent_uuid: g.parent_uuid,
                memory_total_bytes: g.memory_total,
                memory_used_max_bytes: g.memory_used_max,
                util_avg: g.util.get(),
                util_max: g.util_max.map(f64::from),
                util_histogram: g.util_counts.into_iter().collect(),
                mem_util_avg: g.mem_util.get(),
                power_avg_watts: g.power_mw.get().map(|mw| mw / 1000.0),
                temperature_max_c: g.temperature_max.map(f64::from),
                energy_mj,
                processes,
                mig: g.mig,
                mig_compute_slices: g.mig_compute_slices,
                // Less than a process's own context is the driver's, not a hidden process.
                unseen_memory_bytes: g.unseen.filter(|b| *b >= UNSEEN_MEMORY_FLOOR_BYTES),
                unseen_cause: g
                    .unseen_cause
                    .filter(|_| g.unseen >= Some(UNSEEN_MEMORY_FLOOR_BYTES))
                    .map(str::to_owned),
                // Faulted when at least half of its samples were: a GPU lost late in a window
                // still shows the work it did before.
                fault: g.fault.filter(|_| 2 * g.faulted_samples >= g.samples),
            });
        }
        Some(Window {
            serving: Vec::new(),
            start_ms,
            end_ms: end_ms.max(start_ms + 1),
            samples,
            gpus: out,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::ProcessSample;

    fn gpu(util: Option<u32>, mem: u64, energy: Option<u64>) -> DeviceSample {
        DeviceSample {
            uuid: "GPU-a".into(),
            name: "NVIDIA H100".into(),
            memory_total_bytes: Some(80),
            memory_used_bytes: Some(mem),
            gpu_util: util,
            power_mw: Some(300_000),
            energy_counter_mj: energy,
            processes: vec![ProcessSample {
                pid: 999_999_999,
                name: Some("python".into()),
                memory_used_bytes: Some(mem),
                sm_util: util,
                owner: None,
            }],
            ..Default::default()
        }
    }

    fn builder() -> WindowBuilder {
        WindowBuilder::new(OwnerReader::new("/nonexistent-proc", vec![]))
    }

    #[test]
    fn aggregates_avg_max_and_energy_delta() {
        let mut b = builder();
        b.add(1_000, vec![gpu(Some(20), 10, Some(5_000))]);
        b.add(2_000, vec![gpu(Some(60), 30, Some(5_300))]);
        b.add(3_000, vec![gpu(Some(40), 20, Some(5_600))]);
        let w = b.close(4_000).unwrap();
        assert_eq!((w.start_ms, w.end_ms, w.samples), (1_000, 4_000, 3));
        let g = &w.gpus[0];
        assert_eq!(g.util_avg, Some(40.0));
        assert_eq!(g.util_max, Some(60.0));
        assert_eq!(g.util_histogram, vec![(20, 1), (40, 1), (60, 1)]);
        assert_eq!(g.memory_used_max_bytes, Some(30));
        assert_eq!(g.power_avg_watts, Some(300.0));
        assert_eq!(g.energy_mj, Some(600));
        assert_eq!(g.processes[0].sm_util_avg, Some(40.0));
        assert_eq!(g.processes[0].memory_used_max_bytes, Some(30));

        // The next window counts energy from where the last one ended.
        b.add(5_000, vec![gpu(Some(0), 10, Some(6_000))]);
        let w2 = b.close(6_000).unwrap();
        assert_eq!(w2.gpus[0].energy_mj, Some(400));
        // A driver reload resets the counter mid-window: the step across it adds nothing.
        for (at, e) in [(7_000, 6_300), (8_000, 100), (9_000, 400)] {
            b.add(at, vec![gpu(Some(0), 10, Some(e))]);
        }
        assert_eq!(b.close(10_000).unwrap().gpus[0].energy_mj, Some(600));
    }

    /// A window is faulted when most of its samples were; unseen memory is the least any
    /// sample saw (a process that ended between two readings is no hidden process).
    #[test]
    fn a_fault_counts_where_most_samples_had_it_and_unseen_memory_is_the_least_seen() {
        let lost = || gpuledger_proto::DeviceFault {
            code: "gpu_lost".into(),
            detail: "lost".into(),
        };
        let with = |fault: bool, unseen: u64| DeviceSample {
            fault: fault.then(lost),
            unseen_memory_bytes: Some(unseen),
            ..gpu(Some(50), 10, None)
        };
        let gib = 1u64 << 30;
        let mut b = builder();
        b.add(1_000, vec![with(false, 9 * gib)]);
        b.add(2_000, vec![with(false, 3 * gib)]);
        b.add(3_000, vec![with(true, 9 * gib)]);
        let w = b.close(4_000).unwrap();
        assert_eq!(w.gpus[0].fault, None, "one sample in three");
        assert_eq!(w.gpus[0].unseen_memory_bytes, Some(3 * gib));
        b.add(5_000, vec![with(false, 0)]);
        b.add(6_000, vec![with(true, 0)]);
        let w = b.close(7_000).unwrap();
        assert_eq!(w.gpus[0].fault, Some(lost()), "half of them");
        assert_eq!(w.gpus[0].unseen_memory_bytes, None, "under the floor");
    }

    #[test]
    fn values_the_driver_cannot_give_stay_absent() {
        let mut b = builder();
        b.add(1_000, vec![gpu(None, 10, None)]);
        let w = b.close(2_000).unwrap();
        assert_eq!(w.gpus[0].util_avg, None);
        assert_eq!(w.gpus[0].util_max, None);
        assert!(w.gpus[0].util_histogram.is_empty());
        assert_eq!(w.gpus[0].energy_mj, None);
        assert_eq!(w.gpus[0].processes[0].sm_util_avg, None);
    }

    #[test]
    fn an_empty_window_is_none() {
        assert!(builder().close(1_000).is_none());
        let mut b = builder();
        b.begin_at(1_000);
        assert!(
            b.close(2_000).is_none(),
            "a window no sample fell in is nothing"
        );
    }

    #[test]
    fn windows_begun_at_the_boundary_follow_without_gaps() {
        let mut b = builder();
        b.add(900, vec![gpu(Some(1), 1, None)]);
        let first = b.close(1_000).unwrap();
        b.begin_at(1_000);
        // The next sample comes late, but the window starts at the boundary.
        b.add(1_700, vec![gpu(Some(1), 1, None)]);
        let second = b.close(2_000).unwrap();
        assert_eq!((first.start_ms, first.end_ms), (900, 1_000));
        assert_eq!((second.start_ms, second.end_ms), (1_000, 2_000));
    }
}
