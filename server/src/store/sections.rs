//! Page sections of closed months, kept as computed ([`crate::sections`]).

use super::db::{on_backend, On};
use super::StoreError;

/// The stored body of `section` for `key` over `[from_ms, to_ms)`, if any.
pub async fn section_snapshot(
    on: impl Into<On<'_>>,
    section: &str,
    key: &str,
    from_ms: i64,
    to_ms: i64,
) -> Result<Option<String>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_scalar(
            "SELECT body FROM section_snapshots
             WHERE section = $1 AND key = $2 AND from_ms = $3 AND to_ms = $4",
        )
        .bind(section)
        .bind(key)
        .bind(from_ms)
        .bind(to_ms)
        .fetch_optional(&mut *ex)
        .await?)
    })
}

/// Stores (or replaces) a section's body.
pub async fn put_section_snapshot(
    on: impl Into<On<'_>>,
    (section, key): (&str, &str),
    (from_ms, to_ms): (i64, i64),
    computed_ms: i64,
    body: &str,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query(
            "INSERT INTO section_snapshots (section, key, from_ms, to_ms, computed_ms, body)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (section, key, from_ms, to_ms)
             DO UPDATE SET computed_ms = EXCLUDED.computed_ms, body = EXCLUDED.body",
        )
        .bind(section)
        .bind(key)
        .bind(from_ms)
        .bind(to_ms)
        .bind(computed_ms)
        .bind(body)
        .execute(&mut *ex)
        .await?;
        Ok(())
    })
}

/// Deletes every section drawn from an hour of `[from_ms, to_ms)`.
pub async fn delete_section_snapshots(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
) -> Result<u64, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        Ok(
            sqlx::query("DELETE FROM section_snapshots WHERE from_ms < $2 AND to_ms > $1")
                .bind(from_ms)
                .bind(to_ms)
                .execute(&mut *ex)
                .await?
                .rows_affected(),
        )
    })
}
