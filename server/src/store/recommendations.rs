//! Recommendation snapshots: a computed set of advice kept for the range and data it was
//! computed from, so pages read it instead of computing it again.

use super::db::{on_backend, On};
use super::StoreError;

/// Recommendations stored for a range, with whether they were drawn from the rollups of its
/// days as they are now ([`super::sections::rollup_generation`]).
pub async fn recommendation_snapshot(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
    observed_ms: i64,
) -> Result<Option<super::sections::StoredSection>, StoreError> {
    let mut conn = on.into().read().await?;
    let row: Option<(i64, String, i64)> = on_backend!(conn, |ex| {
        sqlx::query_as(concat!(
            "SELECT computed_ms, body, ",
            super::sections::generation_current_sql!("$4", "$2"),
            " FROM recommendation_snapshots
             WHERE from_ms = $1 AND to_ms = $2 AND observed_ms = $3"
        ))
        .bind(from_ms)
        .bind(to_ms)
        .bind(observed_ms)
        .bind(gpuledger_core::time::day_floor(from_ms))
        .fetch_optional(&mut *ex)
        .await
    })?;
    Ok(row.map(
        |(computed_ms, body, current)| super::sections::StoredSection {
            body,
            computed_ms,
            current: current != 0,
        },
    ))
}

/// Stores the recommendations for a range, drawn from the rollups of `generation`; they
/// replace stored ones of no later generation only (one drawn from older rollups, by a view
/// that raced a roll-up, never replaces newer ones).
pub async fn put_recommendation_snapshot(
    on: impl Into<On<'_>>,
    (from_ms, to_ms, observed_ms): (i64, i64, i64),
    (generation, computed_ms): (i64, i64),
    body: &str,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query(
            "INSERT INTO recommendation_snapshots
                (from_ms, to_ms, observed_ms, computed_ms, body, generation)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (from_ms, to_ms, observed_ms)
             DO UPDATE SET computed_ms = EXCLUDED.computed_ms, body = EXCLUDED.body,
                           generation = EXCLUDED.generation
             WHERE EXCLUDED.generation >= recommendation_snapshots.generation",
        )
        .bind(from_ms)
        .bind(to_ms)
        .bind(observed_ms)
        .bind(computed_ms)
        .bind(body)
        .bind(generation)
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
