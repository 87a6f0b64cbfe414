//! Purchase-mix advice per GPU instance type for a range: its shape ([`crate::shape`]) priced
//! all on demand and with its floor committed, at the rate card's commitment prices, else at
//! the committed rate the bill applied to the type; and experiments' work on spot at the rate
//! card's spot price. The rules are the core's
//! ([`gpuledger_core::purchase`]).

use gpuledger_core::purchase::*;

use rust_decimal::Decimal;

use gpuledger_core::commitment::TypeCost;
use gpuledger_core::ratecard::RateCard;
use gpuledger_core::shape::TypeShape;

/// The mix of each type of `shapes` (the whole fleet's), in the rate card's currency, with the
/// ledger's `costs` per type and pricing category over the same range
/// ([`crate::store::ledger::cost_by_type`]) for the committed rate the bill applied. A type
/// the rate card has no price for is listed with that said, and no option.
pub fn of_shapes(card: &RateCard, shapes: &[TypeShape], costs: &[TypeCost]) -> Vec<TypeMix> {
    shapes
        .iter()
        .map(|shape| {
            let Some(rate) = card.instance_types.get(&shape.instance_type) else {
                return unpriced(shape, &card.currency);
            };
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
                    costs
                        .iter()
                        .filter(|c| {
                            c.instance_type == shape.instance_type
                                && c.currency == card.currency
                                && c.pricing_category == "committed"
                                && c.gpu_seconds > 0.0
                        })
                        .filter_map(|c| {
                            let gpu_hours = Decimal::try_from(c.gpu_seconds / 3600.0).ok()?;
                            let cost = c.cost;
                            Some(CommitPrice {
                                term: "as billed".into(),
                                per_instance_hour: (cost / gpu_hours * Decimal::from(rate.gpus))
                                    .round_dp(4),
                                source: "the bill's committed rate".into(),
                            })
                        }),
                );
            }
            mix(
                shape,
                &card.currency,
                rate.gpus,
                (rate.on_demand, rate.spot),
                &commits,
            )
            .unwrap_or_else(|| unpriced(shape, &card.currency))
        })
        .collect()
}

/// A type the rate card cannot price: listed, with nothing invented.
fn unpriced(shape: &TypeShape, currency: &str) -> TypeMix {
    TypeMix {
        instance_type: shape.instance_type.clone(),
        currency: currency.to_owned(),
        gpus_per_instance: 0,
        floor_instances: 0,
        options: Vec::new(),
        cheapest: String::new(),
        missing: Some(format!(
            "the rate card has no on-demand price for {}: add it to weigh buying it",
            shape.instance_type
        )),
        assumes: ASSUMES.to_owned(),
    }
}
