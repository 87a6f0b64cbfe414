//! Purchase-mix advice per GPU instance type from a month's shape ([`crate::shape`]): what the
//! month would have cost all on demand, and with whole instances of its always-on floor
//! committed at each commitment price known (the rest on demand), with the break-even
//! utilization of a commitment. Prices come from the rate card or the bill, never from here.
//!
//! Where the rate card gives a spot price and experiments did work on the type, the options
//! also put that work above the committed floor on spot: training that checkpoints can take an
//! interruption; serving and notebooks are left on demand.
//!
//! It assumes the next months look like this one (the same hours held per type), that a
//! commitment of the type applies to every hour it is held, and that spot capacity is there at
//! its price; what the advice assumes is said with it ([`ASSUMES`]).

use rust_decimal::prelude::FromPrimitive;
use rust_decimal::Decimal;
use serde::Serialize;

use crate::shape::TypeShape;

/// What every mix assumes, said beside it.
pub const ASSUMES: &str = "the next months hold the same GPUs each hour as this one; a \
    commitment covers every hour its type is held; experiments doing work checkpoint and \
    survive a spot interruption, and spot capacity is there at the rate card's price";

/// A price of one instance-hour of a type under a commitment, and where it comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct CommitPrice {
    /// "1-year", "3-year", or "as billed".
    pub term: String,
    pub per_instance_hour: Decimal,
    /// "rate card", "the bill's committed rate".
    pub source: String,
}

/// What the type's month would have cost bought one way.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MixOption {
    /// "all on demand", or "commit 8 instances (1-year, rate card), the rest on demand".
    pub choice: String,
    pub committed_instances: u32,
    #[serde(with = "rust_decimal::serde::str")]
    pub cost: Decimal,
    /// A committed instance beats on demand only when held more than this share of the hours
    /// (the commitment's price ÷ the on-demand price), in percent; `null` all on demand.
    #[serde(with = "rust_decimal::serde::str_option")]
    pub break_even_percent: Option<Decimal>,
    /// GPU-hours of experiments' work it puts on spot.
    pub spot_gpu_hours: f64,
}

/// The options for one type, cheapest marked.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TypeMix {
    pub instance_type: String,
    pub currency: String,
    pub gpus_per_instance: u32,
    /// Whole instances the floor holds: what a commitment would buy.
    pub floor_instances: u32,
    pub options: Vec<MixOption>,
    /// The cheapest option's `choice`.
    pub cheapest: String,
    /// What is missing to price a commitment or spot ("no commitment price: …"), if anything.
    pub missing: Option<String>,
    /// What the options assume ([`ASSUMES`]).
    pub assumes: String,
}

fn money(x: f64) -> Decimal {
    Decimal::from_f64(x).unwrap_or_default().round_dp(6)
}

/// The mix for `shape`, at `on_demand` per instance-hour with `gpus` GPUs an instance, a
/// commitment at each of `commits`, and experiments' work on spot at `spot` per instance-hour
/// where given. `None` where the type has no on-demand price.
pub fn mix(
    shape: &TypeShape,
    currency: &str,
    gpus: u32,
    (on_demand, spot): (Decimal, Option<Decimal>),
    commits: &[CommitPrice],
) -> Option<TypeMix> {
    if gpus == 0 || on_demand <= Decimal::ZERO {
        return None;
    }
    let per_gpu = on_demand / Decimal::from(gpus);
    let spot_per_gpu = spot.map(|s| s / Decimal::from(gpus));
    let hours = Decimal::from(shape.hourly.len() as u64);
    let floor_instances = (shape.spread.floor / f64::from(gpus)).floor().max(0.0) as u32;
    let interruptible = |i: usize| shape.interruptible.get(i).copied().unwrap_or(0.0);
    // Above `committed` GPUs each hour: (GPU-hours on demand, experiments' GPU-hours on spot).
    let band = |committed: f64, with_spot: bool| {
        shape
            .hourly
            .iter()
            .enumerate()
            .fold((0.0, 0.0), |(od, sp), (i, g)| {
                let above = (g - committed).max(0.0);
                let on_spot = if with_spot {
                    interruptible(i).min(above)
                } else {
                    0.0
                };
                (od + above - on_spot, sp + on_spot)
            })
    };
    let spot_work = shape.interruptible.iter().sum::<f64>() > 0.0;
    let mut options = Vec::new();
    for committed in std::iter::once(None).chain(
        (floor_instances > 0)
            .then_some(commits)
            .into_iter()
            .flatten()
            .map(Some),
    ) {
        let committed_gpus = f64::from(floor_instances * gpus) * f64::from(committed.is_some());
        let fixed = committed.map_or(Decimal::ZERO, |c| {
            Decimal::from(floor_instances) * hours * c.per_instance_hour
        });
        let base = match committed {
            None => "all on demand".to_owned(),
            Some(c) => format!(
                "commit {floor_instances} instances ({}, {}), the rest on demand",
                c.term, c.source
            ),
        };
        let break_even_percent =
            committed.map(|c| (c.per_instance_hour * Decimal::ONE_HUNDRED / on_demand).round_dp(1));
        let (od, _) = band(committed_gpus, false);
        options.push(MixOption {
            choice: base.clone(),
            committed_instances: if committed.is_some() {
                floor_instances
            } else {
                0
            },
            cost: (fixed + money(od) * per_gpu).round_dp(2),
            break_even_percent,
            spot_gpu_hours: 0.0,
        });
        if let (Some(spot_per_gpu), true) = (spot_per_gpu, spot_work) {
            let (od, sp) = band(committed_gpus, true);
            // Nothing of experiments' above the commitment: the same as without spot.
            if sp <= 0.0 {
                continue;
            }
            options.push(MixOption {
                choice: match committed {
                    None => "experiments' work on spot, the rest on demand".to_owned(),
                    Some(_) => base.replace(
                        ", the rest on demand",
                        ", experiments' work above it on spot, the rest on demand",
                    ),
                },
                committed_instances: if committed.is_some() {
                    floor_instances
                } else {
                    0
                },
                cost: (fixed + money(od) * per_gpu + money(sp) * spot_per_gpu).round_dp(2),
                break_even_percent,
                spot_gpu_hours: (sp * 100.0).round() / 100.0,
            });
        }
    }
    let cheapest = options
        .iter()
        .min_by_key(|o| o.cost)
        .map(|o| o.choice.clone())
        .unwrap_or_default();
    let mut missing = Vec::new();
    if floor_instances == 0 {
        missing.push("no always-on floor of a whole instance: nothing worth committing".to_owned());
    } else if commits.is_empty() {
        missing.push(format!(
            "no commitment price: add commit_1y or commit_3y for {} to the rate card",
            shape.instance_type
        ));
    }
    if spot_work && spot.is_none() {
        missing.push(format!(
            "no spot price: add spot for {} to the rate card to weigh experiments on spot",
            shape.instance_type
        ));
    }
    Some(TypeMix {
        instance_type: shape.instance_type.clone(),
        currency: currency.to_owned(),
        gpus_per_instance: gpus,
        floor_instances,
        options,
        cheapest,
        missing: (!missing.is_empty()).then(|| missing.join("; ")),
        assumes: ASSUMES.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::{shapes, TypeHour};
    use crate::time::HOUR_MS;

    fn d(text: &str) -> Decimal {
        text.parse().unwrap()
    }

    /// 100 hours of a type of 8-GPU instances: 16 GPUs always, 8 more in 25 of them.
    fn shape() -> TypeShape {
        let hours: Vec<TypeHour> = (0..100)
            .map(|h| TypeHour {
                hour_ms: h * HOUR_MS,
                instance_type: "p5.48xlarge".into(),
                owner: None,
                gpu_seconds: if h < 25 { 24.0 } else { 16.0 } * 3600.0,
                // Of the 8 GPUs above the floor, 6 are experiments' work.
                interruptible_seconds: if h < 25 { 6.0 } else { 0.0 } * 3600.0,
            })
            .collect();
        shapes(&hours, 0, 100 * HOUR_MS).remove(0)
    }

    #[test]
    fn committing_the_floor_prices_the_floor_at_the_commitment_and_the_band_on_demand() {
        let commits = [CommitPrice {
            term: "1-year".into(),
            per_instance_hour: d("40"),
            source: "rate card".into(),
        }];
        let m = mix(&shape(), "USD", 8, (d("80"), None), &commits).unwrap();
        assert_eq!(m.floor_instances, 2);
        // All on demand: 1,800 GPU-hours at $10.
        assert_eq!(m.options[0].cost, d("18000"));
        // Two instances committed for 100 hours at $40, and 200 GPU-hours above them at $10.
        let committed = &m.options[1];
        assert_eq!(committed.cost, d("10000"));
        assert_eq!(committed.break_even_percent, Some(d("50.0")));
        assert_eq!(m.cheapest, committed.choice);
        assert!(m.missing.unwrap().starts_with("no spot price"));
    }

    #[test]
    fn a_commitment_dearer_than_the_hours_it_covers_is_not_the_cheapest() {
        let commits = [CommitPrice {
            term: "3-year".into(),
            per_instance_hour: d("90"),
            source: "rate card".into(),
        }];
        let m = mix(&shape(), "USD", 8, (d("80"), None), &commits).unwrap();
        assert_eq!(m.cheapest, "all on demand");
    }

    #[test]
    fn without_a_commitment_price_or_a_floor_it_says_what_is_missing() {
        let m = mix(&shape(), "USD", 8, (d("80"), None), &[]).unwrap();
        assert_eq!(m.options.len(), 1);
        assert!(m.missing.unwrap().contains("commit_1y"));
        let m = mix(&shape(), "USD", 32, (d("320"), None), &[]).unwrap();
        assert!(m.missing.unwrap().contains("no always-on floor"));
        assert!(mix(&shape(), "USD", 8, (Decimal::ZERO, None), &[]).is_none());
        // Experiments did work, and no spot price says what they would cost there.
        let m = mix(&shape(), "USD", 8, (d("80"), None), &[]).unwrap();
        assert!(m.missing.unwrap().contains("no spot price"));
    }

    #[test]
    fn experiments_work_above_the_floor_goes_on_spot() {
        let commits = [CommitPrice {
            term: "1-year".into(),
            per_instance_hour: d("40"),
            source: "rate card".into(),
        }];
        // Spot at $24 an instance-hour: $3 a GPU-hour against $10 on demand.
        let m = mix(&shape(), "USD", 8, (d("80"), Some(d("24"))), &commits).unwrap();
        let choices: Vec<&str> = m.options.iter().map(|o| o.choice.as_str()).collect();
        assert_eq!(
            choices,
            [
                "all on demand",
                "experiments' work on spot, the rest on demand",
                "commit 2 instances (1-year, rate card), the rest on demand",
                "commit 2 instances (1-year, rate card), experiments' work above it on spot, \
                 the rest on demand",
            ]
        );
        // 150 GPU-hours of experiments' work (6 GPUs for 25 hours) move from $10 to $3.
        assert_eq!(m.options[1].cost, d("18000") - d("1050"));
        assert_eq!(m.options[1].spot_gpu_hours, 150.0);
        // Above the committed 16 GPUs the band is 8 GPUs for 25 hours, 6 of them experiments'.
        assert_eq!(m.options[3].cost, d("8000") + d("500") + d("450"));
        assert_eq!(m.cheapest, m.options[3].choice);
        assert_eq!(m.options[3].break_even_percent, Some(d("50.0")));
        assert_eq!(m.missing, None);
        assert!(m.assumes.contains("checkpoint"));
    }
}
