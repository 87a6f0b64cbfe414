//! PostgreSQL: the production backend, shared by several server replicas. Nothing here assumes
//! this process is the only writer: idempotency rests on the database's unique keys.

use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::{Pool, Postgres};

use super::tokens::{ingest_refusal, window_conflict};
use super::{store_impl, Db, Dialect, StoreError};

impl Dialect for Postgres {
    /// Set for the roll-up's reads of a group of hosts. Parallel workers would take the cores that
    /// serve ingest, and the parallel scan of the hour's time index they make look cheap reads every
    /// host's rows for each group, where the host and GPU indexes read only the group's. JIT costs
    /// more than it saves on statements of this size.
    const ROLLUP_READ_SETTINGS: &'static [&'static str] = &[
        "SET LOCAL max_parallel_workers_per_gather = 0",
        "SET LOCAL jit = off",
    ];
    const OWNER_VALUE: (&'static str, &'static str) = ("(o.labels::jsonb ->> ", ")");
    /// The text's MD5: a long text would not fit a btree entry (migration 0022).
    const OWNER_KEY: (&'static str, &'static str) = ("md5(", ")");
    const JSON_SET: (&'static str, &'static str) = ("json_agg(DISTINCT ", ")::text");
}

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

pub struct PostgresStore {
    pool: Pool<Postgres>,
    db: Db,
}

impl PostgresStore {
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            // A page reads up to nine things side by side (the review), beside the jobs: under
            // load a request waits its turn for a connection rather than failing at once.
            .acquire_timeout(Duration::from_secs(15))
            .connect(url)
            .await?;
        // sqlx's migrator takes an advisory lock, so replicas starting together migrate once.
        MIGRATOR.run(&pool).await?;
        Ok(PostgresStore {
            db: Db::Postgres { pool: pool.clone() },
            pool,
        })
    }
}

store_impl!(PostgresStore, "postgres");

impl PostgresStore {
    /// PostgreSQL takes concurrent writers, from this replica and others alike.
    async fn write_guard(&self) {}
}

/// A report in one statement: data-modifying CTEs upsert the host, claim the batch id and,
/// only if the claim succeeded, insert every window from column arrays (`UNNEST`), record GPUs
/// that are new or changed and mark the hours to roll up. One statement is one transaction, so no
/// BEGIN or COMMIT either: one round trip instead of one per table and two more, since on a busy
/// server PostgreSQL's per-statement work is what ingest spends its CPU on.
///
/// The host is written only when the batch id is new, none of the report's GPUs sits on a host
/// of another active token, and the host itself is this token's (or free): otherwise nothing is
/// written and `ingest_refusal_sql` says why, a repeat or a refusal. A window another batch
/// already stored makes the `guard` CTE violate `ingest_window_already_stored`, which undoes the
/// whole statement; only then is the stored window looked up, to name it.
async fn ingest_report(
    pool: &Pool<Postgres>,
    report: &gpuledger_proto::Report,
    token_id: i64,
    content_sha256: &str,
    agent: super::AgentStatus,
    now_ms: i64,
) -> Result<super::IngestOutcome, StoreError> {
    let rows = super::report_rows::ReportRows::of(report)?;
    let (g, p, l) = (&rows.gpus, &rows.processes, &rows.identities);
    let query = sqlx::query_as(concat!(
        "WITH h AS (",
        super::host_columns_sql!(),
        "SELECT $1::text, $2::text, $3::text, $4::text, $5::text, $6::text, $7::text, $8::int8,
                $9::int8, $10::int8, $11::text, $12::text, $14::int8
         WHERE NOT EXISTS (SELECT 1 FROM ingested_batches WHERE batch_id = $13)
           AND NOT EXISTS (
               SELECT 1 FROM gpus x JOIN hosts y ON y.id = x.host_id
               JOIN api_tokens t ON t.id = y.token_id
               WHERE x.uuid = ANY($38::text[]) AND y.token_id <> $14 AND ",
        super::token_active_sql!("t", "$8"),
        ")
         ",
        super::host_on_conflict_sql!(),
        "
            RETURNING id
         ), b AS (
            INSERT INTO ingested_batches (batch_id, host_id, token_id, received_ms, windows,
                                          content_sha256)
            SELECT $13, h.id, $14, $8, $15, $44 FROM h
            ON CONFLICT DO NOTHING
            RETURNING host_id
         ), gw AS (
            INSERT INTO gpu_windows (gpu_uuid, start_ms, end_ms, host_id, batch_id, samples,
                memory_total_bytes, memory_used_max_bytes, util_avg, util_max, mem_util_avg,
                power_avg_watts, temperature_max_c, energy_mj, util_histogram, mig_gpu_slices,
                mig_gpu_instance_id, mig_instance_slices, mig_compute_slices,
                unseen_memory_bytes, unseen_cause, fault_code, fault_detail)
            SELECT u.gpu_uuid, u.start_ms, u.end_ms, b.host_id, $13, u.samples,
                u.memory_total_bytes, u.memory_used_max_bytes, u.util_avg, u.util_max,
                u.mem_util_avg, u.power_avg_watts, u.temperature_max_c, u.energy_mj,
                u.util_histogram, u.mig_gpu_slices, u.mig_gpu_instance_id,
                u.mig_instance_slices, u.mig_compute_slices, u.unseen_memory_bytes,
                u.unseen_cause, u.fault_code, u.fault_detail
            FROM b, UNNEST($16::text[], $17::int8[], $18::int8[], $19::int8[], $20::int8[],
                           $21::int8[], $22::float8[], $23::float8[], $24::float8[],
                           $25::float8[], $26::float8[], $27::int8[], $47::text[],
                           $48::int8[], $49::int8[], $50::int8[], $51::int8[], $52::int8[],
                           $53::text[], $54::text[], $55::text[])
              AS u(gpu_uuid, start_ms, end_ms, samples, memory_total_bytes,
                   memory_used_max_bytes, util_avg, util_max, mem_util_avg, power_avg_watts,
                   temperature_max_c, energy_mj, util_histogram, mig_gpu_slices,
                   mig_gpu_instance_id, mig_instance_slices, mig_compute_slices,
                   unseen_memory_bytes, unseen_cause, fault_code, fault_detail)
            ON CONFLICT DO NOTHING
            RETURNING 1
         ), pw AS (
            INSERT INTO process_windows (gpu_uuid, start_ms, pid, end_ms, process_name,
                memory_used_max_bytes, sm_util_avg, labels_json, container_id, pod_uid,
                user_name, host_id)
            SELECT u.gpu_uuid, u.start_ms, u.pid, u.end_ms, u.process_name,
                u.memory_used_max_bytes, u.sm_util_avg, u.labels_json, u.container_id,
                u.pod_uid, u.user_name, b.host_id
            FROM b, UNNEST($28::text[], $29::int8[], $30::int8[], $31::int8[], $32::text[],
                           $33::int8[], $34::float8[], $35::text[], $36::text[],
                           $37::text[], $46::text[])
              AS u(gpu_uuid, start_ms, pid, end_ms, process_name, memory_used_max_bytes,
                   sm_util_avg, labels_json, container_id, pod_uid, user_name)
            ON CONFLICT DO NOTHING
            RETURNING 1
         ), guard AS (
            INSERT INTO ingest_window_guard (windows_all_new)
            SELECT false
            WHERE (SELECT COUNT(*) FROM gw) + (SELECT COUNT(*) FROM pw)
                  <> (SELECT COUNT(*) FROM b) * $45
         ), g AS (
            INSERT INTO gpus (uuid, host_id, gpu_index, name, parent_uuid, memory_total_bytes)
            SELECT u.uuid, b.host_id, u.gpu_index, u.name, u.parent_uuid, u.memory_total_bytes
            FROM b, UNNEST($38::text[], $39::int8[], $40::text[], $41::text[], $42::int8[])
              AS u(uuid, gpu_index, name, parent_uuid, memory_total_bytes)
            -- The usual case, a GPU as it was, writes nothing (not even a row lock). A scalar
            -- subquery, so that each GPU is one primary-key probe (as an anti-join the planner
            -- scans the whole table).
            WHERE (SELECT ROW(x.host_id, x.gpu_index, x.name, x.parent_uuid, x.memory_total_bytes)
                   FROM gpus x WHERE x.uuid = u.uuid)
                  IS DISTINCT FROM
                  ROW(b.host_id, u.gpu_index, u.name, u.parent_uuid, u.memory_total_bytes)
            ",
        super::gpu_identity_on_conflict_sql!(),
        "), d AS (
            INSERT INTO rollup_dirty_hours (hour_ms, host_id, generation)
            SELECT hr, b.host_id, 0 FROM b, UNNEST($43::int8[]) AS hr
            ",
        super::dirty_mark_on_conflict_sql!(),
        "
         ), s AS (
            INSERT INTO serving_counts (host_id, endpoint, model, hour_ms, engine, requests,
                input_tokens, output_tokens)
            SELECT b.host_id, u.endpoint, u.model, u.hour_ms, u.engine, u.requests,
                u.input_tokens, u.output_tokens
            FROM b, UNNEST($56::text[], $57::text[], $58::int8[], $59::text[], $60::int8[],
                           $61::int8[], $62::int8[])
              AS u(endpoint, model, hour_ms, engine, requests, input_tokens, output_tokens)
            ",
        super::serving_on_conflict_sql!(),
        "
         )
         SELECT COUNT(*) FROM b"
    ));
    let sc = &rows.serving;
    let stored: Result<(i64,), sqlx::Error> = super::bind_host!(query, report, agent, now_ms)
        .bind(&report.batch_id)
        .bind(token_id)
        .bind(report.windows.len() as i64)
        .bind(&g.uuid)
        .bind(&g.start_ms)
        .bind(&g.end_ms)
        .bind(&g.samples)
        .bind(&g.memory_total_bytes)
        .bind(&g.memory_used_max_bytes)
        .bind(&g.util_avg)
        .bind(&g.util_max)
        .bind(&g.mem_util_avg)
        .bind(&g.power_avg_watts)
        .bind(&g.temperature_max_c)
        .bind(&g.energy_mj)
        .bind(&p.gpu_uuid)
        .bind(&p.start_ms)
        .bind(&p.pid)
        .bind(&p.end_ms)
        .bind(&p.process_name)
        .bind(&p.memory_used_max_bytes)
        .bind(&p.sm_util_avg)
        .bind(&p.labels_json)
        .bind(&p.container_id)
        .bind(&p.pod_uid)
        .bind(l.iter().map(|x| x.uuid.as_str()).collect::<Vec<_>>())
        .bind(l.iter().map(|x| x.gpu_index).collect::<Vec<_>>())
        .bind(l.iter().map(|x| x.name.as_str()).collect::<Vec<_>>())
        .bind(
            l.iter()
                .map(|x| x.parent_uuid.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(l.iter().map(|x| x.memory_total_bytes).collect::<Vec<_>>())
        .bind(&rows.hours)
        .bind(content_sha256)
        .bind((g.uuid.len() + p.gpu_uuid.len()) as i64)
        .bind(&p.user_name)
        .bind(&g.util_histogram)
        .bind(&g.mig_gpu_slices)
        .bind(&g.mig_gpu_instance_id)
        .bind(&g.mig_instance_slices)
        .bind(&g.mig_compute_slices)
        .bind(&g.unseen_memory_bytes)
        .bind(&g.unseen_cause)
        .bind(&g.fault_code)
        .bind(&g.fault_detail)
        .bind(&sc.endpoint)
        .bind(&sc.model)
        .bind(&sc.hour_ms)
        .bind(&sc.engine)
        .bind(&sc.requests)
        .bind(&sc.input_tokens)
        .bind(&sc.output_tokens)
        .fetch_one(pool)
        .await;
    let stored = match stored {
        Ok((stored,)) => stored,
        Err(sqlx::Error::Database(e)) if e.constraint() == Some(WINDOW_GUARD) => {
            let mut conn = pool.acquire().await?;
            return match window_conflict(&mut *conn, report).await? {
                Some(refusal) => Ok(super::IngestOutcome::Refused(refusal)),
                None => Err(StoreError::Invalid(
                    "a process window of this report was already stored".into(),
                )),
            };
        }
        Err(e) => return Err(e.into()),
    };
    if stored > 0 {
        return Ok(super::IngestOutcome::Stored);
    }
    let mut conn = pool.acquire().await?;
    ingest_refusal(&mut *conn, report, token_id, content_sha256, now_ms)
        .await?
        .ok_or_else(|| {
            // Only a race leaves nothing to name: another token took the host or a GPU between
            // the statement and the look-up, and has since lost it. The agent retries.
            StoreError::Invalid("the report was neither stored nor refused; retry".into())
        })
}

/// The constraint the ingest statement violates when a window was already stored.
const WINDOW_GUARD: &str = "ingest_window_already_stored";
