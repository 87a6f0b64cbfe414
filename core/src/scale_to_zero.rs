//! Scale-to-zero windows: hours of the week in which an owner (an inference endpoint, a
//! notebook) holds GPUs and does no work, week after week, so turning it off then, and on
//! again after, saves what those hours cost.
//!
//! An hour is quiet for an owner when the ledger has its cost in that hour and none of it is
//! used: only held idle (memory held at ~0 %), by the one definition of busy. An hour of the
//! week (Monday 00:00 UTC to Sunday 23:00) is a window's hour when it was quiet every time the
//! range saw the owner in it, and the range saw it there in at least [`MIN_WEEKS`] weeks; an
//! hour the owner was not running at all neither counts nor breaks a window. Windows shorter
//! than [`MIN_WINDOW_HOURS`] are left out: nobody scales to zero for an hour.

use std::collections::{BTreeMap, BTreeSet};

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::attribution::Kind;
use crate::time::{weekday, HOUR_MS};

/// Weeks an hour of the week must have been seen quiet, every time, to be a pattern.
pub const MIN_WEEKS: usize = 3;
/// The shortest window worth a schedule.
pub const MIN_WINDOW_HOURS: u32 = 4;
const WEEK_HOURS: u32 = 168;
const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];

/// One owner's part of one hour, as the ledger holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnerHour {
    pub key: String,
    pub hour_ms: i64,
    pub currency: String,
    pub kind: Kind,
    pub cost: Decimal,
    /// Of `cost`, on hours a commitment (savings plan, reservation) covered.
    pub committed: Decimal,
    pub gpu_seconds: f64,
}

/// A recurring quiet stretch of the week.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuietWindow {
    /// Its first hour of the week: 0 is Monday 00:00 UTC, 167 Sunday 23:00.
    pub start_hour_of_week: u32,
    pub hours: u32,
    /// "Fri 20:00 – Mon 08:00 UTC", or "all week".
    pub label: String,
}

/// An owner that could be off in its windows, and what that saves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Candidate {
    pub key: String,
    pub currency: String,
    pub windows: Vec<QuietWindow>,
    /// Hours a week its windows cover.
    pub hours_per_week: u32,
    /// The evidence: hours of the range inside its windows in which it held GPUs, the GPU-hours
    /// it held then, and their cost: what turning it off then saves over the range, in cash
    /// (`saving`) and, for hours a commitment covered, as freed commitment (paid for either
    /// way: cash only once other on-demand work takes it up or the commitment is reduced).
    pub quiet_hours: u32,
    pub gpu_hours: f64,
    #[serde(with = "rust_decimal::serde::str")]
    pub saving: Decimal,
    #[serde(with = "rust_decimal::serde::str")]
    pub frees_commitment: Decimal,
    /// `(saving + frees_commitment) ÷ gpu_hours`: the rate those GPU-hours cost.
    #[serde(with = "rust_decimal::serde::str_option")]
    pub per_gpu_hour: Option<Decimal>,
}

fn hour_of_week(hour_ms: i64) -> u32 {
    weekday(hour_ms) * 24 + (hour_ms.rem_euclid(24 * HOUR_MS) / HOUR_MS) as u32
}

fn slot_label(slot: u32) -> String {
    let slot = slot % WEEK_HOURS;
    format!("{} {:02}:00", DAYS[(slot / 24) as usize], slot % 24)
}

/// Runs of consecutive window hours around the week (a run may wrap from Sunday to Monday).
fn runs(quiet: &[bool; WEEK_HOURS as usize]) -> Vec<(u32, u32)> {
    if quiet.iter().all(|q| *q) {
        return vec![(0, WEEK_HOURS)];
    }
    // Start from an hour that is not quiet, so no run is cut at the week's edge.
    let Some(origin) = quiet.iter().position(|q| !q) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut run: Option<(u32, u32)> = None;
    for i in 1..=WEEK_HOURS {
        let slot = (origin as u32 + i) % WEEK_HOURS;
        match (quiet[slot as usize], run.as_mut()) {
            (true, Some((_, len))) => *len += 1,
            (true, None) => run = Some((slot, 1)),
            (false, Some(_)) => out.extend(run.take()),
            (false, None) => {}
        }
    }
    out.extend(run);
    out.sort_unstable();
    out
}

/// The owners of `hours` with recurring quiet windows, largest saving first.
pub fn find(hours: &[OwnerHour]) -> Vec<Candidate> {
    // Per owner and currency, per hour of the range: any work, cost, GPU-seconds, committed cost.
    type Hours = BTreeMap<i64, (bool, Decimal, f64, Decimal)>;
    let mut by_owner: BTreeMap<(&str, &str), Hours> = BTreeMap::new();
    // A bucket ("(unseen process)", "(unlabeled)") is no endpoint anyone could turn off.
    for h in hours.iter().filter(|h| !h.key.starts_with('(')) {
        let e = by_owner
            .entry((h.key.as_str(), h.currency.as_str()))
            .or_default()
            .entry(h.hour_ms)
            .or_default();
        e.0 |= h.kind == Kind::Used;
        e.1 += h.cost;
        e.2 += h.gpu_seconds;
        e.3 += h.committed;
    }
    let mut found = Vec::new();
    for ((key, currency), hours) in by_owner {
        // Per hour of the week: the weeks it was seen, and whether it ever worked then.
        let mut seen: Vec<BTreeSet<i64>> = vec![BTreeSet::new(); WEEK_HOURS as usize];
        let mut worked = [false; WEEK_HOURS as usize];
        for (&hour, &(used, _, _, _)) in &hours {
            let slot = hour_of_week(hour) as usize;
            seen[slot].insert(hour);
            worked[slot] |= used;
        }
        let mut quiet = [false; WEEK_HOURS as usize];
        for slot in 0..WEEK_HOURS as usize {
            quiet[slot] = !worked[slot] && seen[slot].len() >= MIN_WEEKS;
        }
        let windows: Vec<(u32, u32)> = runs(&quiet)
            .into_iter()
            .filter(|(_, len)| *len >= MIN_WINDOW_HOURS)
            .collect();
        if windows.is_empty() {
            continue;
        }
        let mut in_window = [false; WEEK_HOURS as usize];
        for (start, len) in &windows {
            for i in 0..*len {
                in_window[((start + i) % WEEK_HOURS) as usize] = true;
            }
        }
        let (mut quiet_hours, mut cost_then, mut gpu_seconds) = (0, Decimal::ZERO, 0.0);
        let mut committed = Decimal::ZERO;
        for (&hour, &(_, cost, seconds, on_commitment)) in &hours {
            if in_window[hour_of_week(hour) as usize] {
                quiet_hours += 1;
                cost_then += cost;
                committed += on_commitment;
                gpu_seconds += seconds;
            }
        }
        let gpu_hours = gpu_seconds / 3600.0;
        found.push(Candidate {
            key: key.to_owned(),
            currency: currency.to_owned(),
            hours_per_week: windows.iter().map(|(_, len)| len).sum(),
            windows: windows
                .into_iter()
                .map(|(start, hours)| QuietWindow {
                    start_hour_of_week: start,
                    hours,
                    label: if hours == WEEK_HOURS {
                        "all week".to_owned()
                    } else {
                        format!("{} – {} UTC", slot_label(start), slot_label(start + hours))
                    },
                })
                .collect(),
            quiet_hours,
            gpu_hours,
            per_gpu_hour: Decimal::try_from(gpu_hours)
                .ok()
                .filter(|g| !g.is_zero())
                .map(|g| (cost_then / g).round_dp(4)),
            saving: cost_then - committed,
            frees_commitment: committed,
        });
    }
    found.sort_by(|a, b| {
        (b.saving + b.frees_commitment)
            .cmp(&(a.saving + a.frees_commitment))
            .then(a.key.cmp(&b.key))
    });
    found
}

#[cfg(test)]
mod tests;
