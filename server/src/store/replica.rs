//! A PostgreSQL read replica (a streaming standby of the primary): what pages read when the
//! server is given `--read-database-url`. It runs no migrations (the primary's replicate) and
//! takes no writes; what is computed from its reads and kept goes to the primary
//! ([`Store::primary`]). Whether it is current enough to read is `crate::replica`'s to say,
//! from [`wal_position`] and [`standby_state`].

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::{Pool, Postgres};

use super::{Db, GroupCounters, IngestOutcome, Store, StoreError};

pub struct ReplicaStore {
    pool: Pool<Postgres>,
    db: Db,
    primary: Arc<dyn Store>,
}

impl ReplicaStore {
    /// Opens the read replica at `url` for the primary `primary`. Connections are made when first
    /// used, so a replica that is down when the server starts does not stop it: pages read from the
    /// primary until the replica answers.
    pub fn connect(url: &str, primary: Arc<dyn Store>) -> Result<ReplicaStore, StoreError> {
        if !super::is_postgres_url(url) {
            return Err(StoreError::Invalid(format!(
                "a read replica is a PostgreSQL standby (postgres://...), not {}",
                super::redacted_url(url)
            )));
        }
        if primary.backend() != "postgres" {
            return Err(StoreError::Invalid(
                "a read replica needs a PostgreSQL primary (--database-url postgres://...)".into(),
            ));
        }
        // A statement the standby never answers fails, and its page is read from the primary
        // (`http::reads`), rather than waiting for ever.
        let options = sqlx::postgres::PgConnectOptions::from_str(url)?
            .options([("statement_timeout", "60s")]);
        let pool = PgPoolOptions::new()
            .max_connections(16)
            // A replica that stopped answering is left for the primary by the next poll; until
            // then a page waits this long, not the primary's 15 s.
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy_with(options);
        Ok(ReplicaStore {
            db: Db::Postgres { pool: pool.clone() },
            pool,
            primary,
        })
    }
}

#[async_trait::async_trait]
impl Store for ReplicaStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }
    fn db(&self) -> &Db {
        &self.db
    }
    fn primary(&self) -> &Db {
        self.primary.db()
    }
    fn is_replica(&self) -> bool {
        true
    }
    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
    fn ingest_groups(&self) -> &GroupCounters {
        self.primary.ingest_groups()
    }
    async fn ingest(
        &self,
        _report: &gpuledger_proto::Report,
        _token_id: i64,
        _agent: super::AgentStatus,
        _now_ms: i64,
    ) -> Result<IngestOutcome, StoreError> {
        Err(StoreError::Invalid(
            "a read replica takes no reports: they go to the primary".into(),
        ))
    }
}

/// How far the primary has written its log, in bytes from its start (`None` on SQLite, which
/// has no replicas).
pub async fn wal_position(primary: &Db) -> Result<Option<i64>, StoreError> {
    match primary {
        Db::Sqlite { .. } => Ok(None),
        Db::Postgres { pool } => {
            let (at,): (i64,) = sqlx::query_as("SELECT (pg_current_wal_lsn() - '0/0')::int8")
                .fetch_one(pool)
                .await?;
            Ok(Some(at))
        }
    }
}

/// The database cluster's identifier, the same on a primary and its physical standbys and
/// different on any other (`None` where the role may not read it).
pub async fn cluster_identity(db: &Db) -> Result<Option<i64>, StoreError> {
    let Db::Postgres { pool } = db else {
        return Ok(None);
    };
    match sqlx::query_as::<_, (i64,)>("SELECT system_identifier FROM pg_control_system()")
        .fetch_one(pool)
        .await
    {
        Ok((id,)) => Ok(Some(id)),
        // 42501: not granted to this role; the check is then left out.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42501") => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// What a standby says of itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StandbyState {
    /// How far it has replayed the primary's log, in bytes (`None`: it is not a standby).
    pub replayed: Option<i64>,
    /// The newest migration it has replayed.
    pub schema: i64,
}

impl StandbyState {
    /// Whether its schema is the one this build reads (a migration not yet replayed, or a
    /// replica of an older primary, would make reads fail or mean something else).
    pub fn schema_current(&self) -> bool {
        self.schema >= super::postgres::latest_migration()
    }
}

/// Asks the replica how far it has replayed.
pub async fn standby_state(replica: &Db) -> Result<StandbyState, StoreError> {
    let Db::Postgres { pool } = replica else {
        return Err(StoreError::Invalid(
            "a read replica is a PostgreSQL standby".into(),
        ));
    };
    let (replayed, schema): (Option<i64>, Option<i64>) = sqlx::query_as(
        "SELECT CASE WHEN pg_is_in_recovery()
                     THEN (pg_last_wal_replay_lsn() - '0/0')::int8 END,
                (SELECT MAX(version) FROM _sqlx_migrations WHERE success)",
    )
    .fetch_one(pool)
    .await?;
    Ok(StandbyState {
        replayed,
        schema: schema.unwrap_or_default(),
    })
}
