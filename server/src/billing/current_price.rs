//! What a GPU host costs per hour now, for figures about the present (the fleet page's $/hour,
//! an idle incident's burn rate): the latest hour the bill charged it (bills lag a day or two),
//! else the rate card.
//!
//! Month figures never come from here: they are sums over the hourly ledger.

use std::collections::HashMap;

use rust_decimal::Decimal;

use crate::store;
use crate::store::{Store, StoreError};
use gpuledger_core::bill::spread_over_hours;
use gpuledger_core::bill::StoredCostLine;
use gpuledger_core::ratecard::RateCard;
use gpuledger_core::telemetry::HostRow;
use gpuledger_core::time::{hour_floor, HOUR_MS};

/// How far back bills are read to price the present hour: as far as an hour after the bill's
/// last line is estimated from it in the ledger.
pub const BILL_LOOKBACK_MS: i64 = gpuledger_core::bill::LAST_BILLED_LOOKBACK_MS;

/// One physical GPU's cost per hour on a host, in the currency of its bill (or of the rate
/// card), and whether it is a rate-card estimate.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuPrice {
    pub per_gpu_hour: Decimal,
    pub currency: String,
    pub estimated: bool,
}

/// What one physical GPU of `host` costs per hour: the newest billed hour of its lines within
/// the look-back, divided over its GPUs, else the rate card for its instance type and GPUs.
/// `gpu_names` are the host's physical GPUs (their NVML names). A host billed in several
/// currencies is priced in that of its newest line: amounts in two currencies never add.
pub fn gpu_price(
    host: &HostRow,
    lines: &[&StoredCostLine],
    gpu_names: &[&str],
    card: &RateCard,
    now_ms: i64,
) -> Option<GpuPrice> {
    if gpu_names.is_empty() {
        return None;
    }
    let n = Decimal::from(gpu_names.len());
    let newest = lines
        .iter()
        .max_by_key(|l| (l.charge_period_end_ms, l.charge_period_start_ms))
        .map(|l| l.currency.clone());
    let mut per_hour: std::collections::BTreeMap<i64, Decimal> = Default::default();
    for l in lines
        .iter()
        .filter(|l| Some(&l.currency) == newest.as_ref())
    {
        let spread = spread_over_hours(
            l.effective_cost,
            l.charge_period_start_ms,
            l.charge_period_end_ms,
            now_ms - BILL_LOOKBACK_MS,
            now_ms + HOUR_MS,
        );
        for (h, amount) in spread {
            *per_hour.entry(h).or_default() += amount;
        }
    }
    if let (Some((_, hourly)), Some(currency)) = (per_hour.iter().next_back(), newest) {
        return Some(GpuPrice {
            per_gpu_hour: *hourly / n,
            currency,
            estimated: false,
        });
    }
    let spot = host.lifecycle.as_deref() == Some("spot");
    card.host_price(host.instance_type.as_deref(), gpu_names, spot)
        .map(|(hourly, _)| GpuPrice {
            per_gpu_hour: hourly / n,
            currency: card.currency.clone(),
            estimated: true,
        })
}

/// [`gpu_price`] for every host in `gpu_names` (host id → its physical GPUs' names), reading
/// the bill's recent lines once.
pub async fn gpu_prices(
    store: &dyn Store,
    hosts: &[HostRow],
    gpu_names: &HashMap<i64, Vec<String>>,
    card: &RateCard,
    now_ms: i64,
) -> Result<HashMap<i64, GpuPrice>, StoreError> {
    // Each host's newest billed hour, however far behind the bill is (within the look-back).
    let keys: Vec<&str> = hosts
        .iter()
        .filter_map(|h| h.instance_key.as_deref())
        .collect();
    let lines = store::bills::last_billed_lines(
        store.db(),
        &keys,
        now_ms - BILL_LOOKBACK_MS,
        hour_floor(now_ms) + HOUR_MS,
    )
    .await?;
    let mut out = HashMap::new();
    for host in hosts {
        let Some(names) = gpu_names.get(&host.id) else {
            continue;
        };
        let host_lines: Vec<&StoredCostLine> = lines
            .iter()
            .filter(|l| l.resource_key.is_some() && l.resource_key == host.instance_key)
            // A commitment's unused part written on the resource is not what it costs to run.
            .filter(|l| !l.is_unused_commitment())
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        if let Some(p) = gpu_price(host, &host_lines, &names, card, now_ms) {
            out.insert(host.id, p);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(instance_type: &str, lifecycle: Option<&str>) -> HostRow {
        HostRow {
            id: 1,
            cluster: "c".into(),
            hostname: "h".into(),
            provider: Some("aws".into()),
            instance_id: Some("i-1".into()),
            instance_key: Some("i-1".into()),
            instance_type: Some(instance_type.into()),
            lifecycle: lifecycle.map(str::to_owned),
            region: None,
            from_bill: false,
        }
    }

    fn line(start_ms: i64, end_ms: i64, cost: &str) -> StoredCostLine {
        StoredCostLine {
            resource_key: Some("i-1".into()),
            charge_period_start_ms: start_ms,
            charge_period_end_ms: end_ms,
            charge_category: "Usage".into(),
            billed_cost: gpuledger_core::money::from_text(cost),
            effective_cost: gpuledger_core::money::from_text(cost),
            currency: "USD".into(),
            pricing_category: "on_demand".into(),
            instance_type: None,
            tags_json: "{}".into(),
            commitment_id: None,
            commitment_part: None,
        }
    }

    #[test]
    fn the_newest_billed_hour_wins_over_the_rate_card() {
        let card = RateCard::default_card();
        let now = 100 * HOUR_MS + 20 * 60_000;
        let names = ["NVIDIA A10G"; 4];
        // Two billed hours, three and two hours ago: the newer one prices the present.
        let older = line(97 * HOUR_MS, 98 * HOUR_MS, "4.00");
        let newer = line(98 * HOUR_MS, 99 * HOUR_MS, "6.00");
        let h = host("g5.12xlarge", None);
        let p = gpu_price(&h, &[&older, &newer], &names, &card, now).unwrap();
        assert_eq!(p.per_gpu_hour, Decimal::new(150, 2));
        assert!(!p.estimated);
        // A bill a day or two behind still prices the present (bills lag); one older than the
        // look-back does not: the rate card answers, as an estimate.
        let lagging = line(50 * HOUR_MS, 51 * HOUR_MS, "6.00");
        let p = gpu_price(&h, &[&lagging], &names, &card, now).unwrap();
        assert_eq!((p.per_gpu_hour, p.estimated), (Decimal::new(150, 2), false));
        let month_ago = hour_floor(now - BILL_LOOKBACK_MS) - 2 * HOUR_MS;
        let stale = line(month_ago, month_ago + HOUR_MS, "6.00");
        let p = gpu_price(&h, &[&stale], &names, &card, now).unwrap();
        assert!(p.estimated);
        let (hourly, _) = card.host_price(Some("g5.12xlarge"), &names, false).unwrap();
        assert_eq!(p.per_gpu_hour, hourly / Decimal::from(4));
        // Spot hosts get the spot rate; an unknown type and GPU has no price; no GPU, none.
        let spot = gpu_price(&host("g5.12xlarge", Some("spot")), &[], &names, &card, now).unwrap();
        assert!(spot.per_gpu_hour < p.per_gpu_hour);
        assert!(gpu_price(&host("x9.huge", None), &[], &["Mystery GPU"], &card, now).is_none());
        assert!(gpu_price(&h, &[&newer], &[], &card, now).is_none());
    }

    #[test]
    fn a_price_is_in_its_bills_currency() {
        let card = RateCard::default_card();
        let now = 100 * HOUR_MS + 20 * 60_000;
        let names = ["NVIDIA A10G"; 4];
        let h = host("g5.12xlarge", None);
        let euro = |start: i64, cost: &str| StoredCostLine {
            currency: "EUR".into(),
            ..line(start * HOUR_MS, (start + 1) * HOUR_MS, cost)
        };
        let p = gpu_price(&h, &[&euro(98, "8.00")], &names, &card, now).unwrap();
        assert_eq!(
            (p.per_gpu_hour, p.currency.as_str()),
            (Decimal::new(2, 0), "EUR")
        );
        // A host whose bill moved to another currency is priced in the newest line's alone.
        let dollars = line(97 * HOUR_MS, 98 * HOUR_MS, "4.00");
        let (old_euro, new_euro) = (euro(97, "8.00"), euro(98, "12.00"));
        let p = gpu_price(&h, &[&dollars, &old_euro, &new_euro], &names, &card, now).unwrap();
        assert_eq!(
            (p.per_gpu_hour, p.currency.as_str()),
            (Decimal::new(3, 0), "EUR")
        );
        // The rate card prices in its own currency.
        let p = gpu_price(&h, &[], &names, &card, now).unwrap();
        assert_eq!(p.currency, card.currency);
    }
}
