//! Closed months: their sign-offs, and the restatements recorded when a closed month's
//! figures changed.

use super::db::{on_backend, On};
use super::StoreError;

/// A month signed off by a finance lead: its bill is final, so it closed then.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct SignOffRow {
    pub month_ms: i64,
    pub signed_ms: i64,
    pub by_user: String,
    pub note: String,
}

/// A closed month's figures restated: per team (and the unattributed buckets), before and after.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct RestatementRow {
    pub month_ms: i64,
    pub created_ms: i64,
    pub reason: String,
    pub before_json: String,
    pub after_json: String,
}

/// Records that a month's bill is final (it closes now); false if it was signed off before.
pub async fn sign_off_month(
    on: impl Into<On<'_>>,
    s: &super::SignOffRow,
) -> Result<bool, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let done = sqlx::query(
            "INSERT INTO month_sign_offs (month_ms, signed_ms, by_user, note)
             VALUES ($1, $2, $3, $4) ON CONFLICT (month_ms) DO NOTHING",
        )
        .bind(s.month_ms)
        .bind(s.signed_ms)
        .bind(&s.by_user)
        .bind(&s.note)
        .execute(&mut *ex)
        .await?;
        Ok(done.rows_affected() == 1)
    })
}

/// Every month signed off, oldest first.
pub async fn sign_offs(on: impl Into<On<'_>>) -> Result<Vec<super::SignOffRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT month_ms, signed_ms, by_user, note FROM month_sign_offs
             ORDER BY month_ms",
        )
        .fetch_all(&mut *ex)
        .await?)
    })
}

pub async fn add_restatement(
    on: impl Into<On<'_>>,
    r: &super::RestatementRow,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query(
            "INSERT INTO restatements (month_ms, created_ms, reason, before_json, after_json)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(r.month_ms)
        .bind(r.created_ms)
        .bind(&r.reason)
        .bind(&r.before_json)
        .bind(&r.after_json)
        .execute(&mut *ex)
        .await?;
        Ok(())
    })
}

/// The restatements of the month starting at `month_ms`, oldest first.
pub async fn restatements(
    on: impl Into<On<'_>>,
    month_ms: i64,
) -> Result<Vec<super::RestatementRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT month_ms, created_ms, reason, before_json, after_json
             FROM restatements WHERE month_ms = $1 ORDER BY created_ms, id",
        )
        .bind(month_ms)
        .fetch_all(&mut *ex)
        .await?)
    })
}
