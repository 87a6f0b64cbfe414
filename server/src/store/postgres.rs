//! PostgreSQL: the production backend, shared by several server replicas. Nothing here assumes
//! this process is the only writer: idempotency rests on the database's unique keys.

use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::{Pool, Postgres};

use super::{shared_sql_impl, store_impl, StoreError};

shared_sql_impl!(Postgres);

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

pub struct PostgresStore {
    pool: Pool<Postgres>,
}

impl PostgresStore {
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(5))
            .connect(url)
            .await?;
        // sqlx's migrator takes an advisory lock, so replicas starting together migrate once.
        MIGRATOR.run(&pool).await?;
        Ok(PostgresStore { pool })
    }
}

store_impl!(PostgresStore, "postgres");

impl PostgresStore {
    /// PostgreSQL takes concurrent writers, from this replica and others alike.
    async fn write_guard(&self) {}
}

/// A report's windows in two statements: each column travels as one array and `UNNEST` turns
/// the arrays back into rows, so a report of thousands of windows is two round trips.
async fn insert_report_rows(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    host_id: i64,
    batch_id: &str,
    rows: &super::report_rows::ReportRows,
) -> Result<(), StoreError> {
    let g = &rows.gpus;
    if !g.uuid.is_empty() {
        sqlx::query(
            "INSERT INTO gpu_windows (gpu_uuid, start_ms, end_ms, host_id, batch_id, samples,
                memory_total_bytes, memory_used_max_bytes, util_avg, util_max, mem_util_avg,
                power_avg_watts, temperature_max_c, energy_mj)
             SELECT u.gpu_uuid, u.start_ms, u.end_ms, $1, $2, u.samples, u.memory_total_bytes,
                u.memory_used_max_bytes, u.util_avg, u.util_max, u.mem_util_avg,
                u.power_avg_watts, u.temperature_max_c, u.energy_mj
             FROM UNNEST($3::text[], $4::int8[], $5::int8[], $6::int8[], $7::int8[], $8::int8[],
                         $9::float8[], $10::float8[], $11::float8[], $12::float8[], $13::float8[],
                         $14::int8[])
               AS u(gpu_uuid, start_ms, end_ms, samples, memory_total_bytes, memory_used_max_bytes,
                    util_avg, util_max, mem_util_avg, power_avg_watts, temperature_max_c, energy_mj)
             ON CONFLICT DO NOTHING",
        )
        .bind(host_id)
        .bind(batch_id)
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
        .execute(&mut **tx)
        .await?;
    }
    let p = &rows.processes;
    if !p.gpu_uuid.is_empty() {
        sqlx::query(
            "INSERT INTO process_windows (gpu_uuid, start_ms, pid, end_ms, process_name,
                memory_used_max_bytes, sm_util_avg, model, experiment, endpoint, team,
                labels_json, container_id, pod_uid)
             SELECT * FROM UNNEST($1::text[], $2::int8[], $3::int8[], $4::int8[], $5::text[],
                                  $6::int8[], $7::float8[], $8::text[], $9::text[], $10::text[],
                                  $11::text[], $12::text[], $13::text[], $14::text[])
             ON CONFLICT DO NOTHING",
        )
        .bind(&p.gpu_uuid)
        .bind(&p.start_ms)
        .bind(&p.pid)
        .bind(&p.end_ms)
        .bind(&p.process_name)
        .bind(&p.memory_used_max_bytes)
        .bind(&p.sm_util_avg)
        .bind(&p.model)
        .bind(&p.experiment)
        .bind(&p.endpoint)
        .bind(&p.team)
        .bind(&p.labels_json)
        .bind(&p.container_id)
        .bind(&p.pod_uid)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}
