//! SQLite: the embedded default. WAL so readers never wait for the writer; one writer at a time
//! (an in-process lock) because SQLite allows only one and would otherwise answer "busy".

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Pool, Sqlite};
use tokio::sync::Mutex;

use super::{shared_sql_impl, store_impl, StoreError};

shared_sql_impl!(Sqlite);

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

pub struct SqliteStore {
    pool: Pool<Sqlite>,
    writer: Mutex<()>,
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
        Ok(SqliteStore {
            pool,
            writer: Mutex::new(()),
        })
    }
}

store_impl!(SqliteStore, "sqlite");

impl SqliteStore {
    /// SQLite allows one writer: take turns here rather than meet "database is locked".
    async fn write_guard(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.writer.lock().await
    }
}
