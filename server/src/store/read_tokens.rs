//! Read-only API tokens (for BI tools), as stored: a name, the SHA-256 of the secret, who made
//! it, when it was revoked and last used.

use super::db::{on_backend, On};
use super::StoreError;

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ReadTokenRow {
    pub id: i64,
    pub name: String,
    pub created_by: String,
    pub created_ms: i64,
    pub revoked_ms: Option<i64>,
    pub last_used_ms: Option<i64>,
    /// The teams it reads (a JSON array); NULL for every team.
    pub teams: Option<String>,
}

pub async fn create(
    on: impl Into<On<'_>>,
    name: &str,
    token_hash: &str,
    teams: Option<&str>,
    created_by: &str,
    now_ms: i64,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let done = sqlx::query(
            "INSERT INTO read_tokens (name, token_hash, teams, created_by, created_ms)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        )
        .bind(name)
        .bind(token_hash)
        .bind(teams)
        .bind(created_by)
        .bind(now_ms)
        .execute(&mut *ex)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::Conflict(format!("read token {name:?}")));
        }
        Ok(())
    })
}

pub async fn list(on: impl Into<On<'_>>) -> Result<Vec<ReadTokenRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT id, name, created_by, created_ms, revoked_ms, last_used_ms, teams
             FROM read_tokens ORDER BY name",
        )
        .fetch_all(&mut *ex)
        .await?)
    })
}

/// The token whose secret hashes to `token_hash`, unless it was revoked.
pub async fn active(
    on: impl Into<On<'_>>,
    token_hash: &str,
) -> Result<Option<ReadTokenRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT id, name, created_by, created_ms, revoked_ms, last_used_ms, teams
             FROM read_tokens WHERE token_hash = $1 AND revoked_ms IS NULL",
        )
        .bind(token_hash)
        .fetch_optional(&mut *ex)
        .await?)
    })
}

/// Revokes a token by name; false where there is no such token still active.
pub async fn revoke(on: impl Into<On<'_>>, name: &str, now_ms: i64) -> Result<bool, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let done = sqlx::query(
            "UPDATE read_tokens SET revoked_ms = $1 WHERE name = $2 AND revoked_ms IS NULL",
        )
        .bind(now_ms)
        .bind(name)
        .execute(&mut *ex)
        .await?;
        Ok(done.rows_affected() == 1)
    })
}

/// Revokes every active token `created_by` made (a person removed takes their tokens along).
pub async fn revoke_made_by(
    on: impl Into<On<'_>>,
    created_by: &str,
    now_ms: i64,
) -> Result<u64, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let done = sqlx::query(
            "UPDATE read_tokens SET revoked_ms = $1 WHERE created_by = $2 AND revoked_ms IS NULL",
        )
        .bind(now_ms)
        .bind(created_by)
        .execute(&mut *ex)
        .await?;
        Ok(done.rows_affected())
    })
}

/// Records a use, at most once a minute per token (a BI refresh makes many requests).
pub async fn touch(on: impl Into<On<'_>>, id: i64, now_ms: i64) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query(
            "UPDATE read_tokens SET last_used_ms = $1
             WHERE id = $2 AND (last_used_ms IS NULL OR last_used_ms < $3)",
        )
        .bind(now_ms)
        .bind(id)
        .bind(now_ms - 60_000)
        .execute(&mut *ex)
        .await?;
        Ok(())
    })
}
