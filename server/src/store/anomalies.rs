//! Spend anomalies as the database keeps them: which were announced in Slack, which were
//! dismissed and by whom. Anomalies themselves are found from the ledger each time (see `crate::anomalies`), never stored.

use super::db::{on_backend, On};
use super::StoreError;

/// An anomaly's name: its owner, currency and first day.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AnomalyId {
    pub dimension: String,
    pub owner_key: String,
    pub currency: String,
    pub start_ms: i64,
}

/// Claims the Slack message for an anomaly of a kind: true only the first time, so one
/// replica announces it once.
pub async fn claim_alert(
    on: impl Into<On<'_>>,
    id: &AnomalyId,
    kind: &str,
    now_ms: i64,
) -> Result<bool, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let done = sqlx::query(
            "INSERT INTO anomaly_alerts (dimension, owner_key, currency, start_ms, kind, sent_ms)
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        )
        .bind(&id.dimension)
        .bind(&id.owner_key)
        .bind(&id.currency)
        .bind(id.start_ms)
        .bind(kind)
        .bind(now_ms)
        .execute(&mut *ex)
        .await?;
        Ok(done.rows_affected() == 1)
    })
}

/// The first days an owner's anomalies of a kind were claimed under (late data can move an
/// anomaly's first day: the caller decides which are the same anomaly).
pub async fn claims(
    on: impl Into<On<'_>>,
    id: &AnomalyId,
    kind: &str,
) -> Result<Vec<AnomalyId>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let starts: Vec<(i64,)> = sqlx::query_as(
            "SELECT start_ms FROM anomaly_alerts
             WHERE dimension = $1 AND owner_key = $2 AND currency = $3 AND kind = $4
             ORDER BY start_ms",
        )
        .bind(&id.dimension)
        .bind(&id.owner_key)
        .bind(&id.currency)
        .bind(kind)
        .fetch_all(&mut *ex)
        .await?;
        Ok(starts
            .into_iter()
            .map(|(start_ms,)| AnomalyId {
                start_ms,
                ..id.clone()
            })
            .collect())
    })
}

/// A dismissal as recorded.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct DismissalRow {
    pub dimension: String,
    pub owner_key: String,
    pub currency: String,
    pub start_ms: i64,
    pub dismissed_by: String,
    pub dismissed_ms: i64,
    pub reason: String,
}

impl DismissalRow {
    pub fn id(&self) -> AnomalyId {
        AnomalyId {
            dimension: self.dimension.clone(),
            owner_key: self.owner_key.clone(),
            currency: self.currency.clone(),
            start_ms: self.start_ms,
        }
    }
}

/// Records a dismissal; false where the anomaly was already dismissed (the first one stands).
pub async fn dismiss(on: impl Into<On<'_>>, d: &DismissalRow) -> Result<bool, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let done = sqlx::query(
            "INSERT INTO anomaly_dismissals (dimension, owner_key, currency, start_ms,
                                             dismissed_by, dismissed_ms, reason)
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
        )
        .bind(&d.dimension)
        .bind(&d.owner_key)
        .bind(&d.currency)
        .bind(d.start_ms)
        .bind(&d.dismissed_by)
        .bind(d.dismissed_ms)
        .bind(&d.reason)
        .execute(&mut *ex)
        .await?;
        Ok(done.rows_affected() == 1)
    })
}

/// Dismissals recorded under a first day in `[from_ms, to_ms)`.
pub async fn dismissals(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<DismissalRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT dimension, owner_key, currency, start_ms, dismissed_by, dismissed_ms, reason
             FROM anomaly_dismissals WHERE start_ms >= $1 AND start_ms < $2
             ORDER BY start_ms, dimension, owner_key, currency",
        )
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(&mut *ex)
        .await?)
    })
}
