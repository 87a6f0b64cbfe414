//! Right-sizing: an endpoint or model on a GPU model that a cheaper GPU of the catalogue holds
//! (peak memory plus headroom fits, the p95 utilization scaled by relative compute stays under
//! the target), saving its cost scaled by the price ratio.

use rust_decimal::Decimal;

use super::catalog::{identify, CATALOG, GIB};
use super::tally::Tally;
use super::{monthly, p95_of_bands, Options, RightSize};
use crate::ratecard::RateCard;

pub(super) fn right_size(
    tally: &Tally,
    card: &RateCard,
    options: Options,
    lookback_ms: i64,
) -> Vec<RightSize> {
    let mut right_size = Vec::new();
    for ((by, key, (name, mem)), u) in &tally.usage {
        let Some(current) = identify(name, *mem) else {
            continue;
        };
        let Some(current_price) = current.price(card).filter(|p| !p.is_zero()) else {
            continue;
        };
        let need_gb = u.peak_bytes as f64 / GIB * (1.0 + options.headroom);
        let p95_util = p95_of_bands(&u.bands);
        let best = CATALOG
            .iter()
            .filter_map(|c| Some((c, c.price(card)?)))
            .filter(|(c, price)| c.memory_gb >= need_gb && *price < current_price)
            .map(|(c, price)| (c, price, p95_util * current.tflops / c.tflops))
            .filter(|(_, _, projected)| *projected <= options.target_util)
            .min_by(|a, b| a.1.cmp(&b.1));
        let Some((rec, price, projected)) = best else {
            continue;
        };
        let (spent, committed) =
            u.gpus
                .iter()
                .fold((Decimal::ZERO, Decimal::ZERO), |(spent, committed), g| {
                    let (c, k) = (tally.cost.get(&(*by, *key, *g)).copied()).unwrap_or_default();
                    (spent + c, committed + k)
                });
        let share = Decimal::ONE - price / current_price;
        let frees = committed * share;
        let saving = spent * share - frees;
        right_size.push(RightSize {
            currency: String::new(),
            by: (*by).to_owned(),
            key: key.to_string(),
            current_gpu: current.name.to_owned(),
            gpus: u.gpus.iter().map(|g| (*g).to_owned()).collect(),
            peak_memory_gb: (u.peak_bytes as f64 / GIB * 10.0).round() / 10.0,
            p95_util,
            cost: spent.round_dp(2),
            saving: saving.round_dp(2),
            frees_commitment: frees.round_dp(2),
            monthly_cost: monthly(spent, lookback_ms).round_dp(2),
            monthly_saving: monthly(saving, lookback_ms).round_dp(2),
            monthly_frees_commitment: monthly(frees, lookback_ms).round_dp(2),
            recommended_gpu: rec.name.to_owned(),
            recommended_instance_type: rec.offered_on(),
            projected_p95_util: (projected * 10.0).round() / 10.0,
        });
    }
    right_size
}
