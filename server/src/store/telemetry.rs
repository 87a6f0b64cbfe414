//! What agents reported: hosts, GPUs, raw GPU and process windows, and their retention.

use super::db::{on_backend, On};
use super::StoreError;

/// One GPU on the fleet page, with its host.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct FleetRow {
    pub cluster: String,
    pub hostname: String,
    pub instance_type: Option<String>,
    pub last_report_ms: i64,
    pub spool_depth: Option<i64>,
    pub uuid: Option<String>,
    pub gpu_index: Option<i64>,
    pub name: Option<String>,
    pub parent_uuid: Option<String>,
    pub memory_total_bytes: Option<i64>,
    pub last_util_avg: Option<f64>,
    pub last_memory_used_bytes: Option<i64>,
    pub last_window_end_ms: Option<i64>,
    /// The latest window's memory held by processes the agent cannot see, and why.
    pub last_unseen_memory_bytes: Option<i64>,
    pub last_unseen_cause: Option<String>,
    /// The latest window's fault, where it had one.
    pub last_fault_code: Option<String>,
    pub last_fault_detail: Option<String>,
}

/// A process in the latest window of its GPU.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct FleetProcess {
    pub gpu_uuid: String,
    pub pid: i64,
    pub process_name: Option<String>,
    pub memory_used_max_bytes: Option<i64>,
    pub sm_util_avg: Option<f64>,
    pub labels_json: String,
    pub user_name: Option<String>,
}

/// A stored GPU window, as read back.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StoredGpuWindow {
    pub gpu_uuid: String,
    pub start_ms: i64,
    pub end_ms: i64,
    pub samples: i64,
    pub memory_total_bytes: Option<i64>,
    pub memory_used_max_bytes: Option<i64>,
    pub util_avg: Option<f64>,
    pub util_max: Option<f64>,
    /// Samples per utilization percent, as the sender reported them (JSON).
    pub util_histogram: Option<String>,
    pub mem_util_avg: Option<f64>,
    pub power_avg_watts: Option<f64>,
    pub temperature_max_c: Option<f64>,
    pub energy_mj: Option<i64>,
}

// The core's read models know no database: queries read tuples, named here once.

type HostColumns = (
    i64,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    bool,
);

/// The columns [`process_window`] reads, in its order.
macro_rules! process_window_columns {
    () => {
        "gpu_uuid, start_ms, pid, process_name, memory_used_max_bytes, sm_util_avg, labels_json,
         container_id, pod_uid, user_name"
    };
}
pub(super) use process_window_columns;

pub(super) type ProcessWindowColumns = (
    String,
    i64,
    i64,
    Option<String>,
    Option<i64>,
    Option<f64>,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
);

pub(super) fn process_window(row: ProcessWindowColumns) -> super::StoredProcessWindow {
    super::from_columns!(super::StoredProcessWindow {
        gpu_uuid,
        start_ms,
        pid,
        process_name,
        memory_used_max_bytes,
        sm_util_avg,
        labels_json,
        container_id,
        pod_uid,
        user_name
    })(row)
}

/// How far before its host's last report a GPU's newest window is looked for: a GPU silent for a
/// day while its host reports shows no latest state (it was taken out, or stopped answering),
/// and the look-up reads only the newest days.
pub const FLEET_LOOK_BACK_MS: i64 = gpuledger_core::time::DAY_MS;

/// Each GPU of every host an agent reports, with its newest window (hosts known from the bill
/// alone have no GPU to show).
pub async fn fleet(on: impl Into<On<'_>>) -> Result<Vec<super::FleetRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex, DB| {
        let sql = format!(
            "SELECT h.cluster, h.hostname, h.instance_type, h.last_report_ms, h.spool_depth,
                    g.uuid, g.gpu_index, g.name, g.parent_uuid, g.memory_total_bytes,
                    w.util_avg AS last_util_avg,
                    w.memory_used_max_bytes AS last_memory_used_bytes,
                    w.end_ms AS last_window_end_ms,
                    w.unseen_memory_bytes AS last_unseen_memory_bytes,
                    w.unseen_cause AS last_unseen_cause,
                    w.fault_code AS last_fault_code, w.fault_detail AS last_fault_detail
             FROM hosts h
             LEFT JOIN gpus g ON g.host_id = h.id
             {}
             WHERE h.from_bill = 0
             ORDER BY h.cluster, h.hostname, g.gpu_index, g.uuid",
            <DB as super::Dialect>::NEWEST_WINDOW
        );
        Ok(sqlx::query_as(&sql)
            .bind(FLEET_LOOK_BACK_MS)
            .fetch_all(&mut *ex)
            .await?)
    })
}

/// Each of these GPUs' index on its host and its MIG parent, where known: what names a GPU as
/// `nvidia-smi` does, without reading its newest window as [`fleet`] does.
pub async fn gpu_places(
    on: impl Into<On<'_>>,
    uuids: &[String],
) -> Result<Vec<(String, Option<i64>, Option<String>)>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex, DB| {
        let mut rows = Vec::new();
        for chunk in uuids.chunks(500) {
            let mut q = sqlx::QueryBuilder::<DB>::new(
                "SELECT uuid, gpu_index, parent_uuid FROM gpus WHERE uuid IN (",
            );
            let mut list = q.separated(", ");
            for u in chunk {
                list.push_bind(u.clone());
            }
            list.push_unseparated(")");
            rows.extend(q.build_query_as().fetch_all(&mut *ex).await?);
        }
        Ok(rows)
    })
}

/// The processes of each GPU's newest window (as [`fleet`] finds it).
pub async fn fleet_processes(
    on: impl Into<On<'_>>,
) -> Result<Vec<super::FleetProcess>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex, DB| {
        let sql = format!(
            "SELECT p.gpu_uuid, p.pid, p.process_name, p.memory_used_max_bytes, p.sm_util_avg,
                    p.labels_json, p.user_name
             FROM gpus g
             JOIN hosts h ON h.id = g.host_id
             {}
             JOIN process_windows p ON p.gpu_uuid = g.uuid AND p.start_ms = w.start_ms
             ORDER BY p.gpu_uuid, p.pid",
            <DB as super::Dialect>::NEWEST_WINDOW
        );
        Ok(sqlx::query_as(&sql)
            .bind(FLEET_LOOK_BACK_MS)
            .fetch_all(&mut *ex)
            .await?)
    })
}

/// Windows that start in `[from_ms, to_ms)`, ordered by GPU and time.
pub async fn gpu_windows(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<super::StoredGpuWindow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT gpu_uuid, start_ms, end_ms, samples, memory_total_bytes, memory_used_max_bytes,
                    util_avg, util_max, util_histogram, mem_util_avg, power_avg_watts,
                    temperature_max_c, energy_mj
             FROM gpu_windows WHERE start_ms >= $1 AND start_ms < $2
             ORDER BY gpu_uuid, start_ms",
        )
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(&mut *ex)
        .await?)
    })
}

pub async fn process_windows(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<super::StoredProcessWindow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let rows: Vec<ProcessWindowColumns> = sqlx::query_as(concat!(
            "SELECT ",
            process_window_columns!(),
            " FROM process_windows WHERE start_ms >= $1 AND start_ms < $2
             ORDER BY gpu_uuid, start_ms, pid"
        ))
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(&mut *ex)
        .await?;
        Ok(rows.into_iter().map(process_window).collect())
    })
}

pub async fn batch_count(on: impl Into<On<'_>>) -> Result<i64, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM ingested_batches")
            .fetch_one(&mut *ex)
            .await?;
        Ok(n)
    })
}

pub async fn hosts(on: impl Into<On<'_>>) -> Result<Vec<super::HostRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let rows: Vec<HostColumns> = sqlx::query_as(
            "SELECT id, cluster, hostname, provider, instance_id, instance_key, instance_type,
                    lifecycle, region, (from_bill <> 0) AS from_bill
             FROM hosts ORDER BY cluster, hostname",
        )
        .fetch_all(&mut *ex)
        .await?;
        Ok(rows
            .into_iter()
            .map(super::from_columns!(super::HostRow {
                id,
                cluster,
                hostname,
                provider,
                instance_id,
                instance_key,
                instance_type,
                lifecycle,
                region,
                from_bill
            }))
            .collect())
    })
}

/// A GPU instance the bill charges and no host has: see [`add_billed_hosts`].
#[derive(Debug, Clone, PartialEq)]
pub struct BilledHost {
    /// The bill's normalised resource id: the host's name and instance key.
    pub resource_key: String,
    pub instance_type: Option<String>,
}

/// Adds a host known from the bill alone for each instance no host has yet (in cluster
/// [`gpuledger_core::telemetry::BILLED_ONLY_CLUSTER`]), and marks every hour its bill lines
/// charge for the roll-up: hours attributed before it existed held its cost as unattributed.
/// One transaction; a host another replica added first is left as it is. Returns how many
/// hosts were added.
pub async fn add_billed_hosts(
    on: impl Into<On<'_>>,
    hosts: &[BilledHost],
) -> Result<usize, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let mut tx = crate::store::db::begin_write(&mut *ex).await?;
        let mut added = 0;
        for h in hosts {
            let inserted = sqlx::query(
                "INSERT INTO hosts (cluster, hostname, instance_id, instance_key, instance_type,
                                    last_report_ms, from_bill)
                 SELECT $1, $2, $2, $2, $3, 0, 1
                 WHERE NOT EXISTS (SELECT 1 FROM hosts WHERE instance_key = $2)
                 ON CONFLICT (cluster, hostname) DO NOTHING",
            )
            .bind(gpuledger_core::telemetry::BILLED_ONLY_CLUSTER)
            .bind(&h.resource_key)
            .bind(&h.instance_type)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if inserted == 0 {
                continue;
            }
            added += 1;
            let spans: Vec<(i64, i64)> = sqlx::query_as(
                "SELECT charge_period_start_ms, charge_period_end_ms FROM cost_lines
                 WHERE resource_key = $1",
            )
            .bind(&h.resource_key)
            .fetch_all(&mut *tx)
            .await?;
            let hours = super::hours_of_spans(&spans);
            super::rollups::mark_dirty(&mut *tx, &hours, super::BILLING_MARK_HOST).await?;
        }
        tx.commit().await?;
        Ok(added)
    })
}

/// Every MIG instance's UUID.
pub async fn mig_instances(on: impl Into<On<'_>>) -> Result<Vec<String>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let rows: Vec<(String,)> =
            sqlx::query_as("SELECT uuid FROM gpus WHERE parent_uuid IS NOT NULL")
                .fetch_all(&mut *ex)
                .await?;
        Ok(rows.into_iter().map(|(u,)| u).collect())
    })
}

/// How far retention has deleted raw windows (hours before this may have lost theirs).
pub async fn raw_deleted_before(on: impl Into<On<'_>>) -> Result<Option<i64>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let row: Option<(i64,)> = sqlx::query_as("SELECT deleted_before_ms FROM raw_retention")
            .fetch_optional(&mut *ex)
            .await?;
        Ok(row.map(|(ms,)| ms))
    })
}

/// Records that retention deleted raw windows before `before_ms` (it only moves forward).
pub async fn set_raw_deleted_before(
    on: impl Into<On<'_>>,
    before_ms: i64,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        sqlx::query(
            "INSERT INTO raw_retention (only_row, deleted_before_ms) VALUES (1, $1)
             ON CONFLICT (only_row) DO UPDATE SET deleted_before_ms = excluded.deleted_before_ms
             WHERE raw_retention.deleted_before_ms < excluded.deleted_before_ms",
        )
        .bind(before_ms)
        .execute(&mut *ex)
        .await?;
        Ok(())
    })
}

/// Deletes at most `limit` raw GPU windows, process windows and batch ids older than
/// `before_ms`; returns how many rows went. Called in a loop so no transaction is long.
pub async fn delete_raw_before(
    on: impl Into<On<'_>>,
    before_ms: i64,
    limit: i64,
) -> Result<u64, StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let mut deleted = 0;
        for sql in [
            "DELETE FROM process_windows WHERE (gpu_uuid, start_ms, pid) IN
                (SELECT gpu_uuid, start_ms, pid FROM process_windows
                 WHERE start_ms < $1 LIMIT $2)",
            "DELETE FROM gpu_windows WHERE (gpu_uuid, start_ms) IN
                (SELECT gpu_uuid, start_ms FROM gpu_windows WHERE start_ms < $1 LIMIT $2)",
            "DELETE FROM ingested_batches WHERE batch_id IN
                (SELECT batch_id FROM ingested_batches WHERE received_ms < $1 LIMIT $2)",
        ] {
            deleted += sqlx::query(sql)
                .bind(before_ms)
                .bind(limit)
                .execute(&mut *ex)
                .await?
                .rows_affected();
        }
        Ok(deleted)
    })
}

/// The processes seen on some GPUs in `[from_ms, to_ms)`: per GPU, process name, user and
/// labels, how many windows each was in.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct GpuProcessRow {
    pub gpu_uuid: String,
    pub process_name: Option<String>,
    pub user_name: Option<String>,
    pub labels_json: String,
    pub windows: i64,
}

pub async fn processes_on(
    on: impl Into<On<'_>>,
    gpus: &[String],
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<GpuProcessRow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex, DB| {
        let mut rows = Vec::new();
        for chunk in gpus.chunks(500) {
            let mut q = sqlx::QueryBuilder::<DB>::new(
                "SELECT gpu_uuid, process_name, user_name, labels_json, COUNT(*) AS windows
                 FROM process_windows WHERE start_ms >= ",
            );
            q.push_bind(from_ms)
                .push(" AND start_ms < ")
                .push_bind(to_ms)
                .push(" AND gpu_uuid IN (");
            let mut list = q.separated(", ");
            for g in chunk {
                list.push_bind(g.clone());
            }
            list.push_unseparated(")");
            q.push(
                " GROUP BY gpu_uuid, process_name, user_name, labels_json
                  ORDER BY gpu_uuid, windows DESC, COALESCE(process_name, ''),
                           COALESCE(user_name, ''), labels_json",
            );
            rows.extend(q.build_query_as().fetch_all(&mut *ex).await?);
        }
        Ok(rows)
    })
}
