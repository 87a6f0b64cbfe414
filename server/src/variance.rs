//! Why spend changed: a month against the one before (a month in progress against the same
//! stretch of the previous month), per owner, from the ledger. The rules are the core's
//! ([`gpuledger_core::variance`]: volume, idle, mix and price, adding up to the change).

use serde::Serialize;

use crate::ledger;
use crate::store::{RollupGrain, Store, StoreError};
use gpuledger_core::allocation::main_currency;
use gpuledger_core::allocation::GroupBy;
use gpuledger_core::attribution::Attribution;
use gpuledger_core::owners::OwnerSchema;
use gpuledger_core::scope::Scope;
use gpuledger_core::time::{hour_floor, month_of, rfc3339};
use gpuledger_core::variance::VarianceRow;

/// What a month's spend is set against. A month in progress is set against the same stretch of
/// the previous month (its first days and hours, up to where this one has got), never against a
/// whole month; a closed month against the whole previous month. Returns the range and whether
/// it is a part of the previous month.
pub fn comparison(from: i64, to: i64, now: i64) -> (i64, i64, bool) {
    let (prev_from, _) = month_of(from - 1);
    if now >= to {
        return (prev_from, from, false);
    }
    let elapsed = hour_floor(now.max(from)) - from;
    (prev_from, (prev_from + elapsed).min(from), true)
}

/// A month's change against what it is set against, per key of one dimension, in one currency.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Variance {
    pub by: GroupBy,
    /// `[from, to)`: the month (RFC 3339).
    pub from: String,
    pub to: String,
    /// What it is set against.
    pub previous_from: String,
    pub previous_to: String,
    /// The month is still running: month to date against the same stretch of the month before.
    pub month_to_date: bool,
    pub currency: String,
    /// Other currencies either period carries: never added in, explained on their own.
    pub other_currencies: Vec<String>,
    pub rows: Vec<VarianceRow>,
    /// The rows added up: the whole change, in the same four parts.
    pub total: VarianceRow,
}

/// [`Variance`] from both periods' ledger, already loaded; in the current period's main
/// currency (the previous one's where the current has nothing).
pub fn of(
    current: &Attribution,
    previous: &Attribution,
    by: GroupBy,
    (from, to, prev_from, prev_to, partial): (i64, i64, i64, i64, bool),
) -> Variance {
    let currency = if current.parts.is_empty() {
        main_currency(previous)
    } else {
        main_currency(current)
    };
    let mut other_currencies: Vec<String> = current
        .parts
        .iter()
        .chain(&previous.parts)
        .map(|p| p.currency.as_str())
        .filter(|c| *c != currency)
        .map(str::to_owned)
        .collect();
    other_currencies.sort();
    other_currencies.dedup();
    let rows = gpuledger_core::variance::explain(previous, current, by, &currency);
    Variance {
        by,
        from: rfc3339(from),
        to: rfc3339(to),
        previous_from: rfc3339(prev_from),
        previous_to: rfc3339(prev_to),
        month_to_date: partial,
        currency,
        other_currencies,
        total: VarianceRow::sum("(all)", &rows),
        rows,
    }
}

/// The month `[from, to)` against what it is set against ([`comparison`]), keys `by` one
/// dimension; of the teams `scope` sees. What `keep` says has closed is read as kept, as the
/// review reads it.
pub async fn for_month(
    store: &dyn Store,
    (from, to, now): (i64, i64, i64),
    by: GroupBy,
    (scope, schema): (&Scope, &OwnerSchema),
    keep: ledger::Keep,
) -> Result<Variance, StoreError> {
    let (prev_from, prev_to, partial) = comparison(from, to, now);
    // The same stretch of the month before as the month so far: its kept days grow by one a
    // day (see the review).
    let keep_previous = if partial { keep.growing() } else { keep };
    let (current, previous) = tokio::try_join!(
        // Summed over the range, as the review reads them: the same figures on both.
        ledger::load_kept(store, from, to, RollupGrain::HostRange, keep),
        ledger::load_kept(
            store,
            prev_from,
            prev_to,
            RollupGrain::HostRange,
            keep_previous
        ),
    )?;
    let (current, previous) = (
        scope.restrict(current, schema),
        scope.restrict(previous, schema),
    );
    Ok(of(
        &current,
        &previous,
        by,
        (from, to, prev_from, prev_to, partial),
    ))
}
