//! Idle incidents, cluster snoozes, and the Slack messages queued about them.

use super::db::{on_backend, On};
use super::StoreError;

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct IncidentRow {
    pub id: i64,
    pub incident_key: String,
    pub kind: String,
    pub cluster: String,
    pub hostname: Option<String>,
    pub gpus_json: String,
    pub owners_json: String,
    /// idle devices (`waste::IdleDevice`): each GPU with its host, index and held-idle processes.
    pub devices_json: String,
    pub started_ms: i64,
    pub ended_ms: Option<i64>,
    pub last_seen_ms: i64,
    pub cost_per_hour: String,
    /// What `cost_per_hour` and `wasted` are in.
    pub currency: String,
    pub estimated: i64,
    pub wasted: String,
    pub last_notified_ms: Option<i64>,
    /// Who said the GPUs are idle on purpose (no more reminders), and when.
    pub intended_by: Option<String>,
    pub intended_ms: Option<i64>,
}

/// An incident as the evaluator writes it.
#[derive(Debug, Clone, PartialEq)]
pub struct IncidentUpdate {
    pub incident_key: String,
    pub kind: String,
    pub cluster: String,
    pub hostname: Option<String>,
    pub gpus_json: String,
    pub owners_json: String,
    pub devices_json: String,
    pub started_ms: i64,
    pub last_seen_ms: i64,
    pub cost_per_hour: String,
    pub currency: String,
    pub estimated: bool,
    pub wasted: String,
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct SlackMessageRow {
    pub id: i64,
    pub incident_id: Option<i64>,
    pub event: String,
    pub route: String,
    pub payload: String,
    pub created_ms: i64,
    pub status: String,
    pub attempts: i64,
    pub next_attempt_ms: i64,
    pub last_error: Option<String>,
    pub sent_ms: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct SnoozeRow {
    pub cluster: String,
    pub until_ms: i64,
    pub by_user: String,
}

const INCIDENT_COLUMNS: &str = "id, incident_key, kind, cluster, hostname, gpus_json, owners_json,
    devices_json, started_ms, ended_ms, last_seen_ms, cost_per_hour, currency, estimated, wasted,
    last_notified_ms, intended_by, intended_ms";
const SLACK_COLUMNS: &str = "id, incident_id, event, route, payload, created_ms, status, attempts,
    next_attempt_ms, last_error, sent_ms";

pub async fn open_incidents(on: impl Into<On<'_>>) -> Result<Vec<IncidentRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(&format!(
            "SELECT {INCIDENT_COLUMNS} FROM incidents WHERE ended_ms IS NULL ORDER BY id"
        ))
        .fetch_all(&mut *ex)
        .await?)
    })
}

/// Incidents that overlap `[from_ms, to_ms)`, newest first.
pub async fn incidents(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<IncidentRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(&format!(
            "SELECT {INCIDENT_COLUMNS} FROM incidents
             WHERE started_ms < $2 AND (ended_ms IS NULL OR ended_ms > $1)
             ORDER BY started_ms DESC, id DESC"
        ))
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(&mut *ex)
        .await?)
    })
}

pub async fn incident(on: impl Into<On<'_>>, id: i64) -> Result<Option<IncidentRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(&format!(
            "SELECT {INCIDENT_COLUMNS} FROM incidents WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&mut *ex)
        .await?)
    })
}

pub async fn insert_incident(on: impl Into<On<'_>>, i: &IncidentUpdate) -> Result<i64, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let (id,): (i64,) = sqlx::query_as(
            "INSERT INTO incidents (incident_key, kind, cluster, hostname, gpus_json, owners_json,
                started_ms, last_seen_ms, cost_per_hour, estimated, wasted, devices_json, currency)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) RETURNING id",
        )
        .bind(&i.incident_key)
        .bind(&i.kind)
        .bind(&i.cluster)
        .bind(&i.hostname)
        .bind(&i.gpus_json)
        .bind(&i.owners_json)
        .bind(i.started_ms)
        .bind(i.last_seen_ms)
        .bind(&i.cost_per_hour)
        .bind(i64::from(i.estimated))
        .bind(&i.wasted)
        .bind(&i.devices_json)
        .bind(&i.currency)
        .fetch_one(&mut *ex)
        .await?;
        Ok(id)
    })
}

pub async fn update_incident(
    on: impl Into<On<'_>>,
    id: i64,
    i: &IncidentUpdate,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query(
            "UPDATE incidents SET gpus_json = $2, owners_json = $3, last_seen_ms = $4,
                cost_per_hour = $5, estimated = $6, wasted = $7, hostname = $8,
                devices_json = $9, currency = $10
             WHERE id = $1",
        )
        .bind(id)
        .bind(&i.gpus_json)
        .bind(&i.owners_json)
        .bind(i.last_seen_ms)
        .bind(&i.cost_per_hour)
        .bind(i64::from(i.estimated))
        .bind(&i.wasted)
        .bind(&i.hostname)
        .bind(&i.devices_json)
        .bind(&i.currency)
        .execute(&mut *ex)
        .await?;
        Ok(())
    })
}

pub async fn resolve_incident(
    on: impl Into<On<'_>>,
    id: i64,
    ended_ms: i64,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query("UPDATE incidents SET ended_ms = $2 WHERE id = $1 AND ended_ms IS NULL")
            .bind(id)
            .bind(ended_ms)
            .execute(&mut *ex)
            .await?;
        Ok(())
    })
}

/// Sets an incident's dollars (a resolved one, once the ledger holds its last hours).
pub async fn set_incident_wasted(
    on: impl Into<On<'_>>,
    id: i64,
    wasted: &str,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query("UPDATE incidents SET wasted = $2 WHERE id = $1")
            .bind(id)
            .bind(wasted)
            .execute(&mut *ex)
            .await?;
        Ok(())
    })
}

pub async fn mark_incident_notified(
    on: impl Into<On<'_>>,
    id: i64,
    at_ms: i64,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query("UPDATE incidents SET last_notified_ms = $2 WHERE id = $1")
            .bind(id)
            .bind(at_ms)
            .execute(&mut *ex)
            .await?;
        Ok(())
    })
}

/// Marks incident `id` as idle on purpose, by `by_user`; `false` if there is no such open
/// incident (it ended, or never was).
pub async fn mark_intended(
    on: impl Into<On<'_>>,
    id: i64,
    by_user: &str,
    now_ms: i64,
) -> Result<bool, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let done = sqlx::query(
            "UPDATE incidents SET intended_by = $1, intended_ms = $2
             WHERE id = $3 AND ended_ms IS NULL",
        )
        .bind(by_user)
        .bind(now_ms)
        .bind(id)
        .execute(&mut *ex)
        .await?;
        Ok(done.rows_affected() == 1)
    })
}

pub async fn snooze(
    on: impl Into<On<'_>>,
    cluster: &str,
    until_ms: i64,
    by_user: &str,
    now_ms: i64,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query(
            "INSERT INTO snoozes (cluster, until_ms, by_user, created_ms) VALUES ($1, $2, $3, $4)
             ON CONFLICT (cluster) DO UPDATE SET until_ms = excluded.until_ms,
                by_user = excluded.by_user, created_ms = excluded.created_ms",
        )
        .bind(cluster)
        .bind(until_ms)
        .bind(by_user)
        .bind(now_ms)
        .execute(&mut *ex)
        .await?;
        Ok(())
    })
}

pub async fn active_snoozes(
    on: impl Into<On<'_>>,
    now_ms: i64,
) -> Result<Vec<SnoozeRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT cluster, until_ms, by_user FROM snoozes WHERE until_ms > $1 ORDER BY cluster",
        )
        .bind(now_ms)
        .fetch_all(&mut *ex)
        .await?)
    })
}

pub async fn enqueue_slack(
    on: impl Into<On<'_>>,
    incident_id: Option<i64>,
    event: &str,
    route: &str,
    payload: &str,
    now_ms: i64,
) -> Result<i64, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let (id,): (i64,) = sqlx::query_as(
            "INSERT INTO slack_messages (incident_id, event, route, payload, created_ms, status,
                attempts, next_attempt_ms)
             VALUES ($1, $2, $3, $4, $5, 'pending', 0, $5) RETURNING id",
        )
        .bind(incident_id)
        .bind(event)
        .bind(route)
        .bind(payload)
        .bind(now_ms)
        .fetch_one(&mut *ex)
        .await?;
        Ok(id)
    })
}

/// Pending messages whose next attempt is due, oldest first.
pub async fn due_slack_messages(
    on: impl Into<On<'_>>,
    now_ms: i64,
    limit: i64,
) -> Result<Vec<SlackMessageRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(&format!(
            "SELECT {SLACK_COLUMNS} FROM slack_messages
             WHERE status = 'pending' AND next_attempt_ms <= $1 ORDER BY id LIMIT $2"
        ))
        .bind(now_ms)
        .bind(limit)
        .fetch_all(&mut *ex)
        .await?)
    })
}

pub async fn record_slack_attempt(
    on: impl Into<On<'_>>,
    m: &SlackMessageRow,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query(
            "UPDATE slack_messages SET status = $2, attempts = $3, next_attempt_ms = $4,
                last_error = $5, sent_ms = $6
             WHERE id = $1",
        )
        .bind(m.id)
        .bind(&m.status)
        .bind(m.attempts)
        .bind(m.next_attempt_ms)
        .bind(&m.last_error)
        .bind(m.sent_ms)
        .execute(&mut *ex)
        .await?;
        Ok(())
    })
}

pub async fn slack_history(
    on: impl Into<On<'_>>,
    limit: i64,
) -> Result<Vec<SlackMessageRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(&format!(
            "SELECT {SLACK_COLUMNS} FROM slack_messages ORDER BY id DESC LIMIT $1"
        ))
        .bind(limit)
        .fetch_all(&mut *ex)
        .await?)
    })
}

/// Every message about one incident, oldest first.
pub async fn incident_messages(
    on: impl Into<On<'_>>,
    incident_id: i64,
) -> Result<Vec<SlackMessageRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(&format!(
            "SELECT {SLACK_COLUMNS} FROM slack_messages WHERE incident_id = $1 ORDER BY id"
        ))
        .bind(incident_id)
        .fetch_all(&mut *ex)
        .await?)
    })
}
