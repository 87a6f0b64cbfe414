//! Purchase-mix advice per GPU instance type for a range: its shape ([`crate::shape`]) priced
//! all on demand and with its floor committed, at the rate card's commitment prices, else at
//! the committed rate the bill applied to the type. The rules are the core's
//! ([`gpuledger_core::purchase`]).

pub use gpuledger_core::purchase::*;

use rust_decimal::Decimal;

use crate::billing::ratecard::RateCard;
use crate::shape::TypeShape;
use crate::store::{self, Store, StoreError};

/// The mix of each type of `shapes` (the whole fleet's), in the rate card's currency; types the
/// rate card has no on-demand price for are left out.
pub async fn for_range(
    store: &dyn Store,
    card: &RateCard,
    shapes: &[TypeShape],
    (from_ms, to_ms): (i64, i64),
) -> Result<Vec<TypeMix>, StoreError> {
    let billed = store::ledger::committed_by_type(store.db(), from_ms, to_ms).await?;
    Ok(shapes
        .iter()
        .filter_map(|shape| {
            let rate = card.instance_types.get(&shape.instance_type)?;
            let mut commits: Vec<CommitPrice> =
                [("1-year", rate.commit_1y), ("3-year", rate.commit_3y)]
                    .into_iter()
                    .filter_map(|(term, price)| {
                        Some(CommitPrice {
                            term: term.into(),
                            per_instance_hour: price?,
                            source: "rate card".into(),
                        })
                    })
                    .collect();
            if commits.is_empty() {
                // The committed rate the bill applied to the type this month, per instance.
                commits.extend(
                    billed
                        .iter()
                        .filter(|(t, c, _, seconds)| {
                            *t == shape.instance_type && *c == card.currency && *seconds > 0.0
                        })
                        .filter_map(|(_, _, cost, seconds)| {
                            let gpu_hours = Decimal::try_from(seconds / 3600.0).ok()?;
                            Some(CommitPrice {
                                term: "as billed".into(),
                                per_instance_hour: (cost / gpu_hours * Decimal::from(rate.gpus))
                                    .round_dp(4),
                                source: "the bill's committed rate".into(),
                            })
                        }),
                );
            }
            mix(shape, &card.currency, rate.gpus, rate.on_demand, &commits)
        })
        .collect())
}
