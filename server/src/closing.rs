//! When a month's figures become final. A month closes a set time after it ends (5 days by
//! default, for late windows and the bill to arrive), or earlier when a finance lead signs it off
//! because its final bill is in (`/billing/YYYY-MM`, only while it reconciles to the cent). From then on the roll-up job leaves its
//! hours as they are: a late bill or a rate-card change for a closed month is shown on its review
//! as a change waiting, and applied only by an explicit restatement (`rollup --reopen`), which
//! keeps the figures before and after, when and why. Raw windows of months still open are never
//! deleted, so nothing is re-attributed from data that is gone.

use crate::store::closing::SignOffRow;
use crate::store::{self, Store, StoreError};
use gpuledger_core::ratecard::RateCard;
use gpuledger_core::time::month_start_ms;
use gpuledger_core::time::next_month_start;

/// Days after a month's end until it closes, by default.
pub const DEFAULT_CLOSE_AFTER_MS: i64 = 5 * gpuledger_core::time::DAY_MS;
/// The longest wait allowed: longer would keep two months open at once for no good reason.
pub const MAX_CLOSE_AFTER_MS: i64 = 28 * gpuledger_core::time::DAY_MS;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClosePolicy {
    /// How long after a month ends it closes.
    pub after_ms: i64,
    /// The latest month signed off (its bill final): it and every month before it are closed.
    pub signed_off_through: Option<i64>,
}

impl Default for ClosePolicy {
    fn default() -> Self {
        ClosePolicy {
            after_ms: DEFAULT_CLOSE_AFTER_MS,
            signed_off_through: None,
        }
    }
}

impl ClosePolicy {
    /// A policy from an admin's setting; the error says what is allowed.
    pub fn new(after_ms: i64) -> Result<ClosePolicy, String> {
        if !(0..=MAX_CLOSE_AFTER_MS).contains(&after_ms) {
            return Err(format!(
                "a month closes 0 to {} days after it ends",
                MAX_CLOSE_AFTER_MS / gpuledger_core::time::DAY_MS
            ));
        }
        Ok(ClosePolicy {
            after_ms,
            signed_off_through: None,
        })
    }

    /// The policy with the months signed off so far.
    pub fn with_sign_offs(self, sign_offs: &[crate::store::closing::SignOffRow]) -> ClosePolicy {
        ClosePolicy {
            signed_off_through: sign_offs.iter().map(|s| s.month_ms).max(),
            ..self
        }
    }

    /// The policy as it stands now: with the sign-offs in the database (another replica's or
    /// the web form's included).
    pub async fn current(
        self,
        store: &dyn crate::store::Store,
    ) -> Result<ClosePolicy, crate::store::StoreError> {
        Ok(self.with_sign_offs(&store::closing::sign_offs(store.db()).await?))
    }

    /// Whether the month containing `t_ms` was signed off (or one after it was).
    pub fn is_signed_off(&self, t_ms: i64) -> bool {
        self.signed_off_through
            .is_some_and(|m| month_start_ms(t_ms) <= m)
    }

    /// When the month containing `t_ms` closes.
    pub fn closes_at(&self, t_ms: i64) -> i64 {
        next_month_start(month_start_ms(t_ms)) + self.after_ms
    }

    /// Whether the month containing `t_ms` has closed at `now_ms`.
    pub fn is_closed(&self, t_ms: i64, now_ms: i64) -> bool {
        self.closes_at(t_ms) <= now_ms || self.is_signed_off(t_ms)
    }

    /// The start of the oldest month still open at `now_ms`: hours from here on may change.
    pub fn open_from(&self, now_ms: i64) -> i64 {
        let this = month_start_ms(now_ms);
        let previous = month_start_ms(this - 1);
        if self.is_closed(previous, now_ms) {
            this
        } else {
            previous
        }
    }
}

/// Hours in `[from_ms, to_ms)` marked and not rolled up yet: figures of those hours may still
/// change.
pub async fn pending_hours(store: &dyn Store, from_ms: i64, to_ms: i64) -> Result<i64, StoreError> {
    store::rollups::dirty_mark_count(store.db(), from_ms, to_ms).await
}

/// Every month signed off, oldest first.
pub async fn sign_offs(store: &dyn Store) -> Result<Vec<SignOffRow>, StoreError> {
    store::closing::sign_offs(store.db()).await
}

/// The restatements of the month starting at `month_ms`, oldest first.
pub async fn restatements(
    store: &dyn Store,
    month_ms: i64,
) -> Result<Vec<crate::store::closing::RestatementRow>, StoreError> {
    store::closing::restatements(store.db(), month_ms).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> i64 {
        chrono::DateTime::parse_from_rfc3339(text)
            .unwrap()
            .timestamp_millis()
    }

    #[test]
    fn a_signed_off_month_closes_at_once_and_so_do_those_before_it() {
        let policy = ClosePolicy::default();
        let now = at("2026-11-02T00:00:00Z");
        let october = at("2026-10-01T00:00:00Z");
        assert!(!policy.is_closed(october, now));
        assert_eq!(policy.open_from(now), october);
        let signed = policy.with_sign_offs(&[crate::store::closing::SignOffRow {
            month_ms: october,
            signed_ms: now,
            by_user: "ana".into(),
            note: String::new(),
        }]);
        assert!(signed.is_closed(october, now));
        assert!(signed.is_closed(at("2026-09-15T00:00:00Z"), now));
        assert!(!signed.is_closed(at("2026-11-01T00:00:00Z"), now));
        assert_eq!(signed.open_from(now), at("2026-11-01T00:00:00Z"));
    }

    #[test]
    fn a_month_closes_days_after_it_ends() {
        let p = ClosePolicy::default();
        assert_eq!(
            p.closes_at(at("2026-10-17T08:00:00Z")),
            at("2026-11-06T00:00:00Z")
        );
        assert_eq!(
            p.closes_at(at("2026-12-31T23:00:00Z")),
            at("2027-01-06T00:00:00Z")
        );
        let october = at("2026-10-03T00:00:00Z");
        assert!(!p.is_closed(october, at("2026-11-05T23:59:59Z")));
        assert!(p.is_closed(october, at("2026-11-06T00:00:00Z")));
        // Until October closes, it is the oldest open month; then November is.
        assert_eq!(
            p.open_from(at("2026-11-03T00:00:00Z")),
            at("2026-10-01T00:00:00Z")
        );
        assert_eq!(
            p.open_from(at("2026-11-23T00:00:00Z")),
            at("2026-11-01T00:00:00Z")
        );
        let at_once = ClosePolicy::new(0).unwrap();
        assert_eq!(
            at_once.open_from(at("2026-11-01T00:00:00Z")),
            at("2026-11-01T00:00:00Z")
        );
        assert!(ClosePolicy::new(-1).is_err());
        assert!(ClosePolicy::new(MAX_CLOSE_AFTER_MS + 1).is_err());
    }
}

/// How a sign-off ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignOff {
    /// Not signed off, and why (for the person who tried).
    Blocked(String),
    /// Signed off (or it already was: the first sign-off stands).
    Signed,
}

/// Signs the month `[from, to)` off for `by_user` at `now_ms`: only once it has ended, is still
/// open, has no hours waiting for the roll-up, and its bill reconciles to the ledger to the cent.
pub async fn sign_off(
    store: &dyn Store,
    rate_card: &RateCard,
    policy: ClosePolicy,
    (from, to): (i64, i64),
    by_user: &str,
    note: String,
    now_ms: i64,
) -> Result<SignOff, StoreError> {
    // Only the totals decide: no owner hints needed.
    let recs =
        crate::reconciliation::for_range(store, rate_card, &Default::default(), from, to).await?;
    let pending = store::rollups::dirty_mark_count(store.db(), from, to).await?;
    let policy = policy.current(store).await?;
    if let Some(why) = sign_off_blocked(&policy, &recs, pending, from, to, now_ms) {
        return Ok(SignOff::Blocked(why));
    }
    let sign_off = SignOffRow {
        month_ms: from,
        signed_ms: now_ms,
        by_user: by_user.to_owned(),
        note,
    };
    store::closing::sign_off_month(store.db(), &sign_off).await?;
    Ok(SignOff::Signed)
}

/// Why a month cannot be signed off now, if it cannot: a finance lead signs only a month that
/// has ended, is still open, has no hours waiting to be rolled up and reconciles to the cent.
pub fn sign_off_blocked(
    close: &ClosePolicy,
    recs: &[crate::reconciliation::Reconciliation],
    pending_hours: i64,
    from: i64,
    to: i64,
    now: i64,
) -> Option<String> {
    if to > now {
        return Some("The month has not ended.".into());
    }
    if close.is_closed(from, now) {
        return Some("The month is closed already.".into());
    }
    if pending_hours > 0 {
        return Some(format!(
            "{pending_hours} hours are waiting to be rolled up: try again in a minute."
        ));
    }
    if recs.is_empty() {
        return Some("There is no bill for this month.".into());
    }
    if let Some(r) = recs.iter().find(|r| !r.difference.is_zero()) {
        return Some(format!(
            "The {} bill and the ledger differ by {}: it does not reconcile.",
            r.currency,
            crate::format::money(r.difference, &r.currency)
        ));
    }
    None
}
