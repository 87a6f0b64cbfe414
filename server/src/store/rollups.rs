//! Rolling up: hours marked for roll-up (with generations), what the roll-up reads of them,
//! and the attributed rows that replace an hour's. What is read of the ledger afterwards is in
//! `ledger`.

use super::db::{on_backend, On};
use super::{Dialect, StoreError};

/// How one endpoint or model used one GPU in an hour or a day: its GPU windows in one 5-point
/// band of GPU utilization and the most GPU memory one of its processes held there.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct UsageRow {
    pub period_ms: i64,
    pub host_id: i64,
    pub gpu_uuid: String,
    /// `endpoint` or `model`.
    pub owner_by: String,
    pub owner_key: String,
    /// `floor(utilization / 5)`, 0 to 20; -1 for windows without utilization.
    pub util_band: i64,
    pub windows: i64,
    pub peak_memory_bytes: i64,
}

/// Cost in an hour on bill lines that match no GPU host.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct UnattributedRow {
    pub hour_ms: i64,
    pub currency: String,
    pub cost_nano: i64,
    pub cost_atto: i64,
}

/// An hour to roll up again, with the generation of each mark read.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct DirtyMark {
    pub hour_ms: i64,
    pub host_id: i64,
    pub generation: i64,
}

/// The columns [`WindowRow`] reads (`w` the GPU window, `g` its GPU).
macro_rules! window_columns {
    () => {
        "w.host_id, w.gpu_uuid, g.parent_uuid, g.name AS gpu_name, w.start_ms, w.end_ms,
         w.memory_total_bytes, w.util_avg, w.util_histogram, w.energy_mj, w.mig_gpu_slices,
         w.mig_gpu_instance_id, w.mig_instance_slices, w.mig_compute_slices,
         w.unseen_memory_bytes, w.unseen_cause, w.fault_code, w.fault_detail"
    };
}

/// A GPU window as [`window_columns!`] reads it.
struct WindowRow {
    host_id: i64,
    gpu_uuid: String,
    parent_uuid: Option<String>,
    gpu_name: Option<String>,
    start_ms: i64,
    end_ms: i64,
    memory_total_bytes: Option<i64>,
    util_avg: Option<f64>,
    util_histogram: Option<String>,
    energy_mj: Option<i64>,
    mig_gpu_slices: Option<i64>,
    mig_gpu_instance_id: Option<i64>,
    mig_instance_slices: Option<i64>,
    mig_compute_slices: Option<i64>,
    unseen_memory_bytes: Option<i64>,
    unseen_cause: Option<String>,
    fault_code: Option<String>,
    fault_detail: Option<String>,
}

// By position, in the order of `window_columns!`: the roll-up reads millions of rows, and
// finding each column by its name took a twentieth of its CPU.
impl<'r, R: sqlx::Row> sqlx::FromRow<'r, R> for WindowRow
where
    usize: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    f64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn from_row(row: &'r R) -> Result<Self, sqlx::Error> {
        Ok(WindowRow {
            host_id: row.try_get(0)?,
            gpu_uuid: row.try_get(1)?,
            parent_uuid: row.try_get(2)?,
            gpu_name: row.try_get(3)?,
            start_ms: row.try_get(4)?,
            end_ms: row.try_get(5)?,
            memory_total_bytes: row.try_get(6)?,
            util_avg: row.try_get(7)?,
            util_histogram: row.try_get(8)?,
            energy_mj: row.try_get(9)?,
            mig_gpu_slices: row.try_get(10)?,
            mig_gpu_instance_id: row.try_get(11)?,
            mig_instance_slices: row.try_get(12)?,
            mig_compute_slices: row.try_get(13)?,
            unseen_memory_bytes: row.try_get(14)?,
            unseen_cause: row.try_get(15)?,
            fault_code: row.try_get(16)?,
            fault_detail: row.try_get(17)?,
        })
    }
}

fn window(r: WindowRow) -> super::AttributionWindow {
    super::AttributionWindow {
        host_id: r.host_id,
        gpu_uuid: r.gpu_uuid,
        parent_uuid: r.parent_uuid,
        gpu_name: r.gpu_name,
        start_ms: r.start_ms,
        end_ms: r.end_ms,
        memory_total_bytes: r.memory_total_bytes,
        util_avg: r.util_avg,
        util_histogram: r.util_histogram,
        energy_mj: r.energy_mj,
        mig: gpuledger_core::telemetry::MigFacts {
            gpu_slices: r.mig_gpu_slices,
            gpu_instance_id: r.mig_gpu_instance_id,
            instance_slices: r.mig_instance_slices,
            compute_slices: r.mig_compute_slices,
        },
        unseen_memory_bytes: r.unseen_memory_bytes,
        unseen_cause: r.unseen_cause,
        fault: r.fault_code.map(|code| gpuledger_core::telemetry::Fault {
            code,
            detail: r.fault_detail.unwrap_or_default(),
        }),
    }
}

pub(crate) async fn mark_dirty(
    on: impl Into<On<'_>>,
    hours: &[i64],
    host_id: i64,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex, DB| {
        for chunk in hours.chunks(1000) {
            let mut q = sqlx::QueryBuilder::<DB>::new(
                "INSERT INTO rollup_dirty_hours (hour_ms, host_id, generation) ",
            );
            q.push_values(chunk, |mut b, h| {
                b.push_bind(*h).push_bind(host_id).push_bind(0i64);
            });
            q.push(concat!(" ", super::dirty_mark_on_conflict_sql!()));
            q.build().execute(&mut *ex).await?;
        }
        Ok(())
    })
}

/// Marks hours for the roll-up job to attribute again (a rebuild, a changed rate card).
pub async fn mark_dirty_hours(on: impl Into<On<'_>>, hours: &[i64]) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex| {
        let mut tx = crate::store::db::begin_write(&mut *ex).await?;
        mark_dirty(&mut *tx, hours, super::BILLING_MARK_HOST).await?;
        tx.commit().await?;
        Ok(())
    })
}

/// The oldest marks of hours in `[from_ms, to_ms)`, at most `limit` (the roll-up job reads
/// only months still open: see `closing`).
pub async fn dirty_marks_in(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
    limit: i64,
) -> Result<Vec<super::DirtyMark>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT hour_ms, host_id, generation FROM rollup_dirty_hours
             WHERE hour_ms >= $2 AND hour_ms < $3
             ORDER BY hour_ms, host_id LIMIT $1",
        )
        .bind(limit)
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(&mut *ex)
        .await?)
    })
}

/// How many host-hours in `[from_ms, to_ms)` are marked and not rolled up yet.
pub async fn dirty_mark_count(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
) -> Result<i64, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT COUNT(*) FROM rollup_dirty_hours WHERE hour_ms >= $1 AND hour_ms < $2",
        )
        .bind(from_ms)
        .bind(to_ms)
        .fetch_one(&mut *ex)
        .await?;
        Ok(n)
    })
}

/// The ids of these owners (texts as [`gpuledger_core::owners::Owner::key`] writes them),
/// adding those not known yet. Only these owners are read, a thousand at a time: a dimension
/// with a value per run makes the table large.
async fn owner_ids<'k>(
    on: impl Into<On<'_>>,
    keys: impl Iterator<Item = &'k str>,
) -> Result<std::collections::HashMap<String, i64>, StoreError> {
    let keys: Vec<&str> = keys
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex, DB| {
        let (open, close) = <DB as super::Dialect>::OWNER_KEY;
        let select = |chunk: &[&str]| {
            let mut q = sqlx::QueryBuilder::<DB>::new(format!(
                "SELECT id, labels FROM owners WHERE {open}labels{close} IN ("
            ));
            let mut list = q.separated(", ");
            for k in chunk {
                list.push(open);
                list.push_bind_unseparated(k.to_string());
                list.push_unseparated(close);
            }
            q.push(")");
            q
        };
        let mut ids = std::collections::HashMap::with_capacity(keys.len());
        for chunk in keys.chunks(1000) {
            let known: Vec<(i64, String)> =
                select(chunk).build_query_as().fetch_all(&mut *ex).await?;
            ids.extend(known.into_iter().map(|(id, k)| (k, id)));
            let missing: Vec<&str> = chunk
                .iter()
                .copied()
                .filter(|k| !ids.contains_key(*k))
                .collect();
            if !missing.is_empty() {
                // Another writer may add the same owner first: its row is the one kept.
                let mut q = sqlx::QueryBuilder::<DB>::new("INSERT INTO owners (labels) ");
                q.push_values(&missing, |mut b, k| {
                    b.push_bind(k.to_string());
                });
                q.push(format!(" ON CONFLICT ({open}labels{close}) DO NOTHING"));
                q.build().execute(&mut *ex).await?;
                let added: Vec<(i64, String)> = select(&missing)
                    .build_query_as()
                    .fetch_all(&mut *ex)
                    .await?;
                ids.extend(added.into_iter().map(|(id, k)| (k, id)));
            }
            // Each owner's values, one row per dimension, for those without them: new owners,
            // and any an older server wrote during a rolling upgrade.
            let chunk_ids: Vec<(i64, &str)> = chunk
                .iter()
                .filter_map(|k| ids.get(*k).map(|id| (*id, *k)))
                .collect();
            if chunk_ids.is_empty() {
                continue;
            }
            let mut q = sqlx::QueryBuilder::<DB>::new(
                "SELECT DISTINCT owner_id FROM owner_values WHERE owner_id IN (",
            );
            let mut list = q.separated(", ");
            for (id, _) in &chunk_ids {
                list.push_bind(*id);
            }
            q.push(")");
            let valued: std::collections::HashSet<i64> = q
                .build_query_scalar::<i64>()
                .fetch_all(&mut *ex)
                .await?
                .into_iter()
                .collect();
            let values: Vec<(i64, String, String)> = chunk_ids
                .iter()
                .filter(|(id, _)| !valued.contains(id))
                .flat_map(|(id, k)| {
                    gpuledger_core::owners::Owner::from_key(k)
                        .iter()
                        .map(|(d, v)| (*id, d.to_owned(), v.to_owned()))
                        .collect::<Vec<_>>()
                })
                .collect();
            for part in values.chunks(1000) {
                let mut q = sqlx::QueryBuilder::<DB>::new(
                    "INSERT INTO owner_values (owner_id, dimension, value) ",
                );
                q.push_values(part, |mut b, (id, d, v)| {
                    b.push_bind(*id).push_bind(d.clone()).push_bind(v.clone());
                });
                q.push(" ON CONFLICT (owner_id, dimension) DO NOTHING");
                q.build().execute(&mut *ex).await?;
            }
        }
        Ok(ids)
    })
}

/// The days the marks' hours fall in: those [`replace_rollups`] rebuilds.
pub fn days_of_marks(marks: &[super::DirtyMark]) -> Vec<i64> {
    use gpuledger_core::time::DAY_MS;
    let days: std::collections::BTreeSet<i64> = marks
        .iter()
        .map(|m| m.hour_ms.div_euclid(DAY_MS) * DAY_MS)
        .collect();
    days.into_iter().collect()
}

/// In one transaction: replaces the rollup rows of the marks' hours with `rows` and
/// `unattributed` (and their sums per host), rebuilds the days those hours fall in (and the
/// active hours per value of `experiment`, the dimension training runs are read from), and
/// clears each mark whose generation is still the one read (a report that came meanwhile keeps
/// its mark). What was kept from those days is the caller's to retire, in the same transaction
/// ([`days_of_marks`], `store::sections::retire_days`).
pub async fn replace_rollups(
    on: impl Into<On<'_>>,
    marks: &[super::DirtyMark],
    rows: &[super::RollupRow],
    unattributed: &[super::UnattributedRow],
    usage: &[super::UsageRow],
    experiment: Option<&str>,
) -> Result<(), StoreError> {
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex, DB| {
        let hours: std::collections::BTreeSet<i64> = marks.iter().map(|m| m.hour_ms).collect();
        let days = days_of_marks(marks);
        let mut tx = crate::store::db::begin_write(&mut *ex).await?;
        // A row lock that serializes roll-up writers across replicas and CLI runs, so two
        // never interleave their deletes and inserts of the same hour.
        sqlx::query(
            "INSERT INTO job_leases (name, holder, expires_ms) VALUES ('rollup-writer', NULL, 0)
             ON CONFLICT (name) DO UPDATE SET expires_ms = 0",
        )
        .execute(&mut *tx)
        .await?;
        for h in &hours {
            sqlx::query("DELETE FROM rollup_hours WHERE hour_ms = $1")
                .bind(h)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM rollup_host_hours WHERE hour_ms = $1")
                .bind(h)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM rollup_unattributed WHERE hour_ms = $1")
                .bind(h)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM rollup_usage_hours WHERE hour_ms = $1")
                .bind(h)
                .execute(&mut *tx)
                .await?;
        }
        for chunk in usage.chunks(1000) {
            let mut q = sqlx::QueryBuilder::<DB>::new(
                "INSERT INTO rollup_usage_hours (hour_ms, host_id, gpu_uuid, owner_by,
                    owner_key, util_band, windows, peak_memory_bytes) ",
            );
            q.push_values(chunk, |mut b, u| {
                b.push_bind(u.period_ms)
                    .push_bind(u.host_id)
                    .push_bind(u.gpu_uuid.clone())
                    .push_bind(u.owner_by.clone())
                    .push_bind(u.owner_key.clone())
                    .push_bind(u.util_band)
                    .push_bind(u.windows)
                    .push_bind(u.peak_memory_bytes);
            });
            q.build().execute(&mut *tx).await?;
        }
        let owners = owner_ids(&mut *tx, rows.iter().map(|r| r.owner.as_str())).await?;
        let owner_of_row =
            rows.iter()
                .map(|r| {
                    owners.get(&r.owner).copied().ok_or_else(|| {
                        StoreError::Invalid(format!("owner {} was not stored", r.owner))
                    })
                })
                .collect::<Result<Vec<i64>, StoreError>>()?;
        // 15 parameters a row: 1,000 rows stay under both backends' limits.
        for (chunk, owner_ids) in rows.chunks(1000).zip(owner_of_row.chunks(1000)) {
            let mut q = sqlx::QueryBuilder::<DB>::new(
                "INSERT INTO rollup_hours (hour_ms, host_id, gpu_uuid, owner_id, kind,
                    pricing_category, currency, estimated, cost_nano, cost_atto, gpu_seconds,
                    util_gpu_seconds, util_known_seconds, energy_j, energy_known_seconds) ",
            );
            q.push_values(chunk.iter().zip(owner_ids), |mut b, (r, owner_id)| {
                b.push_bind(r.period_ms)
                    .push_bind(r.host_id)
                    .push_bind(r.gpu_uuid.clone())
                    .push_bind(*owner_id)
                    .push_bind(r.kind.clone())
                    .push_bind(r.pricing_category.clone())
                    .push_bind(r.currency.clone())
                    .push_bind(r.estimated)
                    .push_bind(r.cost_nano)
                    .push_bind(r.cost_atto)
                    .push_bind(r.gpu_seconds)
                    .push_bind(r.util_gpu_seconds)
                    .push_bind(r.util_known_seconds)
                    .push_bind(r.energy_j)
                    .push_bind(r.energy_known_seconds);
            });
            q.build().execute(&mut *tx).await?;
        }
        let (set, end) = <DB as super::Dialect>::JSON_SET;
        // Sums stay exact: atto parts carry over into nano parts in integer math.
        let host_hours = format!(
            "INSERT INTO rollup_host_hours (hour_ms, host_id, owner_id, kind, pricing_category,
                currency, estimated, cost_nano, cost_atto, gpu_seconds, gpus)
             SELECT hour_ms, host_id, owner_id, kind, pricing_category, currency, estimated,
                CAST(SUM(cost_nano) AS BIGINT) + CAST(SUM(cost_atto) AS BIGINT) / 1000000000,
                CAST(SUM(cost_atto) AS BIGINT) % 1000000000,
                SUM(gpu_seconds), {set}gpu_uuid{end}
             FROM rollup_hours WHERE hour_ms = $1
             GROUP BY hour_ms, host_id, owner_id, kind, pricing_category, currency, estimated"
        );
        for h in &hours {
            sqlx::query(&host_hours).bind(h).execute(&mut *tx).await?;
        }
        for chunk in unattributed.chunks(1000) {
            let mut q = sqlx::QueryBuilder::<DB>::new(
                "INSERT INTO rollup_unattributed (hour_ms, currency, cost_nano, cost_atto) ",
            );
            q.push_values(chunk, |mut b, u| {
                b.push_bind(u.hour_ms)
                    .push_bind(u.currency.clone())
                    .push_bind(u.cost_nano)
                    .push_bind(u.cost_atto);
            });
            q.build().execute(&mut *tx).await?;
        }
        rebuild_days(&mut *tx, &days, experiment).await?;
        for m in marks {
            sqlx::query(
                "DELETE FROM rollup_dirty_hours
                 WHERE hour_ms = $1 AND host_id = $2 AND generation = $3",
            )
            .bind(m.hour_ms)
            .bind(m.host_id)
            .bind(m.generation)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    })
}

/// Rebuilds `days` (start of each day, epoch ms) from their hours: the days' rollups and their
/// sums per host, the GPUs' usage per day, and the active hours per value of `experiment` (the
/// dimension training runs are read from).
pub async fn rebuild_days(
    on: impl Into<On<'_>>,
    days: &[i64],
    experiment: Option<&str>,
) -> Result<(), StoreError> {
    use gpuledger_core::time::DAY_MS;
    let mut conn = on.into().write().await?;
    on_backend!(conn, |ex, DB| {
        let mut tx = crate::store::db::begin_write(&mut *ex).await?;
        for &day in days {
            sqlx::query("DELETE FROM rollup_days WHERE day_ms = $1")
                .bind(day)
                .execute(&mut *tx)
                .await?;
            // Sums stay exact: atto parts carry over into nano parts in integer math.
            sqlx::query(
                    "INSERT INTO rollup_days (day_ms, host_id, gpu_uuid, owner_id, kind,
                        pricing_category, currency, estimated, cost_nano, cost_atto, gpu_seconds,
                        util_gpu_seconds, util_known_seconds, energy_j, energy_known_seconds)
                     SELECT $1, host_id, gpu_uuid, owner_id, kind, pricing_category, currency,
                        estimated,
                        CAST(SUM(cost_nano) AS BIGINT) + CAST(SUM(cost_atto) AS BIGINT) / 1000000000,
                        CAST(SUM(cost_atto) AS BIGINT) % 1000000000,
                        SUM(gpu_seconds), SUM(util_gpu_seconds), SUM(util_known_seconds),
                        SUM(energy_j), SUM(energy_known_seconds)
                     FROM rollup_hours WHERE hour_ms >= $1 AND hour_ms < $2
                     GROUP BY host_id, gpu_uuid, owner_id, kind, pricing_category, currency,
                        estimated",
                )
                .bind(day)
                .bind(day + DAY_MS)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM rollup_host_days WHERE day_ms = $1")
                .bind(day)
                .execute(&mut *tx)
                .await?;
            sqlx::query(
                    "INSERT INTO rollup_host_days (day_ms, host_id, owner_id, kind,
                        pricing_category, currency, estimated, cost_nano, cost_atto, gpu_seconds,
                        util_gpu_seconds, util_known_seconds, energy_j, energy_known_seconds)
                     SELECT day_ms, host_id, owner_id, kind, pricing_category, currency, estimated,
                        CAST(SUM(cost_nano) AS BIGINT) + CAST(SUM(cost_atto) AS BIGINT) / 1000000000,
                        CAST(SUM(cost_atto) AS BIGINT) % 1000000000,
                        SUM(gpu_seconds), SUM(util_gpu_seconds), SUM(util_known_seconds),
                        SUM(energy_j), SUM(energy_known_seconds)
                     FROM rollup_days WHERE day_ms = $1
                     GROUP BY day_ms, host_id, owner_id, kind, pricing_category, currency,
                        estimated",
                )
                .bind(day)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM rollup_usage_days WHERE day_ms = $1")
                .bind(day)
                .execute(&mut *tx)
                .await?;
            sqlx::query(
                "INSERT INTO rollup_usage_days (day_ms, host_id, gpu_uuid, owner_by,
                        owner_key, util_band, windows, peak_memory_bytes)
                     SELECT $1, host_id, gpu_uuid, owner_by, owner_key, util_band,
                        CAST(SUM(windows) AS BIGINT), MAX(peak_memory_bytes)
                     FROM rollup_usage_hours WHERE hour_ms >= $1 AND hour_ms < $2
                     GROUP BY host_id, gpu_uuid, owner_by, owner_key, util_band",
            )
            .bind(day)
            .bind(day + DAY_MS)
            .execute(&mut *tx)
            .await?;
            sqlx::query("DELETE FROM rollup_experiment_days WHERE day_ms = $1")
                .bind(day)
                .execute(&mut *tx)
                .await?;
            if let Some(experiment) = experiment {
                let value = <DB as super::Dialect>::owner_value("$3");
                let sql = format!(
                    "INSERT INTO rollup_experiment_days (day_ms, experiment, first_hour_ms,
                            last_hour_ms, hours)
                         SELECT $1, {value}, MIN(h.hour_ms), MAX(h.hour_ms),
                            COUNT(DISTINCT h.hour_ms)
                         FROM rollup_hours h JOIN owners o ON o.id = h.owner_id
                         WHERE h.hour_ms >= $1 AND h.hour_ms < $2 AND {value} IS NOT NULL
                           AND h.kind IN ('used', 'held_idle')
                         GROUP BY {value}"
                );
                sqlx::query(&sql)
                    .bind(day)
                    .bind(day + DAY_MS)
                    .bind(experiment)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    })
}

/// How many raw GPU windows start in each hour of `[from_ms, to_ms)` per host, as
/// `(hour_ms, host_id, windows)` by hour and host id.
pub async fn gpu_windows_per_hour_and_host(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<(i64, i64, i64)>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        Ok(sqlx::query_as(
            "SELECT start_ms - start_ms % $3 AS hour_ms, host_id, COUNT(*) FROM gpu_windows
             WHERE start_ms >= $1 AND start_ms < $2
             GROUP BY start_ms - start_ms % $3, host_id ORDER BY hour_ms, host_id",
        )
        .bind(from_ms)
        .bind(to_ms)
        .bind(gpuledger_core::time::HOUR_MS)
        .fetch_all(&mut *ex)
        .await?)
    })
}

/// GPU windows starting in `[from_ms, to_ms)` with their host and GPU model.
pub async fn attribution_windows(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<super::AttributionWindow>, StoreError> {
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex| {
        let rows: Vec<WindowRow> = sqlx::query_as(concat!(
            "SELECT ",
            window_columns!(),
            " FROM gpu_windows w LEFT JOIN gpus g ON g.uuid = w.gpu_uuid
             WHERE w.start_ms >= $1 AND w.start_ms < $2
             ORDER BY w.host_id, w.start_ms, w.gpu_uuid"
        ))
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(&mut *ex)
        .await?;
        Ok(rows.into_iter().map(window).collect())
    })
}

/// What attributing `[from_ms, to_ms)` of the hosts in `host_ids` reads, in one snapshot:
/// their GPU windows (by host, start, GPU) and the process windows of those GPUs in the same
/// time (by GPU, start, pid). Read by index, host by host and GPU by GPU, so a large fleet's
/// hour costs the same however many groups of hosts it is read in. Where a GPU moved hosts
/// within the range this holds process windows of the other host's windows too; readers
/// match processes to windows.
pub async fn attribution_inputs_of_hosts(
    on: impl Into<On<'_>>,
    from_ms: i64,
    to_ms: i64,
    host_ids: &[i64],
) -> Result<super::AttributionInputs, StoreError> {
    // A read, though in a transaction (PostgreSQL's settings are local to one): on SQLite it
    // must not take the writer's turn, or ingest would wait for the roll-up's reads.
    let mut conn = on.into().read().await?;
    on_backend!(conn, |ex, DB| {
        // Ids bound per statement: far below either database's limit on parameters (and
        // a handful in tests, so that they read in several statements).
        const IDS_PER_STATEMENT: usize = if cfg!(test) { 3 } else { 1_000 };
        let mut tx = sqlx::Connection::begin(&mut *ex).await?;
        for setting in <DB as Dialect>::ROLLUP_READ_SETTINGS {
            sqlx::query(setting).execute(&mut *tx).await?;
        }
        let mut windows: Vec<super::AttributionWindow> = Vec::new();
        for ids in host_ids.chunks(IDS_PER_STATEMENT) {
            let mut q = in_time_and_list(
                concat!(
                    "SELECT ",
                    window_columns!(),
                    " FROM gpu_windows w LEFT JOIN gpus g ON g.uuid = w.gpu_uuid WHERE"
                ),
                ("w.start_ms", from_ms, to_ms),
                "w.host_id",
                ids,
            );
            // Statements differ in their number of ids and are planned for their values.
            let rows: Vec<WindowRow> = q
                .build_query_as()
                .persistent(false)
                .fetch_all(&mut *tx)
                .await?;
            windows.extend(rows.into_iter().map(window));
        }
        // Keys are unique (a GPU has one window per start, a process one per GPU and start),
        // so an unstable sort gives the one order.
        windows.sort_unstable_by(|a, b| {
            (a.host_id, a.start_ms, &a.gpu_uuid).cmp(&(b.host_id, b.start_ms, &b.gpu_uuid))
        });
        let gpus: Vec<&str> = windows
            .iter()
            .map(|w| w.gpu_uuid.as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut processes: Vec<super::StoredProcessWindow> = Vec::new();
        for uuids in gpus.chunks(IDS_PER_STATEMENT) {
            let mut q = in_time_and_list(
                concat!(
                    "SELECT ",
                    super::telemetry::process_window_columns!(),
                    " FROM process_windows WHERE"
                ),
                ("start_ms", from_ms, to_ms),
                "gpu_uuid",
                uuids,
            );
            let rows: Vec<super::telemetry::ProcessWindowColumns> = q
                .build_query_as()
                .persistent(false)
                .fetch_all(&mut *tx)
                .await?;
            processes.extend(rows.into_iter().map(super::telemetry::process_window));
        }
        processes.sort_unstable_by(|a, b| {
            (&a.gpu_uuid, a.start_ms, a.pid).cmp(&(&b.gpu_uuid, b.start_ms, b.pid))
        });
        tx.commit().await?;
        Ok((windows, processes))
    })
}

/// The oldest marks, at most `limit`.
pub async fn dirty_marks(on: impl Into<On<'_>>, limit: i64) -> Result<Vec<DirtyMark>, StoreError> {
    dirty_marks_in(on, i64::MIN, i64::MAX, limit).await
}

/// `select` (ending in WHERE) for rows whose `time` column is in `[from, to)` and whose
/// `column` is one of `values`, each value bound.
pub(super) fn in_time_and_list<'a, DB, V>(
    select: &str,
    (time, from_ms, to_ms): (&str, i64, i64),
    column: &str,
    values: &'a [V],
) -> sqlx::QueryBuilder<'a, DB>
where
    DB: sqlx::Database,
    <DB as sqlx::Database>::Arguments<'a>: Default,
    i64: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    V: Copy + 'a + sqlx::Encode<'a, DB> + sqlx::Type<DB>,
{
    let mut q = sqlx::QueryBuilder::<DB>::new(select);
    q.push(format_args!(" {time} >= "))
        .push_bind(from_ms)
        .push(format_args!(" AND {time} < "))
        .push_bind(to_ms)
        .push(format_args!(" AND {column} IN ("));
    let mut list = q.separated(", ");
    for v in values {
        list.push_bind(*v);
    }
    q.push(")");
    q
}
