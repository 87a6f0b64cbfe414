//! How a roll-up's marked hours are cut into passes a bounded amount of raw windows each, and
//! a pass's hosts into groups read and attributed one after another.

use super::*;

/// Consecutive hours attributed and stored together, their raw data loaded a range of hosts at
/// a time.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Pass {
    pub(super) hours: Vec<i64>,
    /// Groups of hosts, in order, whose ranges together cover every id: just [`HostGroup::ALL`]
    /// unless an hour of the fleet's windows is over the budget.
    pub(super) host_groups: Vec<HostGroup>,
}

/// Host ids, both ends included: a pass over a large fleet's hour covers a range at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HostRange {
    pub(super) first: i64,
    pub(super) last: i64,
}

impl HostRange {
    pub(super) const ALL: HostRange = HostRange {
        first: i64::MIN,
        last: i64::MAX,
    };

    pub(super) fn contains(self, host_id: i64) -> bool {
        (self.first..=self.last).contains(&host_id)
    }
}

/// The hosts of a range attributed together: the range says which bill lines are theirs, the
/// ids (those with windows in the hour when it was planned) which raw data is read.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct HostGroup {
    pub(super) range: HostRange,
    pub(super) host_ids: Vec<i64>,
}

impl HostGroup {
    /// Every host, its raw data read by time alone.
    pub(super) const ALL: HostGroup = HostGroup {
        range: HostRange::ALL,
        host_ids: Vec::new(),
    };
}

/// Splits a run of hours into passes of at most about `budget` raw GPU windows each: a few
/// hours at a time, or an hour a range of hosts at a time, so memory stays bounded whether agents
/// send 5-minute or 1-second windows and whether the fleet has 10 GPUs or 10,000.
pub(super) async fn split_by_windows(
    store: &dyn Store,
    run: &[i64],
    budget: i64,
) -> Result<Vec<Pass>, StoreError> {
    let (from, to) = (run[0], run[run.len() - 1] + HOUR_MS);
    let counts = store::rollups::gpu_windows_per_hour_and_host(store.db(), from, to).await?;
    Ok(plan_passes(run, &counts, budget))
}

/// Passes for `run` given its windows per `(hour, host)`: consecutive hours while their windows
/// fit the budget; an hour over it on its own, its hosts grouped. Counted per hour because data
/// is rarely spread evenly: a run of a day may hold a new fleet's first two hours.
pub(super) fn plan_passes(run: &[i64], counts: &[(i64, i64, i64)], budget: i64) -> Vec<Pass> {
    let budget = budget.max(1);
    let mut per_hour: BTreeMap<i64, Vec<(i64, i64)>> = BTreeMap::new();
    for &(hour, host, windows) in counts {
        per_hour.entry(hour).or_default().push((host, windows));
    }
    let mut passes = Vec::new();
    let mut hours: Vec<i64> = Vec::new();
    let mut in_pass = 0;
    let whole = |hours: Vec<i64>| Pass {
        hours,
        host_groups: vec![HostGroup::ALL],
    };
    for &hour in run {
        let hosts = per_hour.get(&hour).map_or(&[][..], Vec::as_slice);
        let windows: i64 = hosts.iter().map(|(_, n)| n).sum();
        if windows > budget {
            if !hours.is_empty() {
                passes.push(whole(std::mem::take(&mut hours)));
            }
            passes.push(Pass {
                hours: vec![hour],
                host_groups: host_groups(hosts, budget),
            });
            in_pass = 0;
            continue;
        }
        if !hours.is_empty() && in_pass + windows > budget {
            passes.push(whole(std::mem::take(&mut hours)));
            in_pass = 0;
        }
        hours.push(hour);
        in_pass += windows;
    }
    if !hours.is_empty() {
        passes.push(whole(hours));
    }
    passes
}

/// Groups of hosts of about `budget` windows each (one host over it is a group of its own)
/// whose ranges cover every host id; a host is never split.
pub(super) fn host_groups(per_host: &[(i64, i64)], budget: i64) -> Vec<HostGroup> {
    let mut groups = Vec::new();
    let mut first = i64::MIN;
    let mut host_ids = Vec::new();
    let mut in_group = 0;
    for &(host_id, windows) in per_host {
        if in_group > 0 && in_group + windows > budget {
            groups.push(HostGroup {
                range: HostRange {
                    first,
                    last: host_id - 1,
                },
                host_ids: std::mem::take(&mut host_ids),
            });
            first = host_id;
            in_group = 0;
        }
        host_ids.push(host_id);
        in_group += windows;
    }
    groups.push(HostGroup {
        range: HostRange {
            first,
            last: i64::MAX,
        },
        host_ids,
    });
    groups
}

/// Splits sorted hours into runs of consecutive hours, each at most [`HOURS_PER_PASS`] long.
pub(super) fn consecutive_runs(hours: &[i64]) -> Vec<Vec<i64>> {
    let mut runs: Vec<Vec<i64>> = Vec::new();
    for &h in hours {
        match runs.last_mut() {
            Some(r) if r.len() < HOURS_PER_PASS && r.last() == Some(&(h - HOUR_MS)) => r.push(h),
            _ => runs.push(vec![h]),
        }
    }
    runs
}
