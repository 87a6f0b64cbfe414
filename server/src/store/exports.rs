//! Scheduled exports to object storage, as stored: each period's state (done with its manifest
//! and files, or failed with the error and when to try again).

use super::db::{on_backend, On};
use super::StoreError;

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ExportRow {
    /// `day:YYYY-MM-DD` or `month:YYYY-MM`.
    pub period: String,
    pub start_ms: i64,
    pub end_ms: i64,
    /// `done` or `failed`.
    pub status: String,
    pub attempts: i64,
    pub next_attempt_ms: i64,
    pub last_error: Option<String>,
    pub manifest_key: Option<String>,
    /// The files written: `[{"key", "format", "bytes", "sha256"}]`.
    pub files_json: Option<String>,
    pub updated_ms: i64,
}

const COLUMNS: &str = "period, start_ms, end_ms, status, attempts, next_attempt_ms, last_error,
    manifest_key, files_json, updated_ms";

pub async fn get(on: impl Into<On<'_>>, period: &str) -> Result<Option<ExportRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(
            sqlx::query_as(&format!("SELECT {COLUMNS} FROM exports WHERE period = $1"))
                .bind(period)
                .fetch_optional(&mut *ex)
                .await?,
        )
    })
}

/// The latest periods, newest first.
pub async fn recent(on: impl Into<On<'_>>, limit: i64) -> Result<Vec<ExportRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM exports ORDER BY updated_ms DESC, period DESC LIMIT $1"
        ))
        .bind(limit)
        .fetch_all(&mut *ex)
        .await?)
    })
}

/// Writes a period's state (inserted, or replacing what it was).
pub async fn put(on: impl Into<On<'_>>, row: &ExportRow) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query(&format!(
            "INSERT INTO exports ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
             ON CONFLICT (period) DO UPDATE SET start_ms = excluded.start_ms,
                end_ms = excluded.end_ms, status = excluded.status,
                attempts = excluded.attempts, next_attempt_ms = excluded.next_attempt_ms,
                last_error = excluded.last_error, manifest_key = excluded.manifest_key,
                files_json = excluded.files_json, updated_ms = excluded.updated_ms"
        ))
        .bind(&row.period)
        .bind(row.start_ms)
        .bind(row.end_ms)
        .bind(&row.status)
        .bind(row.attempts)
        .bind(row.next_attempt_ms)
        .bind(&row.last_error)
        .bind(&row.manifest_key)
        .bind(&row.files_json)
        .bind(row.updated_ms)
        .execute(&mut *ex)
        .await?;
        Ok(())
    })
}

/// The periods whose last try failed, oldest first: retried whatever their age.
pub async fn failed(on: impl Into<On<'_>>) -> Result<Vec<ExportRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM exports WHERE status = 'failed' ORDER BY start_ms"
        ))
        .fetch_all(&mut *ex)
        .await?)
    })
}

/// What `/metrics` says of the exports, from the table, so every replica says the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExportHealth {
    /// Periods whose last try failed: not written yet.
    pub failing: i64,
    /// When the latest period was written, if any was.
    pub last_done_ms: Option<i64>,
}

pub async fn health(on: impl Into<On<'_>>) -> Result<ExportHealth, StoreError> {
    let mut conn = on.into().read().await?;
    let (failing, last_done_ms): (i64, Option<i64>) = on_backend!(conn, |ex| {
        sqlx::query_as(
            "SELECT COUNT(CASE WHEN status = 'failed' THEN 1 END),
                    MAX(CASE WHEN status = 'done' THEN updated_ms END)
             FROM exports",
        )
        .fetch_one(&mut *ex)
        .await
    })?;
    Ok(ExportHealth {
        failing,
        last_done_ms,
    })
}
