//! PostgreSQL: the production backend, shared by several server replicas. Nothing here assumes
//! this process is the only writer: idempotency rests on the database's unique keys.

use std::time::Duration;

use gpuledger_proto::Report;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Pool, Postgres};

use super::{shared_sql_impl, store_impl, AgentStatus, IngestOutcome, StoreError};

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
    async fn ingest_batch(
        &self,
        report: &Report,
        token_id: i64,
        agent: AgentStatus,
        now_ms: i64,
    ) -> Result<IngestOutcome, StoreError> {
        ingest_tx(&self.pool, report, token_id, agent, now_ms).await
    }
}
