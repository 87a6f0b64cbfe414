//! Purchase-mix advice per GPU instance type from a month's shape ([`crate::shape`]): what the
//! month would have cost all on demand, and with whole instances of its always-on floor
//! committed at each commitment price known (the rest on demand), with the break-even
//! utilization of a commitment. Prices come from the rate card or the bill, never from here.
//!
//! It assumes the next months look like this one (the same hours held per type) and that a
//! commitment of the type applies to every hour it is held; what the advice assumes is said
//! with it.

use rust_decimal::prelude::FromPrimitive;
use rust_decimal::Decimal;
use serde::Serialize;

use crate::shape::TypeShape;

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
    /// What is missing to price a commitment ("no commitment price: …"), if anything.
    pub missing: Option<String>,
}

fn money(x: f64) -> Decimal {
    Decimal::from_f64(x).unwrap_or_default().round_dp(6)
}

/// The mix for `shape`, at `on_demand` per instance-hour with `gpus` GPUs an instance, and a
/// commitment at each of `commits`. `None` where the type has no on-demand price.
pub fn mix(
    shape: &TypeShape,
    currency: &str,
    gpus: u32,
    on_demand: Decimal,
    commits: &[CommitPrice],
) -> Option<TypeMix> {
    if gpus == 0 || on_demand <= Decimal::ZERO {
        return None;
    }
    let per_gpu = on_demand / Decimal::from(gpus);
    let hours = Decimal::from(shape.hourly.len() as u64);
    let floor_instances = (shape.spread.floor / f64::from(gpus)).floor().max(0.0) as u32;
    let committed_gpus = f64::from(floor_instances * gpus);
    // GPU-hours above the committed GPUs: the band bought on demand.
    let band: f64 = shape
        .hourly
        .iter()
        .map(|g| (g - committed_gpus).max(0.0))
        .sum();
    let all: f64 = shape.hourly.iter().sum();
    let mut options = vec![MixOption {
        choice: "all on demand".into(),
        committed_instances: 0,
        cost: (money(all) * per_gpu).round_dp(2),
        break_even_percent: None,
    }];
    if floor_instances > 0 {
        for c in commits {
            options.push(MixOption {
                choice: format!(
                    "commit {floor_instances} instances ({}, {}), the rest on demand",
                    c.term, c.source
                ),
                committed_instances: floor_instances,
                cost: (Decimal::from(floor_instances) * hours * c.per_instance_hour
                    + money(band) * per_gpu)
                    .round_dp(2),
                break_even_percent: Some(
                    (c.per_instance_hour * Decimal::ONE_HUNDRED / on_demand).round_dp(1),
                ),
            });
        }
    }
    let cheapest = options
        .iter()
        .min_by_key(|o| o.cost)
        .map(|o| o.choice.clone())
        .unwrap_or_default();
    let missing = if floor_instances == 0 {
        Some("no always-on floor of a whole instance: nothing worth committing".into())
    } else if commits.is_empty() {
        Some(format!(
            "no commitment price: add commit_1y or commit_3y for {} to the rate card",
            shape.instance_type
        ))
    } else {
        None
    };
    Some(TypeMix {
        instance_type: shape.instance_type.clone(),
        currency: currency.to_owned(),
        gpus_per_instance: gpus,
        floor_instances,
        options,
        cheapest,
        missing,
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
        let m = mix(&shape(), "USD", 8, d("80"), &commits).unwrap();
        assert_eq!(m.floor_instances, 2);
        // All on demand: 1,800 GPU-hours at $10.
        assert_eq!(m.options[0].cost, d("18000"));
        // Two instances committed for 100 hours at $40, and 200 GPU-hours above them at $10.
        let committed = &m.options[1];
        assert_eq!(committed.cost, d("10000"));
        assert_eq!(committed.break_even_percent, Some(d("50.0")));
        assert_eq!(m.cheapest, committed.choice);
        assert_eq!(m.missing, None);
    }

    #[test]
    fn a_commitment_dearer_than_the_hours_it_covers_is_not_the_cheapest() {
        let commits = [CommitPrice {
            term: "3-year".into(),
            per_instance_hour: d("90"),
            source: "rate card".into(),
        }];
        let m = mix(&shape(), "USD", 8, d("80"), &commits).unwrap();
        assert_eq!(m.cheapest, "all on demand");
    }

    #[test]
    fn without_a_commitment_price_or_a_floor_it_says_what_is_missing() {
        let m = mix(&shape(), "USD", 8, d("80"), &[]).unwrap();
        assert_eq!(m.options.len(), 1);
        assert!(m.missing.unwrap().contains("commit_1y"));
        let m = mix(&shape(), "USD", 32, d("320"), &[]).unwrap();
        assert!(m.missing.unwrap().contains("no always-on floor"));
        assert!(mix(&shape(), "USD", 8, Decimal::ZERO, &[]).is_none());
    }
}
