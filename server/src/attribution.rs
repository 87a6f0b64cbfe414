//! Attribution's loader: reads what a range needs and hands it to the core's rules
//! ([`gpuledger_core::attribution`]: every dollar of a host-hour to who used its GPUs).

use crate::store;
use crate::store::{Store, StoreError};
use gpuledger_core::attribution::*;
use gpuledger_core::commitment::charge_unused;
use gpuledger_core::ratecard::RateCard;
use gpuledger_core::time::hour_floor;

/// Loads what `[from_ms, to_ms)` needs and attributes it.
pub async fn compute(
    store: &dyn Store,
    card: &RateCard,
    rules: &Rules,
    from_ms: i64,
    to_ms: i64,
) -> Result<Attribution, StoreError> {
    let from = hour_floor(from_ms);
    let hosts = store::telemetry::hosts(store.db()).await?;
    let windows = store::rollups::attribution_windows(store.db(), from, to_ms).await?;
    let processes = store::telemetry::process_windows(store.db(), from, to_ms).await?;
    let lines = store::bills::cost_lines(store.db(), from, to_ms).await?;
    let mut lines = charge_unused(lines, rules.unused_commitments, from, to_ms);
    lines.extend(last_billed(store, &hosts, from).await?);
    Ok(attribute_by(
        hosts,
        &windows,
        &processes,
        &lines,
        card,
        &rules.busy,
        &rules.owners,
        from,
        to_ms,
    ))
}

/// What the bill last charged each agent-reported host of `hosts` for an hour ending by
/// `from_ms`, within [`gpuledger_core::bill::LAST_BILLED_LOOKBACK_MS`]: the lines an hour
/// after the bill's last line is estimated from ([`attribute_by`]).
pub async fn last_billed(
    store: &dyn Store,
    hosts: &[gpuledger_core::telemetry::HostRow],
    from_ms: i64,
) -> Result<Vec<gpuledger_core::bill::StoredCostLine>, StoreError> {
    let keys: Vec<&str> = hosts
        .iter()
        .filter(|h| !h.from_bill)
        .filter_map(|h| h.instance_key.as_deref())
        .collect();
    let since = from_ms - gpuledger_core::bill::LAST_BILLED_LOOKBACK_MS;
    store::bills::last_billed_lines(store.db(), &keys, since, from_ms).await
}

#[cfg(test)]
mod tests;
