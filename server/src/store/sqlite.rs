//! SQLite: the embedded default. WAL so readers never wait for the writer; one writer at a time
//! (an in-process lock) because SQLite allows only one and would otherwise answer "busy".

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Connection, Pool, Sqlite};
use tokio::sync::Mutex;

use super::group_commit::{GroupCommit, Job, Written};
use super::tokens::{ingest_refusal, window_conflict};
use super::{store_impl, Db, Dialect, IngestOutcome, StoreError};

impl Dialect for Sqlite {
    /// Nothing to set for the roll-up's reads (see the PostgreSQL store).
    const ROLLUP_READ_SETTINGS: &'static [&'static str] = &[];
    /// Dimension names are letters, digits and `_` (see `core::owners`): safe in a JSON path.
    const OWNER_VALUE: (&'static str, &'static str) = ("json_extract(o.labels, '$.' || ", ")");
    /// The text itself.
    const OWNER_KEY: (&'static str, &'static str) = ("", "");
    const JSON_SET: (&'static str, &'static str) = ("json_group_array(DISTINCT ", ")");
    /// SQLite has no LATERAL: a correlated MAX, one index probe per GPU.
    const NEWEST_WINDOW: &'static str = "LEFT JOIN gpu_windows w ON w.gpu_uuid = g.uuid
        AND w.start_ms = (SELECT MAX(x.start_ms) FROM gpu_windows x
                          WHERE x.gpu_uuid = g.uuid AND x.start_ms >= h.last_report_ms - $1)";
    const JSON_ARRAY_TEXTS: (&'static str, &'static str) = ("SELECT value FROM json_each(", ")");
    const JSON_ARRAY_VALUES: (&'static str, &'static str) = ("SELECT value FROM json_each(", ")");
    // TOTAL sums in floating point and never raises; exact below 2^53.
    const CAPPED_SUM: (&'static str, &'static str) =
        ("CAST(MIN(TOTAL(", "), 9000000000000000000.0) AS INTEGER)");
}

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

pub struct SqliteStore {
    pool: Pool<Sqlite>,
    db: Db,
    group: GroupCommit,
}

impl SqliteStore {
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        MIGRATOR.run(&pool).await?;
        // Shared with `db`, so writes through either take the same turn: SQLite allows one
        // writer, and taking turns here is cheaper than meeting "database is locked".
        let writer = Arc::new(Mutex::new(()));
        // One writer: SQLite writes one transaction at a time anyway.
        let group = {
            let (pool, writer) = (pool.clone(), writer.clone());
            GroupCommit::start(1, move |jobs| {
                let (pool, writer) = (pool.clone(), writer.clone());
                async move { ingest_group(&pool, &writer, jobs).await }
            })
        };
        Ok(SqliteStore {
            db: Db::Sqlite {
                pool: pool.clone(),
                writer,
            },
            pool,
            group,
        })
    }
}

store_impl!(SqliteStore, "sqlite");

/// A group of reports in one transaction, each in its own savepoint, so that a repeat or a
/// refusal undoes only its own rows; one commit (one write of the pages they share) for all.
/// Should the transaction itself fail, each report is written alone and gets its own answer.
async fn ingest_group(pool: &Pool<Sqlite>, writer: &Mutex<()>, jobs: Vec<Job>) -> Written {
    let _turn = writer.lock().await;
    if jobs.len() > 1 {
        match ingest_together(pool, &jobs).await {
            Ok(outcomes) => return Written { outcomes, alone: 0 },
            Err(e) => tracing::warn!(
                error = %e,
                reports = jobs.len(),
                "a group of reports could not be committed together; writing each alone"
            ),
        }
    }
    let mut outcomes = Vec::with_capacity(jobs.len());
    for job in &jobs {
        outcomes.push(
            ingest_report(
                pool,
                &job.report,
                job.token_id,
                &job.content_sha256,
                job.agent,
                job.now_ms,
            )
            .await,
        );
    }
    Written {
        alone: if jobs.len() > 1 { jobs.len() } else { 0 },
        outcomes,
    }
}

async fn ingest_together(
    pool: &Pool<Sqlite>,
    jobs: &[Job],
) -> Result<Vec<Result<IngestOutcome, StoreError>>, StoreError> {
    let mut tx = pool
        .begin_with(crate::store::db::SQLITE_BEGIN_WRITE)
        .await?;
    let mut outcomes = Vec::with_capacity(jobs.len());
    for job in jobs {
        // A savepoint: sqlx nests a transaction begun inside another.
        let mut one = tx.begin().await?;
        let outcome = ingest_report_tx(
            &mut one,
            &job.report,
            job.token_id,
            &job.content_sha256,
            job.agent,
            job.now_ms,
        )
        .await;
        match outcome {
            Ok(IngestOutcome::Stored) => one.commit().await?,
            _ => one.rollback().await?,
        }
        outcomes.push(outcome);
    }
    tx.commit().await?;
    Ok(outcomes)
}

/// Rows per multi-row `VALUES` statement: 23 columns each stays far below SQLite's limit of
/// 32,766 bound values.
const ROWS_PER_STATEMENT: usize = 500;

/// A report's windows as multi-row inserts. SQLite runs in-process, so round trips cost little;
/// what counts is few statements, and one transaction for a group of reports (the caller's).
async fn insert_report_rows(
    tx: &mut sqlx::Transaction<'_, Sqlite>,
    host_id: i64,
    batch_id: &str,
    rows: &super::report_rows::ReportRows,
) -> Result<u64, StoreError> {
    let mut inserted = 0;
    let g = &rows.gpus;
    let indexes: Vec<usize> = (0..g.uuid.len()).collect();
    for chunk in indexes.chunks(ROWS_PER_STATEMENT) {
        let mut q = sqlx::QueryBuilder::<Sqlite>::new(
            "INSERT INTO gpu_windows (gpu_uuid, start_ms, end_ms, host_id, batch_id, samples,
                memory_total_bytes, memory_used_max_bytes, util_avg, util_max, mem_util_avg,
                power_avg_watts, temperature_max_c, energy_mj, util_histogram, mig_gpu_slices,
                mig_gpu_instance_id, mig_instance_slices, mig_compute_slices,
                unseen_memory_bytes, unseen_cause, fault_code, fault_detail) ",
        );
        q.push_values(chunk, |mut b, &i| {
            b.push_bind(&g.uuid[i])
                .push_bind(g.start_ms[i])
                .push_bind(g.end_ms[i])
                .push_bind(host_id)
                .push_bind(batch_id)
                .push_bind(g.samples[i])
                .push_bind(g.memory_total_bytes[i])
                .push_bind(g.memory_used_max_bytes[i])
                .push_bind(g.util_avg[i])
                .push_bind(g.util_max[i])
                .push_bind(g.mem_util_avg[i])
                .push_bind(g.power_avg_watts[i])
                .push_bind(g.temperature_max_c[i])
                .push_bind(g.energy_mj[i])
                .push_bind(&g.util_histogram[i])
                .push_bind(g.mig_gpu_slices[i])
                .push_bind(g.mig_gpu_instance_id[i])
                .push_bind(g.mig_instance_slices[i])
                .push_bind(g.mig_compute_slices[i])
                .push_bind(g.unseen_memory_bytes[i])
                .push_bind(&g.unseen_cause[i])
                .push_bind(&g.fault_code[i])
                .push_bind(&g.fault_detail[i]);
        });
        q.push(" ON CONFLICT DO NOTHING");
        inserted += q.build().execute(&mut **tx).await?.rows_affected();
    }
    let p = &rows.processes;
    let indexes: Vec<usize> = (0..p.gpu_uuid.len()).collect();
    for chunk in indexes.chunks(ROWS_PER_STATEMENT) {
        let mut q = sqlx::QueryBuilder::<Sqlite>::new(
            "INSERT INTO process_windows (gpu_uuid, start_ms, pid, end_ms, process_name,
                memory_used_max_bytes, sm_util_avg, labels_json, container_id, pod_uid,
                user_name, host_id) ",
        );
        q.push_values(chunk, |mut b, &i| {
            b.push_bind(&p.gpu_uuid[i])
                .push_bind(p.start_ms[i])
                .push_bind(p.pid[i])
                .push_bind(p.end_ms[i])
                .push_bind(&p.process_name[i])
                .push_bind(p.memory_used_max_bytes[i])
                .push_bind(p.sm_util_avg[i])
                .push_bind(&p.labels_json[i])
                .push_bind(&p.container_id[i])
                .push_bind(&p.pod_uid[i])
                .push_bind(&p.user_name[i])
                .push_bind(host_id);
        });
        q.push(" ON CONFLICT DO NOTHING");
        inserted += q.build().execute(&mut **tx).await?.rows_affected();
    }
    Ok(inserted)
}

/// A report in one transaction: all of it is stored, or (a repeat, a refusal) none of it.
async fn ingest_report(
    pool: &sqlx::Pool<Sqlite>,
    report: &gpuledger_proto::Report,
    token_id: i64,
    content_sha256: &str,
    agent: crate::store::AgentStatus,
    now_ms: i64,
) -> Result<crate::store::IngestOutcome, crate::store::StoreError> {
    let mut tx = pool
        .begin_with(crate::store::db::SQLITE_BEGIN_WRITE)
        .await?;
    let outcome =
        ingest_report_tx(&mut tx, report, token_id, content_sha256, agent, now_ms).await?;
    match outcome {
        crate::store::IngestOutcome::Stored => tx.commit().await?,
        _ => tx.rollback().await?,
    }
    Ok(outcome)
}

/// A report in a handful of statements; SQLite runs in-process, so their number costs little.
/// Who may report the host and whether the batch is new are asked first: the caller holds the
/// only writer, so the answer still holds when the rows are written.
async fn ingest_report_tx(
    tx: &mut sqlx::Transaction<'_, Sqlite>,
    report: &gpuledger_proto::Report,
    token_id: i64,
    content_sha256: &str,
    agent: crate::store::AgentStatus,
    now_ms: i64,
) -> Result<crate::store::IngestOutcome, crate::store::StoreError> {
    if let Some(outcome) =
        ingest_refusal(&mut **tx, report, token_id, content_sha256, now_ms).await?
    {
        return Ok(outcome);
    }
    let host: Option<(i64,)> = super::bind_host!(
        sqlx::query_as(concat!(
            super::host_columns_sql!(),
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) ",
            super::host_on_conflict_sql!(),
            " RETURNING id"
        )),
        report,
        agent,
        now_ms
    )
    .bind(token_id)
    .fetch_optional(&mut **tx)
    .await?;
    let Some((host_id,)) = host else {
        return Err(StoreError::Invalid(
            "the host was claimed by another token while this report was checked".into(),
        ));
    };

    sqlx::query(
        "INSERT INTO ingested_batches
            (batch_id, host_id, token_id, received_ms, windows, content_sha256)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(&report.batch_id)
    .bind(host_id)
    .bind(token_id)
    .bind(now_ms)
    .bind(report.windows.len() as i64)
    .bind(content_sha256)
    .execute(&mut **tx)
    .await?;

    // Bulk: a statement per table, not one per row (each backend binds its own way).
    let rows = crate::store::report_rows::ReportRows::of(report)?;
    let inserted = insert_report_rows(tx, host_id, &report.batch_id, &rows).await?;
    if inserted < (rows.gpus.uuid.len() + rows.processes.gpu_uuid.len()) as u64 {
        // A window another batch stored: refuse the whole report rather than keep part of it.
        let refusal = window_conflict(&mut **tx, report).await?.ok_or_else(|| {
            StoreError::Invalid("a process window of this report was already stored".into())
        })?;
        return Ok(crate::store::IngestOutcome::Refused(refusal));
    }
    upsert_gpus(tx, host_id, &rows.identities).await?;
    super::rollups::mark_dirty(&mut **tx, &rows.hours, host_id).await?;
    insert_serving(tx, host_id, &rows.serving).await?;
    Ok(crate::store::IngestOutcome::Stored)
}

async fn insert_serving(
    tx: &mut sqlx::Transaction<'_, Sqlite>,
    host_id: i64,
    s: &crate::store::report_rows::ServingColumns,
) -> Result<(), crate::store::StoreError> {
    for i in 0..s.endpoint.len() {
        sqlx::query(concat!(
            "INSERT INTO serving_counts (host_id, endpoint, model, hour_ms, engine, requests,
                input_tokens, output_tokens)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ",
            super::serving_on_conflict_sql!()
        ))
        .bind(host_id)
        .bind(&s.endpoint[i])
        .bind(&s.model[i])
        .bind(s.hour_ms[i])
        .bind(&s.engine[i])
        .bind(s.requests[i])
        .bind(s.input_tokens[i])
        .bind(s.output_tokens[i])
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

async fn upsert_gpus(
    tx: &mut sqlx::Transaction<'_, Sqlite>,
    host_id: i64,
    identities: &[crate::store::report_rows::GpuIdentity],
) -> Result<(), crate::store::StoreError> {
    for chunk in identities.chunks(500) {
        let mut q = sqlx::QueryBuilder::<Sqlite>::new(
            "INSERT INTO gpus (uuid, host_id, gpu_index, name, parent_uuid, memory_total_bytes) ",
        );
        q.push_values(chunk, |mut b, g| {
            b.push_bind(&g.uuid)
                .push_bind(host_id)
                .push_bind(g.gpu_index)
                .push_bind(&g.name)
                .push_bind(&g.parent_uuid)
                .push_bind(g.memory_total_bytes);
        });
        q.push(concat!(" ", super::gpu_identity_on_conflict_sql!()));
        q.build().execute(&mut **tx).await?;
    }
    Ok(())
}
