//! Recommendation snapshots: a computed set of advice kept for the range and data it was
//! computed from, so pages read it instead of computing it again.

use super::db::{on_backend, On};
use super::StoreError;

/// Recommendations stored for a range: `(computed_ms, JSON body)`.
pub async fn recommendation_snapshot(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
    observed_ms: i64,
) -> Result<Option<(i64, String)>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT computed_ms, body FROM recommendation_snapshots
             WHERE from_ms = $1 AND to_ms = $2 AND observed_ms = $3",
        )
        .bind(from_ms)
        .bind(to_ms)
        .bind(observed_ms)
        .fetch_optional(&mut *ex)
        .await?)
    })
}

/// Stores (or replaces) the recommendations for a range.
pub async fn put_recommendation_snapshot(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
    observed_ms: i64,
    computed_ms: i64,
    body: &str,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query(
            "INSERT INTO recommendation_snapshots
                (from_ms, to_ms, observed_ms, computed_ms, body)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (from_ms, to_ms, observed_ms)
             DO UPDATE SET computed_ms = EXCLUDED.computed_ms, body = EXCLUDED.body",
        )
        .bind(from_ms)
        .bind(to_ms)
        .bind(observed_ms)
        .bind(computed_ms)
        .bind(body)
        .execute(&mut *ex)
        .await?;
        Ok(())
    })
}

/// Deletes snapshots of ranges still under way that were computed before `before_ms`.
pub async fn expire_recommendation_snapshots(
    on: impl Into<On<'_>>,
    before_ms: i64,
) -> Result<u64, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query(
            "DELETE FROM recommendation_snapshots
             WHERE computed_ms < to_ms AND computed_ms < $1",
        )
        .bind(before_ms)
        .execute(&mut *ex)
        .await?
        .rows_affected())
    })
}
