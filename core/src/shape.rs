//! The shape of the work per GPU instance type: how many GPUs it held in each hour of a range,
//! as a week (day of week × hour of day, UTC), and the always-on floor against the peak, for the
//! type and per owner. What capacity to commit, buy on demand or run on spot follows from it.
//!
//! GPUs held in an hour are the GPU-seconds the ledger has for the hour ÷ 3,600: every GPU paid
//! for, used, held idle or idle, so the floor is the capacity the fleet never went below. An
//! hour of the range with none is 0 GPUs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::time::{weekday, HOUR_MS};

/// The percentile of hourly GPUs taken as the always-on floor: 90 % of the hours held more.
pub const FLOOR_PERCENTILE: f64 = 10.0;

/// GPU-seconds of one instance type (and owner, where given) in one hour.
#[derive(Debug, Clone, PartialEq)]
pub struct TypeHour {
    pub hour_ms: i64,
    pub instance_type: String,
    /// The owner's value in the dimension read (a team), `None` for no value.
    pub owner: Option<String>,
    pub gpu_seconds: f64,
    /// Of them, the GPU-seconds experiments (the experiment role's owners) used doing work:
    /// training that checkpoints, which could run on interruptible (spot) capacity.
    pub interruptible_seconds: f64,
}

/// The floor, middle and peak of an hourly series of GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Spread {
    /// GPUs held in all but [`FLOOR_PERCENTILE`] % of the hours.
    pub floor: f64,
    pub median: f64,
    pub peak: f64,
    pub gpu_hours: f64,
}

impl Spread {
    fn of(series: &[f64]) -> Spread {
        let mut sorted = series.to_vec();
        sorted.sort_by(f64::total_cmp);
        let at = |p: f64| -> f64 {
            if sorted.is_empty() {
                return 0.0;
            }
            // Nearest rank: the smallest value at least p % of the hours are at or below.
            let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
            sorted[rank.min(sorted.len()) - 1]
        };
        Spread {
            floor: round2(at(FLOOR_PERCENTILE)),
            median: round2(at(50.0)),
            peak: round2(sorted.last().copied().unwrap_or(0.0)),
            gpu_hours: round2(series.iter().sum()),
        }
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// One owner's part of a type's shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OwnerShape {
    /// `null` for GPU time no owner in the dimension holds (idle, unlabeled).
    pub owner: Option<String>,
    #[serde(flatten)]
    pub spread: Spread,
}

/// One instance type's week.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TypeShape {
    pub instance_type: String,
    /// Hours of the range read (each counts, with 0 GPUs where none was held).
    pub hours: usize,
    #[serde(flatten)]
    pub spread: Spread,
    /// Average GPUs held at each hour of the week: `week[d][h]`, Monday 0, hours 0–23 UTC.
    pub week: Vec<Vec<f64>>,
    /// Per owner, largest GPU-hours first.
    pub owners: Vec<OwnerShape>,
    /// GPU-hours experiments used doing work: what could run on spot capacity.
    pub interruptible_gpu_hours: f64,
    /// GPUs held in each hour of the range, in order: what a purchase mix is priced on.
    #[serde(skip)]
    pub hourly: Vec<f64>,
    /// Of them, the GPUs experiments used doing work, each hour.
    #[serde(skip)]
    pub interruptible: Vec<f64>,
}

/// Each instance type's shape over the hours `[from_ms, to_ms)`, largest GPU-hours first.
pub fn shapes(hours: &[TypeHour], from_ms: i64, to_ms: i64) -> Vec<TypeShape> {
    let first = from_ms.div_euclid(HOUR_MS);
    let count = usize::try_from((to_ms - from_ms).div_euclid(HOUR_MS)).unwrap_or(0);
    if count == 0 {
        return Vec::new();
    }
    let index = |hour_ms: i64| {
        usize::try_from(hour_ms.div_euclid(HOUR_MS) - first)
            .ok()
            .filter(|i| *i < count)
    };
    // Per type: GPUs per hour of the range; per (type, owner) the same.
    let mut by_type: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut interruptible: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut by_owner: BTreeMap<(&str, Option<&str>), Vec<f64>> = BTreeMap::new();
    for h in hours {
        let Some(i) = index(h.hour_ms) else {
            continue;
        };
        let gpus = h.gpu_seconds / 3600.0;
        by_type
            .entry(h.instance_type.as_str())
            .or_insert_with(|| vec![0.0; count])[i] += gpus;
        interruptible
            .entry(h.instance_type.as_str())
            .or_insert_with(|| vec![0.0; count])[i] += h.interruptible_seconds / 3600.0;
        by_owner
            .entry((h.instance_type.as_str(), h.owner.as_deref()))
            .or_insert_with(|| vec![0.0; count])[i] += gpus;
    }
    let mut out: Vec<TypeShape> = by_type
        .into_iter()
        .map(|(instance_type, series)| {
            let mut sums = vec![vec![0.0; 24]; 7];
            let mut seen = vec![vec![0u32; 24]; 7];
            for (i, gpus) in series.iter().enumerate() {
                let hour_ms = (first + i as i64) * HOUR_MS;
                let (d, h) = (
                    weekday(hour_ms) as usize,
                    (hour_ms.rem_euclid(24 * HOUR_MS) / HOUR_MS) as usize,
                );
                sums[d][h] += gpus;
                seen[d][h] += 1;
            }
            let week = sums
                .iter()
                .zip(&seen)
                .map(|(s, n)| {
                    s.iter()
                        .zip(n)
                        .map(|(s, n)| {
                            if *n == 0 {
                                0.0
                            } else {
                                round2(s / f64::from(*n))
                            }
                        })
                        .collect()
                })
                .collect();
            let mut owners: Vec<OwnerShape> = by_owner
                .iter()
                .filter(|((t, _), _)| *t == instance_type)
                .map(|((_, owner), series)| OwnerShape {
                    owner: owner.map(str::to_owned),
                    spread: Spread::of(series),
                })
                .collect();
            owners.sort_by(|a, b| b.spread.gpu_hours.total_cmp(&a.spread.gpu_hours));
            let spot = interruptible.remove(instance_type).unwrap_or_default();
            TypeShape {
                instance_type: instance_type.to_owned(),
                hours: count,
                spread: Spread::of(&series),
                week,
                owners,
                interruptible_gpu_hours: round2(spot.iter().sum()),
                hourly: series,
                interruptible: spot,
            }
        })
        .collect();
    out.sort_by(|a, b| b.spread.gpu_hours.total_cmp(&a.spread.gpu_hours));
    out
}

#[cfg(test)]
mod tests;
