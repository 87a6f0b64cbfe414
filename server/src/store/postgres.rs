//! PostgreSQL: the production backend, shared by several server replicas. Nothing here assumes
//! this process is the only writer: idempotency rests on the database's unique keys.

use std::collections::HashSet;
use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::{Pool, Postgres};

use super::group_commit::{GroupCommit, Job, Written};
use super::tokens::{ingest_refusal, window_conflict};
use super::{store_impl, Db, Dialect, IngestOutcome, StoreError};

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
    /// A LATERAL newest-first probe: the look-back bound, a value per host, prunes it at run
    /// time to the partitions of the newest days (store::partitions), where a MAX over the
    /// whole table would probe every day's partition for every GPU.
    const NEWEST_WINDOW: &'static str = "LEFT JOIN LATERAL (
        SELECT * FROM gpu_windows x
        WHERE x.gpu_uuid = g.uuid AND x.start_ms >= h.last_report_ms - $1
        ORDER BY x.start_ms DESC LIMIT 1) w ON true";
    const JSON_ARRAY_TEXTS: (&'static str, &'static str) =
        ("SELECT json_array_elements_text(", "::json)");
    const JSON_ARRAY_VALUES: (&'static str, &'static str) = (
        "SELECT value FROM json_array_elements_text(",
        "::json) AS value",
    );
    // SUM over BIGINT is NUMERIC: exact, capped before the cast back.
    const CAPPED_SUM: (&'static str, &'static str) =
        ("CAST(LEAST(SUM(", "), 9000000000000000000) AS BIGINT)");
}

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// The newest migration this build has: a read replica must have replayed it to be read.
pub(crate) fn latest_migration() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or_default()
}

pub struct PostgresStore {
    pool: Pool<Postgres>,
    db: Db,
    group: GroupCommit,
}

/// Ingest writers per replica: enough that one slow group does not hold up the next, few enough
/// that groups stay large under load and leave the pool to pages and jobs.
const INGEST_WRITERS: usize = 2;

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
        let group = {
            let pool = pool.clone();
            GroupCommit::start(INGEST_WRITERS, move |jobs| {
                let pool = pool.clone();
                async move { ingest_group(&pool, jobs).await }
            })
        };
        Ok(PostgresStore {
            db: Db::Postgres { pool: pool.clone() },
            pool,
            group,
        })
    }
}

store_impl!(PostgresStore, "postgres");

/// A report written alone, in [`ingest_together`]'s statement (one statement is one
/// transaction, so no BEGIN or COMMIT either). When it stores nothing, the report is a repeat or
/// refused and `ingest_refusal` says which; a window another batch already stored violates its
/// table's key, which undoes the whole statement, and only then is the stored window looked
/// up, to name it.
async fn ingest_report(pool: &Pool<Postgres>, job: &Job) -> Result<IngestOutcome, StoreError> {
    let report = &job.report;
    match ingest_together(pool, &[job]).await {
        Ok(stored) if !stored.is_empty() => Ok(IngestOutcome::Stored),
        Ok(_) => {
            let mut conn = pool.acquire().await?;
            ingest_refusal(
                &mut *conn,
                report,
                job.token_id,
                &job.content_sha256,
                job.now_ms,
            )
            .await?
            .ok_or_else(|| {
                // Only a race leaves nothing to name: another token took the host or a GPU
                // between the statement and the look-up, and has since lost it. The agent
                // retries.
                StoreError::Invalid("the report was neither stored nor refused; retry".into())
            })
        }
        Err(e) if window_already_stored(&e) => {
            let mut conn = pool.acquire().await?;
            match window_conflict(&mut *conn, report).await? {
                Some(refusal) => Ok(IngestOutcome::Refused(refusal)),
                None => Err(StoreError::Invalid(
                    "a process window of this report was already stored".into(),
                )),
            }
        }
        Err(e) => Err(e),
    }
}

/// Whether the ingest statement failed on a window stored before: a unique key of a GPU's or a
/// process's windows (a day's partition's, whose name begins with its table's). The statement
/// inserts windows without `ON CONFLICT`, which would cost each row a second look at the key:
/// a window sent again under a new batch id is rare, and undoes its statement.
fn window_already_stored(e: &StoreError) -> bool {
    let StoreError::Database(sqlx::Error::Database(e)) = e else {
        return false;
    };
    e.kind() == sqlx::error::ErrorKind::UniqueViolation
        && e.constraint()
            .is_some_and(|c| c.starts_with("gpu_windows") || c.starts_with("process_windows"))
}

/// A group of reports (see `group_commit`): as many as possible in one statement, the rest each
/// alone. Each is answered as if written alone: the ones the group statement did not store (a
/// repeat, a refusal, a window stored before) go through [`ingest_report`], which says why; and
/// if the group statement fails as a whole, nothing of it was stored and every report goes alone.
///
/// The statement takes at most one report per host, batch id and GPU: its joins map rows back to
/// their report by host and batch id, and a host, GPU or window row may be written once per
/// statement. A report that repeats one of them is written alone after the group. Reports are
/// taken in host order, so concurrent groups (of this replica's writers or of others) lock host
/// rows in one order.
async fn ingest_group(pool: &Pool<Postgres>, jobs: Vec<Job>) -> Written {
    let mut together: Vec<usize> = Vec::new();
    if jobs.len() > 1 {
        let (mut hosts, mut batches, mut gpus) = (HashSet::new(), HashSet::new(), HashSet::new());
        for (place, job) in jobs.iter().enumerate() {
            let r = &job.report;
            let host = (r.host.cluster.as_str(), r.host.hostname.as_str());
            let uuids: HashSet<&str> = r
                .windows
                .iter()
                .flat_map(|w| &w.gpus)
                .map(|g| g.uuid.as_str())
                .collect();
            if hosts.contains(&host)
                || batches.contains(r.batch_id.as_str())
                || !uuids.is_disjoint(&gpus)
            {
                continue;
            }
            hosts.insert(host);
            batches.insert(r.batch_id.as_str());
            gpus.extend(uuids);
            together.push(place);
        }
        together.sort_by_key(|&place| {
            let h = &jobs[place].report.host;
            (h.cluster.as_str(), h.hostname.as_str())
        });
    }
    let group: Vec<&Job> = together.iter().map(|&place| &jobs[place]).collect();
    let stored: HashSet<usize> = store_together(pool, &group)
        .await
        .into_iter()
        .filter_map(|at| together.get(at).copied())
        .collect();
    let mut outcomes = Vec::with_capacity(jobs.len());
    let mut alone = 0;
    for (place, job) in jobs.iter().enumerate() {
        outcomes.push(if stored.contains(&place) {
            Ok(IngestOutcome::Stored)
        } else {
            alone += usize::from(jobs.len() > 1);
            ingest_report(pool, job).await
        });
    }
    Written { outcomes, alone }
}

/// Stores what it can of `group` in few statements and answers the places (in `group`) of the
/// reports stored. A window stored before makes the statement fail as a whole (its key);
/// usual enough, an agent sending a window again under a new batch id, that the group is halved
/// and each half tried again, so one such report costs a few statements, not every report of
/// its group written alone; the report itself is then written alone, which names it. Any
/// other failure leaves that part of the group to be written alone.
async fn store_together(pool: &Pool<Postgres>, group: &[&Job]) -> Vec<usize> {
    let mut stored = Vec::new();
    if group.len() < 2 {
        return stored;
    }
    let mut parts = Vec::new();
    parts.push(0..group.len());
    while let Some(part) = parts.pop() {
        match ingest_together(pool, &group[part.clone()]).await {
            Ok(places) => stored.extend(
                places
                    .into_iter()
                    .filter_map(|at| usize::try_from(at).ok())
                    .map(|at| part.start + at),
            ),
            Err(e) if window_already_stored(&e) => {
                // One report left is the one: written alone, it is named.
                if part.len() > 1 {
                    let half = part.start + part.len() / 2;
                    parts.push(part.start..half);
                    parts.push(half..part.end);
                }
            }
            Err(e) => tracing::warn!(
                error = %e,
                reports = part.len(),
                "a group of reports could not be stored together; writing each alone"
            ),
        }
    }
    stored
}

/// The statement [`ingest_together`] runs (see there): the group's reports as column arrays
/// in, the places of the reports stored out.
const INGEST_TOGETHER: &str = concat!(
    "WITH rep AS (
        SELECT * FROM UNNEST($1::int8[], $2::text[], $3::text[], $4::text[], $5::text[],
                             $6::text[], $7::text[], $8::text[], $9::int8[], $10::int8[],
                             $11::int8[], $12::text[], $13::text[], $14::int8[], $15::text[],
                             $16::int8[], $17::text[])
          AS r(r, cluster, hostname, provider, instance_id, instance_type, region,
               agent_version, now_ms, spool_depth, spool_dropped, instance_key, lifecycle,
               token_id, batch_id, windows, content_sha256)
     ), ids AS (
        SELECT * FROM UNNEST($18::int8[], $19::text[], $20::int8[], $21::text[],
                             $22::text[], $23::int8[])
          AS u(r, uuid, gpu_index, name, parent_uuid, memory_total_bytes)
     ), foreign_gpus AS (
        -- Reports with a GPU on a host of another active token, found in one pass over the
        -- group's GPUs (a correlated look-up would read them all once per report).
        SELECT DISTINCT ids.r
        FROM ids JOIN rep ON rep.r = ids.r JOIN gpus x ON x.uuid = ids.uuid
        JOIN hosts y ON y.id = x.host_id JOIN api_tokens t ON t.id = y.token_id
        WHERE y.token_id <> rep.token_id AND ",
    super::tokens::token_active_sql!("t", "rep.now_ms"),
    "
     ), h AS (",
    super::host_columns_sql!(),
    "SELECT rep.cluster, rep.hostname, rep.provider, rep.instance_id, rep.instance_type,
            rep.region, rep.agent_version, rep.now_ms, rep.spool_depth, rep.spool_dropped,
            rep.instance_key, rep.lifecycle, rep.token_id
     FROM rep
     WHERE NOT EXISTS (SELECT 1 FROM ingested_batches WHERE batch_id = rep.batch_id)
       AND NOT EXISTS (SELECT 1 FROM foreign_gpus f WHERE f.r = rep.r)
     ",
    super::host_on_conflict_sql!("excluded.last_report_ms"),
    "
        RETURNING id, cluster, hostname
     ), b AS (
        INSERT INTO ingested_batches (batch_id, host_id, token_id, received_ms, windows,
                                      content_sha256)
        SELECT rep.batch_id, h.id, rep.token_id, rep.now_ms, rep.windows, rep.content_sha256
        FROM rep JOIN h ON h.cluster = rep.cluster AND h.hostname = rep.hostname
        -- h's conditions again: the join alone would take a report h left out.
        WHERE NOT EXISTS (SELECT 1 FROM foreign_gpus f WHERE f.r = rep.r)
        ON CONFLICT DO NOTHING
        RETURNING batch_id, host_id
     ), br AS (
        SELECT rep.r, b.host_id, b.batch_id
        FROM b JOIN rep ON rep.batch_id = b.batch_id
     ), gw AS (
        INSERT INTO gpu_windows (gpu_uuid, start_ms, end_ms, host_id, batch_id, samples,
            memory_total_bytes, memory_used_max_bytes, util_avg, util_max, mem_util_avg,
            power_avg_watts, temperature_max_c, energy_mj, util_histogram, mig_gpu_slices,
            mig_gpu_instance_id, mig_instance_slices, mig_compute_slices,
            unseen_memory_bytes, unseen_cause, fault_code, fault_detail)
        SELECT u.gpu_uuid, u.start_ms, u.end_ms, br.host_id, br.batch_id, u.samples,
            u.memory_total_bytes, u.memory_used_max_bytes, u.util_avg, u.util_max,
            u.mem_util_avg, u.power_avg_watts, u.temperature_max_c, u.energy_mj,
            u.util_histogram, u.mig_gpu_slices, u.mig_gpu_instance_id,
            u.mig_instance_slices, u.mig_compute_slices, u.unseen_memory_bytes,
            u.unseen_cause, u.fault_code, u.fault_detail
        FROM UNNEST($24::int8[], $25::text[], $26::int8[], $27::int8[], $28::int8[],
                    $29::int8[], $30::int8[], $31::float8[], $32::float8[], $33::float8[],
                    $34::float8[], $35::float8[], $36::int8[], $37::text[], $38::int8[],
                    $39::int8[], $40::int8[], $41::int8[], $42::int8[], $43::text[],
                    $44::text[], $45::text[])
          AS u(r, gpu_uuid, start_ms, end_ms, samples, memory_total_bytes,
               memory_used_max_bytes, util_avg, util_max, mem_util_avg, power_avg_watts,
               temperature_max_c, energy_mj, util_histogram, mig_gpu_slices,
               mig_gpu_instance_id, mig_instance_slices, mig_compute_slices,
               unseen_memory_bytes, unseen_cause, fault_code, fault_detail)
        JOIN br ON br.r = u.r
     ), pw AS (
        INSERT INTO process_windows (gpu_uuid, start_ms, pid, end_ms, process_name,
            memory_used_max_bytes, sm_util_avg, labels_json, container_id, pod_uid,
            user_name, host_id)
        SELECT u.gpu_uuid, u.start_ms, u.pid, u.end_ms, u.process_name,
            u.memory_used_max_bytes, u.sm_util_avg, u.labels_json, u.container_id,
            u.pod_uid, u.user_name, br.host_id
        FROM UNNEST($46::int8[], $47::text[], $48::int8[], $49::int8[], $50::int8[],
                    $51::text[], $52::int8[], $53::float8[], $54::text[], $55::text[],
                    $56::text[], $57::text[])
          AS u(r, gpu_uuid, start_ms, pid, end_ms, process_name, memory_used_max_bytes,
               sm_util_avg, labels_json, container_id, pod_uid, user_name)
        JOIN br ON br.r = u.r
     ), g AS (
        INSERT INTO gpus (uuid, host_id, gpu_index, name, parent_uuid, memory_total_bytes)
        SELECT ids.uuid, br.host_id, ids.gpu_index, ids.name, ids.parent_uuid,
               ids.memory_total_bytes
        FROM ids JOIN br ON br.r = ids.r
        -- As in the single report's statement: a GPU as it was writes nothing.
        WHERE (SELECT ROW(x.host_id, x.gpu_index, x.name, x.parent_uuid, x.memory_total_bytes)
               FROM gpus x WHERE x.uuid = ids.uuid)
              IS DISTINCT FROM
              ROW(br.host_id, ids.gpu_index, ids.name, ids.parent_uuid, ids.memory_total_bytes)
        ",
    super::gpu_identity_on_conflict_sql!(),
    "), d AS (
        INSERT INTO rollup_dirty_hours (hour_ms, host_id, generation)
        SELECT u.hour_ms, br.host_id, 0
        FROM UNNEST($58::int8[], $59::int8[]) AS u(r, hour_ms) JOIN br ON br.r = u.r
        -- The roll-up takes marks in this order: the same order here, so the two never
        -- wait on each other in a circle.
        ORDER BY u.hour_ms, br.host_id
        ",
    super::dirty_mark_on_conflict_sql!(),
    "
     ), s AS (
        INSERT INTO serving_counts (host_id, endpoint, model, hour_ms, engine, requests,
            input_tokens, output_tokens)
        SELECT br.host_id, u.endpoint, u.model, u.hour_ms, u.engine, u.requests,
            u.input_tokens, u.output_tokens
        FROM UNNEST($60::int8[], $61::text[], $62::text[], $63::int8[], $64::text[],
                    $65::int8[], $66::int8[], $67::int8[])
          AS u(r, endpoint, model, hour_ms, engine, requests, input_tokens, output_tokens)
        JOIN br ON br.r = u.r
        ",
    super::serving_on_conflict_sql!(),
    "
     )
     SELECT r FROM br"
);

/// Reports in one statement, no two of one host, batch id or GPU (see [`ingest_group`]):
/// data-modifying CTEs upsert each report's host, claim its batch id and, only if the claim
/// succeeded, insert its windows from column arrays (`UNNEST`), record GPUs that are new or
/// changed and mark the hours to roll up. Each row carries its report's place in `jobs` (`r`).
/// A host is written only when the batch id is new, none of the report's GPUs sits on a host of
/// another active token, and the host itself is this token's (or free): otherwise nothing of
/// that report is written. The statement fails as a whole where a window was stored before
/// ([`window_already_stored`]). Answers the places of the reports it stored.
///
/// One statement, not one per table, since on a busy server PostgreSQL's per-statement work is
/// what ingest spends its CPU on; and, for a group, one for all its reports.
async fn ingest_together(pool: &Pool<Postgres>, jobs: &[&Job]) -> Result<Vec<i64>, StoreError> {
    let reports: Vec<&gpuledger_proto::Report> = jobs.iter().map(|j| &j.report).collect();
    let (rows, at) = super::report_rows::ReportRows::of_group(&reports)?;
    let (g, p, l, sc) = (&rows.gpus, &rows.processes, &rows.identities, &rows.serving);
    let query = sqlx::query_as(INGEST_TOGETHER);
    let each = |f: fn(&Job) -> Option<String>| jobs.iter().map(|j| f(j)).collect::<Vec<_>>();
    let stored: Vec<(i64,)> = query
        .bind((0..jobs.len() as i64).collect::<Vec<_>>())
        .bind(
            jobs.iter()
                .map(|j| j.report.host.cluster.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| j.report.host.hostname.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(each(|j| j.report.host.provider.clone()))
        .bind(each(|j| j.report.host.instance_id.clone()))
        .bind(each(|j| j.report.host.instance_type.clone()))
        .bind(each(|j| j.report.host.region.clone()))
        .bind(
            jobs.iter()
                .map(|j| j.report.agent_version.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(jobs.iter().map(|j| j.now_ms).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.agent.spool_depth).collect::<Vec<_>>())
        .bind(
            jobs.iter()
                .map(|j| j.agent.spool_dropped)
                .collect::<Vec<_>>(),
        )
        .bind(each(|j| {
            j.report
                .host
                .instance_id
                .as_deref()
                .map(gpuledger_core::bill::normalize_resource_id)
        }))
        .bind(each(|j| j.report.host.lifecycle.clone()))
        .bind(jobs.iter().map(|j| j.token_id).collect::<Vec<_>>())
        .bind(
            jobs.iter()
                .map(|j| j.report.batch_id.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| j.report.windows.len() as i64)
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| j.content_sha256.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(&at.identities)
        .bind(l.iter().map(|x| x.uuid.as_str()).collect::<Vec<_>>())
        .bind(l.iter().map(|x| x.gpu_index).collect::<Vec<_>>())
        .bind(l.iter().map(|x| x.name.as_str()).collect::<Vec<_>>())
        .bind(
            l.iter()
                .map(|x| x.parent_uuid.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(l.iter().map(|x| x.memory_total_bytes).collect::<Vec<_>>())
        .bind(&at.gpus)
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
        .bind(&g.util_histogram)
        .bind(&g.mig_gpu_slices)
        .bind(&g.mig_gpu_instance_id)
        .bind(&g.mig_instance_slices)
        .bind(&g.mig_compute_slices)
        .bind(&g.unseen_memory_bytes)
        .bind(&g.unseen_cause)
        .bind(&g.fault_code)
        .bind(&g.fault_detail)
        .bind(&at.processes)
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
        .bind(&p.user_name)
        .bind(&at.hours)
        .bind(&rows.hours)
        .bind(&at.serving)
        .bind(&sc.endpoint)
        .bind(&sc.model)
        .bind(&sc.hour_ms)
        .bind(&sc.engine)
        .bind(&sc.requests)
        .bind(&sc.input_tokens)
        .bind(&sc.output_tokens)
        .fetch_all(pool)
        .await?;
    Ok(stored.into_iter().map(|(r,)| r).collect())
}
