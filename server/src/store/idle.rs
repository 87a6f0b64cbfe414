//! The ledger's idle time as the idle history and incidents read it: idle and held-idle hours
//! per host, and the rows an incident's dollars come from.

use super::db::{on_backend, On};
use super::ledger::OWNER_AND_AMOUNTS;
use super::rollups::in_time_and_list;
use super::StoreError;

/// Idle and held-idle cost per host, hour, owner, kind and currency in `[from_ms, to_ms)`, with
/// the GPUs that carried it: read from the hours summed per host, a row per host-hour and owner
/// instead of one per GPU.
pub async fn idle_hours(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<super::IdleHourRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT r.hour_ms, r.host_id, r.kind, r.currency, r.estimated, r.cost_nano,
                r.cost_atto, r.gpus, o.labels AS owner
             FROM rollup_host_hours r JOIN owners o ON o.id = r.owner_id
             WHERE r.hour_ms >= $1 AND r.hour_ms < $2 AND r.kind IN ('idle', 'held_idle')",
        )
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(&mut *ex)
        .await?)
    })
}

/// The hours of `[from_ms, to_ms)` in which each of `host_ids` carried idle or held-idle cost,
/// with the GPUs that carried it (a JSON array of texts): how far back an idle run goes once
/// the raw windows are gone.
pub async fn idle_hours_of_hosts(
    on: impl Into<On<'_>>,
    host_ids: &[i64],
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<(i64, i64, String)>, StoreError> {
    if host_ids.is_empty() {
        return Ok(Vec::new());
    }
    // Integers from the database, written into the statement: nothing a client typed.
    let ids: Vec<String> = host_ids.iter().map(i64::to_string).collect();
    let ids = ids.join(", ");
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(&format!(
            "SELECT host_id, hour_ms, gpus FROM rollup_host_hours
             WHERE host_id IN ({ids}) AND hour_ms >= $1 AND hour_ms < $2
               AND kind IN ('idle', 'held_idle')"
        ))
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(&mut *ex)
        .await?)
    })
}

/// The idle and held-idle hourly rollup rows of the hosts in `host_ids` in
/// `[from_ms, to_ms)`: what an incident's dollars are read from.
pub async fn idle_rollups_of_hosts(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
    host_ids: &[i64],
) -> Result<Vec<super::RollupRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        const IDS_PER_STATEMENT: usize = 1_000;
        let mut rows = Vec::new();
        for ids in host_ids.chunks(IDS_PER_STATEMENT) {
            let select = format!(
                "SELECT hour_ms AS period_ms, host_id, gpu_uuid, {OWNER_AND_AMOUNTS}
                 FROM rollup_hours JOIN owners o ON o.id = owner_id
                 WHERE kind IN ('idle', 'held_idle') AND"
            );
            let mut q = in_time_and_list(&select, ("hour_ms", from_ms, to_ms), "host_id", ids);
            rows.extend(
                q.build_query_as()
                    .persistent(false)
                    .fetch_all(&mut *ex)
                    .await?,
            );
        }
        Ok(rows)
    })
}
