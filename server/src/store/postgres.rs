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
