//! One definition of busy: what a GPU (or MIG instance) did over one reported window, by its
//! cluster's thresholds. Attribution (used / held idle / idle dollars), idle incidents, the
//! fleet page and, through the ledger, recommendations all read it from here, so a GPU is never
//! "used" in the bill's split and "idle" in an alert for the same minute.
//!
//! The thresholds come from the server config's `[idle]` section (per cluster where set:
//! `IdleConfig::thresholds`): a GPU is busy at or above `threshold_percent` utilization; a
//! process works at or above `held_sm_percent` SM utilization and otherwise, holding memory,
//! holds the GPU idle.
//!
//! Where nothing measures activity (a MIG device of a GPU without GPM, an A100's: the driver
//! gives neither utilization nor per-process figures there), a process holding the device uses
//! it by its presence: it is never held idle or idle on no evidence. Memory held by processes
//! the agent cannot see holds the device as a process does. A device that could not be read (a
//! fault) and shows no work has nothing to go on.

use crate::telemetry::{AttributionWindow, StoredProcessWindow};

/// The two thresholds that decide a window, for one cluster.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// GPU utilization (%) at or above which the GPU is busy.
    pub busy_gpu_percent: f64,
    /// SM utilization (%) at or above which a process works.
    pub working_sm_percent: f64,
}

impl Thresholds {
    /// [`activity`] with these thresholds.
    pub fn activity(
        &self,
        util: Option<f64>,
        processes: impl IntoIterator<Item = (Option<i64>, Option<f64>)>,
    ) -> Activity {
        activity(
            util,
            processes,
            self.busy_gpu_percent,
            self.working_sm_percent,
        )
    }

    /// How a window that [`activity`] calls busy divides, where its samples show both busy and
    /// quiet stretches (a notebook cell that ran 10 s of a minute): the busy part and the mean
    /// utilization of each part. `None` when there is no histogram, or every sample falls on
    /// one side: then the whole window is what [`activity`] says.
    pub fn split(&self, histogram: Option<&str>) -> Option<Split> {
        let counts: Vec<(u32, u32)> = serde_json::from_str(histogram?).ok()?;
        let (mut busy, mut quiet) = ((0u64, 0u64), (0u64, 0u64));
        for (percent, n) in counts {
            let side = if f64::from(percent) >= self.busy_gpu_percent {
                &mut busy
            } else {
                &mut quiet
            };
            side.0 += u64::from(n);
            side.1 += u64::from(percent) * u64::from(n);
        }
        if busy.0 == 0 || quiet.0 == 0 {
            return None;
        }
        let mean = |(n, sum): (u64, u64)| sum as f64 / n as f64;
        Some(Split {
            busy_fraction: busy.0 as f64 / (busy.0 + quiet.0) as f64,
            busy_util: mean(busy),
            quiet_util: mean(quiet),
        })
    }

    /// Whether a process holding the GPU works, given the window's activity: by its SM
    /// utilization where the driver gives one, else by the GPU's (or by its presence where
    /// nothing measures it).
    pub fn works(&self, sm: Option<f64>, window: Activity) -> bool {
        match sm {
            Some(sm) => sm >= self.working_sm_percent,
            None => matches!(window, Activity::Busy | Activity::Present),
        }
    }

    /// The activity of a stored window with its processes: the one classification attribution,
    /// incidents and the fleet page read. The memory of processes the agent cannot see holds
    /// the device like a process's; a fault without work is [`Activity::Unknown`].
    pub fn of_window(&self, w: &AttributionWindow, processes: &[&StoredProcessWindow]) -> Activity {
        self.of_window_with(
            w,
            processes
                .iter()
                .map(|p| (p.memory_used_max_bytes, p.sm_util_avg)),
        )
    }

    /// [`Thresholds::of_window`] with each process as (memory held, SM utilization).
    pub fn of_window_with(
        &self,
        w: &AttributionWindow,
        processes: impl IntoIterator<Item = (Option<i64>, Option<f64>)>,
    ) -> Activity {
        let state = self.activity(w.util_avg, processes.into_iter().chain(unseen_holder(w)));
        match (state, &w.fault) {
            (Activity::Busy | Activity::Present, _) | (_, None) => state,
            (_, Some(_)) => Activity::Unknown,
        }
    }
}

/// The memory processes the agent cannot see hold, as a holder with no SM figure. The agent
/// reports it only from a floor up (what a CUDA context alone takes), so any is a process's.
pub fn unseen_holder(w: &AttributionWindow) -> Option<(Option<i64>, Option<f64>)> {
    w.unseen_memory_bytes
        .filter(|b| *b > 0)
        .map(|b| (Some(b), None))
}

/// A busy window split by its utilization samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Split {
    /// The part of the window's samples at or above the busy threshold, strictly between 0 and 1.
    pub busy_fraction: f64,
    /// Mean utilization (%) of the busy samples, and of the quiet ones.
    pub busy_util: f64,
    pub quiet_util: f64,
}

/// What a GPU or MIG instance did over one window, by its cluster's thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// A process holding memory works (SM at or above `held_sm_percent`), or the GPU's
    /// utilization is at or above the threshold.
    Busy,
    /// Processes hold the device and nothing measures its activity (a MIG device without
    /// GPM): in use by their presence. Attributed as used; never idle, never alerted.
    Present,
    /// Processes hold memory and none works.
    HeldIdle,
    /// No process holds memory and utilization is under the threshold (or unmeasured: NVML
    /// lists every process on a device, so with none there, nothing runs).
    Idle,
    /// The device could not be read (lost, a fatal XID, the driver away) and shows no work:
    /// nothing to go on. Its time is idle, for the fault's reason.
    Unknown,
}

impl Activity {
    pub fn as_str(self) -> &'static str {
        match self {
            Activity::Busy => "busy",
            Activity::Present => "in use (activity not measurable)",
            Activity::HeldIdle => "held idle",
            Activity::Idle => "idle",
            Activity::Unknown => "no data",
        }
    }

    /// Busy or present: someone's work, in the bill and on the fleet page.
    pub fn in_use(self) -> bool {
        matches!(self, Activity::Busy | Activity::Present)
    }
}

/// Whether a process holds its GPU: it holds memory on it, or shows SM work. The one definition,
/// for attribution (who pays for a held-idle window) and alerts (who is named as holding it).
pub fn holds(memory_bytes: Option<i64>, sm_percent: Option<f64>) -> bool {
    memory_bytes.unwrap_or(0) > 0 || sm_percent.unwrap_or(0.0) > 0.0
}

/// The activity of one window: `util` is the GPU's utilization, `processes` each process's
/// (memory held, SM utilization). A process holds the GPU as [`holds`] says; one without SM
/// utilization works when the GPU is busy, and uses it by its presence where the GPU's
/// utilization is not measured either.
pub fn activity(
    util: Option<f64>,
    processes: impl IntoIterator<Item = (Option<i64>, Option<f64>)>,
    threshold: f64,
    held_sm_percent: f64,
) -> Activity {
    let gpu_busy = util.map(|u| u >= threshold);
    let (mut held, mut unmeasured) = (false, false);
    for (memory, sm) in processes {
        if !holds(memory, sm) {
            continue;
        }
        held = true;
        match (sm, gpu_busy) {
            (Some(sm), _) if sm >= held_sm_percent => return Activity::Busy,
            (None, Some(true)) => return Activity::Busy,
            (None, None) => unmeasured = true,
            _ => {}
        }
    }
    match (held, gpu_busy) {
        (true, _) if unmeasured => Activity::Present,
        (true, _) => Activity::HeldIdle,
        (false, Some(true)) => Activity::Busy,
        (false, _) => Activity::Idle,
    }
}

/// Width of a utilization band, in points: usage is kept as window counts per band (what
/// right-sizing reads).
pub const UTIL_BAND_POINTS: f64 = 5.0;
/// Bands from 0 (under 5%) to 20 (100%).
pub const BANDS: usize = 21;

/// The band a window's utilization falls in: 0 (under 5%) to 20 (100%).
pub fn util_band(util: f64) -> i64 {
    ((util / UTIL_BAND_POINTS).floor() as i64).clamp(0, BANDS as i64 - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_window_splits_by_its_samples() {
        let rules = Thresholds {
            busy_gpu_percent: 5.0,
            working_sm_percent: 1.0,
        };
        // 10 s of a minute at 90 %, the rest at 0 and 2 %.
        let split = rules.split(Some("[[0,40],[2,10],[90,10]]")).unwrap();
        assert!((split.busy_fraction - 10.0 / 60.0).abs() < 1e-12);
        assert_eq!(split.busy_util, 90.0);
        assert!((split.quiet_util - 20.0 / 50.0).abs() < 1e-12);
        // The threshold is the cluster's: at 1 % the 2 % samples are busy too.
        let low = Thresholds {
            busy_gpu_percent: 1.0,
            ..rules
        };
        assert!(
            (low.split(Some("[[0,40],[2,10],[90,10]]"))
                .unwrap()
                .busy_fraction
                - 20.0 / 60.0)
                .abs()
                < 1e-12
        );
        // All on one side, no histogram, or one the server cannot read: no split.
        assert_eq!(rules.split(Some("[[50,15]]")), None);
        assert_eq!(rules.split(Some("[[0,15]]")), None);
        assert_eq!(rules.split(None), None);
        assert_eq!(rules.split(Some("not json")), None);
    }

    #[test]
    fn activity_by_the_thresholds() {
        let gib = Some(1i64 << 30);
        // (GPU utilization, processes (memory, SM)) -> activity, at threshold 5 % and SM 1 %.
        type Case = (Option<f64>, Vec<(Option<i64>, Option<f64>)>, Activity);
        let cases: [Case; 12] = [
            (Some(0.0), vec![], Activity::Idle),
            (Some(4.9), vec![], Activity::Idle),
            // Busy with no visible process (another container's): busy, not idle.
            (Some(5.0), vec![], Activity::Busy),
            // Nothing measured and nothing held: NVML lists every process, so nothing runs.
            (None, vec![], Activity::Idle),
            // A MIG device without GPM: a process holding it uses it by its presence.
            (None, vec![(gib, None)], Activity::Present),
            // One process measured idle beside one that cannot be measured: present.
            (None, vec![(gib, Some(0.0)), (gib, None)], Activity::Present),
            (None, vec![(gib, Some(0.0))], Activity::HeldIdle),
            (Some(0.0), vec![(gib, Some(0.0))], Activity::HeldIdle),
            (
                Some(0.0),
                vec![(gib, Some(0.9)), (gib, Some(1.0))],
                Activity::Busy,
            ),
            // No per-process SM from the driver: the GPU's utilization decides.
            (Some(40.0), vec![(gib, None)], Activity::Busy),
            (Some(2.0), vec![(gib, None)], Activity::HeldIdle),
            // A process holding no memory holds nothing.
            (Some(0.0), vec![(Some(0), Some(0.0))], Activity::Idle),
        ];
        for (util, procs, want) in cases {
            assert_eq!(
                activity(util, procs.clone(), 5.0, 1.0),
                want,
                "{util:?} {procs:?}"
            );
        }
        // Per-cluster thresholds move the line.
        assert_eq!(activity(Some(20.0), [], 30.0, 1.0), Activity::Idle);
        assert_eq!(
            activity(Some(0.0), [(gib, Some(3.0))], 5.0, 5.0),
            Activity::HeldIdle
        );
    }
}
