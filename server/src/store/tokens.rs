//! Agent tokens and which hosts each may report: the storage side of the scope rules in
//! `auth`. A host is bound to the first active token that reports it
//! (`hosts.token_id`); a report from another token for that host, or for one of its GPUs, is
//! refused until an admin moves the host ([`rebind_host`]). A host whose token
//! was revoked or has expired is free again: the next token in scope that reports it takes it.

use super::db::{on_backend, On};
use super::StoreError;

/// An agent token as listed: never its secret.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct TokenRow {
    pub id: i64,
    pub name: String,
    pub created_ms: i64,
    pub revoked_ms: Option<i64>,
    /// The cluster (or cluster pattern) it may report; `None` only for a token made before
    /// scopes existed (docs/security.md, "Agent tokens").
    pub cluster: Option<String>,
    /// The host names it may report, as a glob pattern; `None` for every host of its cluster.
    pub host_pattern: Option<String>,
    pub expires_ms: Option<i64>,
    pub last_used_ms: Option<i64>,
    pub last_address: Option<String>,
    /// Until when the secret replaced by the last rotation still works.
    pub previous_expires_ms: Option<i64>,
}

impl TokenRow {
    pub fn is_active(&self, now_ms: i64) -> bool {
        self.revoked_ms.is_none() && self.expires_ms.is_none_or(|e| e > now_ms)
    }
}

/// A token to create. The scope is required: a token that may report anything would let one
/// leaked secret rewrite every host's costs.
#[derive(Debug, Clone, Copy)]
pub struct NewToken<'a> {
    pub name: &'a str,
    pub hash: &'a str,
    pub cluster: &'a str,
    pub host_pattern: Option<&'a str>,
    pub expires_ms: Option<i64>,
}

impl<'a> NewToken<'a> {
    /// A token for every host of one cluster, never expiring.
    pub fn for_cluster(name: &'a str, hash: &'a str, cluster: &'a str) -> Self {
        NewToken {
            name,
            hash,
            cluster,
            host_pattern: None,
            expires_ms: None,
        }
    }
}

/// Why a report was refused because of who sent it or what was already stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// The report's cluster is outside the token's scope.
    ClusterOutOfScope,
    /// The report's host name is outside the token's host pattern.
    HostOutOfScope,
    /// The host reports with another active token.
    HostOfAnotherToken,
    /// One of the report's GPUs sits on a host of another active token.
    GpuOfAnotherToken,
    /// The batch id was stored before with other content, or by another token.
    BatchReused,
    /// A window of the report was already stored by another batch.
    WindowStored,
    /// A window of the report overlaps one another batch stored for the same GPU.
    WindowOverlaps,
    /// A window of the report falls in a month whose figures are final.
    MonthClosed,
    /// Request counts of a source another active token reports.
    SourceOfAnotherToken,
    /// Counts or progress for an endpoint or experiment that runs on none of the token's hosts
    /// and that no admin bound to it.
    OwnerNotOfToken,
}

impl RefusalKind {
    /// The label in metrics and on the fleet page.
    pub fn reason(self) -> &'static str {
        match self {
            RefusalKind::ClusterOutOfScope => "cluster_out_of_scope",
            RefusalKind::HostOutOfScope => "host_out_of_scope",
            RefusalKind::HostOfAnotherToken => "host_of_another_token",
            RefusalKind::GpuOfAnotherToken => "gpu_of_another_token",
            RefusalKind::BatchReused => "batch_reused",
            RefusalKind::WindowStored => "window_stored",
            RefusalKind::WindowOverlaps => "window_overlaps",
            RefusalKind::MonthClosed => "month_closed",
            RefusalKind::SourceOfAnotherToken => "source_of_another_token",
            RefusalKind::OwnerNotOfToken => "owner_not_of_token",
        }
    }

    /// Who sent it is the problem (403), as opposed to what it says (409).
    pub fn is_forbidden(self) -> bool {
        !matches!(
            self,
            RefusalKind::BatchReused
                | RefusalKind::WindowStored
                | RefusalKind::WindowOverlaps
                | RefusalKind::MonthClosed
        )
    }
}

/// A refused report: nothing of it was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub kind: RefusalKind,
    /// The report field at fault, as validation names fields (`windows[0].gpus[1].uuid`).
    pub field: String,
    pub message: String,
}

/// Refused reports of one token for one host and reason, for the fleet page.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct RefusalRow {
    pub token: String,
    pub cluster: String,
    pub hostname: String,
    pub reason: String,
    pub message: String,
    pub first_ms: i64,
    pub last_ms: i64,
    pub attempts: i64,
}

/// "This token is active at `$now`" for a token row aliased `$t`, as SQL.
macro_rules! token_active_sql {
    ($t:literal, $now:literal) => {
        concat!(
            $t,
            ".revoked_ms IS NULL AND (",
            $t,
            ".expires_ms IS NULL OR ",
            $t,
            ".expires_ms > ",
            $now,
            ")"
        )
    };
}
pub(crate) use token_active_sql;

/// The columns a token is listed with.
macro_rules! token_columns_sql {
    () => {
        "id, name, created_ms, revoked_ms, cluster, host_pattern, expires_ms, last_used_ms,
         last_address, previous_expires_ms"
    };
}

pub async fn create_token(
    on: impl Into<On<'_>>,
    token: &NewToken<'_>,
    now_ms: i64,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let result = sqlx::query(
            "INSERT INTO api_tokens (name, token_hash, created_ms, cluster, host_pattern,
                                     expires_ms)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT DO NOTHING",
        )
        .bind(token.name)
        .bind(token.hash)
        .bind(now_ms)
        .bind(token.cluster)
        .bind(token.host_pattern)
        .bind(token.expires_ms)
        .execute(&mut *ex)
        .await?;
        if result.rows_affected() == 0 {
            return Err(StoreError::Conflict(format!("token {:?}", token.name)));
        }
        Ok(())
    })
}

pub async fn list_tokens(on: impl Into<On<'_>>) -> Result<Vec<TokenRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(concat!(
            "SELECT ",
            token_columns_sql!(),
            " FROM api_tokens ORDER BY name"
        ))
        .fetch_all(&mut *ex)
        .await?)
    })
}

pub async fn token_by_name(
    on: impl Into<On<'_>>,
    name: &str,
) -> Result<Option<TokenRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(concat!(
            "SELECT ",
            token_columns_sql!(),
            " FROM api_tokens WHERE name = $1"
        ))
        .bind(name)
        .fetch_optional(&mut *ex)
        .await?)
    })
}

/// Returns whether an active token by that name was revoked.
pub async fn revoke_token(
    on: impl Into<On<'_>>,
    name: &str,
    now_ms: i64,
) -> Result<bool, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let result = sqlx::query(
            "UPDATE api_tokens SET revoked_ms = $2 WHERE name = $1 AND revoked_ms IS NULL",
        )
        .bind(name)
        .bind(now_ms)
        .execute(&mut *ex)
        .await?;
        Ok(result.rows_affected() > 0)
    })
}

/// Gives an active token a new secret; the old one keeps working until
/// `old_valid_until_ms`. Returns whether an active token by that name was found whose previous
/// secret no longer works: rotating inside an overlap would end the overlap at once.
pub async fn rotate_token(
    on: impl Into<On<'_>>,
    name: &str,
    new_hash: &str,
    old_valid_until_ms: i64,
    now_ms: i64,
) -> Result<bool, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let result = sqlx::query(concat!(
            "UPDATE api_tokens
             SET previous_token_hash = token_hash, previous_expires_ms = $3,
                 token_hash = $2
             WHERE name = $1
               AND (previous_expires_ms IS NULL OR previous_expires_ms <= $4) AND ",
            token_active_sql!("api_tokens", "$4")
        ))
        .bind(name)
        .bind(new_hash)
        .bind(old_valid_until_ms)
        .bind(now_ms)
        .execute(&mut *ex)
        .await?;
        Ok(result.rows_affected() > 0)
    })
}

/// The active (neither revoked nor expired) token with this secret's hash, or the previous
/// secret's during its overlap.
pub async fn active_token(
    on: impl Into<On<'_>>,
    hash: &str,
    now_ms: i64,
) -> Result<Option<TokenRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(concat!(
            "SELECT ",
            token_columns_sql!(),
            " FROM api_tokens t
             WHERE (t.token_hash = $1 OR (t.previous_token_hash = $1
                                          AND t.previous_expires_ms > $2))
               AND ",
            token_active_sql!("t", "$2")
        ))
        .bind(hash)
        .bind(now_ms)
        .fetch_optional(&mut *ex)
        .await?)
    })
}

/// Records that a token was used, and from where.
pub async fn touch_token(
    on: impl Into<On<'_>>,
    token_id: i64,
    now_ms: i64,
    address: Option<&str>,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query(
            "UPDATE api_tokens SET last_used_ms = $2, last_address = COALESCE($3, last_address)
             WHERE id = $1 AND (last_used_ms IS NULL OR last_used_ms < $2)",
        )
        .bind(token_id)
        .bind(now_ms)
        .bind(address)
        .execute(&mut *ex)
        .await?;
        Ok(())
    })
}

/// The clusters of the hosts bound to a token.
pub async fn token_clusters(
    on: impl Into<On<'_>>,
    token_id: i64,
) -> Result<Vec<String>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let rows: Vec<(String,)> = sqlx::query_as(
            "SELECT DISTINCT cluster FROM hosts WHERE token_id = $1 ORDER BY cluster",
        )
        .bind(token_id)
        .fetch_all(&mut *ex)
        .await?;
        Ok(rows.into_iter().map(|(c,)| c).collect())
    })
}

/// Scopes a token made before scopes existed, which never reported, to the first cluster
/// it reports. Returns whether it did.
pub async fn adopt_token_cluster(
    on: impl Into<On<'_>>,
    token_id: i64,
    cluster: &str,
) -> Result<bool, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let result = sqlx::query(
            "UPDATE api_tokens SET cluster = $2
             WHERE id = $1 AND cluster IS NULL
               AND NOT EXISTS (SELECT 1 FROM hosts WHERE token_id = $1)",
        )
        .bind(token_id)
        .bind(cluster)
        .execute(&mut *ex)
        .await?;
        Ok(result.rows_affected() > 0)
    })
}

/// Binds a host to a token. Returns whether the host exists.
pub async fn rebind_host(
    on: impl Into<On<'_>>,
    cluster: &str,
    hostname: &str,
    token_id: i64,
) -> Result<bool, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let mut tx = crate::store::db::begin_write(&mut *ex).await?;
        let moved =
            sqlx::query("UPDATE hosts SET token_id = $3 WHERE cluster = $1 AND hostname = $2")
                .bind(cluster)
                .bind(hostname)
                .bind(token_id)
                .execute(&mut *tx)
                .await?;
        if moved.rows_affected() == 0 {
            tx.rollback().await?;
            return Ok(false);
        }
        // What the move settles is no longer a refusal to look at.
        sqlx::query(
            "DELETE FROM ingest_refusals
             WHERE cluster = $1 AND hostname = $2 AND token_id = $3",
        )
        .bind(cluster)
        .bind(hostname)
        .bind(token_id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(true)
    })
}

/// Counts a refused report for the fleet page.
pub async fn record_refusal(
    on: impl Into<On<'_>>,
    token_id: i64,
    cluster: &str,
    hostname: &str,
    refusal: &Refusal,
    now_ms: i64,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query(
            "INSERT INTO ingest_refusals
                (token_id, cluster, hostname, reason, message, first_ms, last_ms, attempts)
             VALUES ($1, $2, $3, $4, $5, $6, $6, 1)
             ON CONFLICT (token_id, cluster, hostname, reason) DO UPDATE SET
                message = excluded.message,
                last_ms = excluded.last_ms,
                attempts = ingest_refusals.attempts + 1",
        )
        .bind(token_id)
        .bind(cluster)
        .bind(hostname)
        .bind(refusal.kind.reason())
        .bind(&refusal.message)
        .bind(now_ms)
        .execute(&mut *ex)
        .await?;
        Ok(())
    })
}

/// Refused reports seen since `since_ms`, newest first.
pub async fn ingest_refusals(
    on: impl Into<On<'_>>,
    since_ms: i64,
) -> Result<Vec<RefusalRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT t.name AS token, r.cluster, r.hostname, r.reason, r.message, r.first_ms,
                    r.last_ms, r.attempts
             FROM ingest_refusals r JOIN api_tokens t ON t.id = r.token_id
             WHERE r.last_ms >= $1
             ORDER BY r.last_ms DESC, t.name, r.cluster, r.hostname",
        )
        .bind(since_ms)
        .fetch_all(&mut *ex)
        .await?)
    })
}

/// Why a report that stored nothing was not stored: a repeat of a batch (duplicate, or
/// a reused batch id), or a host or GPU of another active token. `None` when none of
/// these holds. SQLite asks before writing; PostgreSQL after its one statement wrote
/// nothing.
pub async fn ingest_refusal(
    on: impl Into<On<'_>>,
    report: &gpuledger_proto::Report,
    token_id: i64,
    content_sha256: &str,
    now_ms: i64,
) -> Result<Option<super::IngestOutcome>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex, DB| {
        use super::{IngestOutcome, Refusal, RefusalKind};
        let batch: Option<(i64, Option<String>)> = sqlx::query_as(
            "SELECT token_id, content_sha256 FROM ingested_batches WHERE batch_id = $1",
        )
        .bind(&report.batch_id)
        .fetch_optional(&mut *ex)
        .await?;
        if let Some((by, digest)) = batch {
            // A batch stored before digests were kept repeats as it always did.
            if by == token_id && digest.as_deref().is_none_or(|d| d == content_sha256) {
                return Ok(Some(IngestOutcome::Duplicate));
            }
            let message = if by == token_id {
                "this batch id was already stored with other content; a batch id names \
                 one batch for good"
            } else {
                "this batch id was already stored from another token"
            };
            return Ok(Some(IngestOutcome::Refused(Refusal {
                kind: RefusalKind::BatchReused,
                field: "batch_id".into(),
                message: message.into(),
            })));
        }
        let host_token: Option<(String,)> = sqlx::query_as(concat!(
            "SELECT t.name FROM hosts h JOIN api_tokens t ON t.id = h.token_id
             WHERE h.cluster = $1 AND h.hostname = $2 AND h.token_id <> $3 AND ",
            token_active_sql!("t", "$4")
        ))
        .bind(&report.host.cluster)
        .bind(&report.host.hostname)
        .bind(token_id)
        .bind(now_ms)
        .fetch_optional(&mut *ex)
        .await?;
        if let Some((owner,)) = host_token {
            return Ok(Some(IngestOutcome::Refused(Refusal {
                kind: RefusalKind::HostOfAnotherToken,
                field: "host.hostname".into(),
                message: format!(
                    "host {}/{} reports with token {owner:?}; an admin moves a host to \
                     another token with `token rebind`",
                    report.host.cluster, report.host.hostname
                ),
            })));
        }
        // The report's GPUs another active token's host holds, in one statement (SQLite asks
        // for every report, and each statement is a round trip to its thread); each named at
        // its first window.
        let uuids = serde_json::to_string(&gpus_of(report))
            .map_err(|e| StoreError::Invalid(format!("GPU ids cannot be encoded: {e}")))?;
        let (open, close) = <DB as super::db::Dialect>::JSON_ARRAY_TEXTS;
        let sql = format!(
            concat!(
                "SELECT x.uuid, h.cluster, h.hostname, t.name
                 FROM gpus x JOIN hosts h ON h.id = x.host_id
                 JOIN api_tokens t ON t.id = h.token_id
                 WHERE x.uuid IN ({}$1{}) AND h.token_id <> $2 AND ",
                token_active_sql!("t", "$3")
            ),
            open, close
        );
        let held: Vec<(String, String, String, String)> = sqlx::query_as(&sql)
            .bind(&uuids)
            .bind(token_id)
            .bind(now_ms)
            .fetch_all(&mut *ex)
            .await?;
        for (w, window) in report.windows.iter().enumerate() {
            for (g, gpu) in window.gpus.iter().enumerate() {
                let Some((_, cluster, hostname, owner)) =
                    held.iter().find(|(uuid, ..)| *uuid == gpu.uuid)
                else {
                    continue;
                };
                return Ok(Some(IngestOutcome::Refused(Refusal {
                    kind: RefusalKind::GpuOfAnotherToken,
                    field: format!("windows[{w}].gpus[{g}].uuid"),
                    message: format!(
                        "GPU {} belongs to host {cluster}/{hostname}, which reports \
                         with token {owner:?}; an admin moves a host to another token \
                         with `token rebind`",
                        gpu.uuid
                    ),
                })));
            }
        }
        Ok(None)
    })
}

/// The report's GPUs, each once.
fn gpus_of(report: &gpuledger_proto::Report) -> Vec<&str> {
    let mut uuids: Vec<&str> = report
        .windows
        .iter()
        .flat_map(|w| &w.gpus)
        .map(|g| g.uuid.as_str())
        .collect();
    uuids.sort_unstable();
    uuids.dedup();
    uuids
}

/// The first window of the report that overlaps a window another batch stored for the same
/// GPU at another start, as a refusal: the overlap's energy and cost would count twice. (A
/// window at the same start is [`window_conflict`]'s.) A GPU's reports come from its host's one
/// agent, one after another, so no two race here.
pub async fn window_overlap(
    on: impl Into<On<'_>>,
    report: &gpuledger_proto::Report,
    token_id: i64,
    now_ms: i64,
) -> Result<Option<Refusal>, StoreError> {
    let uuids = gpus_of(report);
    let (Some(first), Some(last)) = (
        report.windows.iter().map(|w| w.start_ms).min(),
        report.windows.iter().map(|w| w.end_ms).max(),
    ) else {
        return Ok(None);
    };
    let uuids = serde_json::to_string(&uuids)
        .map_err(|e| StoreError::Invalid(format!("GPU ids cannot be encoded: {e}")))?;
    let mut conn = on.into().read().await?;
    let stored: Vec<(String, i64, i64, String)> = on_backend!(conn, |ex, DB| {
        let (open, close) = <DB as super::db::Dialect>::JSON_ARRAY_TEXTS;
        // Windows span an hour at most, so one starting more than that before the report's
        // first cannot reach it: the key (gpu_uuid, start_ms) bounds the look.
        // This host's windows only, and not while another active token holds it: a GPU or a
        // host of another token is refused for that (403) when the report is stored.
        let sql = format!(
            concat!(
                "SELECT w.gpu_uuid, w.start_ms, w.end_ms, w.batch_id
                 FROM gpu_windows w JOIN hosts h ON h.id = w.host_id
                 LEFT JOIN api_tokens t ON t.id = h.token_id AND t.id <> $7 AND ",
                token_active_sql!("t", "$8"),
                " WHERE w.gpu_uuid IN ({open}$1{close}) AND w.start_ms > $2 AND w.start_ms < $3
                   AND w.batch_id <> $4 AND h.cluster = $5 AND h.hostname = $6
                   AND t.id IS NULL"
            ),
            open = open,
            close = close
        );
        sqlx::query_as(&sql)
            .bind(&uuids)
            .bind(first.saturating_sub(crate::validate::MAX_WINDOW_MS))
            .bind(last)
            .bind(&report.batch_id)
            .bind(&report.host.cluster)
            .bind(&report.host.hostname)
            .bind(token_id)
            .bind(now_ms)
            .fetch_all(&mut *ex)
            .await
    })?;
    for (w, window) in report.windows.iter().enumerate() {
        for (g, gpu) in window.gpus.iter().enumerate() {
            let overlapped = stored.iter().find(|(uuid, start, end, _)| {
                *uuid == gpu.uuid
                    && *start != window.start_ms
                    && *start < window.end_ms
                    && *end > window.start_ms
            });
            if let Some((_, start, end, batch)) = overlapped {
                return Ok(Some(Refusal {
                    kind: RefusalKind::WindowOverlaps,
                    field: format!("windows[{w}].gpus[{g}]"),
                    message: format!(
                        "GPU {}'s window {}–{} ms overlaps its window {start}–{end} ms stored by \
                         batch {batch:?}; a GPU's windows never overlap, or the overlap's energy \
                         and cost would count twice",
                        gpu.uuid, window.start_ms, window.end_ms
                    ),
                }));
            }
        }
    }
    Ok(None)
}

/// The first window of the report that another batch already stored, as a refusal
/// (SQLite asks inside its transaction, where this report's own rows are visible).
pub async fn window_conflict(
    on: impl Into<On<'_>>,
    report: &gpuledger_proto::Report,
) -> Result<Option<Refusal>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        for (w, window) in report.windows.iter().enumerate() {
            for (g, gpu) in window.gpus.iter().enumerate() {
                let stored: Option<(String,)> = sqlx::query_as(
                    "SELECT batch_id FROM gpu_windows
                     WHERE gpu_uuid = $1 AND start_ms = $2 AND batch_id <> $3",
                )
                .bind(&gpu.uuid)
                .bind(window.start_ms)
                .bind(&report.batch_id)
                .fetch_optional(&mut *ex)
                .await?;
                if let Some((batch,)) = stored {
                    return Ok(Some(Refusal {
                        kind: RefusalKind::WindowStored,
                        field: format!("windows[{w}].gpus[{g}]"),
                        message: format!(
                            "GPU {}'s window starting at {} ms was already stored by batch \
                             {batch:?}; a window is stored once and never overwritten",
                            gpu.uuid, window.start_ms
                        ),
                    }));
                }
            }
        }
        Ok(None)
    })
}

/// An owner an admin bound to an agent token: the token may post request counts (an endpoint)
/// or runs' progress (an experiment) for it wherever it runs.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct OwnerBinding {
    pub token: String,
    /// `endpoint` or `experiment` ([`gpuledger_core::owners::Role::as_str`]).
    pub role: String,
    pub value: String,
    pub bound_ms: i64,
}

/// Binds `value` of `role` to a token; binding it again changes nothing.
pub async fn bind_owner(
    on: impl Into<On<'_>>,
    token_id: i64,
    (role, value): (&str, &str),
    now_ms: i64,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query(
            "INSERT INTO token_owner_bindings (token_id, role, value, bound_ms)
             VALUES ($1, $2, $3, $4) ON CONFLICT (token_id, role, value) DO NOTHING",
        )
        .bind(token_id)
        .bind(role)
        .bind(value)
        .bind(now_ms)
        .execute(&mut *ex)
        .await?;
        Ok(())
    })
}

/// Removes a binding. Returns whether there was one.
pub async fn unbind_owner(
    on: impl Into<On<'_>>,
    token_id: i64,
    (role, value): (&str, &str),
) -> Result<bool, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let gone = sqlx::query(
            "DELETE FROM token_owner_bindings WHERE token_id = $1 AND role = $2 AND value = $3",
        )
        .bind(token_id)
        .bind(role)
        .bind(value)
        .execute(&mut *ex)
        .await?;
        Ok(gone.rows_affected() > 0)
    })
}

/// Every binding, by token name, role and value.
pub async fn owner_bindings(on: impl Into<On<'_>>) -> Result<Vec<OwnerBinding>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT t.name AS token, b.role, b.value, b.bound_ms
             FROM token_owner_bindings b JOIN api_tokens t ON t.id = b.token_id
             ORDER BY t.name, b.role, b.value",
        )
        .fetch_all(&mut *ex)
        .await?)
    })
}
