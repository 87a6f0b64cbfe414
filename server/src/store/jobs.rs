//! Jobs that one replica runs at a time: leases, when each last ran, and which days of
//! Cost Explorer were synced.

use super::db::{on_backend, On};
use super::StoreError;

/// Days (UTC midnights) in `[from_ms, to_ms)` already fetched from Cost Explorer.
pub async fn ce_synced_days(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<i64>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let rows: Vec<(i64,)> = sqlx::query_as(
            "SELECT day_ms FROM aws_ce_synced_days WHERE day_ms >= $1 AND day_ms < $2 ORDER BY day_ms",
        )
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(&mut *ex)
        .await?;
        Ok(rows.into_iter().map(|(d,)| d).collect())
    })
}

pub async fn mark_ce_synced(
    on: impl Into<On<'_>>,
    days: &[i64],
    now_ms: i64,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let mut tx = crate::store::db::begin_write(&mut *ex).await?;
        for day in days {
            sqlx::query(
                "INSERT INTO aws_ce_synced_days (day_ms, synced_ms) VALUES ($1, $2)
                 ON CONFLICT (day_ms) DO UPDATE SET synced_ms = excluded.synced_ms",
            )
            .bind(day)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    })
}

/// Takes the lease on a periodic job unless another holder's lease is still running.
pub async fn try_lease(
    on: impl Into<On<'_>>,
    job: &str,
    holder: &str,
    now_ms: i64,
    ttl_ms: i64,
) -> Result<bool, StoreError> {
    try_lease_due(on, job, holder, now_ms, (ttl_ms, 0)).await
}

/// [`try_lease`], taken only if the job last finished `every_ms` or more ago (on any replica):
/// a job each replica's timer asks for runs once per period, not once per replica.
pub async fn try_lease_due(
    on: impl Into<On<'_>>,
    job: &str,
    holder: &str,
    now_ms: i64,
    (ttl_ms, every_ms): (i64, i64),
) -> Result<bool, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        // One statement, so two replicas racing for it cannot both win.
        let result = sqlx::query(
            "INSERT INTO job_leases (name, holder, expires_ms) VALUES ($1, $2, $3)
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_ms = excluded.expires_ms
             WHERE (job_leases.expires_ms <= $4 OR job_leases.holder = excluded.holder)
               AND COALESCE(job_leases.last_run_ms, $5) <= $5",
        )
        .bind(job)
        .bind(holder)
        .bind(now_ms + ttl_ms)
        .bind(now_ms)
        // No period: whenever the lease is free, whatever another replica's clock wrote.
        .bind(if every_ms > 0 { now_ms - every_ms } else { i64::MAX })
        .execute(&mut *ex)
        .await?;
        Ok(result.rows_affected() == 1)
    })
}

/// Records that `holder` finished `job` and gives the lease up.
pub async fn finish_lease(
    on: impl Into<On<'_>>,
    job: &str,
    holder: &str,
    now_ms: i64,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query(
            "UPDATE job_leases SET last_run_ms = $3, expires_ms = $3, holder = NULL
             WHERE name = $1 AND holder = $2",
        )
        .bind(job)
        .bind(holder)
        .bind(now_ms)
        .execute(&mut *ex)
        .await?;
        Ok(())
    })
}

/// Gives up every lease whose holder's name starts with `prefix` (one process's jobs), without
/// recording a run: what a replica stopping mid-job does, so that another takes the job at its
/// next tick rather than when the lease expires.
pub async fn release_leases_of(
    on: impl Into<On<'_>>,
    prefix: &str,
    now_ms: i64,
) -> Result<u64, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let result = sqlx::query(
            "UPDATE job_leases SET expires_ms = $2, holder = NULL
             WHERE substr(holder, 1, length(CAST($1 AS TEXT))) = CAST($1 AS TEXT)",
        )
        .bind(prefix)
        .bind(now_ms)
        .execute(&mut *ex)
        .await?;
        Ok(result.rows_affected())
    })
}

pub async fn job_last_run(on: impl Into<On<'_>>, job: &str) -> Result<Option<i64>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let row: Option<(Option<i64>,)> =
            sqlx::query_as("SELECT last_run_ms FROM job_leases WHERE name = $1")
                .bind(job)
                .fetch_optional(&mut *ex)
                .await?;
        Ok(row.and_then(|(r,)| r))
    })
}
