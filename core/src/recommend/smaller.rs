//! Advice for a host whose working GPUs are too busy to pack, beside GPUs that ran nothing:
//! the rate card's smaller instance of its family, or those GPUs' cost named.

use rust_decimal::Decimal;

use super::{monthly, Consolidation};
use crate::ratecard::RateCard;

/// What a host's whole GPUs cost and did over the look-back, for sizing its instance.
#[derive(Default)]
pub(super) struct HostGpus<'a> {
    pub(super) gpus: Vec<&'a str>,
    /// How many of them did some work.
    pub(super) busy: usize,
    pub(super) cost: Decimal,
    /// Of `cost`, on hours a commitment covered.
    pub(super) committed_cost: Decimal,
    pub(super) util_gpu_seconds: f64,
    pub(super) util_known_seconds: f64,
    /// Whether the host has MIG instances (its whole GPUs are not what to size by).
    pub(super) mig: bool,
}

/// A GPU that ran no process, and what it cost so (of it, on committed hours).
pub(super) struct IdleGpu<'a> {
    pub(super) gpu: &'a str,
    pub(super) cost: Decimal,
    pub(super) committed_cost: Decimal,
}

/// A host by name, and its instance type where one is known.
pub(super) struct HostOn<'a> {
    pub(super) hostname: String,
    pub(super) instance_type: Option<&'a str>,
}

/// Advice for a host on which some GPUs worked, too busy to pack, while `idle` ran nothing at
/// all (a cloud instance is paid whole, so those GPUs cannot be released alone). Where the rate
/// card has an instance type of the same family with fewer GPUs that still holds the busy ones,
/// the cheapest such: the move saves the price difference on the host's whole cost. Otherwise
/// the idle GPUs' own cost, to be saved by giving them work or moving the busy GPUs' work
/// onto GPUs with room and releasing the host.
pub(super) fn smaller_instance(
    on: &HostOn,
    host: &HostGpus,
    idle: &[IdleGpu],
    card: &RateCard,
    lookback_ms: i64,
) -> Consolidation {
    let smaller = on.instance_type.and_then(|current| {
        let rate = card.instance_types.get(current)?;
        let family = current.split('.').next()?;
        card.instance_types
            .iter()
            .filter(|(t, r)| {
                t.split('.').next() == Some(family)
                    && r.gpus as usize >= host.busy.max(1)
                    && r.gpus < rate.gpus
                    && r.on_demand < rate.on_demand
                    && !rate.on_demand.is_zero()
            })
            .min_by(|a, b| a.1.on_demand.cmp(&b.1.on_demand).then(a.0.cmp(b.0)))
            .map(|(t, r)| {
                (
                    t.clone(),
                    r.gpus,
                    Decimal::ONE - r.on_demand / rate.on_demand,
                )
            })
    });
    let (n, s) = (host.gpus.len(), idle.len());
    let (gpus, cost, cash, freed, action) = match smaller {
        Some((instance_type, count, share)) => (
            host.gpus.iter().map(|g| (*g).to_owned()).collect::<Vec<_>>(),
            host.cost,
            (host.cost - host.committed_cost) * share,
            host.committed_cost * share,
            format!(
                "move to {instance_type} ({count} GPUs): {s} of its {n} GPUs ran no process                  while the others were too busy to pack together"
            ),
        ),
        None => {
            let (cost, committed) = idle
                .iter()
                .fold((Decimal::ZERO, Decimal::ZERO), |(cost, committed), g| {
                    (cost + g.cost, committed + g.committed_cost)
                });
            (
                idle.iter().map(|g| g.gpu.to_owned()).collect(),
                cost,
                cost - committed,
                committed,
                format!(
                    "give its {s} GPUs that ran no process work, or move the work of its other                      {} onto GPUs with room and release the host: {}",
                    n - s,
                    match on.instance_type {
                        Some(t) => format!("the rate card has no smaller {t} with room for it"),
                        None => "its instance type is not known".to_owned(),
                    }
                ),
            )
        }
    };
    Consolidation {
        currency: String::new(),
        gpus,
        action,
        host: on.hostname.clone(),
        avg_util: if host.util_known_seconds > 0.0 {
            (host.util_gpu_seconds / host.util_known_seconds * 10.0).round() / 10.0
        } else {
            0.0
        },
        cost: cost.round_dp(2),
        saving: cash.round_dp(2),
        frees_commitment: freed.round_dp(2),
        monthly_cost: monthly(cost, lookback_ms).round_dp(2),
        monthly_saving: monthly(cash, lookback_ms).round_dp(2),
        monthly_frees_commitment: monthly(freed, lookback_ms).round_dp(2),
    }
}
