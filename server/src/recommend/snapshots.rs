//! Recommendations kept as last computed, per range, so a page reads one row instead of summing
//! a week of a whole fleet's rollups on every request.
//!
//! A range still under way (this month's last days, the API's look-back) is recomputed by a
//! periodic job under a lease and served for at most [`MAX_AGE_MS`]; a range that had ended when
//! it was computed is served while the rollups of its days are the generation it was drawn from
//! (as kept sections are): a roll-up that rewrites one of its days (late data, a new bill)
//! retires it, even one that committed while a view was computing it.

use super::{recommend, Options, Recommendations};
use crate::store;
use crate::store::{Store, StoreError};
use gpuledger_core::owners::OwnerSchema;
use gpuledger_core::ratecard::RateCard;
use gpuledger_core::time::DAY_MS;
use gpuledger_core::time::{hour_floor, HOUR_MS};

/// How long recommendations of a range still under way are served before being recomputed.
pub const MAX_AGE_MS: i64 = 10 * 60_000;
/// How often the job recomputes the ranges pages ask for now (well inside [`MAX_AGE_MS`]).
pub const REFRESH_EVERY_MS: i64 = 5 * 60_000;
/// The job's lease name.
pub const REFRESH_JOB: &str = "recommendations";
/// The look-back of the review and of the API by default.
pub const DEFAULT_LOOKBACK_MS: i64 = 7 * 24 * HOUR_MS;

/// A range recommendations are drawn from; monthly figures are scaled from `observed_ms` (the
/// part of it that has happened).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub from_ms: i64,
    pub to_ms: i64,
    pub observed_ms: i64,
}

/// The review's range for the month `[month_from, month_to)`: its last 7 whole UTC days (so
/// they come from daily rollups), today as far as it has happened; `None` before it starts.
pub fn review_range(month_from: i64, month_to: i64, now_ms: i64) -> Option<Range> {
    let until_now = hour_floor(now_ms) + HOUR_MS;
    let to_ms = (now_ms.div_euclid(DAY_MS) * DAY_MS + DAY_MS).min(month_to);
    let from_ms = month_from.max(to_ms - DEFAULT_LOOKBACK_MS);
    let observed_ms = to_ms.min(until_now) - from_ms;
    (observed_ms > 0).then_some(Range {
        from_ms,
        to_ms,
        observed_ms,
    })
}

/// The API's range: `lookback_ms` up to the end of the current hour.
pub fn lookback_range(now_ms: i64, lookback_ms: i64) -> Range {
    let to_ms = hour_floor(now_ms) + HOUR_MS;
    Range {
        from_ms: to_ms - lookback_ms,
        to_ms,
        observed_ms: lookback_ms,
    }
}

/// Recommendations for `range`: the stored ones while still valid, else computed from the
/// rollups and stored.
pub async fn get(
    store: &dyn Store,
    card: &RateCard,
    owners: &OwnerSchema,
    range: Range,
    now_ms: i64,
) -> Result<Recommendations, StoreError> {
    // Read afresh (the differential tests' reference): computed, nothing read or kept.
    let afresh = crate::sections::reading_afresh();
    let stored = if afresh {
        None
    } else {
        store::recommendations::recommendation_snapshot(
            store.db(),
            range.from_ms,
            range.to_ms,
            range.observed_ms,
        )
        .await?
    };
    if let Some(kept) = stored {
        let ended = kept.computed_ms >= range.to_ms;
        if (ended && kept.current) || (!ended && now_ms - kept.computed_ms < MAX_AGE_MS) {
            match serde_json::from_str(&kept.body) {
                Ok(r) => return Ok(r),
                // Written by another version: compute again and overwrite.
                Err(e) => tracing::warn!(error = %e, "stored recommendations unreadable"),
            }
        }
    }
    // A range still under way is kept only from the primary's reads: a snapshot has no guard
    // against one computed from a lagging replica replacing a newer one (the refresh job keeps
    // them). One over for a day is final either way, and kept on the primary.
    if afresh || (store.is_replica() && range.to_ms > now_ms - gpuledger_core::time::DAY_MS) {
        let evidence =
            crate::recommend::recommendation_evidence(store, range.from_ms, range.to_ms, owners)
                .await?;
        return Ok(recommend(
            &evidence,
            card,
            range.observed_ms,
            Options::default(),
        ));
    }
    compute_and_store(store, card, owners, range, now_ms).await
}

/// Computes recommendations for `range` from the rollups and stores them.
pub async fn compute_and_store(
    store: &dyn Store,
    card: &RateCard,
    owners: &OwnerSchema,
    range: Range,
    now_ms: i64,
) -> Result<Recommendations, StoreError> {
    // Read before the evidence: a roll-up that commits while it is read moves it on.
    let generation =
        store::sections::rollup_generation(store.db(), (range.from_ms, range.to_ms)).await?;
    let evidence =
        crate::recommend::recommendation_evidence(store, range.from_ms, range.to_ms, owners)
            .await?;
    let r = recommend(&evidence, card, range.observed_ms, Options::default());
    if let Some(body) = crate::sections::copy_of("recommendations", &r) {
        store::recommendations::put_recommendation_snapshot(
            store.primary(),
            (range.from_ms, range.to_ms, range.observed_ms),
            (generation, now_ms),
            &body,
        )
        .await?
    }
    Ok(r)
}

/// What the periodic job does: recomputes the ranges pages ask for now (this month's review,
/// the API's default look-back) and drops expired snapshots of ranges still under way.
pub async fn refresh(
    store: &dyn Store,
    card: &RateCard,
    owners: &OwnerSchema,
    now_ms: i64,
) -> Result<(), StoreError> {
    let (month_from, month_to) = gpuledger_core::time::month_of(now_ms);
    if let Some(range) = review_range(month_from, month_to, now_ms) {
        compute_and_store(store, card, owners, range, now_ms).await?;
    }
    compute_and_store(
        store,
        card,
        owners,
        lookback_range(now_ms, DEFAULT_LOOKBACK_MS),
        now_ms,
    )
    .await?;
    store::recommendations::expire_recommendation_snapshots(store.db(), now_ms - MAX_AGE_MS)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests;
